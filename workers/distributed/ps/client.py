"""The worker side of the parameter server: push gradients, pull parameters into the net.

One training step is one pipelined round trip per Redis server that holds shards of this
worker's server group: XADD the gradient message to each shard's stream, BLPOP the shard's
notice that the group's update is applied, GET the new parameters. Inside a group this is
synchronous; between groups it is not (a shard applies each group's update when it is complete,
and the parameters a worker gets include whatever other groups pushed meanwhile), as in SINGA
where servers answer each update with the fresh parameters. With bounded staleness the worker's
clock rides along to the main Redis, and the worker waits while it is more than `staleness`
steps ahead of the slowest worker of its server group.

With `overlap`, a step armed by `begin_step` before its backward pass sends the gradients in
parts while the backward pass runs (overlap.py), one sender thread per Redis server; the step's
round trip then carries only what was not sent yet. What the shards apply, when a worker waits
and what it pulls are the same: only when the bytes leave changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
import torch

from dsl.net import NeuralNet
from workers.distributed.ps.overlap import PART_BYTES, ReadyParts, plan_parts
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


@dataclass(frozen=True)
class _Part:
    """Part `index` of a shard's gradient, of `parts` (the norm's part, if any, included)."""

    shard: _Shard
    index: int
    parts: int
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
        overlap: bool = False,
        part_bytes: int = PART_BYTES,
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
        # One thread per Redis server sends the parts of a step's gradient (in order) and, with
        # several servers, runs the round trips in parallel.
        self._senders = (
            {url: ThreadPoolExecutor(1, thread_name_prefix="ps-send") for url in self.urls}
            if overlap or len(self.urls) > 1
            else {}
        )
        self.overlap = overlap
        # The parts each shard's gradient travels in when the step is armed (`begin_step`).
        clipped = int(clip_norm is not None)  # a last part carries the norm
        backward_order = list(reversed(self.params))
        self._parts: list[_Part] = []
        for shard in self.shards:
            groups = (
                plan_parts(shard.slices, backward_order, part_bytes=part_bytes) if overlap else []
            )
            self._parts += [
                _Part(shard, i, len(groups) + clipped, group) for i, group in enumerate(groups)
            ]
        self._ready = ReadyParts([part.slices for part in self._parts])
        # Each shard's last part holds the first layers, whose gradients come at the very end of
        # the backward pass: it goes with the round trip, which leaves at once, not a thread.
        self._with_round_trip = {
            max(i for i, part in enumerate(self._parts) if part.shard.index == shard.index)
            for shard in self.shards
            if overlap
        }
        self._armed: int | None = None  # the step whose backward pass sends its parts
        self._sending: list[Future[Any]] = []
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._accumulated_hook(name))
            for name, p in self.params.items()
            if overlap and p.requires_grad
        ]

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
        for handle in self._hooks:
            handle.remove()
        for sender in self._senders.values():
            sender.shutdown()

    # -- one step ------------------------------------------------------------------------------
    def _shards_at(self, url: str) -> list[_Shard]:
        return [shard for shard in self.shards if shard.url == url]

    def _grad_norm(self) -> float:
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        if self.clip_norm is None or not grads:
            return 0.0
        norms = torch._foreach_norm(grads)
        return float(torch.linalg.vector_norm(torch.stack(norms)))

    def _grad(self, s: Slice) -> torch.Tensor:
        """Slice `s` of its parameter's gradient (zeros where the parameter has none)."""
        grad = self.params[s.param].grad
        if grad is None:
            return torch.zeros(s.shape, dtype=self.params[s.param].dtype)
        return grad.reshape(-1)[s.start : s.stop].view(s.shape)

    def _message(self, step: int, part: _Part, norm: float) -> bytes:
        shard = part.shard
        header = GradHeader(
            self.worker, self.group, step, self.versions[shard.index], norm, part.index, part.parts
        )
        return encode_grad_message(header, ((s.id, self._grad(s)) for s in part.slices), self.dtype)

    def _step_parts(self, shard: _Shard) -> list[_Part]:
        """What of `shard`'s gradient this step's round trip carries: all of it in one part,
        or (armed) its last part and those no hook sent, and the norm's when the job clips."""
        if self._armed is None:
            return [_Part(shard, 0, 1, shard.slices)]
        indices = sorted({*self._ready.unsent(), *self._with_round_trip})
        unsent = [self._parts[i] for i in indices if self._parts[i].shard.index == shard.index]
        parts = sum(1 for part in self._parts if part.shard.index == shard.index)
        if self.clip_norm is not None:
            unsent.append(_Part(shard, parts, parts + 1, []))
        return unsent

    def _push_commands(
        self, pipe: redis.client.Pipeline, step: int, shards: list[_Shard], norm: float
    ) -> None:
        for shard in shards:
            for part in self._step_parts(shard):
                message = self._message(step, part, norm)
                pipe.xadd(self.keys.grads(self.server_group, shard.index), {"m": message})

    def push(self, step: int) -> None:
        """Send this step's gradients to the shards without waiting for the update."""
        pipes = []
        norm = self._grad_norm()
        for url in self.urls:
            pipe = self.connections.client(url).pipeline(transaction=False)
            self._push_commands(pipe, step, self._shards_at(url), norm)
            pipes.append(pipe)
        self._armed = None
        self._run(pipes)
        self._sent()

    # -- overlap with the backward pass --------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Step `step`'s backward pass comes next (once, before `step(step)`): with `overlap`,
        send its gradients in parts as they are accumulated; without, leave them to `step`."""
        if self.overlap:
            self._ready.begin()
            self._armed = step

    def _accumulated_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def accumulated(param: torch.Tensor) -> None:
            if self._armed is None or not self.pushes:
                return
            try:
                complete = self._ready.accumulated(name)
            except ValueError as exc:
                raise PSError(str(exc)) from None
            for index in complete:
                part = self._parts[index]
                if index in self._with_round_trip:
                    continue
                send = self._senders[part.shard.url].submit(self._send, self._armed, part)
                self._sending.append(send)

        return accumulated

    def _send(self, step: int, part: _Part) -> None:
        """In a sender thread: one part, while the backward pass goes on. The norm is not known
        yet; the part that carries it comes last."""
        client = self.connections.client(part.shard.url)
        message = self._message(step, part, 0.0)
        client.xadd(self.keys.grads(self.server_group, part.shard.index), {"m": message})

    def _sent(self) -> None:
        """Wait for the parts the sender threads took this step (mostly sent already, during
        the backward pass); raise what went wrong there."""
        sending, self._sending = self._sending, []
        for send in sending:
            send.result()

    def step(self, step: int) -> None:
        """Push this step's gradients (if this worker pushes), wait until the shards applied
        the group's update and pull the parameters: one round trip per Redis server."""
        if self._armed is not None and self._armed != step:
            raise PSError(f"step {step} was armed as step {self._armed}")
        plans = []
        norm = self._grad_norm() if self.pushes else 0.0
        for url in self.urls:
            pipe = self.connections.client(url).pipeline(transaction=False)
            shards = self._shards_at(url)
            pushed = 0
            if self.pushes:
                self._push_commands(pipe, step, shards, norm)
                pushed = len(pipe.command_stack)
            for shard in shards:
                notice = self.keys.notify(self.server_group, shard.index, self.worker)
                pipe.blpop([notice], timeout=BLOCK_SECONDS)
                pipe.get(self.keys.params(self.server_group, shard.index))
            if self.clocked and url == self.connections.main_url:
                self._clock_commands(pipe, step + 1)
            plans.append((url, shards, pushed, pipe))
        self._armed = None
        self._sent()
        replies = self._run([pipe for _, _, _, pipe in plans])
        for (url, shards, pushed, _), reply in zip(plans, replies, strict=True):
            tail = reply[pushed:]
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
        """Execute one pipeline per Redis server (in `self.urls`' order), in parallel."""
        if len(pipes) == 1:
            return [pipes[0].execute()]
        runs = [
            self._senders[url].submit(pipe.execute)
            for url, pipe in zip(self.urls, pipes, strict=True)
        ]
        return [run.result() for run in runs]

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
