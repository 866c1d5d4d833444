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

With `cluster.localsgd_delay: d` > 0 the replicas do not wait for the averaging: at a sync
step each sends a copy of its parameters to an all-reduce that runs in the background while it
takes its next d steps, and after the d-th it swaps its copy for the mean and keeps what it
learnt meanwhile (parameters += mean - copy), as overlapped local SGD does (Wang et al.,
"Overlap Local-SGD", 2020). The replicas are then apart by their last d steps only; the last
step still averages them whole, after taking in an averaging in flight. The step that takes
the mean in is fixed (d steps after the sync), so a run is as reproducible as without.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.algorithms.model_averaging import utils as model_averaging
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from dsl.net import NeuralNet
from workers.distributed.allreduce import DDPSync
from workers.distributed.comm import ProcessGroup

if TYPE_CHECKING:
    from workers.trainer import Trainer


@dataclass
class _Averaging:
    """A sum of the replicas' parameters in flight, and this replica's copy it started from."""

    copy: torch.Tensor
    total: torch.Tensor
    work: dist.Work
    due: int  # steps done when the mean is taken in


class LocalSGD:
    """DDP that stops all-reducing after the warm-up, and the averager of the parameters."""

    def __init__(
        self,
        net: NeuralNet,
        *,
        group: ProcessGroup = None,
        period: int,
        warmup: int,
        delay: int = 0,
    ) -> None:
        if not 0 <= delay < period:
            raise ValueError(f"a localsgd delay of {delay} steps is not in [0, {period})")
        self.warmup, self.delay = warmup, delay
        self._averaging: _Averaging | None = None
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
        self._averaging = None  # one in flight when the run stopped is not taken in

    @torch.no_grad()
    def after_update(self, trainer: Trainer, step: int) -> None:
        """Average the replicas when a sync is due after step `step` (0-based), or it is the
        last one."""
        if self.delay:
            self._after_update_delayed(trainer, step)
            return
        due = self._sync_due(self.averager.step)
        self.averager.average_parameters(self.params)
        if not due and step + 1 == trainer.spec.train_steps:
            model_averaging.average_parameters(iter(self.params), self.averager.process_group)

    def _sync_due(self, done: int) -> bool:
        """Whether the replicas are averaged once `done` steps are done (PeriodicModelAverager's
        rule: after steps warmup, warmup + sync_freq, ...)."""
        return done >= self.warmup and (done - self.warmup) % self.averager.period == 0

    def _after_update_delayed(self, trainer: Trainer, step: int) -> None:
        """With a delay: take in the averaging in flight when its step has come, start one at a
        sync step; average whole at the last step."""
        done = step + 1
        last = done == trainer.spec.train_steps
        group = self.averager.process_group
        if self._averaging is not None and (done == self._averaging.due or last):
            self._take_in(self._averaging, dist.get_world_size(group))
            self._averaging = None
        if last:
            model_averaging.average_parameters(iter(self.params), group)
        elif self._sync_due(done):
            copy = torch.cat([p.detach().reshape(-1) for p in self.params])
            total = copy.clone()
            work = dist.all_reduce(total, group=group, async_op=True)
            assert work is not None
            self._averaging = _Averaging(copy, total, work, done + self.delay)

    def _take_in(self, averaging: _Averaging, world: int) -> None:
        """parameters += the replicas' mean - this replica's copy, once the sum has come."""
        averaging.work.wait()
        change = averaging.total.div_(world).sub_(averaging.copy)
        sizes = [p.numel() for p in self.params]
        for param, part in zip(self.params, change.split(sizes), strict=True):
            param.add_(part.view_as(param))
