"""One worker of a synchronous worker group: the pieces of allreduce.py and partition.py applied
to a trainer, in their one valid order.

1. split the net for this worker (before the updater is built over its parameters);
2. build the trainer on the split net;
3. average gradients over the group before each update (the all-reduce);
4. map checkpoints between this worker's slices and whole tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from dsl.compiler import CompiledJob
from dsl.schema import JobSpec
from workers.checkpoint import Checkpoint
from workers.data import Dataset
from workers.distributed.allreduce import GradientSync, attach_allreduce
from workers.distributed.comm import ProcessGroup
from workers.distributed.partition import PartitionedNet, partition_net
from workers.distributed.rendezvous import GroupMember
from workers.metrics import MetricSink
from workers.trainer import Trainer, TrainOptions


def checkpoint_due(spec: JobSpec, done: int) -> bool:
    """Whether the trainer saves a checkpoint once `done` steps are done (its own schedule)."""
    return done == spec.train_steps or bool(
        spec.checkpoint.freq and done % spec.checkpoint.freq == 0
    )


class WholeCheckpoints:
    """Checkpoints of a net split by feature hold whole tensors, as a local run's do.

    Joining the slices is a collective, and only rank 0 writes checkpoints, so every worker
    joins them right after the update of a step the trainer will save at; rank 0's trainer
    then writes the joined tensors. Loading takes each worker's slices of the whole tensors.
    """

    def __init__(self, trainer: Trainer, net: PartitionedNet) -> None:
        self.trainer, self.net = trainer, net
        self.step = -1
        self.params: dict[str, torch.Tensor] = {}
        self.updater: dict[str, torch.Tensor] = {}

    def after_update(self, step: int) -> None:
        if checkpoint_due(self.trainer.spec, step + 1):
            self.params = self.net.gather_full(dict(self.net.named_params()))
            self.updater = self.net.gather_full(self.trainer.updater.state_tensors())
            self.step = step + 1

    def to_whole(self, ckpt: Checkpoint) -> Checkpoint:
        if ckpt.step != self.step:
            raise RuntimeError(
                f"checkpoint of step {ckpt.step} requested, but the workers joined their "
                f"parameter slices at step {self.step}"
            )
        return replace(ckpt, params=self.params, updater=self.updater)

    def to_local(self, ckpt: Checkpoint) -> Checkpoint:
        return replace(
            ckpt, params=self.net.take_local(ckpt.params), updater=self.net.take_local(ckpt.updater)
        )


def attach_whole_checkpoints(trainer: Trainer) -> WholeCheckpoints | None:
    """Make a trainer whose net is split by feature save and load whole-model checkpoints."""
    net = trainer.net
    if not isinstance(net, PartitionedNet) or not net.shard_axes:
        return None
    whole = WholeCheckpoints(trainer, net)
    update = trainer.apply_update

    def apply_update(step: int) -> None:
        update(step)
        whole.after_update(step)

    trainer.apply_update = apply_update
    trainer.checkpoint_out = whole.to_whole
    trainer.checkpoint_in = whole.to_local
    return whole


def partitioned_trainer(
    compiled: CompiledJob,
    dataset: Dataset,
    options: TrainOptions,
    *,
    member: GroupMember,
    sinks: Sequence[MetricSink] = (),
    process_group: ProcessGroup = None,
) -> Trainer:
    """Steps 1 and 2: the trainer of `member` on its part of the net.

    `options.rank` / `options.world` say which rows of each global batch the worker reads;
    `member` is its place in the group that splits the net (the same in a single group).
    """
    net = partition_net(
        compiled.net,
        net_dim=compiled.spec.neuralnet.partition_dim,
        rank=member.rank,
        world=member.world,
        group=process_group,
    )
    return Trainer(replace(compiled, net=net), dataset, options, sinks)


def group_trainer(
    compiled: CompiledJob,
    dataset: Dataset,
    options: TrainOptions,
    *,
    sinks: Sequence[MetricSink] = (),
    process_group: ProcessGroup = None,
    compression: str | None = None,
) -> tuple[Trainer, GradientSync]:
    """The allreduce framework's trainer for worker `options.rank` of a group of
    `options.world`, which has already joined its process group."""
    member = GroupMember(options.rank, options.world, options.group)
    trainer = partitioned_trainer(
        compiled, dataset, options, member=member, sinks=sinks, process_group=process_group
    )
    sync = attach_allreduce(trainer, process_group, compression=compression)
    attach_whole_checkpoints(trainer)
    return trainer, sync
