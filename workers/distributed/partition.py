"""Partitioning a job's net over the workers of a group: by batch, by feature, or mixed.

`partition_dim` on the net and on each layer says how a layer is split across the group:

- 0 (batch): every worker runs the whole layer on its own rows of the batch (data parallel).
- 1 (feature): every worker holds a slice of the layer's output units or channels (rows of
  `w`, entries of `b`) and computes that slice for the whole batch (model parallel). Layer
  types that can be cut this way register a splitter below (dense, conv1d, conv2d); on any
  other layer 1 means the same as -1.
- -1 (replicated): every worker runs the whole layer on the whole batch.

Between layers a tensor is either batch-local (the worker's rows, `ROWS`) or whole and the
same on every worker (`WHOLE`). Where a layer needs the other kind, the net inserts SINGA's
connection layers itself, as collectives (workers/distributed/comm.py): rows are joined by an
all-gather along the batch and taken back by slicing; a feature-split layer's slices are
joined by an all-gather along its feature axis. Users write no communication code.

Gradients. Each worker back-propagates its own loss; the collectives' backward passes sum what
every worker's copy contributed, so every worker ends with the gradient of the sum of the
workers' losses, which is `world` times the loss of the unpartitioned net (a loss over the
worker's rows is the mean over rows; a loss over the whole batch is the same on every worker).
Replicated parameters therefore get their gradients averaged over the group (the all-reduce of
workers/distributed/allreduce.py), and feature slices divided by the group size.

During evaluation every worker gets the whole test batch, so every layer works on whole
tensors and every worker reports the same metrics.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import torch
from torch import nn

from dsl.graph import SourceRef
from dsl.layers.base import Layer, LayerConfig, Phase
from dsl.layers.conv import Conv, ConvConfigBase
from dsl.layers.dense import Dense
from dsl.net import CompiledLayer, Flow, NeuralNet, Step
from dsl.registry import Registry
from workers.distributed.comm import (
    ProcessGroup,
    all_gather_along,
    gather_pieces,
    piece_bounds,
    split_sizes,
    take_piece,
)

Mode = Literal["batch", "feature", "replicated"]


class PartitionError(ValueError):
    """A net cannot be partitioned the way its job asks."""


class Layout(Enum):
    ROWS = "rows"  # this worker's rows of the batch
    WHOLE = "whole"  # the whole batch, identical on every worker


@dataclass(frozen=True)
class Shard:
    """A worker's part of a layer split by feature."""

    module: Layer
    out_axis: int  # axis of the layer's output that holds the features
    param_axes: dict[str, int]  # local parameter name -> axis cut across the workers


# (layer config, whole module, [start, stop) of the features this worker keeps) -> its shard
Splitter = Callable[[LayerConfig, Layer, int, int], Shard]
SPLITTERS: Registry[Splitter] = Registry("feature splitter")


def _cut_rows(module: Layer, start: int, stop: int) -> tuple[Layer, dict[str, int]]:
    """A copy of `module` keeping rows [start, stop) of each of its parameters."""
    shard = copy.deepcopy(module)
    axes = {}
    for name, param in module.named_parameters(recurse=False):
        setattr(shard, name, nn.Parameter(param.detach()[start:stop].clone()))
        axes[name] = 0
    return shard, axes


@SPLITTERS.register("dense", "innerproduct")
def _split_dense(config: LayerConfig, module: Layer, start: int, stop: int) -> Shard:
    assert isinstance(module, Dense)
    shard, axes = _cut_rows(module, start, stop)  # w (units, in), b (units)
    return Shard(shard, out_axis=-1, param_axes=axes)  # (B, *lead, units)


@SPLITTERS.register("conv1d", "conv2d", "convolution")
def _split_conv(config: LayerConfig, module: Layer, start: int, stop: int) -> Shard:
    assert isinstance(module, Conv) and isinstance(config, ConvConfigBase)
    if config.groups != 1:
        # A slice of filters may straddle channel groups, which one conv call cannot express.
        raise PartitionError(
            f"layer '{config.name}' ({config.type}) has groups={config.groups}; only convolutions "
            "with groups 1 can be split by feature (partition_dim 1)"
        )
    shard, axes = _cut_rows(module, start, stop)  # w (filters, C, *kernel), b (filters)
    return Shard(shard, out_axis=1, param_axes=axes)  # (B, filters, *spatial)


