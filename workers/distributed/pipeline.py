"""Pipeline parallelism: a net cut into stages, one process each (GPipe, PipeDream's 1F1B,
interleaved 1F1B, zero bubble, ZB-V).

The planner (dsl/planner.py) lists each piece's layers and the stage that runs it: one piece
per stage, or with virtual stages several (round-robin, or ZB-V's V). Here each piece becomes a
module that takes the tensors crossing into it and returns those crossing out of it, run by
torch.distributed.pipelining (`PipelineStage` and a schedule: `ScheduleGPipe`, `Schedule1F1B`,
`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`): every
batch is cut into micro-batches, gradients accumulate over them and are divided by their
number, so a step equals the unpipelined step on the whole batch. The last piece's labelled
layers (losses, metrics) run in the schedule's loss function, where the micro-batch's labels
are.

What crosses a cut, and the module a stage runs, are in workers/distributed/stages.py.
Evaluation and checkpoints go over the same process group: a forward-only pass hands the
tensors on stage by stage, and the stages' parameters are gathered to the first stage so a
checkpoint holds the whole net under its usual names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.distributed.pipelining.stage import _PipelineStageBase

from contract.stream import TimelineRecord
from dsl.compiler import CompiledJob
from dsl.net import NeuralNet, module_key
from dsl.planner import PipelinePlan
from dsl.schema import JobSpec
from workers.algorithms import BatchResult
from workers.checkpoint import Checkpoint
from workers.data import eval_batches
from workers.distributed.allreduce import GradientSync, broadcast_replicas, replicated_tensors
from workers.distributed.comm import ProcessGroup
from workers.distributed.stages import (
    SavedActivations,
    StageFlow,
    StageModule,
    run_flow,
    run_head,
    stage_flows,
    stage_job,
)
from workers.precision import Precision, PrecisionError, precision_for
from workers.trainer import StepHooks, Trainer

MB = 1 << 20
# One stage per process (PipelineScheduleSingle) or several (PipelineScheduleMulti); the rules
# of each name are dsl/pipeline.py's ScheduleSpec.
SINGLE_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MULTI_SCHEDULES = {
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "zero_bubble": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
}


@dataclass
class PipelineGroups:
    """The process groups of a pipelined job: one per pipeline (its stages talk point to point)
    and, with replicas, one per stage (its peers in the other pipelines all-reduce)."""

    replicas: int
    stages: int
    replica: int
    stage: int
    pipeline: ProcessGroup
    peers: ProcessGroup = None
    # The rank of this pipeline's first stage in the process's world: each pipeline of an
    # asynchronous job is a world of its own, so that it restarts without the others.
    first_rank: int = 0

    @classmethod
    def create(cls, *, replicas: int, stages: int, rank: int) -> PipelineGroups:
        """Every process of the job calls it with its rank in the job's world, replica-major."""
        replica, stage = divmod(rank, stages)
        pipelines = [
            dist.new_group([r * stages + s for s in range(stages)]) for r in range(replicas)
        ]
        peers = None
        if replicas > 1:
            by_stage = [
                dist.new_group([r * stages + s for r in range(replicas)]) for s in range(stages)
            ]
            peers = by_stage[stage]
        return cls(replicas, stages, replica, stage, pipelines[replica], peers, replica * stages)

    @classmethod
    def alone(cls, *, replicas: int, stages: int, replica: int, stage: int) -> PipelineGroups:
        """Pipeline `replica` of `replicas` as a world of its own, its stages ranked in order
        (replicas that exchange their updates through parameter-server shards)."""
        return cls(replicas, stages, replica, stage, dist.new_group(list(range(stages))))

    def rank_of(self, stage: int) -> int:
        """The rank of `stage` of this process's pipeline in the process's world."""
        return self.first_rank + stage

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1


