"""A parameter-server shard: the process that owns some slices of the model and updates them.

Everything a shard knows lives in Redis (journal.py: parameters, snapshots and a log of the
updates since), so a replacement continues exactly where a killed one stopped. Gradients arrive
on a Redis stream read through a consumer group; a message read but not yet acknowledged when
the shard dies is read again by its successor.

An update is the average of one worker group's gradients for one step (`pushers_per_group`
messages), clipped by the global gradient norm when the job clips, then the job's `Updater`
with each parameter's lr_scale / wd_scale and the learning rate of that step. Server groups
(hogwild) average their parameters with each other every `sync_freq` updates.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import torch

from contract.keys import NORMS_TTL_SECONDS
from dsl.frameworks import FRAMEWORK_SPECS
from dsl.plugins import PLUGIN_UPDATERS
from dsl.schema import JobSpec
from dsl.topology import Topology
from dsl.updater_config import UpdaterConfig
from workers.distributed.ps.journal import (
    POLL_SECONDS,
    SNAPSHOT_EVERY,
    ShardError,
    ShardJournal,
    Update,
)
from workers.distributed.ps.plan import (
    CONSUMER,
    CONSUMER_GROUP,
    Connections,
    PSKeys,
    PSPlan,
)
from workers.distributed.ps.slicing import SliceMap
from workers.distributed.ps.wire import (
    Frame,
    FrameBuffer,
    GradHeader,
    Range,
    decode_frames,
    decode_grad_message,
)
from workers.updaters import ParamEntry, Updater

log = logging.getLogger(__name__)

READ_BLOCK_MS = 200
NORM_POLL_MS = 1  # while an update waits for the other shards' parts of its gradient norm


@dataclass(frozen=True)
class _Part:
    """One message of a worker's gradient for one step: its stream entry and contents."""

    entry_id: bytes
    header: GradHeader
    frames: list[Frame]


@dataclass(frozen=True)
class ShardReport:
    version: int
    updates: int
    peer_syncs: int
    seconds: float


