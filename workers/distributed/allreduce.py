"""The allreduce framework: synchronous data-parallel training inside one worker group.

Every worker holds a whole replica (rank 0's values broadcast when the group forms), trains on
its rows of each global batch, and the gradients are averaged over the group before every
worker applies the job's updater itself, so the replicas stay equal and the run equals the
local trainer on the combined batch. There are no server processes: the "servers" are
co-located with the workers.

Two ways to average, by the kind of step:

- `DDPSync`: torch's DistributedDataParallel around the net, for the `bp` algorithm (one
  forward and one backward pass per step). The forward goes through DDP (bp's `forward`),
  which readies its buckets; its reducer all-reduces each bucket as soon as its gradients
  exist, overlapping the rest of the backward pass (PowerSGD takes one bucket: see
  `bucket_cap_mb`). `cluster.compression` picks DDP's communication hook
  (`compression_hook`): none (DDP's own all-reduce), fp16 / bf16 (`fp16_compress_hook`,
  `bf16_compress_hook`: half the bytes; `bf16_hook` says why the latter is called under
  another name) or powersgd (`powerSGD_hook`, of rank `cluster.powersgd_rank`). Framework
  localsgd gives it `post_localSGD_hook` (workers/distributed/localsgd.py).
- `GradientSync`: an all-reduce of whole gradients in flat buckets once the step's gradients
  are complete, kept for what cannot sit on DDP cleanly:
  - bptt back-propagates once per chunk of a sequence, and DDP's reducer reduces at the end of
    every backward pass its forward readied: the algorithm would have to run its chunks but
    the last under DDP's `no_sync`, that is, know about DDP;
  - cd writes its gradients without a backward pass, so DDP's autograd hooks never fire;
  - a pipeline stage runs one backward pass per micro-batch inside torch's pipelining
    schedules (split into input and weight passes by the zero-bubble ones), and its replicas
    reduce once per step after the schedule (workers/distributed/pipeline.py).
  It sends its buckets in fp16 / bf16 where compression asks; PowerSGD and local SGD need DDP,
  and jobs that would need them here are refused when validated (dsl/sync_checks.py).

Both leave the slices of a net split by feature (partition.py) out of the exchange (DDP is told
to ignore them) and divide their gradients by the group size; with the updater's
clip.grad_norm such a net is clipped by the whole model's norm, of which a worker holds part.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from dsl.compiler import CompiledJob
from dsl.net import NeuralNet
from workers.algorithms import BatchResult, bp
from workers.distributed.comm import ProcessGroup
from workers.distributed.partition import sharded_params

if TYPE_CHECKING:
    from workers.trainer import Trainer

WIRE_DTYPES: dict[str, torch.dtype | None] = {
    "none": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
MB = 1 << 20
BUCKET_MB = 25  # GradientSync's buckets, DDP's default size
# PowerSGD compresses from this step on: the least torch allows with error feedback, whose
# first steps let DDP settle its buckets; earlier steps all-reduce whole gradients.
POWERSGD_START = 2

# A DDP communication hook and its state, as DistributedDataParallel.register_comm_hook takes them.
CommHook = tuple[Any, Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]]


def bf16_hook(group, bucket):
    """DDP's `bf16_compress_hook` under another name: DDP refuses to register a hook of that
    name unless NCCL (or XCCL) is there, though gloo all-reduces bf16 as well.

    Unannotated: DDP compares a hook's annotations with the classes (dist.GradBucket), and
    this module's annotations are strings."""
    return default_hooks.bf16_compress_hook(group, bucket)


def compression_hook(
    compression: str, *, group: ProcessGroup, powersgd_rank: int
) -> CommHook | None:
    """DDP's hook for `cluster.compression`; None: DDP's built-in all-reduce."""
    if compression == "none":
        return None
    if compression == "fp16":
        return group, default_hooks.fp16_compress_hook
    if compression == "bf16":
        return group, bf16_hook
    if compression == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=POWERSGD_START,
        )
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(
        f"unknown gradient compression '{compression}'; known: none, fp16, bf16, powersgd"
    )


def bucket_cap_mb(compression: str, params: Iterable[torch.Tensor]) -> float | None:
    """DDP's bucket size for `compression`; None: DDP's default (1 MB first, then 25 MB).

    PowerSGD gets one bucket for all of `params`: its hook launches its second and third
    all-reduce from callbacks of the first, and with several buckets in flight those callbacks
    may run in another order on each worker; gloo pairs collectives by the order they were
    launched, and aborts on the mismatch."""
    if compression != "powersgd":
        return None
    return sum(p.numel() * p.element_size() for p in params) / MB + 1.0


