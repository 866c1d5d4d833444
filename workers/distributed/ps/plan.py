"""Who talks to whom in a parameter-server job: groups, shards, Redis keys and servers.

Worker group g trains against server group g % nserver_groups. A shard aggregates, for each
worker group, the gradients of that group's `pushers_per_group` workers for one step (their
average is one update), so the workers inside a group are synchronous; different worker groups
sharing a server group are asynchronous. Server groups (hogwild) average their parameters every
`sync_freq` updates.

Every key lives under the job's scope (`Keys.job_scope(job_id)`). Shard s of server group sg
is shard number i = sg * nshards + s, kept on Redis server `ps_urls[i % len(ps_urls)]`; the
job-wide keys (slice map, worker clocks, finished workers, gradient norms) stay on the main Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.connection import Encoder, PythonRespSerializer

from contract.keys import delete_matching
from dsl.topology import Topology

# Shards read gradients from their stream as members of this consumer group, always under the
# same consumer name, so a replacement shard receives what its predecessor read but never
# acknowledged.
CONSUMER_GROUP = "shards"
CONSUMER = "shard"
# Blocking reads (BLPOP, XREADGROUP BLOCK) wait at most BLOCK_SECONDS at a time and then ask again;
# a socket silent for SOCKET_TIMEOUT means Redis is gone.
BLOCK_SECONDS = 2
SOCKET_TIMEOUT = 60.0
# redis-py packs commands with hiredis's pack_command when hiredis is installed, which copies
# every argument into one new buffer at a few hundred MB/s (15 ms for a 5 MB gradient message on
# the 2-core VM); redis-py's own packer hands arguments over `buffer_cutoff` bytes to sendall as
# they are. Replies are still parsed by hiredis.
_BUFFER_CUTOFF = 6000
_PACKER = PythonRespSerializer(_BUFFER_CUTOFF, Encoder("utf-8", "strict", False).encode)


class PSConfigError(ValueError):
    """A topology the parameter server cannot run."""


@dataclass(frozen=True)
class PSPlan:
    nworker_groups: int
    nworkers_per_group: int
    nserver_groups: int
    nshards: int
    pushers_per_group: int  # workers of a group that push; the others only pull

    @classmethod
    def from_topology(cls, topology: Topology, pushers_per_group: int | None = None) -> PSPlan:
        if topology.nserver_groups < 1 or topology.nservers_per_group < 1:
            raise PSConfigError(
                f"framework '{topology.framework}' has no server shards "
                f"({topology.nserver_groups} server groups x {topology.nservers_per_group})"
            )
        if topology.nworker_groups < topology.nserver_groups:
            raise PSConfigError(
                f"{topology.nserver_groups} server groups need at least as many worker groups "
                f"(got {topology.nworker_groups}): a server group without workers never updates"
            )
        pushers = topology.nworkers_per_group if pushers_per_group is None else pushers_per_group
        if not 1 <= pushers <= topology.nworkers_per_group:
            raise PSConfigError(f"pushers_per_group must be 1..{topology.nworkers_per_group}")
        return cls(
            nworker_groups=topology.nworker_groups,
            nworkers_per_group=topology.nworkers_per_group,
            nserver_groups=topology.nserver_groups,
            nshards=topology.nservers_per_group,
            pushers_per_group=pushers,
        )

    @property
    def nworkers(self) -> int:
        return self.nworker_groups * self.nworkers_per_group

    def worker_id(self, group: int, rank: int) -> int:
        """A worker's index over the whole job (also its data rank)."""
        return group * self.nworkers_per_group + rank

    def server_group_of(self, worker_group: int) -> int:
        return worker_group % self.nserver_groups

    def worker_groups_of(self, server_group: int) -> list[int]:
        return [g for g in range(self.nworker_groups) if g % self.nserver_groups == server_group]

    def workers_of(self, server_group: int) -> list[int]:
        return [
            self.worker_id(g, r)
            for g in self.worker_groups_of(server_group)
            for r in range(self.nworkers_per_group)
        ]

    def group_workers(self, worker_group: int) -> list[int]:
        return [self.worker_id(worker_group, r) for r in range(self.nworkers_per_group)]

    def shard_index(self, server_group: int, shard: int) -> int:
        return server_group * self.nshards + shard


