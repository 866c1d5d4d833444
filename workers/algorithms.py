"""SINGA's TrainOneBatch algorithms: each computes the gradients of one batch.

`bp` back-propagates through a feed-forward DAG, `bptt` through a recurrent net over sequences
truncated every `unroll_len` steps, and `cd` runs contrastive divergence CD-k on an rbm layer.
Each is a plain function registered by name; the trainer applies the update afterwards, so the
same functions serve the local trainer and the distributed workers. Each runs its forward passes
under the job's `precision` and back-propagates through it (fp16 scales the loss).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from dsl.layers.base import Layer, Phase
from dsl.net import NeuralNet
from dsl.registry import Registry
from dsl.schema import BPTTConfig, CDConfig, JobSpec
from workers.precision import Precision


@dataclass
class BatchResult:
    """Detached scalars of one batch; kept as tensors so the hot loop never syncs."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


Algorithm = Callable[
    [NeuralNet, torch.Tensor, torch.Tensor, JobSpec, torch.Generator, Precision], BatchResult
]
ALGORITHMS: Registry[Algorithm] = Registry("train_one_batch algorithm")
# The algorithms that accumulate each parameter's gradient once per step (one backward pass), so
# that a gradient is final the moment it is accumulated: a parameter-server worker sends it then,
# during the backward pass (workers/distributed/ps/overlap.py). bptt accumulates over chunks.
ONE_BACKWARD_PASS = frozenset({"bp", "cd"})


def bp(
    net: NeuralNet,
    x: torch.Tensor,
    y: torch.Tensor,
    spec: JobSpec,
    gen: torch.Generator,
    precision: Precision,
    *,
    forward: nn.Module | None = None,
) -> BatchResult:
    """One forward and one backward pass. `forward`: the module that runs the net's forward
    when it is not the net itself (DistributedDataParallel around it, whose forward readies
    the all-reduce of the gradients: workers/distributed/allreduce.py)."""
    net.reset_state()
    with precision.autocast():
        out = (net if forward is None else forward)(x, y, "train", with_metrics=True)
    assert out.loss is not None  # the compiler guarantees a loss layer for bp
    precision.backward(out.loss)
    return BatchResult(out.loss.detach(), out.metrics)


# Registered apart from its definition, so that `bp` keeps its own signature (with `forward`)
# for the allreduce framework, which calls it by name.
ALGORITHMS.register("bp")(bp)


@ALGORITHMS.register("bptt")
def bptt(
    net: NeuralNet,
    x: torch.Tensor,
    y: torch.Tensor,
    spec: JobSpec,
    gen: torch.Generator,
    precision: Precision,
) -> BatchResult:
    """Truncated BPTT: the sequence axis is the first per-sample axis, x (B, T, ...).

    With per-step labels y (B, T) every chunk has a loss and gradients accumulate over the
    chunks; with one label per sequence only the last chunk has one, and earlier chunks only
    advance the hidden state. The state is carried across chunks but cut from the graph.
    """
    cfg = spec.train_one_batch
    assert isinstance(cfg, BPTTConfig)
    steps = x.shape[1]
    chunk = cfg.unroll_len or steps
    per_step_labels = y.dim() >= 2 and y.shape[1] == steps
    starts = list(range(0, steps, chunk))
    net.reset_state()
    total = torch.zeros(())
    metrics: dict[str, torch.Tensor] = {}
    for i, t0 in enumerate(starts):
        xs = x[:, t0 : t0 + chunk]
        last = i == len(starts) - 1
        if per_step_labels or last:
            ys = y[:, t0 : t0 + chunk] if per_step_labels else y
            with precision.autocast():
                out = net(xs, ys, "train", with_metrics=True)
            assert out.loss is not None
            weight = xs.shape[1] / steps if per_step_labels else 1.0
            precision.backward(out.loss * weight)
            total = total + out.loss.detach() * weight
            for key, value in out.metrics.items():
                metrics[key] = metrics.get(key, torch.zeros(())) + value * weight
        else:
            with torch.no_grad(), precision.autocast():
                net(xs, None, "train")
        net.detach_state()
    metrics["loss"] = total
    return BatchResult(total, metrics)


def rbm_input(net: NeuralNet, x: torch.Tensor, phase: Phase) -> tuple[Layer, torch.Tensor]:
    """The net's last rbm layer and its visible units for batch `x`, flattened to (B, V)."""
    config, rbm = [(c, m) for c, m in net.layer_modules() if c.type == "rbm"][-1]
    source = config.srclayers[0]
    v0 = net(x, None, phase, stop_at=source).outputs[source]
    assert isinstance(v0, torch.Tensor)
    return rbm, v0.flatten(1)


@ALGORITHMS.register("cd")
def cd(
    net: NeuralNet,
    x: torch.Tensor,
    y: torch.Tensor,
    spec: JobSpec,
    gen: torch.Generator,
    precision: Precision,
) -> BatchResult:
    """CD-k on the net's last rbm layer; the layers below it are fixed feature extractors."""
    cfg = spec.train_one_batch
    assert isinstance(cfg, CDConfig)
    with precision.autocast():
        with torch.no_grad():
            rbm, v0 = rbm_input(net, x, "train")
        loss, recon = rbm.cd_loss(v0, cfg.k, gen)  # type: ignore[operator]
    precision.backward(loss)
    return BatchResult(loss.detach(), {"recon_error": recon.detach()})
