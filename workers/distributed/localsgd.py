"""Framework localsgd: post-local SGD (Lin et al., "Don't use large mini-batches, use local
SGD") on torch's own pieces.

For the first `cluster.localsgd_warmup` steps the group all-reduces its gradients as framework
allreduce does (DDP with `post_localSGD_hook`, which then stops exchanging gradients); from
there each replica takes its steps on its own rows of the batch with its own gradients, and
`PeriodicModelAverager` averages the replicas' parameters every `cluster.sync_freq` steps,
the one exchange between syncs. The replicas are equal right after a sync step, and after the
last step, which always averages. Between syncs each worker evaluates its own replica; rank 0
writes the checkpoints, and a restart starts every replica from rank 0's.

Only parameters are averaged: the updater's state (momentum, Adam's moments) stays each
worker's own, as in torch's post-local SGD. With sync_freq 1 and an updater linear in the
gradient (sgd, with momentum and weight decay) the run equals allreduce's: the mean of the
replicas' steps from equal parameters is the step of the mean gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.algorithms.model_averaging import utils as averaging
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from dsl.net import NeuralNet
from workers.distributed.allreduce import DDPSync
from workers.distributed.comm import ProcessGroup

if TYPE_CHECKING:
    from workers.trainer import Trainer


class LocalSGD:
    """DDP that stops all-reducing after the warm-up, and the averager of the parameters."""

    def __init__(
        self, net: NeuralNet, *, group: ProcessGroup = None, period: int, warmup: int
    ) -> None:
        self.warmup = warmup
        self.state = PostLocalSGDState(
            process_group=group,
            subgroup=None,
            start_localSGD_iter=warmup,
            # After the warm-up each replica keeps its own gradient: no subgroup to reduce in.
            post_local_gradient_allreduce=False,
        )
        self.sync = DDPSync(net, group=group, hook=(self.state, post_localSGD_hook))
        self.params = [p for p in net.parameters() if p.requires_grad]
        self.averager = PeriodicModelAverager(
            period=period, warmup_steps=warmup, process_group=group
        )

    def at_start(self, trainer: Trainer) -> None:
        """Where a restored run stands: the steps its hook and averager have counted. The
        averager counts steps done once the update is applied, so it averages after steps
        warmup + sync_freq, warmup + 2 sync_freq, ..."""
        self.state.iter = min(trainer.step, self.warmup)
        self.averager.step = trainer.step + 1

    @torch.no_grad()
    def after_update(self, trainer: Trainer, step: int) -> None:
        """Average the replicas when a sync is due after step `step` (0-based), or it is the
        last one."""
        due = self.averager.step >= self.warmup and (
            (self.averager.step - self.warmup) % self.averager.period == 0
        )
        self.averager.average_parameters(self.params)
        if not due and step + 1 == trainer.spec.train_steps:
            averaging.average_parameters(iter(self.params), self.averager.process_group)
