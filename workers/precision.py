"""Mixed precision (the job's `precision`): what forward passes compute in, and fp16's loss scale.

The parameters, their gradients, the updater's state and the checkpoints stay fp32 whatever the
precision: autocast runs each forward pass (the loss included) in bf16 or fp16 where torch deems
it safe, and the backward pass hands fp32 gradients to the fp32 parameters.

fp16's narrow range needs a loss scale (torch.amp.GradScaler): the loss is multiplied before
backward, and the updater (workers/updaters.py) divides the gradients back right before the
optimiser step. That is after the framework's gradient exchange (all-reduce averages the scaled
gradients), so every replica of a group unscales the same values and skips the same steps when
they overflow. bf16 has fp32's range and needs no scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

# precision -> the autocast type; None: fp32, no autocast
AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


# fp32's forward context, asked for at every step: nullcontext holds no state, so one serves all.
_FP32 = nullcontext()


class PrecisionError(ValueError):
    """A precision the worker's device does not train in."""


@dataclass
class Precision:
    """How one worker's forward and backward passes treat precision."""

    device_type: str = "cpu"
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def autocast(self) -> AbstractContextManager[object]:
        """The context of a forward pass; backward runs outside it, as torch advises."""
        if self.dtype is None:
            return _FP32
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def state(self) -> dict[str, str]:
        """The loss scale for a checkpoint's metadata, so a resumed run goes on with it."""
        if self.scaler is None:
            return {}
        saved = self.scaler.state_dict()
        return {
            "loss_scale": repr(saved["scale"]),
            "loss_scale_growth": str(saved["_growth_tracker"]),
        }

    def load_state(self, meta: Mapping[str, str]) -> None:
        if self.scaler is None or "loss_scale" not in meta:
            return
        saved = self.scaler.state_dict()
        saved["scale"] = float(meta["loss_scale"])
        saved["_growth_tracker"] = int(meta["loss_scale_growth"])
        self.scaler.load_state_dict(saved)


def precision_for(name: str, device: torch.device) -> Precision:
    """The job's `precision` on `device`; fp16 only on a GPU."""
    if name == "fp16" and device.type != "cuda":
        raise PrecisionError(
            f"precision fp16 is for GPUs, and this worker trains on {device.type}: on a CPU "
            "fp16 is slower than fp32 and needs a loss scale; use precision bf16 there, or train "
            "on a GPU"
        )
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return Precision(device.type, AUTOCAST_DTYPES[name], scaler)
