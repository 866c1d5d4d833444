"""The worker side of the parameter server: push gradients, pull parameters into the net.

One training step is one pipelined round trip per Redis server that holds shards of this
worker's server group: XADD the gradient message to each shard's stream, BLPOP the shard's
notice that the group's update is applied, GET the new parameters. Inside a group this is
synchronous; between groups it is not (a shard applies each group's update when it is complete,
and the parameters a worker gets include whatever other groups pushed meanwhile), as in SINGA
where servers answer each update with the fresh parameters. With bounded staleness the worker's
clock rides along to the main Redis, and the worker waits while it is more than `staleness`
steps ahead of the slowest worker of its server group.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
import torch

from dsl.net import NeuralNet
from workers.distributed.ps.plan import BLOCK_SECONDS, Connections, PSKeys, PSPlan
from workers.distributed.ps.slicing import ParamInfo, Slice, SliceMap, plan_slices
from workers.distributed.ps.wire import (
    GradHeader,
    decode_frames,
    encode_frames,
    encode_grad_message,
    wire_dtype,
)

FINISHED_CLOCK = 2**62  # a finished worker never holds the others back
POLL_SECONDS = 0.002


class PSError(RuntimeError):
    """The parameter server did not answer as the protocol says."""


@dataclass(frozen=True)
class _Shard:
    index: int
    url: str
    slices: list[Slice]


def net_params(net: NeuralNet) -> list[ParamInfo]:
    """The net's parameters in net order, with their shapes and update scales."""
    specs = net.param_specs()
    return [
        ParamInfo(name, tuple(p.shape), specs[name].lr_scale, specs[name].wd_scale)
        for name, p in net.named_params().items()
    ]


@dataclass
class PSStats:
    version: int = 0  # the newest parameter version pulled from any shard
    staleness: int = 0  # steps ahead of the slowest worker of the server group


