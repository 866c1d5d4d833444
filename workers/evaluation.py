"""An evaluation split's figures (validation or test) for a whole net, the trainer's default
`evaluate` (a pipeline's stages pass the split through all of them instead:
workers/distributed/pipeline.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workers.algorithms import rbm_input
from workers.data import eval_batches

if TYPE_CHECKING:
    from workers.trainer import Trainer


@torch.no_grad()
def evaluate_whole(trainer: Trainer, split: str) -> dict[str, float]:
    """Loss and metrics over the split ("val" or "test", or its first validate.steps or
    test.steps batches), as `<split>/<name>`."""
    return trainer.compiled_net.run(lambda: _evaluate(trainer, split))


def _evaluate(trainer: Trainer, split: str) -> dict[str, float]:
    net, spec = trainer.net, trainer.spec
    x_split, y_split, limit = trainer.eval_split(split)
    net.eval()
    sums: dict[str, float] = {}
    seen = 0
    cd = spec.train_one_batch.alg == "cd"
    for x, y in eval_batches(x_split, y_split, spec.data.batch_size, limit):
        if cd:
            values = _cd_eval(trainer, x)
        else:
            net.reset_state()
            with trainer.precision.autocast():
                out = net(x, y, "test", with_metrics=True)
            values = {k: float(v) for k, v in out.metrics.items()}
            if out.loss is not None:
                values["loss"] = float(out.loss)
        for key, value in values.items():
            sums[key] = sums.get(key, 0.0) + value * len(x)
        seen += len(x)
    net.train()
    return {f"{split}/{k}": v / max(seen, 1) for k, v in sums.items()}


def _cd_eval(trainer: Trainer, x: torch.Tensor) -> dict[str, float]:
    # Its own stream: evaluating must not shift the training samples' noise, and the same
    # parameters should always give the same figure.
    generator = torch.Generator(device=trainer.device).manual_seed(trainer.spec.seed + 11)
    with trainer.precision.autocast():
        rbm, v0 = rbm_input(trainer.net, x, "test")
        _, recon = rbm.cd_loss(v0, 1, generator)  # type: ignore[operator]
    return {"recon_error": float(recon)}
