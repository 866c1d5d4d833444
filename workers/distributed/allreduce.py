"""The allreduce framework: synchronous data-parallel training inside one worker group.

Every worker holds a whole replica (the same initialisation from the job's seed, and rank 0's
values broadcast once to be sure), trains on its rows of each global batch, and after the
algorithm's backward the gradients are averaged over the group with torch.distributed
all-reduce (gloo between CPU processes, NCCL between GPUs). Every worker then applies the job's
updater itself, so the replicas stay equal and the run equals the local trainer on the combined
batch. There are no server processes: the "servers" are co-located with the workers.

Gradients travel in flat buckets of about `bucket_mb`, as DistributedDataParallel does: with
one backward per step (the bp algorithm) a bucket is sent as soon as all its gradients exist,
so communication overlaps the rest of the backward pass. Buckets are always launched in the
same order on every worker, which is what pairs the collectives up. With
`cluster.compression: fp16 | bf16` the buckets are sent in that type, halving the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dsl.compiler import CompiledJob
from dsl.net import NeuralNet
from workers.distributed.comm import ProcessGroup
from workers.distributed.partition import sharded_params

WIRE_DTYPES: dict[str, torch.dtype | None] = {
    "none": None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
MB = 1 << 20


@dataclass(eq=False)
class _Bucket:
    params: list[torch.Tensor]
    spans: list[tuple[int, int]]  # [start, stop) of each parameter in `flat`
    flat: torch.Tensor  # (sum of numels,) in the wire type
    waiting: int = 0  # parameters whose gradient has not arrived this step
    work: dist.Work | None = field(default=None, repr=False)


class GradientSync:
    """Averages gradients over a process group, in buckets, optionally overlapping backward.

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
        bucket_mb: float = 25.0,
        first_bucket_mb: float | None = None,
        overlap: bool = True,
        clip_norm: float | None = None,
    ) -> None:
        if compression not in WIRE_DTYPES:
            raise ValueError(
                f"unknown gradient compression '{compression}'; known: {', '.join(WIRE_DTYPES)}"
            )
        self.group = group
        self.world = dist.get_world_size(group)
        skip = set(sharded)
        self.sliced = [tensor for name, tensor in params if name in skip]
        self.replicated = [tensor for name, tensor in params if name not in skip]
        self.clip_norm = clip_norm if self.sliced else None
        # Backward produces the last layers' gradients first, so buckets run from the end; a
        # small first bucket starts the communication early, as DDP's does.
        first = min(1.0, bucket_mb) if first_bucket_mb is None else first_bucket_mb
        self.buckets = _make_buckets(
            list(reversed(self.replicated)),
            WIRE_DTYPES[compression],
            [int(first * MB), int(bucket_mb * MB)],
        )
        self.wire_bytes = 0  # bytes this worker has contributed to all-reduces so far
        self._next = 0
        self._ready = [False] * len(self.buckets)
        self._reset_counts()
        self.overlap = overlap
        if overlap:
            for index, bucket in enumerate(self.buckets):
                for param in bucket.params:
                    param.register_post_accumulate_grad_hook(self._hook(index))

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def arrived(_: torch.Tensor) -> None:
            bucket = self.buckets[index]
            if bucket.waiting == 0:
                raise RuntimeError(
                    "a gradient arrived twice in one step; overlapping the all-reduce with "
                    "backward needs exactly one backward pass per step (overlap=False)"
                )
            bucket.waiting -= 1
            if bucket.waiting == 0:
                self._ready[index] = True
                self._launch_in_order()

        return arrived

    def _reset_counts(self) -> None:
        for bucket in self.buckets:
            bucket.waiting = len(bucket.params)

    def _launch_in_order(self) -> None:
        while self._next < len(self.buckets) and self._ready[self._next]:
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        for param, (start, stop) in zip(bucket.params, bucket.spans, strict=True):
            part = bucket.flat[start:stop]
            if param.grad is None:  # unused this step on every worker alike
                part.zero_()
            else:
                part.copy_(param.grad.reshape(-1))
        # Averaging before the sum keeps half-precision sums of many workers in range.
        bucket.flat.div_(self.world)
        bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        self.wire_bytes += bucket.flat.numel() * bucket.flat.element_size()

    def finish(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """Send what has not been sent, wait, and leave the group's mean in every `.grad`.

        `scaler`: fp16's loss scale, which the gradients carry until the update.
        """
        self._ready = [True] * len(self.buckets)
        self._launch_in_order()
        for bucket in self.buckets:
            assert bucket.work is not None
            bucket.work.wait()
            bucket.work = None
            for param, (start, stop) in zip(bucket.params, bucket.spans, strict=True):
                if param.grad is not None:
                    param.grad.copy_(bucket.flat[start:stop].view_as(param.grad))
        for param in self.sliced:
            if param.grad is not None:
                param.grad.div_(self.world)
        if self.clip_norm is not None:
            scale = scaler.get_scale() if scaler is not None else 1.0
            self._clip_whole_norm(self.clip_norm * scale)
        self._next = 0
        self._ready = [False] * len(self.buckets)
        self._reset_counts()

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


def _make_buckets(
    params: list[torch.Tensor], wire: torch.dtype | None, limits: list[int]
) -> list[_Bucket]:
    """Consecutive parameters grouped until a bucket reaches its byte limit."""
    groups: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for param in params:
        current.append(param)
        size += param.numel() * param.element_size()
        if size >= limits[min(len(groups), len(limits) - 1)]:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    buckets = []
    for members in groups:
        spans, offset = [], 0
        for param in members:
            spans.append((offset, offset + param.numel()))
            offset += param.numel()
        dtype = wire or members[0].dtype
        flat = torch.zeros(offset, dtype=dtype, device=members[0].device)
        buckets.append(_Bucket(members, spans, flat))
    return buckets


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


def gradient_sync(
    job: CompiledJob,
    process_group: ProcessGroup = None,
    *,
    compression: str | None = None,
    bucket_mb: float = 25.0,
) -> GradientSync:
    """Equal replicas (rank 0's values), and the sync that averages the job's gradients; its
    net is on the worker's device already (the buckets are made there).

    `compression` defaults to the job's cluster.compression.
    """
    net, spec = job.net, job.spec
    clip = spec.updater.clip
    broadcast_replicas(replicated_tensors(net), process_group)
    return GradientSync(
        list(net.named_params().items()),
        group=process_group,
        sharded=sharded_params(net),
        compression=compression or spec.cluster.compression,
        bucket_mb=bucket_mb,
        # bptt back-propagates once per chunk and cd only reaches the rbm: reduce after.
        overlap=spec.train_one_batch.alg == "bp",
        clip_norm=clip.grad_norm if clip is not None else None,
    )