@dataclass
class Timeline:
    """When this stage ran each micro-batch's forward and backward (or, split, its input- and
    weight-gradient passes) on each of its pieces, for the latest step."""

    events: list[tuple[str, int, float, float, int]] = field(default_factory=list)
    started: float = 0.0
    busy: float = 0.0  # seconds of compute in the latest step

    def start(self) -> None:
        self.events.clear()
        self.busy = 0.0
        self.started = time.perf_counter()

    def record(self, kind: str, microbatch: int, began: float, piece: int) -> None:
        now = time.perf_counter()
        self.busy += now - began
        self.events.append((kind, microbatch, began - self.started, now - self.started, piece))


class TimedStage(PipelineStage):
    """A PipelineStage that notes when it computes, for the busy fraction and the timeline:
    F forward, B backward (input gradients only when the schedule splits it), W weight
    gradients."""

    def __init__(self, *args: object, timeline: Timeline, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.timeline = timeline

    def forward_one_chunk(self, fwd_chunk_id: int, *args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)  # type: ignore[arg-type]
        self.timeline.record("F", fwd_chunk_id, began, self.stage_index)
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, *args: object, **kwargs: object) -> None:
        began = time.perf_counter()
        super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)  # type: ignore[arg-type]
        self.timeline.record("B", bwd_chunk_id, began, self.stage_index)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, *args: object, **kwargs: object) -> None:
        began = time.perf_counter()
        super().backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs)
        self.timeline.record("W", bwd_chunk_id, began, self.stage_index)