def wait_for_slice_map(client: redis.Redis, keys: PSKeys, timeout: float) -> SliceMap:
    """The job's slice map, which the first worker stores; waits for it up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        raw = client.get(keys.slice_map)
        if raw is not None:
            return SliceMap.from_json(raw)
        if time.monotonic() > deadline:
            raise ShardError(f"no slice map at {keys.slice_map} after {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


def _shard_updater_config(config: UpdaterConfig) -> UpdaterConfig:
    """The job's updater without norm clipping: the shard clips by the norm of the whole
    gradient, which it gets from the workers or the other shards, not of its own slices."""
    if config.clip is None or config.clip.grad_norm is None:
        return config
    return config.model_copy(update={"clip": None})


class ShardServer:
    def __init__(
        self,
        connections: Connections,
        keys: PSKeys,
        plan: PSPlan,
        server_group: int,
        shard: int,
        slice_map: SliceMap,
        spec: JobSpec,
        *,
        gang: bool = False,
    ) -> None:
        """`gang`: the job's framework restarts the whole job, shards included, when a worker
        fails (no worker is restarted alone to send a step again)."""
        self.connections, self.keys, self.plan = connections, keys, plan
        self.server_group, self.shard = server_group, shard
        self.client = connections.shard_client(plan, server_group, shard)
        self.journal = ShardJournal(self.client, keys, server_group, shard)
        self.slices = slice_map.shard_slices(shard)
        # The slices live in the parameters blob that every commit sends as it is.
        self._blob = FrameBuffer(((s.id, torch.zeros(s.shape)) for s in self.slices), 0)
        self.tensors = self._blob.tensors
        entries = [
            ParamEntry(
                f"{s.param}@{s.id}",
                self.tensors[s.id],
                slice_map.param(s.param).lr_scale,
                slice_map.param(s.param).wd_scale,
            )
            for s in self.slices
        ]
        self.updater = Updater(entries, _shard_updater_config(spec.updater), spec.train_steps)
        clip = spec.updater.clip
        self.clip_norm = clip.grad_norm if clip is not None else None
        self.sync_freq = spec.cluster.sync_freq
        self.workers = plan.workers_of(server_group)
        self.version = 0
        self.updates = 0
        self.peer_syncs = 0
        self._since_sync = 0
        self._snapshot_version = 0
        # Slices are updated as soon as every pusher sent them, while the workers' backward
        # passes go on, where that is exact: nothing comes between the parts of one update (one
        # worker group: one update at a time), the update needs no global norm, it is a
        # built-in updater (element by element: the same bits as updating every slice at once,
        # which a replay does), and no worker restarted alone sends a step again (the slices
        # updated early could not be taken back).
        self.early = (
            gang
            and len(plan.worker_groups_of(server_group)) == 1
            and self.clip_norm is None
            and PLUGIN_UPDATERS.get(spec.updater.type) is None
        )
        # (worker group, step) -> worker -> part -> the part's message
        self._pending: dict[tuple[int, int], dict[int, dict[int, _Part]]] = {}
        # (worker group, step) -> the slices of that pending update already applied
        self._applied: dict[tuple[int, int], set[int]] = {}
        # The slices updated early that the staged copy of the parameters holds (journal.stage)
        self._staged: set[int] = set()
        self._queue: list[Update] = []  # complete, in arrival order, maybe awaiting norms

    # -- state in Redis ------------------------------------------------------------------------
    def load(self, timeout: float) -> None:
        """Continue from the last snapshot and the updates logged since, or start from the
        parameters a worker wrote (and take the first snapshot of them)."""
        blob, snapshot = self.journal.read(timeout)
        key = self.keys.params(self.server_group, self.shard)
        self._load_params(snapshot.params if snapshot else blob, key)
        if snapshot is not None:
            self.updater.load_state_tensors(snapshot.updater)
            self._snapshot_version = self.version
            for logged in self.journal.logged_updates(snapshot.log):
                grads = self._average(logged.messages)
                self.apply(Update(logged.group, logged.step, grads, logged.entry_ids, logged.norm))
            self._check_replay(blob, snapshot.version)
        self.journal.create_consumer_group()
        if snapshot is None:
            self.commit((), (), snapshot=True)  # the base that later updates are replayed on
        log.info(
            "shard %d/%d %s at version %d (%d updates replayed)",
            self.server_group,
            self.shard,
            "resumed" if snapshot else "started",
            self.version,
            len(snapshot.log) if snapshot else 0,
        )

    def _load_params(self, blob: bytes, key: str) -> None:
        frames = decode_frames(blob)
        missing = set(self.tensors) - {f.slice_id for f in frames}
        if missing:
            raise ShardError(f"{key} lacks slices {sorted(missing)[:5]}")
        for frame in frames:
            self.tensors[frame.slice_id].copy_(frame.tensor)
        self.version = frames[0].version if frames else 0

    def _check_replay(self, blob: bytes, version: int) -> None:
        """The replayed parameters must be the committed ones, bit for bit."""
        frames = decode_frames(blob)
        same = self.version == version and all(
            torch.equal(self.tensors[f.slice_id], f.tensor) for f in frames
        )
        if not same:
            raise ShardError(
                f"replaying the log from the snapshot gave version {self.version} with other "
                f"parameters than the committed version {version}"
            )

    def commit(
        self,
        updates: Sequence[Update],
        notify: Sequence[int],
        empty_ids: Sequence[bytes] = (),
        *,
        snapshot: bool = False,
    ) -> None:
        """Commit this version (ShardJournal.commit), with a snapshot when asked.

        Slices updated early were written to the staged blob as they were updated (`_apply_early`):
        the commit then writes only the rest and the new version into it and publishes it. A
        commit of no update while an update is half applied early leaves the parameters as
        they are; the whole blob is only sent when nothing was staged."""
        self._blob.set_version(self.version)
        state = self.updater.state_tensors() if snapshot else None
        params: memoryview | list[Range] | None = self._blob.view()
        if self._staged:
            params = None
            if updates:
                rest = set(self.tensors) - self._staged
                params = self._blob.ranges(rest) + self._blob.ranges(
                    self._staged, headers_only=True
                )
                self._staged = set()
        self.journal.commit(params, self.version, updates, notify, empty_ids, updater_state=state)
        if snapshot:
            self._snapshot_version = self.version

    # -- updates -------------------------------------------------------------------------------
    def _average(self, messages: list[tuple[GradHeader, list[Frame]]]) -> dict[int, torch.Tensor]:
        """The mean of one group's gradients for one step, slice id -> fp32 tensor. Each
        worker's gradient may come in several parts, each slice in one of them."""
        # A fixed summation order (by worker), whichever order the parts came in: exact replays,
        # and the same bits whether a worker sent its gradient in one part or in several.
        messages.sort(key=lambda m: (m[0].worker, m[0].part))
        grads: dict[int, torch.Tensor] = {}
        for header, frames in messages:
            for frame in frames:
                target = self.tensors.get(frame.slice_id)
                if target is None or target.shape != frame.tensor.shape:
                    raise ShardError(
                        f"worker {header.worker} sent slice {frame.slice_id} "
                        f"{tuple(frame.tensor.shape)}, which shard {self.shard} does not hold"
                    )
                if frame.slice_id in grads:
                    grads[frame.slice_id].add_(frame.tensor)
                else:  # a copy: the frame views the message's immutable bytes
                    grads[frame.slice_id] = frame.tensor.to(torch.float32, copy=True)
        workers = len({header.worker for header, _ in messages})
        if workers > 1:
            for g in grads.values():
                g.div_(workers)
        return grads

    def _publish_norm(self, update: Update) -> None:
        """Add this shard's part of the squared norm of a group's averaged gradient to the
        job-wide hash where every shard of the server group adds its own."""
        norms = [torch.linalg.vector_norm(g) for g in update.grads.values()]
        mine = float(torch.linalg.vector_norm(torch.stack(norms))) ** 2 if norms else 0.0
        if self.plan.nshards == 1:
            update.norm = math.sqrt(mine)
            return
        key = self.keys.norms(self.server_group, update.group, update.step)
        pipe = self.connections.main.pipeline(transaction=False)
        pipe.hset(key, str(self.shard), repr(mine))
        pipe.expire(key, NORMS_TTL_SECONDS)
        pipe.execute()

    def _collect_norms(self) -> None:
        """Fill in the norms every shard has published for. Never waits: a shard waiting for
        another while holding an update the other waits for would deadlock them both."""
        waiting = [u for u in self._queue if u.norm is None]
        if not waiting:
            return
        pipe = self.connections.main.pipeline(transaction=False)
        for update in waiting:
            pipe.hvals(self.keys.norms(self.server_group, update.group, update.step))
        for update, values in zip(waiting, pipe.execute(), strict=True):
            if len(values) >= self.plan.nshards:
                update.norm = math.sqrt(sum(float(v) for v in values))

    def apply(self, update: Update) -> None:
        """One update from the averaged gradients of one worker group for one step."""
        if self.clip_norm is not None:
            assert update.norm is not None
            # torch.nn.utils.clip_grad_norm_'s rule, with the norm of the whole gradient
            coef = min(self.clip_norm / (update.norm + 1e-6), 1.0)
            for g in update.grads.values():
                g.mul_(coef)
        self._step_slices(update.step, update.grads)
        self.version += 1
        self.updates += 1
        self._since_sync += 1

    def _apply_early(self, key: tuple[int, int], waiting: dict[int, dict[int, _Part]]) -> None:
        """Update the slices of a pending update that every pusher has sent (see `early`)."""
        if len(waiting) < self.plan.pushers_per_group:
            return
        applied = self._applied.get(key, set())
        sent = [
            {f.slice_id for part in parts.values() for f in part.frames}
            for parts in waiting.values()
        ]
        ready = set.intersection(*sent) - applied
        if not ready:
            return
        messages = [
            (part.header, [f for f in part.frames if f.slice_id in ready])
            for parts in waiting.values()
            for part in parts.values()
        ]
        self._step_slices(key[1], self._average(messages))
        self._applied[key] = applied | ready
        # Sent to Redis now, while the workers' backward passes go on, not with the commit.
        self.journal.stage(self._blob.ranges(ready))
        self._staged |= ready

    def _step_slices(self, step: int, grads: dict[int, torch.Tensor]) -> None:
        """The updater's step `step` on the slices in `grads` (the others have no gradient)."""
        for slice_id, tensor in self.tensors.items():
            tensor.grad = grads.get(slice_id)
        self.updater.step(step)
        self.updater.zero_grad()

    def _complete(self, waiting: dict[int, dict[int, _Part]]) -> bool:
        """Whether every pusher of the group sent every part of its gradient."""
        return len(waiting) >= self.plan.pushers_per_group and all(
            len(parts) == next(iter(parts.values())).header.parts for parts in waiting.values()
        )

    @property
    def waiting_for_norms(self) -> bool:
        return bool(self._queue)

    def handle(self, entries: list[tuple[bytes, dict[bytes, bytes] | None]]) -> None:
        """Apply, in order, every update the messages complete (once its norm is known, when
        the job clips); commit them together."""
        empty_ids: list[bytes] = []
        for entry_id, fields in entries:
            if not fields:  # deleted while pending: nothing left to apply
                empty_ids.append(entry_id)
                continue
            header, frames = decode_grad_message(fields[b"m"])
            key = (header.group, header.step)
            waiting = self._pending.setdefault(key, {})
            parts = waiting.setdefault(header.worker, {})
            if header.part in parts:
                # The worker sends this step again (it was restarted alone): the parts of its
                # earlier try are acknowledged and deleted unused.
                if key in self._applied:
                    raise ShardError(
                        f"worker {header.worker} sent step {header.step} again after some of "
                        "its slices were updated; a replacement shard applies the step whole "
                        "from the stream"
                    )
                empty_ids.extend(part.entry_id for part in parts.values())
                parts.clear()
            parts[header.part] = _Part(entry_id, header, frames)
            if not self._complete(waiting):
                if self.early and not self._queue:  # never ahead of an update not applied yet
                    self._apply_early(key, waiting)
                continue
            del self._pending[key]
            early = self._applied.pop(key, set())
            received = [part for parts in waiting.values() for part in parts.values()]
            messages = [
                (part.header, [f for f in part.frames if f.slice_id not in early])
                for part in received
            ]
            update = Update(
                group=header.group,
                step=header.step,
                grads=self._average(messages),
                entry_ids=[part.entry_id for part in received],
            )
            if self.clip_norm is not None:
                if len(waiting) == 1:  # the worker's own, of the whole gradient: in its last part
                    update.norm = parts[header.parts - 1].header.norm
                else:
                    self._publish_norm(update)
            self._queue.append(update)
        if self.clip_norm is not None:
            self._collect_norms()
        applied: list[Update] = []
        notify: list[int] = []
        while self._queue and (self.clip_norm is None or self._queue[0].norm is not None):
            update = self._queue.pop(0)
            self.apply(update)
            applied.append(update)
            notify.extend(self.plan.group_workers(update.group))
        if applied or empty_ids:
            snapshot = self.version - self._snapshot_version >= SNAPSHOT_EVERY
            self.commit(applied, notify, empty_ids, snapshot=snapshot)
        if self.plan.nserver_groups > 1 and self._since_sync >= self.sync_freq:
            self.average_with_peers()

    def average_with_peers(self) -> None:
        """Hogwild: replace this shard's slices by their mean over all server groups' copies."""
        peers = [sg for sg in range(self.plan.nserver_groups) if sg != self.server_group]
        blobs: list[Any] = [
            self.connections.shard_client(self.plan, sg, self.shard).get(
                self.keys.params(sg, self.shard)
            )
            for sg in peers
        ]
        copies = [decode_frames(blob) for blob in blobs if blob is not None]
        for frames in copies:
            for frame in frames:
                self.tensors[frame.slice_id].add_(frame.tensor)
        for tensor in self.tensors.values():
            tensor.div_(len(copies) + 1)
        self._since_sync = 0
        self.peer_syncs += 1
        self.commit((), (), snapshot=True)  # the logged updates no longer lead to these values

    # -- the loop ------------------------------------------------------------------------------
    def finished(self) -> bool:
        done = self.connections.main.scard(self.keys.done(self.server_group))
        return int(done) >= len(self.workers)

    def serve(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        stream = self.keys.grads(self.server_group, self.shard)
        count = max(2 * len(self.workers), 4)
        # First what a predecessor read but never acknowledged (ids after `cursor`), then new
        # messages (">").
        cursor = "0"
        while not should_stop():
            history = cursor != ">"
            block = None if history else NORM_POLL_MS if self.waiting_for_norms else READ_BLOCK_MS
            reply: Any = self.client.xreadgroup(
                CONSUMER_GROUP, CONSUMER, {stream: cursor}, count=count, block=block
            )
            entries = reply[0][1] if reply else []
            if not entries:
                if history:
                    cursor = ">"
                elif self.waiting_for_norms:
                    self.handle([])
                elif self.finished():
                    return
                continue
            if history:
                cursor = entries[-1][0].decode()
            self.handle(entries)


def run_shard(
    redis_url: str,
    scope: str,
    server_group: int,
    shard: int,
    spec: JobSpec,
    topology: Topology,
    *,
    ps_urls: Sequence[str] = (),
    pushers_per_group: int | None = None,
    slice_map: SliceMap | None = None,
    start_timeout: float = 600.0,
    should_stop: Callable[[], bool] = lambda: False,
) -> ShardReport:
    """Serve shard `shard` of server group `server_group` until its workers finish."""
    started = time.perf_counter()
    plan = PSPlan.from_topology(topology, pushers_per_group)
    gang = FRAMEWORK_SPECS.get(topology.framework).restart == "gang"
    if not (0 <= server_group < plan.nserver_groups and 0 <= shard < plan.nshards):
        raise ShardError(
            f"shard {server_group}/{shard} is outside {plan.nserver_groups} server groups x "
            f"{plan.nshards} shards"
        )
    keys = PSKeys(scope)
    connections = Connections(redis_url, ps_urls)
    try:
        if slice_map is None:
            slice_map = wait_for_slice_map(connections.main, keys, start_timeout)
        server = ShardServer(
            connections, keys, plan, server_group, shard, slice_map, spec, gang=gang
        )
        server.load(start_timeout)
        server.serve(should_stop)
        return ShardReport(
            server.version, server.updates, server.peer_syncs, time.perf_counter() - started
        )
    finally:
        connections.close()
