"""Parallelism, applied by plain functions before the trainer, which is built without knowledge
of it and takes what they add to a step as one `StepHooks` (workers/trainer.py).

Every framework applies its pieces in this one order:

1. partition the net over the worker's group, by feature or by batch (`partition`), or cut it
   into pipeline stages, one per worker of the group (`pipeline_stage`, in
   workers/distributed/pipeline.py, which builds steps 2 to 4 its own way for a stage); then
   place it on the worker's device (`on_device`), since what follows holds its tensors;
2. synchronise the replicas: the parameter-server client takes the place of the local update
   (`sync_through_servers`), the all-reduce of the gradients inside a group (DDP's, in the
   backward pass, or after it) comes before the update (`sync_in_group`); a hybrid has both,
   so the group's mean is pushed once per group; localsgd averages the parameters after the
   update every sync_freq steps instead (`sync_apart`);
3. gradient compression: the exchanges of step 2 send gradients as `compression=` says (the
   job's cluster.compression: a wire type, or DDP's PowerSGD hook);
4. whole-model checkpoints for a net split by feature (`whole_checkpoints`), and one answer
   for every worker to whether the run stops early (`agreed_stops`);
5. build the trainer on that net with the hooks.

Steps 2 to 4 each take the hooks built so far and return them with their part added.
The framework is chosen in one place, `FRAMEWORKS` (framework -> how it is applied), its
names those of dsl/frameworks.py's descriptors; a pipelined job's stages run `_pipeline`,
which applies the framework to the pipeline's replicas. `train` and `serve` are what one
process of a job runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

import redis
import torch
import torch.distributed as dist

from dsl.compiler import CompiledJob
from dsl.frameworks import FRAMEWORK_SPECS
from dsl.net import NeuralNet
from dsl.planner import plan_pipeline
from dsl.registry import Registry
from dsl.schema import JobSpec
from dsl.topology import Topology, topology_problems
from workers.algorithms import ONE_BACKWARD_PASS, BatchResult
from workers.checkpoint import Checkpoint
from workers.context import Place, RunContext
from workers.data import Dataset
from workers.distributed.allreduce import (
    DDPSync,
    GroupSync,
    broadcast_replicas,
    gradient_sync,
    replicated_tensors,
)
from workers.distributed.comm import ProcessGroup
from workers.distributed.localsgd import LocalSGD
from workers.distributed.partition import PartitionedNet, partition_net, sharded_params
from workers.distributed.pipeline import PipelineGroups, cut_stage, pipeline_stage
from workers.distributed.ps.client import PSClient, net_params
from workers.distributed.ps.plan import Connections, PSKeys, PSPlan
from workers.distributed.ps.shard import ShardReport, run_shard
from workers.distributed.ps.slicing import SliceMap, plan_stage_slices
from workers.distributed.rendezvous import (
    GroupMember,
    join_group,
    leave_group,
    reachable_address,
    redis_store,
)
from workers.distributed.stages import stage_job
from workers.evaluation import selection_due
from workers.metrics import MetricSink
from workers.precision import precision_for
from workers.trainer import StepHooks, Summary, Trainer, TrainOptions


class TopologyError(ValueError):
    """A topology a worker cannot run as asked."""


# -- the pieces, in their order ----------------------------------------------------------------
def partition(
    job: CompiledJob, *, rank: int, world: int, group: ProcessGroup = None
) -> CompiledJob:
    """1. The job with worker `rank` of `world`'s part of the net (the whole net when the
    net is split by batch only)."""
    net = partition_net(
        job.net, net_dim=job.spec.neuralnet.partition_dim, rank=rank, world=world, group=group
    )
    return replace(job, net=net)


def on_device(job: CompiledJob, *, device: str) -> CompiledJob:
    """1. The job with its net moved to the worker's device (in place, as nn.Module.to does),
    before the gradient buckets or the server client hold its tensors."""
    job.net.to(torch.device(device))
    return job


def sync_through_servers(
    hooks: StepHooks,
    *,
    client: PSClient,
    job: CompiledJob,
    device: str,
    replicas: Sequence[torch.Tensor] = (),
) -> StepHooks:
    """2. Route the updates through the parameter-server shards, in place of the update that
    `hooks` apply (so it comes first of the pieces that change the update).

    The client connects (stores the initial parameters, pulls the shards' values) after the
    trainer restored its checkpoint and before its first step; each step then pushes the
    gradients and pulls the new parameters. A client made with `overlap` sends each step's
    gradients during its backward pass, as they are accumulated. With `replicas` (a hybrid's
    group, whose mean gradient is pushed) rank 0's values are broadcast after each pull, so the
    replicas of a group stay identical even when another group's update lands between two pulls.
    `ps/version` and `ps/staleness` are reported every disp_freq steps.
    """
    if precision_for(job.spec.precision, torch.device(device)).scaler is not None:
        raise TopologyError(
            "precision fp16 with parameter-server shards: the shards apply the updates and do "
            "not undo fp16's loss scale; use precision bf16, or one worker group of allreduce"
        )
    every = job.spec.disp_freq
    one_batch = hooks.train_one_batch

    def train_one_batch(trainer: Trainer, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        client.begin_step(trainer.step)
        return one_batch(trainer, x, y)

    def apply_update(trainer: Trainer, step: int) -> None:
        client.step(step)
        if (step + 1) % every == 0:
            values = {
                "ps/version": float(client.stats.version),
                "ps/staleness": float(client.stats.staleness),
            }
            trainer.reporting.emit(step + 1, values)
        if replicas:
            broadcast_replicas(replicas)

    def connect(trainer: Trainer) -> None:
        client.connect()

    def equal_replicas(trainer: Trainer) -> None:
        broadcast_replicas(replicas)

    starts = (connect, equal_replicas) if replicas else (connect,)
    return replace(
        hooks,
        train_one_batch=train_one_batch,
        apply_update=apply_update,
        at_start=(*hooks.at_start, *starts),
    )


def sync_in_group(hooks: StepHooks, *, sync: GroupSync) -> StepHooks:
    """2 and 3. Average the gradients over the group (`sync`, from `gradient_sync`, which
    compresses them on the wire) before the update that `hooks` apply; on DDP the forward
    pass goes through it, and the backward pass averages."""
    update = hooks.apply_update

    def apply_update(trainer: Trainer, step: int) -> None:
        sync.finish(trainer.updater.scaler)
        update(trainer, step)

    if isinstance(sync, DDPSync):
        hooks = replace(hooks, train_one_batch=sync.train_one_batch)
    return replace(hooks, apply_update=apply_update)


def sync_apart(hooks: StepHooks, *, local: LocalSGD) -> StepHooks:
    """2. localsgd: the gradients all-reduced for the warm-up steps only, then the update
    that `hooks` apply with each replica's own, and the replicas averaged every sync_freq
    steps after it."""
    hooks = sync_in_group(hooks, sync=local.sync)
    update = hooks.apply_update

    def apply_update(trainer: Trainer, step: int) -> None:
        update(trainer, step)
        local.after_update(trainer, step)

    return replace(hooks, apply_update=apply_update, at_start=(*hooks.at_start, local.at_start))


def checkpoint_due(spec: JobSpec, done: int) -> bool:
    """Whether the trainer may save a checkpoint once `done` steps are done: its own
    schedule, and where the objective is measured when a new best is kept (keep_best) or the
    run may stop early there (and saves its last checkpoint)."""
    selecting = spec.checkpoint.keep_best or spec.early_stop is not None
    return (
        done == spec.train_steps
        or bool(spec.checkpoint.freq and done % spec.checkpoint.freq == 0)
        or (selecting and selection_due(spec, done))
    )


class WholeCheckpoints:
    """Checkpoints of a net split by feature hold whole tensors, as a local run's do.

    Joining the slices is a collective, and only rank 0 writes checkpoints, so every worker
    joins them right after the update of a step the trainer will save at; rank 0's trainer
    then writes the joined tensors. Loading takes each worker's slices of the whole tensors.
    """

    def __init__(self, net: PartitionedNet) -> None:
        self.net = net
        self.step = -1
        self.params: dict[str, torch.Tensor] = {}
        self.updater: dict[str, torch.Tensor] = {}

    def after_update(self, trainer: Trainer, step: int) -> None:
        clock = trainer.checkpointing.restart_clock
        if checkpoint_due(trainer.spec, step + 1) or clock.due(step + 1):
            self.params = self.net.gather_full(dict(self.net.named_params()))
            self.updater = self.net.gather_full(trainer.updater.state_tensors())
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


def rank0_decides(*, device: str, group: ProcessGroup = None) -> Callable[[bool], bool]:
    """A collective that hands every worker of `group` (default: the whole world) rank 0's
    answer to a yes-or-no question."""
    source = 0 if group is None else dist.get_global_rank(group, 0)

    def decide(flag: bool) -> bool:
        tensor = torch.tensor([int(flag)], dtype=torch.int32, device=torch.device(device))
        dist.broadcast(tensor, src=source, group=group)
        return bool(tensor.item())

    return decide


def synced_restart_points(
    hooks: StepHooks, *, device: str, group: ProcessGroup = None
) -> StepHooks:
    """Restart points of a trainer whose checkpoint is a collective (its parts are joined
    first): rank 0 of `group` decides when, every disp_freq steps, and tells the others."""
    return replace(hooks, restart_sync=rank0_decides(device=device, group=group))


def agreed_stops(hooks: StepHooks, *, device: str, group: ProcessGroup = None) -> StepHooks:
    """Workers that take every step together stop early together: rank 0 of `group` decides,
    at each validation, whether the run stops there, and tells the others."""
    return replace(hooks, agree=rank0_decides(device=device, group=group))


def whole_checkpoints(hooks: StepHooks, *, net: NeuralNet, device: str) -> StepHooks:
    """4. Make a worker whose net is split by feature save and load whole-model checkpoints;
    the hooks of any other net as they are."""
    if not isinstance(net, PartitionedNet) or not net.shard_axes:
        return hooks
    whole = WholeCheckpoints(net)
    update = hooks.apply_update

    def apply_update(trainer: Trainer, step: int) -> None:
        update(trainer, step)
        whole.after_update(trainer, step)

    hooks = replace(
        hooks,
        apply_update=apply_update,
        checkpoint_out=whole.to_whole,
        checkpoint_in=whole.to_local,
    )
    return synced_restart_points(hooks, device=device, group=net.group)


def group_trainer(
    job: CompiledJob,
    dataset: Dataset,
    options: TrainOptions,
    *,
    sinks: Sequence[MetricSink] = (),
    group: ProcessGroup = None,
    compression: str | None = None,
) -> tuple[Trainer, GroupSync]:
    """The allreduce framework's trainer for worker `options.rank` of a group of
    `options.world` that has joined its process group (steps 1 to 5). `compression` defaults
    to the job's cluster.compression."""
    part = partition(job, rank=options.rank, world=options.world, group=group)
    part = on_device(part, device=options.device)
    sync = gradient_sync(part, group, compression=compression or job.spec.cluster.compression)
    hooks = sync_in_group(StepHooks(), sync=sync)
    hooks = whole_checkpoints(hooks, net=part.net, device=options.device)
    hooks = agreed_stops(hooks, device=options.device, group=group)
    return Trainer(part, dataset, options, sinks, hooks=hooks), sync


def group_pushers(topology: Topology) -> int | None:
    """Workers per group whose pushes make one update of a shard (the framework's
    descriptor); None leaves the parameter server's default (every worker of the group). Each
    stage of a pipeline has shards of its own, so one push completes each shard's update."""
    if topology.stages > 1:
        return 1
    return FRAMEWORK_SPECS.get(topology.framework).pushers_per_group


def check_topology(topology: Topology) -> None:
    """Refuse topologies whose server shards would be missing or idle (the rules job
    validation applies, dsl.topology.topology_problems, for a topology built otherwise)."""
    problems = topology_problems(topology)
    if problems:
        raise TopologyError(
            "; ".join(f"cluster.{key}: {message} ({hint})" for key, message, hint in problems)
        )


# -- the frameworks ------------------------------------------------------------------------------
@dataclass
class Worker:
    """A trainer with its framework applied, and what to do once it trained to the end."""

    trainer: Trainer
    after_run: list[Callable[[], None]] = field(default_factory=list)


Framework = Callable[[RunContext, ExitStack], Worker]
FRAMEWORKS: Registry[Framework] = Registry("framework")


def train(ctx: RunContext) -> Summary:
    """Train this worker's part of the job to the end, with the job's parallelism."""
    with ExitStack() as cleanup:
        # A pipelined job's stages run the pipeline, whose replicas the framework syncs.
        applied = _pipeline if ctx.topology.stages > 1 else FRAMEWORKS.get(ctx.topology.framework)
        worker = applied(ctx, cleanup)
        summary = worker.trainer.run()
        # A stopped worker leaves at once: its peers may be stopping at another step, and a
        # closing barrier or the shards' last exchange would wait for them.
        if summary.status not in ("cancelled", "drained"):
            for finish in worker.after_run:
                finish()
        # The trainer's DDP wrapper and hooks hold the process group: let go of here, so that
        # `cleanup` (leave_group) frees them and joins their gloo threads with the group. A
        # process that exits with a group's threads alive dies with SIGABRT ("terminate called
        # without an active exception").
        del worker
        return summary


@FRAMEWORKS.register("local")
def _local(ctx: RunContext, cleanup: ExitStack) -> Worker:
    return Worker(Trainer(ctx.job, ctx.dataset, ctx.train_options(), ctx.sinks))


@FRAMEWORKS.register("sandblaster", "downpour", "hogwild")
def _parameter_server(ctx: RunContext, cleanup: ExitStack) -> Worker:
    """Each worker takes part `worker_id` of `nworkers` of every global batch, pushes its
    gradients to the shards of its server group and pulls the parameters back each step."""
    if not ctx.topology.server_worker_separate:
        raise TopologyError(
            f"cluster.framework '{ctx.topology.framework}' without separate server shards is "
            "not run by the parameter server (server_worker_separate: false)"
        )
    plan = PSPlan.from_topology(ctx.topology)
    options = ctx.train_options(rank=plan.worker_id(ctx.group, ctx.rank), world=plan.nworkers)
    job = on_device(ctx.job, device=ctx.device)
    # Gradients leave during the backward pass where each is accumulated once per step.
    overlap = ctx.spec.train_one_batch.alg in ONE_BACKWARD_PASS
    client = _ps_client(ctx, job.net, plan, cleanup, overlap=overlap)
    hooks = sync_through_servers(StepHooks(), client=client, job=job, device=ctx.device)
    trainer = Trainer(job, ctx.dataset, options, ctx.sinks, hooks=hooks)
    return Worker(trainer, after_run=[client.finish])


@FRAMEWORKS.register("allreduce")
def _allreduce(ctx: RunContext, cleanup: ExitStack) -> Worker:
    """One group averages its gradients by all-reduce; several groups (a hybrid) also exchange
    their updates through server shards, asynchronously between groups as in downpour."""
    check_topology(ctx.topology)
    member = join_worker_group(ctx, cleanup)
    # Rank 0 serves the group's store: nobody leaves before the others.
    done: list[Callable[[], None]] = [dist.barrier]
    if ctx.topology.nworker_groups == 1:
        trainer, _ = group_trainer(
            ctx.job,
            ctx.dataset,
            ctx.train_options(world=member.world),
            sinks=ctx.sinks,
            compression=ctx.spec.cluster.compression,
        )
        return Worker(trainer, after_run=done)
    plan = PSPlan.from_topology(ctx.topology, pushers_per_group=group_pushers(ctx.topology))
    # Every worker of the job reads its own rows of each global batch, as in the other
    # parameter-server frameworks; the rows of a group are consecutive.
    options = ctx.train_options(rank=plan.worker_id(ctx.group, ctx.rank), world=plan.nworkers)
    part = partition(ctx.job, rank=member.rank, world=member.world)
    if sharded_params(part.net):
        raise TopologyError(
            "splitting layers by feature (partition_dim 1) inside worker groups that exchange "
            "updates through server shards is not supported: the shards hold whole parameters; "
            "use one worker group (nworker_groups: 1) or partition_dim 0 / -1"
        )
    part = on_device(part, device=ctx.device)
    sync = gradient_sync(part, compression=ctx.spec.cluster.compression)
    client = _ps_client(ctx, part.net, plan, cleanup)
    hooks = sync_through_servers(
        StepHooks(),
        client=client,
        job=part,
        device=ctx.device,
        replicas=replicated_tensors(part.net),
    )
    hooks = sync_in_group(hooks, sync=sync)  # so the group's mean is what is pushed
    trainer = Trainer(part, ctx.dataset, options, ctx.sinks, hooks=hooks)
    return Worker(trainer, after_run=[client.finish, *done])


@FRAMEWORKS.register("localsgd")
def _localsgd(ctx: RunContext, cleanup: ExitStack) -> Worker:
    """One group whose replicas take their steps apart and average every sync_freq steps
    (workers/distributed/localsgd.py)."""
    check_topology(ctx.topology)
    member = join_worker_group(ctx, cleanup)
    options = ctx.train_options(world=member.world)
    job = on_device(ctx.job, device=ctx.device)
    cluster = ctx.spec.cluster
    local = LocalSGD(
        job.net,
        period=cluster.sync_freq,
        warmup=cluster.localsgd_warmup,
        delay=cluster.localsgd_delay,
    )
    hooks = sync_apart(StepHooks(), local=local)
    hooks = agreed_stops(hooks, device=ctx.device)
    trainer = Trainer(job, ctx.dataset, options, ctx.sinks, hooks=hooks)
    # Rank 0 serves the group's store: nobody leaves before the others.
    return Worker(trainer, after_run=[dist.barrier])


def _pipeline(ctx: RunContext, cleanup: ExitStack) -> Worker:
    """Each worker group is one pipeline and its workers the stages; the stages of all the
    groups form one process group, from which each pipeline and each stage's replicas get
    their own. Replicas average each stage's gradients by all-reduce, or exchange them
    through server shards (`_pipeline_through_servers`)."""
    t = ctx.topology
    if FRAMEWORK_SPECS.get(t.framework).needs_servers:
        return _pipeline_through_servers(ctx, cleanup)
    member = join_worker_group(
        ctx, cleanup, member=GroupMember(ctx.group * t.stages + ctx.rank, t.workers)
    )
    groups = PipelineGroups.create(replicas=t.nworker_groups, stages=t.stages, rank=member.rank)
    options = replace(
        ctx.train_options(rank=groups.replica, world=groups.replicas), writes=member.rank == 0
    )
    stage, hooks = pipeline_stage(
        ctx.job,
        plan=plan_pipeline(ctx.job),
        groups=groups,
        device=ctx.device,
        compression=ctx.spec.cluster.compression,
        due=lambda done: checkpoint_due(ctx.spec, done),
    )
    # The whole job's world: its stages save together, and stop together.
    hooks = synced_restart_points(hooks, device=ctx.device)
    hooks = agreed_stops(hooks, device=ctx.device)
    trainer = Trainer(stage, ctx.dataset, options, ctx.sinks, hooks=hooks)
    return Worker(trainer, after_run=[dist.barrier])


def _pipeline_through_servers(ctx: RunContext, cleanup: ExitStack) -> Worker:
    """Asynchronous pipelines (downpour, hogwild; SSP with cluster.staleness): each pipeline
    is a torch.distributed world of its own whose stages run the schedule together, and each
    stage pushes its layers' gradients to the shards that hold them and pulls their
    parameters, apart from the other pipelines. A pipeline restarts alone, all its stages."""
    t = ctx.topology
    check_topology(t)
    join_worker_group(ctx, cleanup)  # rank: the stage; world: the pipeline's stages
    groups = PipelineGroups.alone(
        replicas=t.nworker_groups, stages=t.stages, replica=ctx.group, stage=ctx.rank
    )
    options = replace(
        ctx.train_options(rank=ctx.group, world=t.nworker_groups),
        writes=ctx.group == 0 and ctx.rank == 0,
    )
    plan = plan_pipeline(ctx.job)
    stage = cut_stage(ctx.job, plan=plan, stage=ctx.rank, device=ctx.device)
    # Every stage computes the same map of the whole net: each stage's layers on its shards.
    slice_map = plan_stage_slices(
        [net_params(stage_job(ctx.job, plan, s).net) for s in range(t.stages)],
        t.nservers_per_group,
    )
    # The stages clip by the whole pipeline's gradient norm before they push
    # (pipeline_stage), so the shards, each of which sees one stage's part, leave it as it is.
    client = _ps_client(
        ctx, stage.net, PSPlan.from_topology(t), cleanup, slice_map=slice_map, clip=False
    )
    hooks = sync_through_servers(StepHooks(), client=client, job=stage, device=ctx.device)
    stage, hooks = pipeline_stage(
        ctx.job,
        plan=plan,
        groups=groups,
        device=ctx.device,
        compression=ctx.spec.cluster.compression,
        due=lambda done: checkpoint_due(ctx.spec, done),
        stage=stage,
        hooks=hooks,
    )
    # The pipeline's world: its stages save together, and stop together.
    hooks = synced_restart_points(hooks, device=ctx.device)
    hooks = agreed_stops(hooks, device=ctx.device)
    trainer = Trainer(stage, ctx.dataset, options, ctx.sinks, hooks=hooks)
    return Worker(trainer, after_run=[client.finish, dist.barrier])


def join_worker_group(
    ctx: RunContext, cleanup: ExitStack, *, member: GroupMember | None = None
) -> GroupMember:
    """Join this worker's group as a torch.distributed process group (met through Redis);
    `cleanup` leaves it. Every worker of the group must call it; `member` joins another
    process group than the worker's group (a pipelined job's whole world)."""
    member = member or GroupMember(ctx.rank, ctx.topology.nworkers_per_group, ctx.group)
    rendezvous = redis.Redis.from_url(ctx.redis_url)
    cleanup.callback(rendezvous.close)
    # Each attempt meets under its own key, and each replacement of a group restarted alone
    # (an asynchronous pipeline): a worker placed again must never find the store of the
    # processes before, whose rank 0 may live on for a moment after it was stopped.
    scope = f"{ctx.scope}:attempt:{ctx.attempt}:replacement:{ctx.replacement}"
    cleanup.callback(leave_group, rendezvous, scope, member.group)
    address = reachable_address(ctx.redis_url)
    store = redis_store(rendezvous, scope, member, advertise=address)
    join_group(store, member, device=ctx.device, address=address)
    return member


def _ps_client(
    ctx: RunContext,
    net: NeuralNet,
    plan: PSPlan,
    cleanup: ExitStack,
    *,
    slice_map: SliceMap | None = None,
    clip: bool = True,
    overlap: bool = False,
) -> PSClient:
    """The worker's parameter-server client; `slice_map`: the job's, of which `net` holds a
    part; `clip`: whether the shards clip by the norm the worker sends; `overlap`: whether
    gradients leave in parts during the backward pass (one backward pass per step only)."""
    connections = Connections(ctx.redis_url, ctx.ps_urls)
    cleanup.callback(connections.close)
    clipping = ctx.spec.updater.clip if clip else None
    client = PSClient(
        net,
        plan=plan,
        connections=connections,
        keys=PSKeys(ctx.scope),
        group=ctx.group,
        rank=ctx.rank,
        compression=ctx.spec.cluster.compression,
        clip_norm=clipping.grad_norm if clipping is not None else None,
        staleness=ctx.spec.cluster.staleness,
        slice_map=slice_map,
        overlap=overlap,
    )
    cleanup.callback(client.close)
    return client


def serve(spec: JobSpec, place: Place) -> ShardReport:
    """Serve shard `place.rank` of server group `place.group` until the workers of that group
    finish (the parameter-server frameworks and allreduce hybrids)."""
    return run_shard(
        place.redis_url,
        place.scope,
        place.group,
        place.rank,
        spec,
        place.topology,
        ps_urls=place.ps_urls,
        pushers_per_group=group_pushers(place.topology),
        should_stop=place.should_stop,
    )