@dataclass(frozen=True)
class LayerPlan:
    mode: Mode
    out_axis: int = 0  # feature layers: the output axis joined across workers
    sizes: tuple[int, ...] = ()  # feature layers: how many features each worker holds

    def input_layout(self, phase: Phase) -> Layout:
        return Layout.ROWS if self.mode == "batch" and phase == "train" else Layout.WHOLE


def layer_mode(config: LayerConfig, net_dim: int) -> Mode:
    """How one layer is split: its own partition_dim, else the net's."""
    dim = config.partition_dim if config.partition_dim is not None else net_dim
    if dim == 0:
        return "batch"
    if dim == 1 and config.type in SPLITTERS:
        return "feature"
    return "replicated"


class PartitionedNet(NeuralNet):
    """A net whose layers are split over a group; same interface and parameter names."""

    def __init__(
        self,
        layers: list[CompiledLayer],
        plans: dict[str, LayerPlan],
        shard_axes: dict[str, int],
        full_sizes: dict[str, tuple[int, ...]],
        *,
        rank: int,
        world: int,
        group: ProcessGroup,
    ) -> None:
        super().__init__(layers)
        self.plans = plans
        self.rank, self.world, self.group = rank, world, group
        # `<layer>/<param>` of every feature-split parameter -> the axis cut, and its full sizes
        self.shard_axes = shard_axes
        self.full_sizes = full_sizes

    def _flow(self, y: torch.Tensor | None, phase: Phase) -> Flow:
        return _SplitFlow(self, y, phase)

    def relayout(self, tensor: torch.Tensor, have: Layout, need: Layout) -> torch.Tensor:
        if have == need:
            return tensor
        if need == Layout.WHOLE:  # (B / world, ...) -> (B, ...)
            rows = [tensor.shape[0]] * self.world
            return all_gather_along(tensor, 0, rows, self.group)
        return take_piece(tensor, 0, self.world, self.rank)  # (B, ...) -> (B / world, ...)

    # -- whole-model views of the split parameters, for checkpoints -----------------------------
    def gather_full(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole tensors from every worker's slices. Collective: every worker calls it.

        `tensors` maps a parameter name, or `<parameter name>/<updater state key>`, to this
        worker's tensor; slices of split parameters are joined, everything else is copied.
        """
        out = {}
        for key in sorted(tensors):  # the same order on every worker: collectives pair up
            tensor = tensors[key].detach()
            name = self._sliced_param(key, tensor)
            if name is None:
                out[key] = tensor.clone()
            else:
                axis = self.shard_axes[name]
                out[key] = gather_pieces(tensor, axis, list(self.full_sizes[name]), self.group)
        return out

    def take_local(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This worker's slices of whole tensors (the inverse of `gather_full`; local)."""
        out = {}
        for key, tensor in tensors.items():
            name = key if key in self.shard_axes else key.rpartition("/")[0]
            axis = self.shard_axes.get(name)
            if (
                axis is not None
                and tensor.dim() > 0
                and tensor.shape[axis] == sum(self.full_sizes[name])
            ):
                tensor = take_piece(tensor, axis, self.world, self.rank).clone()
            out[key] = tensor
        return out

    def _sliced_param(self, key: str, tensor: torch.Tensor) -> str | None:
        """The split parameter whose slice `tensor` is (its updater state too), or None."""
        name = key if key in self.shard_axes else key.rpartition("/")[0]
        axis = self.shard_axes.get(name)
        if axis is None or tensor.dim() == 0:  # scalars such as the optimiser's step count
            return None
        return name if tensor.shape[axis] == self.full_sizes[name][self.rank] else None


class _SplitFlow(Flow):
    """A pass of a split net: every output has a layout, converted where a layer needs another."""

    def __init__(self, net: PartitionedNet, y: torch.Tensor | None, phase: Phase) -> None:
        super().__init__(y)
        self.net, self.phase = net, phase
        # The trainer hands each worker its rows for training and the whole batch for tests.
        self.given = Layout.ROWS if phase == "train" else Layout.WHOLE
        self.layouts: dict[str, Layout] = {}
        self.converted: dict[tuple[str, int | None, Layout], torch.Tensor] = {}
        self.labels = {self.given: y}

    def _need(self, step: Step) -> Layout:
        return self.net.plans[step.name].input_layout(self.phase)

    def inputs(self, step: Step) -> list[torch.Tensor]:
        need = self._need(step)
        return [self._as_layout(ref, need) for ref in step.sources]

    def label(self, step: Step) -> torch.Tensor:
        need = self._need(step)
        if need not in self.labels:
            assert self.y is not None
            self.labels[need] = self.net.relayout(self.y, self.given, need)
        label = self.labels[need]
        assert label is not None
        return label

    def after_layer(
        self, step: Step, out: torch.Tensor | tuple[torch.Tensor, ...]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        plan = self.net.plans[step.name]
        if plan.mode == "feature":
            assert isinstance(out, torch.Tensor)
            return all_gather_along(out, plan.out_axis, list(plan.sizes), self.net.group)
        return out

    def keep(self, step: Step, out: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        super().keep(step, out)
        self.layouts[step.name] = self.given if step.is_input else self._need(step)

    def _as_layout(self, ref: SourceRef, need: Layout) -> torch.Tensor:
        value = self.outputs[ref.layer]
        tensor = value[ref.output or 0] if isinstance(value, tuple) else value
        have = self.layouts[ref.layer]
        if have == need:
            return tensor
        key = (ref.layer, ref.output, need)
        if key not in self.converted:  # one collective however many layers read the same source
            self.converted[key] = self.net.relayout(tensor, have, need)
        return self.converted[key]


def partition_net(
    net: NeuralNet,
    *,
    net_dim: int,
    rank: int,
    world: int,
    group: ProcessGroup = None,
) -> NeuralNet:
    """The net as worker `rank` of a group of `world` runs it.

    A net split only by batch is returned as it is: the workers run the whole net on their own
    rows and the group's all-reduce keeps the replicas equal.
    """
    modes = {c.config.name: layer_mode(c.config, net_dim) for c in net.compiled}
    if world == 1 or all(
        modes[c.config.name] == "batch" for c in net.compiled if c.config.type != "input"
    ):
        return net
    layers: list[CompiledLayer] = []
    plans: dict[str, LayerPlan] = {}
    shard_axes: dict[str, int] = {}
    full_sizes: dict[str, tuple[int, ...]] = {}
    for compiled in net.compiled:
        config, module = compiled.config, compiled.module
        mode = modes[config.name]
        if mode != "feature":
            plans[config.name] = LayerPlan(mode)
            layers.append(compiled)
            continue
        features = _feature_count(compiled)
        if features < world:
            raise PartitionError(
                f"layer '{config.name}' ({config.type}) has {features} output features, fewer "
                f"than the {world} workers of the group that split it by feature; give it "
                "partition_dim 0 or -1"
            )
        sizes = split_sizes(features, world)
        start, stop = piece_bounds(features, world, rank)
        shard = SPLITTERS.get(config.type)(config, module, start, stop)
        for local, axis in shard.param_axes.items():
            name = f"{config.name}/{local}"
            shard_axes[name] = axis
            full_sizes[name] = tuple(sizes)
        plans[config.name] = LayerPlan(mode, shard.out_axis, tuple(sizes))
        layers.append(CompiledLayer(config, shard.module, compiled.out_shape, compiled.sources))
    return PartitionedNet(
        layers, plans, shard_axes, full_sizes, rank=rank, world=world, group=group
    )


def _feature_count(compiled: CompiledLayer) -> int:
    """Output features of a dense (last axis) or conv (channels) layer, from its weight."""
    weight = compiled.module.w
    assert isinstance(weight, torch.Tensor)
    return int(weight.shape[0])


def sharded_params(net: NeuralNet) -> set[str]:
    """Names of the parameters the workers hold slices of (empty for a net split by batch)."""
    return set(net.shard_axes) if isinstance(net, PartitionedNet) else set()
