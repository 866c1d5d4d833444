"""The allreduce framework as one placed worker process runs it: a single group, or several
groups joined by the parameter server (a hybrid topology).

One worker group (the `allreduce` preset): the workers meet through Redis (rendezvous.py),
average their gradients with all-reduce and each applies the updater itself; no server shards.

Several worker groups, e.g. 2 groups x 2 workers with one server group:

    group 0: w0 <-all-reduce-> w1        group 1: w2 <-all-reduce-> w3
              |  push (w0 only)                     |  push (w2 only)
              v                                     v
          +--------------- parameter-server shards ---------------+
          ^  pull (every worker of the group), then rank 0 broadcasts

Inside a group the workers are synchronous: the all-reduce gives each the group's mean
gradient, its rank 0 pushes that one gradient to the shards (`pushers_per_group` 1), every
worker waits for the group's update and pulls it, and rank 0's values are broadcast so the
replicas of a group stay identical even when another group's update lands between two pulls.
Between groups the shards apply each group's update as it comes: asynchronous, as in downpour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import redis
import torch.distributed as dist

from dsl.compiler import CompiledJob
from dsl.topology import Topology, topology_problems
from workers.data import Dataset
from workers.distributed.allreduce import broadcast_replicas, gradient_sync, replicated_tensors
from workers.distributed.group import group_trainer, partitioned_trainer
from workers.distributed.partition import sharded_params
from workers.distributed.ps.client import PSClient, attach_ps
from workers.distributed.ps.plan import Connections, PSKeys, PSPlan
from workers.distributed.rendezvous import (
    GroupMember,
    join_group,
    leave_group,
    reachable_address,
    redis_store,
)
from workers.metrics import MetricSink
from workers.trainer import Summary, TrainOptions


class HybridError(ValueError):
    """An allreduce topology that cannot run as asked."""


def group_pushers(topology: Topology) -> int | None:
    """Workers per group that push gradients to the shards: allreduce groups push once, as one
    replica; None leaves the parameter server's default (every worker pushes)."""
    return 1 if topology.framework == "allreduce" else None


def check_topology(topology: Topology) -> None:
    """Refuse allreduce topologies whose server shards would be missing or idle (the rules
    job validation applies, dsl.topology.topology_problems, for a topology built otherwise)."""
    problems = topology_problems(topology)
    if problems:
        raise HybridError(
            "; ".join(f"cluster.{key}: {message} ({hint})" for key, message, hint in problems)
        )


def run_allreduce_worker(
    job: CompiledJob,
    dataset: Dataset,
    *,
    topology: Topology,
    group: int,
    rank: int,
    redis_url: str,
    scope: str,
    run_dir: Path,
    ps_urls: Sequence[str] = (),
    sinks: Sequence[MetricSink] = (),
    should_stop: Callable[[], bool] = lambda: False,
    device: str = "cpu",
    base_dir: Path | None = None,
    resume: bool = False,
    rendezvous_timeout: float = 300.0,
) -> Summary:
    """Train worker `rank` of worker group `group` of an allreduce topology to the end."""
    check_topology(topology)
    member = GroupMember(rank, topology.nworkers_per_group, group)
    client = redis.Redis.from_url(redis_url)
    try:
        store = redis_store(
            client,
            scope,
            member,
            advertise=reachable_address(redis_url),
            timeout=rendezvous_timeout,
        )
        join_group(store, member, device=device)
        options = TrainOptions(
            run_dir=run_dir,
            device=device,
            resume=resume,
            rank=rank,
            world=member.world,
            group=group,
            base_dir=base_dir or Path.cwd(),
            should_stop=should_stop,
        )
        if topology.nworker_groups == 1:
            trainer, _ = group_trainer(job, dataset, options, sinks=sinks)
            summary = trainer.run()
        else:
            summary = _run_hybrid(
                job, dataset, options, member, topology, redis_url, scope, ps_urls, sinks
            )
        dist.barrier()  # rank 0 serves the group's store: nobody leaves before the others
        return summary
    finally:
        leave_group(client, scope, group)
        client.close()


def _run_hybrid(
    job: CompiledJob,
    dataset: Dataset,
    options: TrainOptions,
    member: GroupMember,
    topology: Topology,
    redis_url: str,
    scope: str,
    ps_urls: Sequence[str],
    sinks: Sequence[MetricSink],
) -> Summary:
    plan = PSPlan.from_topology(topology, pushers_per_group=group_pushers(topology))
    # Every worker of the job reads its own rows of each global batch, as in the other
    # parameter-server frameworks; the rows of a group are consecutive.
    options = replace(
        options,
        rank=plan.worker_id(member.group, member.rank),
        world=plan.nworkers,
        group_rank=member.rank,
    )
    trainer = partitioned_trainer(job, dataset, options, member=member, sinks=sinks)
    if sharded_params(trainer.net):
        raise HybridError(
            "splitting layers by feature (partition_dim 1) inside worker groups that exchange "
            "updates through server shards is not supported: the shards hold whole parameters; "
            "use one worker group (nworker_groups: 1) or partition_dim 0 / -1"
        )
    sync = gradient_sync(trainer)
    connections = Connections(redis_url, ps_urls)
    spec = job.spec
    clip = spec.updater.clip
    ps = PSClient(
        trainer.net,
        plan=plan,
        connections=connections,
        keys=PSKeys(scope),
        group=member.group,
        rank=member.rank,
        compression=spec.cluster.compression,
        clip_norm=clip.grad_norm if clip is not None else None,
        staleness=spec.cluster.staleness,
    )
    attach_ps(trainer, ps)  # start: pull the shards' parameters; each step: push (rank 0), pull
    exchange = trainer.apply_update
    replicas = replicated_tensors(trainer)

    def apply_update(step: int) -> None:
        sync.finish()  # the group's mean gradient, on every worker
        exchange(step)
        broadcast_replicas(replicas)

    trainer.apply_update = apply_update
    trainer.start_hooks.append(lambda: broadcast_replicas(replicas))
    try:
        summary = trainer.run()
        ps.finish()
        return summary
    finally:
        ps.close()
        connections.close()
