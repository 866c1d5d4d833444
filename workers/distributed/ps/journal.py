"""A shard's state in Redis, kept so that a replacement continues exactly where a killed shard
stopped.

Each commit is one MULTI/EXEC: the new parameters (one blob, see wire.py) and version, the
acknowledgement of the gradient messages the updates consumed, a log record per update (its
group, step, clipping norm and messages) and the notices to the waiting workers. Every
`SNAPSHOT_EVERY` updates the commit also takes a snapshot - a server-side copy of the
parameters and the updater state (safetensors bytes) - empties the log and deletes the messages
it named; writing the updater state at every update cost as much as the parameters. A
replacement loads the snapshot and applies the logged updates again from their messages, which
the stream keeps until the next snapshot: the same inputs in the same order, so the same bits
as the committed parameters (the shard checks).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import redis
import safetensors.torch
import torch

from workers.distributed.ps.plan import CONSUMER_GROUP, PSKeys
from workers.distributed.ps.wire import Frame, GradHeader, Range, decode_grad_message

POLL_SECONDS = 0.05
NOTICES_KEPT = 8
# Updates between snapshots of the parameters and updater state. The stream keeps the messages
# of the updates since the last one (here 10 x 5 MB for the MLP of bench/ps_throughput.py).
SNAPSHOT_EVERY = 10


class ShardError(RuntimeError):
    """A shard cannot start or go on (no parameters to start from, inconsistent messages)."""


@dataclass
class Update:
    """One worker group's averaged gradients for one step, waiting to be applied."""

    group: int
    step: int
    grads: dict[int, torch.Tensor]
    entry_ids: list[bytes]
    norm: float | None = None  # of the whole gradient; None until every shard's part is in

    def record(self) -> str:
        """The log record: what it takes to apply this update again from its messages."""
        ids = [eid.decode() for eid in self.entry_ids]
        return json.dumps({"group": self.group, "step": self.step, "norm": self.norm, "ids": ids})


@dataclass(frozen=True)
class LoggedUpdate:
    """An update of the log, with the gradient messages it was made of."""

    group: int
    step: int
    norm: float | None
    entry_ids: list[bytes]
    messages: list[tuple[GradHeader, list[Frame]]]


@dataclass(frozen=True)
class Snapshot:
    """Where a replacement resumes: the last snapshot and the updates logged since."""

    params: bytes  # a parameters blob at the snapshot's version
    updater: dict[str, torch.Tensor]
    log: list[bytes]  # Update.record()s, oldest first
    version: int  # the committed version, which replaying the log must reach