class PipelineRunner:
    """Runs one stage's part of each training step and evaluation for its trainer: the pieces
    of the net the plan gives it, under the job's schedule."""

    def __init__(
        self,
        job: CompiledJob,
        plan: PipelinePlan,
        groups: PipelineGroups,
        device: torch.device,
        precision: Precision,
    ) -> None:
        config = job.spec.pipeline
        assert config is not None
        if precision.scaler is not None:
            # The schedule runs each micro-batch's backward itself, from the unscaled loss.
            raise PrecisionError(
                "precision fp16 with a pipeline is not built yet: its loss scale would have to "
                "be shared by the stages; use bf16"
            )
        self.precision = precision
        self.spec: JobSpec = job.spec
        self.groups = groups
        self.plan = plan
        self.pieces = plan.pieces_of(groups.stage)
        self.last_piece = len(plan.stages) - 1
        self.train_flows = stage_flows(job.net, plan, "train")
        self.test_flows = stage_flows(job.net, plan, "test")
        self.train_flow = self.train_flows[self.last_piece]  # its head: the loss function's
        self.saved = SavedActivations()  # all this stage's pieces together
        self.timeline = Timeline()
        named = dict(job.net.named_layers())
        stages: list[_PipelineStageBase] = []
        for piece in self.pieces:
            layers = nn.ModuleDict(
                {module_key(n): named[n] for n in plan.stages[piece].layers if n in named}
            )
            module = StageModule(
                layers,
                self.train_flows[piece],
                rematerialize=config.rematerialize,
                autocast=precision.autocast,
                saved=self.saved,
            )
            stages.append(
                TimedStage(
                    module,
                    piece,
                    len(plan.stages),
                    device,
                    group=groups.pipeline,
                    timeline=self.timeline,
                )
            )
        if config.schedule in MULTI_SCHEDULES:
            self.schedule: _PipelineSchedule = MULTI_SCHEDULES[config.schedule](
                stages, n_microbatches=config.microbatches, loss_fn=self._loss
            )
        else:
            (stage,) = stages
            self.schedule = SINGLE_SCHEDULES[config.schedule](
                stage, n_microbatches=config.microbatches, loss_fn=self._loss
            )
        self.metric_names: list[object] | None = None
        self._metrics: list[dict[str, torch.Tensor]] = []

    @property
    def holds_first(self) -> bool:
        return 0 in self.pieces

    @property
    def holds_last(self) -> bool:
        return self.last_piece in self.pieces

    def rank_of_piece(self, piece: int) -> int:
        """The global rank of the process of this pipeline that runs `piece`."""
        return self.groups.rank_of(self.plan.stages[piece].rank)

    def _loss(self, sent: torch.Tensor | tuple[torch.Tensor, ...], y: torch.Tensor) -> torch.Tensor:
        outputs = sent if isinstance(sent, tuple) else (sent,)
        with self.precision.autocast():
            loss, metrics = run_head(self.train_flow, outputs, y, with_metrics=True)
        assert loss is not None  # the compiler guarantees a loss layer for bp
        self._metrics.append(metrics)
        return loss

    def train_one_batch(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        """The trainer's algorithm for a stage: this stage's part of the schedule, then the
        last piece's loss and metrics shared with every stage (each reports and checks them)."""
        self.timeline.start()
        self.saved.reset()
        losses: list[torch.Tensor] = []
        args = (x,) if self.holds_first else ()
        if self.holds_last:
            self.schedule.step(*args, target=y, losses=losses)
        else:
            self.schedule.step(*args)
        busy = self.timeline.busy / max(time.perf_counter() - self.timeline.started, 1e-9)
        values = self._share_values(losses)
        metrics = {k: v for k, v in values.items() if k != "loss"}
        # This stage's own share of the step spent computing; the rest is its bubble (and the
        # communication the compute did not hide).
        metrics["pipeline/busy"] = torch.tensor(busy)
        metrics["pipeline/bubble"] = torch.tensor(1.0 - busy)
        # The most activation memory the stage held for backward passes during the step.
        metrics["pipeline/activation_mb"] = torch.tensor(self.saved.peak / MB)
        return BatchResult(values["loss"], metrics)

    def _share_values(self, losses: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        groups = self.groups
        last = self.rank_of_piece(self.last_piece)
        mean: dict[str, torch.Tensor] = {}
        if self.holds_last:
            # The schedule also calls the loss function once on placeholders, to learn the
            # shapes of the gradients: only the step's own micro-batches count.
            count = len(losses)
            self._metrics = self._metrics[-count:]
            mean["loss"] = torch.stack([loss.detach() for loss in losses]).mean()
            for name in self._metrics[0]:
                mean[name] = torch.stack([m[name] for m in self._metrics]).sum() / count
            self._metrics.clear()
        if self.metric_names is None:
            names: list[object] = [list(mean)]
            dist.broadcast_object_list(names, src=last, group=groups.pipeline)
            self.metric_names = list(names[0])  # type: ignore[call-overload]
        flat = torch.zeros(len(self.metric_names))
        if self.holds_last:
            flat = torch.stack([mean[str(name)].float().cpu() for name in self.metric_names])
        dist.broadcast(flat, src=last, group=groups.pipeline)
        return {str(name): value for name, value in zip(self.metric_names, flat, strict=True)}

    @torch.no_grad()
    def evaluate(self, trainer: Trainer, split: str) -> dict[str, float]:
        """A split ("val" or "test") through the pieces in pipeline order, forward only; the
        last piece's figures, shared."""
        x_split, y_split, limit = trainer.eval_split(split)
        trainer.net.eval()
        sums: dict[str, float] = {}
        seen = 0
        for x, y in eval_batches(x_split, y_split, self.spec.data.batch_size, limit):
            figures = self._evaluate_batch(x, y)
            for key, value in figures.items():
                sums[key] = sums.get(key, 0.0) + value * len(x)
            seen += len(x)
        trainer.net.train()
        result: list[object] = [{f"{split}/{k}": v / max(seen, 1) for k, v in sums.items()}]
        dist.broadcast_object_list(
            result, src=self.rank_of_piece(self.last_piece), group=self.groups.pipeline
        )
        return dict(result[0])  # type: ignore[call-overload]

    def _evaluate_batch(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
        """This stage's pieces' part of one batch's forward pass; the figures on the stage of
        the last piece (none elsewhere). A piece hands on to the next piece's stage, or keeps
        what it sends when that piece is its own (ZB-V's turn of the V)."""
        me = self.groups.rank_of(self.groups.stage)
        sent: list[torch.Tensor] = []
        for piece in self.pieces:
            flow: StageFlow = self.test_flows[piece]
            if piece == 0:
                inputs = [x]
            elif self.rank_of_piece(piece - 1) == me:
                inputs = sent
            else:
                inputs = self._receive(len(flow.receives), self.rank_of_piece(piece - 1))
            with self.precision.autocast():
                values = run_flow(flow, inputs)
            sent = [values[key] for key in flow.sends]
            if piece == self.last_piece:
                with self.precision.autocast():
                    loss, metrics = run_head(flow, sent, y, with_metrics=True)
                figures = {k: float(v) for k, v in metrics.items()}
                if loss is not None:
                    figures["loss"] = float(loss)
                return figures
            if self.rank_of_piece(piece + 1) != me:
                self._send(sent, self.rank_of_piece(piece + 1))
        return {}

    def _send(self, tensors: Sequence[torch.Tensor], to: int) -> None:
        """Shapes and dtypes first (the last test batch may be smaller), then the tensors."""
        meta: list[object] = [[(tuple(t.shape), t.dtype) for t in tensors]]
        dist.send_object_list(meta, dst=to, group=self.groups.pipeline)
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=to, group=self.groups.pipeline)

    def _receive(self, count: int, source: int) -> list[torch.Tensor]:
        meta: list[object] = [None]
        dist.recv_object_list(meta, src=source, group=self.groups.pipeline)
        shapes: list[tuple[tuple[int, ...], torch.dtype]] = meta[0]  # type: ignore[assignment]
        assert len(shapes) == count
        tensors = []
        for shape, dtype in shapes:
            tensor = torch.empty(shape, dtype=dtype)
            dist.recv(tensor, src=source, group=self.groups.pipeline)
            tensors.append(tensor)
        return tensors


class PipelineCheckpoints:
    """Checkpoints of a pipelined job hold the whole net under its usual names.

    After the update of a step the trainer will save at, every stage of the first pipeline sends
    its parameters, buffers and updater state to its first stage, whose trainer writes them as
    one checkpoint; loading takes each stage's own entries from a whole-net checkpoint.
    """

    def __init__(self, net: NeuralNet, groups: PipelineGroups, due: Callable[[int], bool]):
        self.net, self.groups, self.due = net, groups, due
        self.step = -1
        self.merged: tuple[dict[str, torch.Tensor], ...] = ({}, {}, {})

    def after_update(self, trainer: Trainer, step: int) -> None:
        due = self.due(step + 1) or trainer.checkpointing.restart_clock.due(step + 1)
        if self.groups.replica != 0 or not due:
            return
        net = self.net
        mine = (
            {name: p.detach().cpu() for name, p in net.named_params().items()},
            {
                f"{name}/{local}": b.detach().cpu()
                for name, module in net.named_layers()
                for local, b in module.named_buffers()
            },
            trainer.updater.state_tensors(),
        )
        parts: list[object] | None = [None] * self.groups.stages if self.groups.is_first else None
        dist.gather_object(mine, parts, dst=self.groups.rank_of(0), group=self.groups.pipeline)
        if parts is not None:
            merged: tuple[dict[str, torch.Tensor], ...] = ({}, {}, {})
            for part in parts:
                for whole, piece in zip(merged, part, strict=True):  # type: ignore[call-overload]
                    whole.update(piece)
            self.merged = merged
        self.step = step + 1

    def to_whole(self, ckpt: Checkpoint) -> Checkpoint:
        if ckpt.step != self.step:
            raise RuntimeError(
                f"checkpoint of step {ckpt.step} requested, but the stages gathered their "
                f"parameters at step {self.step}"
            )
        params, buffers, updater = self.merged
        return replace(ckpt, params=params, buffers=buffers, updater=updater)

    def to_stage(self, ckpt: Checkpoint) -> Checkpoint:
        names = set(self.net.named_params())
        updater = {k: v for k, v in ckpt.updater.items() if k.rpartition("/")[0] in names}
        return replace(ckpt, updater=updater)


def clip_across_stages(
    params: Sequence[torch.Tensor], max_norm: float, group: ProcessGroup
) -> None:
    """Clip by the norm of the whole net's gradient, of which each stage holds a part; the
    updater's own clipping then sees a part already within the limit and leaves it."""
    grads = [p.grad for p in params if p.grad is not None]
    squares = torch.zeros(())
    for grad in grads:
        squares += grad.detach().float().pow(2).sum().cpu()
    dist.all_reduce(squares, group=group)
    scale = max_norm / (float(squares.sqrt()) + 1e-6)
    if scale < 1.0:
        torch._foreach_mul_(grads, scale)


def cut_stage(job: CompiledJob, *, plan: PipelinePlan, stage: int, device: str) -> CompiledJob:
    """The job cut to stage `stage`'s layers, on the worker's device (moved in place, before
    anything holds its tensors)."""
    cut = stage_job(job, plan, stage)
    cut.net.to(torch.device(device))
    return cut


def pipeline_stage(
    job: CompiledJob,
    *,
    plan: PipelinePlan,
    groups: PipelineGroups,
    device: str,
    compression: str,
    due: Callable[[int], bool],
    stage: CompiledJob | None = None,
    hooks: StepHooks | None = None,
) -> tuple[CompiledJob, StepHooks]:
    """One stage of the job's pipeline: the job cut to the stage's layers, on the worker's
    device (`stage`, when the caller cut it already), and the hooks its trainer takes: run the
    stage's part of the schedule as its algorithm, evaluate through all the stages, average the
    gradients with the same stage of the other replicas, clip over the whole pipeline, and save
    whole-net checkpoints. `hooks`, the hooks built so far, give the update itself (default: the
    stage's own updater; the parameter-server client's push and pull) and what runs at the
    start."""
    where = torch.device(device)
    stage = stage or cut_stage(job, plan=plan, stage=groups.stage, device=device)
    hooks = hooks or StepHooks()
    update = hooks.apply_update
    runner = PipelineRunner(job, plan, groups, where, precision_for(job.spec.precision, where))
    every = job.spec.disp_freq

    def train_one_batch(trainer: Trainer, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        result = runner.train_one_batch(x, y)
        if (trainer.step + 1) % every == 0:
            record = TimelineRecord(
                trainer.step + 1,
                tuple(runner.timeline.events),
                group=groups.replica,
                rank=groups.stage,
            )
            for sink in trainer.reporting.sinks:
                sink.emit(record)
        return result

    params = list(stage.net.named_params().items())
    sync: GradientSync | None = None
    if groups.peers is not None:
        broadcast_replicas(replicated_tensors(stage.net), groups.peers)
        # Gradients accumulate over the micro-batches' backwards: all-reduce once, after them.
        sync = GradientSync(params, group=groups.peers, compression=compression)
    clip = job.spec.updater.clip
    max_norm = clip.grad_norm if clip is not None else None
    checkpoints = PipelineCheckpoints(stage.net, groups, due)

    def apply_update(trainer: Trainer, step: int) -> None:
        if sync is not None:
            sync.finish()
        if max_norm is not None:
            clip_across_stages([p for _, p in params], max_norm, groups.pipeline)
        update(trainer, step)
        checkpoints.after_update(trainer, step)

    hooks = replace(
        hooks,
        train_one_batch=train_one_batch,
        apply_update=apply_update,
        evaluate=runner.evaluate,
        checkpoint_out=checkpoints.to_whole,
        checkpoint_in=checkpoints.to_stage,
    )
    return stage, hooks
