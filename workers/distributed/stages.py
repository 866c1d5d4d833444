"""A pipeline stage's share of a net: what it runs, receives and sends (pipeline.py runs it).
With virtual stages a "stage" here is one piece of the net (a stage's worker runs several).

What crosses a cut is computed per phase from the layers' sources: every output of a layer of
an earlier stage that a layer of this stage or a later one reads, so a skip connection over a
stage is handed through it. The last stage's labelled layers (losses, metrics) form its head,
which the schedule's loss function runs where the micro-batch's labels are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as rematerialized

from dsl.compiler import CompiledJob
from dsl.graph import SourceRef
from dsl.layers.base import Phase
from dsl.net import CompiledLayer, NeuralNet, Step, run_labelled, total_loss
from dsl.planner import PipelinePlan

Key = tuple[str, int]  # (layer, output index): one tensor of a pass


def _key(ref: SourceRef) -> Key:
    return (ref.layer, ref.output or 0)


@dataclass(frozen=True)
class StageFlow:
    """One stage's part of a phase: the layers it runs, the tensors it receives and sends.

    On the last stage `head` holds the layers that read the labels (losses and metrics) and
    `sends` what they read.
    """

    steps: tuple[Step, ...]
    receives: tuple[Key, ...]
    sends: tuple[Key, ...]
    head: tuple[Step, ...] = ()


def stage_flows(net: NeuralNet, plan: PipelinePlan, phase: Phase) -> list[StageFlow]:
    """Every stage's flow for `phase`, first stage first."""
    stage_of = plan.stage_of()
    steps = net.steps(phase)
    last = len(plan.stages) - 1
    head = [s for s in steps if s.wants_label]
    body = [s for s in steps if not s.wants_label]
    # The tensors read after stage s: by a later stage's layers, or by the head.
    consumers: list[tuple[int, Step]] = [(stage_of[s.name], s) for s in body]
    consumers += [(last + 1, s) for s in head]
    flows: list[StageFlow] = []
    for index in range(len(plan.stages)):
        sends: list[Key] = []
        for where, step in consumers:
            if where <= index:
                continue
            for ref in step.sources:
                key = _key(ref)
                if stage_of[ref.layer] <= index and key not in sends:
                    sends.append(key)
        mine = tuple(s for s in body if stage_of[s.name] == index)
        flows.append(
            StageFlow(
                steps=mine,
                receives=flows[-1].sends if flows else (),
                sends=tuple(sends),
                head=tuple(head) if index == last else (),
            )
        )
    return flows


def run_flow(flow: StageFlow, inputs: Sequence[torch.Tensor]) -> dict[Key, torch.Tensor]:
    """Run a stage's layers on what it receives; the first stage receives the batch's samples
    alone, which its input layers hand on."""
    values: dict[Key, torch.Tensor] = {}
    if flow.receives:
        values = dict(zip(flow.receives, inputs, strict=True))
    for step in flow.steps:
        if step.module.stateful:
            step.module.reset_state()  # type: ignore[operator]  # each micro-batch starts anew
        if step.is_input:
            out: torch.Tensor | tuple[torch.Tensor, ...] = inputs[0]
        else:
            out = step.module(*[values[_key(ref)] for ref in step.sources])
        if isinstance(out, tuple):
            for i, tensor in enumerate(out):
                values[(step.name, i)] = tensor
        else:
            values[(step.name, 0)] = out
    return values


def run_head(
    flow: StageFlow, sent: Sequence[torch.Tensor], y: torch.Tensor, *, with_metrics: bool
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The last stage's losses (summed) and metrics, as NeuralNet.forward computes them."""
    values = dict(zip(flow.sends, sent, strict=True))
    losses: list[torch.Tensor] = []
    metrics: dict[str, torch.Tensor] = {}
    for step in flow.head:
        inputs = [values[_key(ref)] for ref in step.sources] + [y]
        run_labelled(step, inputs, losses, metrics if with_metrics else None)
    return total_loss(losses), metrics


class SavedActivations:
    """Bytes of the tensors a stage keeps for its backward passes: now, and the most since
    `reset` (parameters, which are kept anyway, do not count)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def reset(self) -> None:
        self.peak = self.live

    def pack(self, tensor: torch.Tensor) -> _Kept:
        base = tensor._base if tensor._base is not None else tensor
        size = 0 if isinstance(base, nn.Parameter) else tensor.numel() * tensor.element_size()
        self.live += size
        self.peak = max(self.peak, self.live)
        return _Kept(tensor, size, self)

    @staticmethod
    def unpack(kept: _Kept) -> torch.Tensor:
        return kept.tensor


class _Kept:
    """A tensor kept for backward; forgotten (and uncounted) when autograd drops it."""

    __slots__ = ("owner", "size", "tensor")

    def __init__(self, tensor: torch.Tensor, size: int, owner: SavedActivations) -> None:
        self.tensor, self.size, self.owner = tensor, size, owner

    def __del__(self) -> None:
        self.owner.live -= self.size


class StageModule(nn.Module):
    """What a PipelineStage runs: the stage's layers, from the tensors in to the tensors out."""

    def __init__(
        self,
        layers: nn.ModuleDict,
        flow: StageFlow,
        *,
        rematerialize: bool,
        autocast: Callable[[], AbstractContextManager[object]] = nullcontext,
        saved: SavedActivations | None = None,
    ) -> None:
        super().__init__()
        self.layers = layers
        self.flow = flow
        self.rematerialize = rematerialize
        self.autocast = autocast  # the job's precision
        # Shared by the pieces of one stage: what the stage keeps, all its pieces together.
        self.saved = saved if saved is not None else SavedActivations()

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autograd.graph.saved_tensors_hooks(self.saved.pack, self.saved.unpack):
            return self._forward(*inputs)

    def _forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for tensor in inputs:
            if tensor.requires_grad:
                # Gradients go back to the previous stage, which receives into contiguous
                # buffers; some backwards (a concat's) give strided views.
                tensor.register_hook(torch.Tensor.contiguous)
        if self.rematerialize and torch.is_grad_enabled():
            # Keep only this stage's inputs; the backward runs the stage's forward again.
            out: tuple[torch.Tensor, ...] = rematerialized(self._run, *inputs, use_reentrant=False)
            return out
        return self._run(*inputs)

    def _run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with self.autocast():
            values = run_flow(self.flow, inputs)
        # The next stage receives into buffers laid out like these tensors, and gloo receives
        # only into contiguous ones.
        return tuple(values[key].contiguous() for key in self.flow.sends)


def stage_job(job: CompiledJob, plan: PipelinePlan, rank: int) -> CompiledJob:
    """The job as stage `rank` holds it: a net of its pieces' layers only (the same modules,
    so its parameters keep their names), which its trainer and updater are built over."""
    names = {name for piece in plan.pieces_of(rank) for name in plan.stages[piece].layers}
    layers: list[CompiledLayer] = [c for c in job.net.compiled if c.config.name in names]
    return replace(job, net=NeuralNet(layers))