class ShardJournal:
    """Reads and commits one shard's state: parameters, snapshot, update log, acknowledgements."""

    def __init__(self, client: redis.Redis, keys: PSKeys, server_group: int, shard: int) -> None:
        self.client, self.keys = client, keys
        self.server_group, self.shard = server_group, shard
        self.grads = keys.grads(server_group, shard)
        self._logged_ids: list[bytes] = []  # messages of the logged updates, kept for replays

    def read(self, timeout: float) -> tuple[bytes, Snapshot | None]:
        """The committed parameters (waiting up to `timeout` for a worker to write the first),
        and the snapshot to resume from if a predecessor took one."""
        sg, shard = self.server_group, self.shard
        params_key = self.keys.params(sg, shard)
        deadline = time.monotonic() + timeout
        while True:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(params_key)
            pipe.hgetall(self.keys.state(sg, shard))
            pipe.get(self.keys.snapshot(sg, shard))
            pipe.lrange(self.keys.log(sg, shard), 0, -1)
            blob, state, snapshot, log_records = pipe.execute()
            if blob is not None:
                break
            if time.monotonic() > deadline:
                raise ShardError(f"no initial parameters at {params_key} after {timeout:.0f} s")
            time.sleep(POLL_SECONDS)
        if snapshot is None or b"snapshot" not in state:
            return blob, None
        updater = safetensors.torch.load(state[b"updater"])
        return blob, Snapshot(snapshot, updater, list(log_records), int(state[b"version"]))

    def logged_updates(self, log: Sequence[bytes]) -> Iterator[LoggedUpdate]:
        """The logged updates with their messages, which the stream kept, one at a time."""
        for record in log:
            fields = json.loads(record)
            pipe = self.client.pipeline(transaction=False)
            for entry_id in fields["ids"]:
                pipe.xrange(self.grads, entry_id, entry_id)
            messages = []
            for entry_id, entries in zip(fields["ids"], pipe.execute(), strict=True):
                if not entries:
                    raise ShardError(
                        f"message {entry_id} of a logged update is gone from {self.grads}"
                    )
                messages.append(decode_grad_message(entries[0][1][b"m"]))
            entry_ids = [eid.encode() for eid in fields["ids"]]
            self._logged_ids.extend(entry_ids)
            yield LoggedUpdate(fields["group"], fields["step"], fields["norm"], entry_ids, messages)

    def create_consumer_group(self) -> None:
        try:
            self.client.xgroup_create(self.grads, CONSUMER_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:  # BUSYGROUP: a predecessor created it
            if "BUSYGROUP" not in str(exc):
                raise

    def stage(self, ranges: Sequence[Range]) -> None:
        """Write `ranges` of the next version into the staged blob; `commit(..., staged)`
        writes the rest and publishes it. The staged blob holds an older version (or nothing):
        every range of the next version is written, one of the two ways, before it counts."""
        staged = self.keys.staged(self.server_group, self.shard)
        pipe = self.client.pipeline(transaction=False)
        for offset, data in ranges:
            pipe.setrange(staged, offset, data)
        pipe.execute()

    def commit(
        self,
        params: memoryview | Sequence[Range] | None,
        version: int,
        updates: Sequence[Update],
        notify: Sequence[int],
        empty_ids: Sequence[bytes] = (),
        *,
        updater_state: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """Publish `params` at `version`, acknowledge the messages consumed (`empty_ids`:
        deleted ones), log the updates - or, given the updater's state, take a snapshot - and
        wake the workers waiting for this version, all or nothing. `params` is the whole blob,
        the ranges that, written over the staged copy (`stage`), make it, or None to leave
        the parameters as they are."""
        sg, shard = self.server_group, self.shard
        params_key, grads = self.keys.params(sg, shard), self.grads
        consumed = [eid for update in updates for eid in update.entry_ids]
        pipe = self.client.pipeline(transaction=True)
        if isinstance(params, memoryview):
            pipe.set(params_key, params)
        elif params is not None:
            # The staged blob becomes the parameters, and the old parameters the staged blob,
            # whose bytes the next version overwrites in place: no copy, nothing freed.
            staged = self.keys.staged(sg, shard)
            spare = staged + ":old"  # exists only inside this transaction
            for offset, data in params:
                pipe.setrange(staged, offset, data)
            pipe.rename(params_key, spare)
            pipe.rename(staged, params_key)
            pipe.rename(spare, staged)
        pipe.hset(self.keys.state(sg, shard), "version", version)
        if consumed or empty_ids:
            pipe.xack(grads, CONSUMER_GROUP, *consumed, *empty_ids)
        if empty_ids:
            pipe.xdel(grads, *empty_ids)
        if updater_state is not None:
            pipe.copy(params_key, self.keys.snapshot(sg, shard), replace=True)
            pipe.hset(
                self.keys.state(sg, shard),
                mapping={"snapshot": version, "updater": safetensors.torch.save(updater_state)},
            )
            pipe.delete(self.keys.log(sg, shard))
            if self._logged_ids or consumed:
                pipe.xdel(grads, *self._logged_ids, *consumed)
        elif updates:
            pipe.rpush(self.keys.log(sg, shard), *(update.record() for update in updates))
        for worker in notify:
            key = self.keys.notify(sg, shard, worker)
            pipe.rpush(key, version)
            pipe.ltrim(key, -NOTICES_KEPT, -1)  # a worker that only pushes never reads them
        pipe.execute()
        if updater_state is not None:
            self._logged_ids = []
        else:
            self._logged_ids.extend(consumed)
