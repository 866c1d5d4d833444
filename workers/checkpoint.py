"""Checkpoints as safetensors files: parameters, buffers, updater state, random-number
generator states and the step.

Writes are atomic (a temporary file, synced, renamed into place), so a crash never leaves a
torn checkpoint; only the newest `keep` files stay (and the best one, when it is protected).
Nothing is pickled. `RestartClock` says when the writer saves the service's restart points.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from contract.rundir import CHECKPOINTS, checkpoint_path, list_checkpoints


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit the net."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, no permission)."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Checkpoint:
    step: int
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    updater: dict[str, torch.Tensor] = field(default_factory=dict)
    # Generator states (uint8 tensors), so a resumed run draws the same noise (cd sampling,
    # dropout) as an uninterrupted one.
    rng: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)


def save_checkpoint(
    directory: Path, ckpt: Checkpoint, keep: int, *, protect: int | None = None
) -> Path:
    """Write `ckpt` to `directory` and delete all but the newest `keep` there, except the
    checkpoint of step `protect` (the best one, which checkpoint.keep_best keeps)."""
    tensors: dict[str, torch.Tensor] = {}
    for prefix, group in (
        ("param", ckpt.params),
        ("buffer", ckpt.buffers),
        ("updater", ckpt.updater),
        ("rng", ckpt.rng),
    ):
        for name, tensor in group.items():
            tensors[f"{prefix}/{name}"] = tensor.detach().to("cpu").contiguous()
    meta = {**ckpt.meta, "step": str(ckpt.step), "format": "trainyard-1"}
    final = checkpoint_path(directory, ckpt.step)
    tmp = final.with_suffix(".tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata=meta)
        _fsync(tmp)  # the bytes are on disk before the name points at them
        os.replace(tmp, final)
        _fsync(directory)  # and the rename itself survives a crash of the machine
    except (OSError, SafetensorError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        # safetensors words an OSError as "Error while serializing: I/O error: <why> (os error N)"
        found = re.search(r"I/O error: (.*) \(os error \d+\)", reason)
        reason = found.group(1) if found else reason
        raise CheckpointWriteError(
            f"cannot write checkpoint {final.name} to {directory}: {reason}; "
            "the earlier checkpoints are unchanged"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    prune_checkpoints(directory, keep, protect=protect)
    return final


def prune_checkpoints(directory: Path, keep: int, *, protect: int | None = None) -> None:
    """Delete all but the newest `keep` checkpoints of `directory`, and the one of step
    `protect`."""
    for step, old in list_checkpoints(directory)[:-keep]:
        if step != protect:
            old.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> Checkpoint:
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = dict(handle.metadata() or {})
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    groups: dict[str, dict[str, torch.Tensor]] = {
        "param": {},
        "buffer": {},
        "updater": {},
        "rng": {},
    }
    for key, tensor in tensors.items():
        prefix, _, name = key.partition("/")
        if prefix in groups:
            groups[prefix][name] = tensor
    return Checkpoint(
        step=int(meta.get("step", "0")),
        params=groups["param"],
        buffers=groups["buffer"],
        updater=groups["updater"],
        rng=groups["rng"],
        meta=meta,
    )


def resolve_checkpoint(location: Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory or checkpoint folder."""
    if location.is_file():
        return location
    for directory in (location / CHECKPOINTS, location):
        found = list_checkpoints(directory)
        if found:
            return found[-1][1]
    raise CheckpointError(f"no checkpoint found at {location}")


def load_matching_params(net_params: dict[str, torch.nn.Parameter], ckpt: Checkpoint) -> list[str]:
    """Copy parameters whose names match into the net; return the names loaded.

    A name present in both with different shapes is an error, since silently skipping it
    would train from a half-initialised net.
    """
    loaded = []
    with torch.no_grad():
        for name, param in net_params.items():
            if name not in ckpt.params:
                continue
            source = ckpt.params[name]
            if source.shape != param.shape:
                raise CheckpointError(
                    f"parameter {name}: checkpoint has shape {list(source.shape)}, "
                    f"the net has {list(param.shape)}"
                )
            param.copy_(source.to(param.device, param.dtype))
            loaded.append(name)
    return loaded


def write_json_atomic(path: Path, payload: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class RestartClock:
    """When the writer saves a restart point: every `seconds` of training. The answer for a
    step is computed once; with `sync` (a collective that hands every worker rank 0's answer)
    it is asked every `every` steps, so the workers that save together agree on the step."""

    def __init__(
        self,
        seconds: float,
        *,
        every: int = 1,
        sync: Callable[[bool], bool] | None = None,
    ) -> None:
        self.seconds, self.every, self.sync = seconds, every, sync
        self.last = time.monotonic()
        self._memo = (-1, False)

    def due(self, step: int) -> bool:
        if self._memo[0] == step:
            return self._memo[1]
        answer = False
        if self.seconds > 0 and step % self.every == 0:
            now = time.monotonic()
            answer = now - self.last >= self.seconds
            if self.sync is not None:
                answer = self.sync(answer)
            if answer:
                self.last = now
        self._memo = (step, answer)
        return answer