@dataclass(frozen=True)
class PSKeys:
    scope: str

    @property
    def slice_map(self) -> str:
        return f"{self.scope}:ps:slices"

    def _shard(self, server_group: int, shard: int) -> str:
        return f"{self.scope}:ps:sg{server_group}:s{shard}"

    def params(self, server_group: int, shard: int) -> str:
        """The shard's parameters: one blob of frames, all at the current version."""
        return self._shard(server_group, shard) + ":params"

    def staged(self, server_group: int, shard: int) -> str:
        """A copy of the parameters blob that the shard overwrites, slice by slice, as it
        updates slices early, and renames to `params` when it commits the version."""
        return self._shard(server_group, shard) + ":staged"

    def state(self, server_group: int, shard: int) -> str:
        """Hash: version (the current one), snapshot (the version of the last snapshot) and
        updater (the updater state at the snapshot, safetensors bytes)."""
        return self._shard(server_group, shard) + ":state"

    def snapshot(self, server_group: int, shard: int) -> str:
        """The shard's parameters blob at its last snapshot."""
        return self._shard(server_group, shard) + ":snapshot"

    def log(self, server_group: int, shard: int) -> str:
        """List of the updates applied since the last snapshot, in order (JSON records)."""
        return self._shard(server_group, shard) + ":log"

    def grads(self, server_group: int, shard: int) -> str:
        """Stream of gradient messages for the shard."""
        return self._shard(server_group, shard) + ":grads"

    def notify(self, server_group: int, shard: int, worker: int) -> str:
        """List the shard pushes the new version to once a worker's group update is applied."""
        return self._shard(server_group, shard) + f":notify:w{worker}"

    def clocks(self, server_group: int) -> str:
        """Hash worker id -> steps done, for bounded staleness."""
        return f"{self.scope}:ps:sg{server_group}:clocks"

    def done(self, server_group: int) -> str:
        """Set of the server group's workers that finished; the shards stop when all did."""
        return f"{self.scope}:ps:sg{server_group}:done"

    def norms(self, server_group: int, group: int, step: int) -> str:
        """Hash shard -> squared norm of its part of a group's averaged gradient at `step`."""
        return f"{self.scope}:ps:sg{server_group}:norms:g{group}:{step}"

    @property
    def pattern(self) -> str:
        return f"{self.scope}:ps:*"


class Connections:
    """Redis clients: the main one and one per parameter-server Redis, shared by shards."""

    def __init__(self, redis_url: str, ps_urls: Sequence[str] = ()) -> None:
        self.main_url = redis_url
        self.ps_urls = list(ps_urls) or [redis_url]
        self._clients: dict[str, redis.Redis] = {}

    def client(self, url: str) -> redis.Redis:
        if url not in self._clients:
            # Replies to blocking reads come within BLOCK_SECONDS; anything slower is a fault.
            self._clients[url] = redis.Redis.from_url(
                url, socket_timeout=SOCKET_TIMEOUT, command_packer=_PACKER
            )
        return self._clients[url]

    @property
    def main(self) -> redis.Redis:
        return self.client(self.main_url)

    def shard_url(self, plan: PSPlan, server_group: int, shard: int) -> str:
        return self.ps_urls[plan.shard_index(server_group, shard) % len(self.ps_urls)]

    def shard_client(self, plan: PSPlan, server_group: int, shard: int) -> redis.Redis:
        return self.client(self.shard_url(plan, server_group, shard))

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def clear_ps_keys(connections: Connections, keys: PSKeys) -> int:
    """Delete a job's parameter-server keys from every Redis it used; returns how many."""
    urls = dict.fromkeys([connections.main_url, *connections.ps_urls])
    return sum(delete_matching(connections.client(url), keys.pattern) for url in urls)