class PSClient:
    def __init__(
        self,
        net: NeuralNet,
        *,
        plan: PSPlan,
        connections: Connections,
        keys: PSKeys,
        group: int,
        rank: int,
        compression: str = "none",
        clip_norm: float | None = None,
        staleness: int | None = None,
        wait_timeout: float = 600.0,
        slice_map: SliceMap | None = None,
    ) -> None:
        self.plan, self.connections, self.keys = plan, connections, keys
        self.worker = plan.worker_id(group, rank)
        self.group = group
        self.server_group = plan.server_group_of(group)
        self.pushes = rank < plan.pushers_per_group
        self.dtype = wire_dtype(compression)
        self.clip_norm = clip_norm
        self.wait_timeout = wait_timeout
        peers = plan.workers_of(self.server_group)
        self.clocked = len(plan.worker_groups_of(self.server_group)) > 1
        self.staleness = staleness if self.clocked else None
        self.peers = [w for w in peers if w != self.worker]
        self.params = {name: p for name, p in net.named_params().items()}
        # The job's map; a pipeline's stage holds some of its parameters (`net` is the stage's)
        # and talks only to the shards of its own slices.
        self.slice_map: SliceMap = slice_map or plan_slices(net_params(net), plan.nshards)
        own = [s for s in self.slice_map.slices if s.param in self.params]
        self.shards = [
            _Shard(s, connections.shard_url(plan, self.server_group, s), slices)
            for s in range(plan.nshards)
            if (slices := [piece for piece in own if piece.shard == s])
        ]
        self.urls = list(dict.fromkeys(shard.url for shard in self.shards))
        self._views = {s.id: self.params[s.param].detach().view(-1)[s.start : s.stop] for s in own}
        self.versions = {shard.index: 0 for shard in self.shards}
        self.stats = PSStats()
        self._pool = ThreadPoolExecutor(len(self.urls)) if len(self.urls) > 1 else None
        self._flat_grads: dict[str, torch.Tensor] = {}
        self._norm = 0.0

    # -- start and end -------------------------------------------------------------------------
    def connect(self) -> None:
        """Store the slice map and the initial parameters unless already there, then pull.

        Every worker builds the same initial net from the job's seed, so whichever writes first
        writes the same values; a worker that joins later (or a rerun) gets the shards' current
        parameters instead of its own.
        """
        main = self.connections.main
        mine = self.slice_map.to_json()
        main.set(self.keys.slice_map, mine, nx=True)
        stored = main.get(self.keys.slice_map)
        if stored is None or stored.decode() != mine:  # type: ignore[union-attr]
            raise PSError(
                f"the slice map at {self.keys.slice_map} is not this net's: another job with "
                "the same scope, or workers that built different nets"
            )
        for url in self.urls:
            pipe = self.connections.client(url).pipeline(transaction=False)
            for shard in self._shards_at(url):
                blob = encode_frames(
                    ((s.id, self._views[s.id].view(s.shape)) for s in shard.slices), 0
                )
                pipe.set(self.keys.params(self.server_group, shard.index), blob, nx=True)
            pipe.execute()
        if self.clocked:
            main.hsetnx(self.keys.clocks(self.server_group), str(self.worker), 0)
        self.pull()

    def finish(self) -> None:
        """Tell the shards this worker is done (they stop once all their workers are)."""
        pipe = self.connections.main.pipeline(transaction=False)
        if self.clocked:
            pipe.hset(self.keys.clocks(self.server_group), str(self.worker), FINISHED_CLOCK)
        pipe.sadd(self.keys.done(self.server_group), str(self.worker))
        pipe.execute()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    # -- one step ------------------------------------------------------------------------------
    def _shards_at(self, url: str) -> list[_Shard]:
        return [shard for shard in self.shards if shard.url == url]

    def _grad_norm(self) -> float:
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        if self.clip_norm is None or not grads:
            return 0.0
        norms = torch._foreach_norm(grads)
        return float(torch.linalg.vector_norm(torch.stack(norms)))

    def _message(
        self, step: int, shard: _Shard, flat_grads: dict[str, torch.Tensor], norm: float
    ) -> bytes:
        header = GradHeader(self.worker, self.group, step, self.versions[shard.index], norm)
        return encode_grad_message(
            header,
            ((s.id, flat_grads[s.param][s.start : s.stop].view(s.shape)) for s in shard.slices),
            self.dtype,
        )

    def _push_commands(self, pipe: redis.client.Pipeline, step: int, shards: list[_Shard]) -> None:
        flat_grads = self._flat_grads
        for shard in shards:
            message = self._message(step, shard, flat_grads, self._norm)
            pipe.xadd(self.keys.grads(self.server_group, shard.index), {"m": message})

    def _prepare_push(self) -> None:
        self._flat_grads = {
            name: (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for name, p in self.params.items()
        }
        self._norm = self._grad_norm()

    def push(self, step: int) -> None:
        """Send this step's gradients to the shards without waiting for the update."""
        self._prepare_push()
        pipes = []
        for url in self.urls:
            pipe = self.connections.client(url).pipeline(transaction=False)
            self._push_commands(pipe, step, self._shards_at(url))
            pipes.append(pipe)
        self._run(pipes)

    def step(self, step: int) -> None:
        """Push this step's gradients (if this worker pushes), wait until the shards applied
        the group's update and pull the parameters: one round trip per Redis server."""
        if self.pushes:
            self._prepare_push()
        plans = []
        for url in self.urls:
            pipe = self.connections.client(url).pipeline(transaction=False)
            shards = self._shards_at(url)
            if self.pushes:
                self._push_commands(pipe, step, shards)
            for shard in shards:
                notice = self.keys.notify(self.server_group, shard.index, self.worker)
                pipe.blpop([notice], timeout=BLOCK_SECONDS)
                pipe.get(self.keys.params(self.server_group, shard.index))
            if self.clocked and url == self.connections.main_url:
                self._clock_commands(pipe, step + 1)
            plans.append((url, shards, pipe))
        replies = self._run([pipe for _, _, pipe in plans])
        for (url, shards, _), reply in zip(plans, replies, strict=True):
            tail = reply[len(shards) if self.pushes else 0 :]
            for i, shard in enumerate(shards):
                blob = self._await_update(shard, step, tail[2 * i], tail[2 * i + 1])
                self._load(shard, blob)
            if self.clocked and url == self.connections.main_url:
                self._note_clocks(step + 1, tail[2 * len(shards) + 1])
        if self.clocked and self.connections.main_url not in self.urls:
            pipe = self.connections.main.pipeline(transaction=False)
            self._clock_commands(pipe, step + 1)
            self._note_clocks(step + 1, pipe.execute()[1])
        if self.staleness is not None and self.stats.staleness > self.staleness:
            self._wait_for_slowest(step + 1)

    def _run(self, pipes: Sequence[redis.client.Pipeline]) -> list[list[Any]]:
        if self._pool is None:
            return [pipe.execute() for pipe in pipes]
        return list(self._pool.map(lambda pipe: pipe.execute(), pipes))

    def _await_update(self, shard: _Shard, step: int, notice: Any, blob: Any) -> Any:
        """The parameters after this group's update of `step` on `shard`, waiting if need be."""
        deadline = time.monotonic() + self.wait_timeout
        client = self.connections.client(shard.url)
        key = self.keys.notify(self.server_group, shard.index, self.worker)
        # A notice at or below the version already held is left over from an earlier run.
        while notice is None or int(notice[1]) <= self.versions[shard.index]:
            if time.monotonic() > deadline:
                raise PSError(
                    f"shard {self.server_group}/{shard.index} applied no update for step {step} "
                    f"within {self.wait_timeout:.0f} s"
                )
            pipe = client.pipeline(transaction=False)
            pipe.blpop([key], timeout=BLOCK_SECONDS)
            pipe.get(self.keys.params(self.server_group, shard.index))
            notice, blob = pipe.execute()
        return blob

    def _load(self, shard: _Shard, blob: bytes | None) -> None:
        if blob is None:
            raise PSError(f"shard {self.server_group}/{shard.index} has no parameters")
        frames = decode_frames(blob)
        with torch.no_grad():
            for frame in frames:
                self._views[frame.slice_id].copy_(frame.tensor.reshape(-1))
        if frames:
            self.versions[shard.index] = frames[0].version
        self.stats.version = max(self.versions.values())

    def pull(self) -> None:
        """Copy the shards' current parameters into the net."""
        for url in self.urls:
            pipe = self.connections.client(url).pipeline(transaction=False)
            shards = self._shards_at(url)
            for shard in shards:
                pipe.get(self.keys.params(self.server_group, shard.index))
            for shard, blob in zip(shards, pipe.execute(), strict=True):
                self._load(shard, blob)

    # -- bounded staleness and flow control ----------------------------------------------------
    def _clock_commands(self, pipe: redis.client.Pipeline, clock: int) -> None:
        key = self.keys.clocks(self.server_group)
        pipe.hset(key, str(self.worker), clock)
        pipe.hmget(key, [str(w) for w in self.peers])

    def _note_clocks(self, clock: int, peer_clocks: list[Any] | None) -> None:
        if not peer_clocks:
            self.stats.staleness = 0
            return
        slowest = min(int(c) if c is not None else 0 for c in peer_clocks)
        self.stats.staleness = max(clock - slowest, 0)

    def _wait_for_slowest(self, clock: int) -> None:
        """SSP: wait until no worker of the server group is more than `staleness` behind."""
        assert self.staleness is not None
        deadline = time.monotonic() + self.wait_timeout
        key = self.keys.clocks(self.server_group)
        main = self.connections.main
        while self.stats.staleness > self.staleness:
            if time.monotonic() > deadline:
                raise PSError(f"waited {self.wait_timeout:.0f} s for slower workers")
            time.sleep(POLL_SECONDS)
            self._note_clocks(clock, main.hmget(key, [str(w) for w in self.peers]))
        self.pull()