class _GroupGradients:
    """What both ways of averaging share: which parameters are exchanged, and the feature
    slices' part once the exchange is done."""

    def __init__(
        self,
        params: Sequence[tuple[str, torch.Tensor]],
        *,
        group: ProcessGroup,
        sharded: Iterable[str],
        clip_norm: float | None,
    ) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        skip = set(sharded)
        self.sliced = [tensor for name, tensor in params if name in skip]
        self.replicated = [tensor for name, tensor in params if name not in skip]
        self.clip_norm = clip_norm if self.sliced else None

    def _finish_slices(self, scaler: torch.amp.GradScaler | None) -> None:
        for param in self.sliced:
            if param.grad is not None:
                param.grad.div_(self.world)
        if self.clip_norm is not None:
            scale = scaler.get_scale() if scaler is not None else 1.0
            self._clip_whole_norm(self.clip_norm * scale)

    def _clip_whole_norm(self, max_norm: float) -> None:
        """Clip by the norm of the whole model's gradient, of which this worker holds a part.

        The updater's own clipping sees only this worker's part, whose norm is then below the
        limit, so it leaves the gradients alone.
        """
        replicated = [p.grad for p in self.replicated if p.grad is not None]
        sliced = [p.grad for p in self.sliced if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float32, device=self.sliced[0].device)
        for grad in sliced:
            squares += grad.float().pow(2).sum()
        dist.all_reduce(squares, group=self.group)
        for grad in replicated:
            squares += grad.float().pow(2).sum()
        # clip_grad_norm_'s formula, so a whole net clipped locally gets the same factor
        factor = (max_norm / (squares.sqrt() + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(replicated + sliced, factor)


# torch 2.13's DDP argument; see _ddp_syncing_buffers_once.
DDP_SYNCS_BUFFERS_AT_INIT = (
    "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
)


def _ddp_syncing_buffers_once(
    net: NeuralNet, group: Any, bucket_mb: float | None
) -> DistributedDataParallel:
    """DDP that gives every worker rank 0's buffers when it is made and none after. torch 2.13
    names this `forward_sync_buffers=False`; before it (the GPU image's 2.11, the oldest that
    pyproject allows) there is only `broadcast_buffers=False`, which skips the first sync too,
    so the buffers are broadcast here once."""
    if DDP_SYNCS_BUFFERS_AT_INIT:
        return DistributedDataParallel(
            net, process_group=group, bucket_cap_mb=bucket_mb, forward_sync_buffers=False
        )
    ddp = DistributedDataParallel(
        net, process_group=group, bucket_cap_mb=bucket_mb, broadcast_buffers=False
    )
    with torch.no_grad():
        for buffer in net.buffers():
            dist.broadcast(
                buffer, src=0 if group is None else dist.get_global_rank(group, 0), group=group
            )
    return ddp


class DDPSync(_GroupGradients):
    """The gradients of the `bp` algorithm averaged by DistributedDataParallel around `net`,
    through `hook` (None: DDP's own all-reduce)."""

    def __init__(
        self,
        net: NeuralNet,
        *,
        group: ProcessGroup = None,
        hook: CommHook | None = None,
        bucket_mb: float | None = None,
        clip_norm: float | None = None,
    ) -> None:
        named = list(net.named_params().items())
        super().__init__(named, group=group, sharded=sharded_params(net), clip_norm=clip_norm)
        # DDP expects a gradient for every parameter it reduces: a layer the loss does not
        # depend on (include: [test], a branch to a metric only) has none, and a slice is this
        # worker's own.
        trained = _reaching_a_loss(net)
        sliced = {id(p) for p in self.sliced}
        ignored = [
            name
            for name, param in net.named_parameters()
            if id(param) in sliced or id(param) not in trained
        ]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ignored)
        # Buffers (batch norm's running statistics) are rank 0's at the start and each
        # worker's own after, as before DDP; rank 0 writes the checkpoints.
        self.ddp = _ddp_syncing_buffers_once(net, group, bucket_mb)
        if hook is not None:
            self.ddp.register_comm_hook(*hook)

    def train_one_batch(self, trainer: Trainer, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        """The bp algorithm with its forward through DDP, which readies the reducer."""
        return bp(
            trainer.net,
            x,
            y,
            trainer.spec,
            trainer.generator,
            trainer.precision,
            forward=self.ddp,
        )

    def finish(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """After the backward pass, which left the group's mean in every replicated `.grad`:
        the feature slices' part. `scaler`: fp16's loss scale, which the gradients carry."""
        self._finish_slices(scaler)


def _reaching_a_loss(net: NeuralNet) -> set[int]:
    """The ids of the parameters of the train phase's layers that its losses depend on."""
    steps = net.steps("train")  # in the order they run: every source before its reader
    needed = {step.name for step in steps if step.module.is_loss}
    for step in reversed(steps):
        if step.name in needed:
            needed.update(source.layer for source in step.sources)
    return {id(p) for step in steps if step.name in needed for p in step.module.parameters()}


class GradientSync(_GroupGradients):
    """Averages whole gradients over a process group in flat buckets, after the step's
    gradients are complete (the steps DDP cannot take, see the module's docstring).

    `sharded` names parameters each worker holds a different slice of (a net split by
    feature): they are not exchanged, only divided by the group size (see partition.py).
    """

    def __init__(
        self,
        params: Sequence[tuple[str, torch.Tensor]],
        *,
        group: ProcessGroup = None,
        sharded: Iterable[str] = (),
        compression: str = "none",
        clip_norm: float | None = None,
    ) -> None:
        if compression not in WIRE_DTYPES:
            raise ValueError(
                f"unknown gradient compression '{compression}' for an all-reduce after the "
                f"step; known: {', '.join(WIRE_DTYPES)}"
            )
        super().__init__(params, group=group, sharded=sharded, clip_norm=clip_norm)
        self.wire = WIRE_DTYPES[compression]
        self.buckets = _make_buckets(self.replicated, BUCKET_MB * MB)

    def finish(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """All-reduce every bucket, wait, and leave the group's mean in every `.grad`.

        `scaler`: fp16's loss scale, which the gradients carry until the update.
        """
        flats, works = [], []
        for bucket in self.buckets:
            flat = torch.cat(
                [
                    torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                    if p.grad is None  # unused this step on every worker alike
                    else p.grad.reshape(-1)
                    for p in bucket
                ]
            )
            if self.wire is not None:
                flat = flat.to(self.wire)
            # Averaging before the sum keeps half-precision sums of many workers in range.
            flat.div_(self.world)
            works.append(dist.all_reduce(flat, group=self.group, async_op=True))
            flats.append(flat)
        for bucket, flat, work in zip(self.buckets, flats, works, strict=True):
            work.wait()
            offset = 0
            for param in bucket:
                if param.grad is not None:
                    part = flat[offset : offset + param.numel()]
                    param.grad.copy_(part.view_as(param.grad))
                offset += param.numel()
        self._finish_slices(scaler)


def _make_buckets(params: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive parameters grouped until a bucket reaches `limit` bytes."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for param in params:
        if size >= limit:
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += param.numel() * param.element_size()
    return [bucket for bucket in buckets if bucket]


@torch.no_grad()
def broadcast_replicas(tensors: Sequence[torch.Tensor], group: ProcessGroup = None) -> None:
    """Overwrite `tensors` with rank 0's values on every worker of the group (one message)."""
    if not tensors:
        return
    source = dist.get_global_rank(group, 0) if group is not None else 0
    flat = torch.cat([t.detach().reshape(-1).to(tensors[0].dtype) for t in tensors])
    dist.broadcast(flat, source, group=group)
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()


def replicated_tensors(net: NeuralNet) -> list[torch.Tensor]:
    """What every worker of the group holds whole: all parameters but slices, and buffers."""
    sharded = sharded_params(net)
    params = [p for name, p in net.named_params().items() if name not in sharded]
    return params + [b for b in net.buffers() if b.is_floating_point()]


GroupSync = DDPSync | GradientSync


def gradient_sync(
    job: CompiledJob,
    process_group: ProcessGroup = None,
    *,
    compression: str | None = None,
) -> GroupSync:
    """Equal replicas (rank 0's values), and the sync that averages the job's gradients: on
    DDP where the step allows it (see the module's docstring). The net is on the worker's
    device already. `compression` defaults to the job's cluster.compression."""
    net, spec = job.net, job.spec
    clip = spec.updater.clip
    clip_norm = clip.grad_norm if clip is not None else None
    compression = compression or spec.cluster.compression
    sharded = sharded_params(net)
    # DDP refuses a net with nothing to reduce: one whose every parameter is a feature slice.
    whole = any(name not in sharded for name in net.named_params())
    if spec.train_one_batch.alg == "bp" and whole:
        hook = compression_hook(
            compression, group=process_group, powersgd_rank=spec.cluster.powersgd_rank
        )
        return DDPSync(
            net,
            group=process_group,
            hook=hook,
            bucket_mb=bucket_cap_mb(compression, net.parameters()),
            clip_norm=clip_norm,
        )
    broadcast_replicas(replicated_tensors(net), process_group)
    return GradientSync(
        list(net.named_params().items()),
        group=process_group,
        sharded=sharded,
        compression=compression,
        clip_norm=clip_norm,
    )
