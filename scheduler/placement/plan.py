"""Gang placement of a job's processes on nodes: pure functions over plain dataclasses.

A job is placed whole or not at all: every worker of every worker group and every separate
server shard gets a node with free slots (and GPUs), or the job keeps waiting.

The queue is shared fairly between users (`order_queue`): higher priority first (only admins
set it above the default), then the users holding fewest slots, taking turns (each user's
first queued job, then each one's second, ...), then submission order. So one user's flood of
jobs does not hold back another user's job. When the job whose turn it is does not fit now,
the jobs behind it wait too, so a large job is never starved by a stream of small ones. Two
kinds of job are passed over without blocking the queue: one that could not fit even on the
empty cluster, and one whose owner holds their quota of running jobs, slots or GPUs (it starts
when their other jobs end).

A job with server shards (the parameter-server frameworks and allreduce hybrids) places none of
its processes on a node that cannot reach a parameter-server Redis (scheduler/agent/ps_reach.py):
its workers and shards all talk to those servers. Its waiting reason names such nodes.

No database and no broker here; the scheduler loop feeds these functions from SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # dsl.topology imports the job language, and with it torch
    from dsl.topology import Topology


@dataclass(frozen=True)
class NodeCapacity:
    """A node agent as placement sees it: what it has and what its allocations use."""

    name: str
    queue: str
    slots: int
    gpus: int = 0
    slots_used: int = 0
    gpus_used: int = 0
    alive: bool = True
    # The parameter-server Redis servers its agent cannot reach, each "host:port: error".
    ps_unreachable: tuple[str, ...] = ()
    # The plugins its processes load, name -> version.
    plugins: Mapping[str, str] = field(default_factory=dict)
    # Why a plugin failed to load in its agent: it takes no jobs. "": every plugin loaded.
    plugin_error: str = ""
    memory_mb: int = 0  # what its worker processes may use together (0: its agent does not say)
    # The indices of its GPUs that live processes use: each GPU is one process's alone.
    devices_used: frozenset[int] = frozenset()

    @property
    def memory_per_slot_mb(self) -> int:
        return self.memory_mb // self.slots if self.slots else 0

    def free_devices(self, count: int) -> tuple[int, ...]:
        """The `count` lowest GPU indices no live process uses (fewer if there are not)."""
        free = [i for i in range(self.gpus) if i not in self.devices_used]
        return tuple(free[:count])

    def takes(self, request: PlacementRequest) -> bool:
        """Whether any process of `request` may go here (room aside): not a node whose share of
        memory for a worker's slots is less than the memory the job's workers asked for, nor
        one without a plugin the job uses, nor one whose own plugin failed to load."""
        if not self.alive or self.plugin_error:
            return False
        if request.parameter_server and self.ps_unreachable:
            return False
        share = self.memory_per_slot_mb * request.slots_per_worker
        if request.memory_mb and self.memory_mb and share < request.memory_mb:
            return False
        return all(self.has(need) for need in request.plugins)

    def has(self, need: PluginNeed) -> bool:
        """Whether its processes load the plugin `need` names, at the version it names."""
        return self.plugins.get(need.plugin) == need.version

    @property
    def free_slots(self) -> int:
        return max(self.slots - self.slots_used, 0)

    @property
    def free_gpus(self) -> int:
        return max(self.gpus - self.gpus_used, 0)

    def fits(self, slots: int, gpus: int) -> int:
        """How many processes of (slots, gpus) each still fit on this node."""
        if not self.alive:
            return 0
        by_slots = self.free_slots // slots if slots else 0
        return min(by_slots, self.free_gpus // gpus) if gpus else by_slots


@dataclass(frozen=True)
class PluginNeed:
    """A plugin type a job uses: only nodes whose processes load the plugin take it."""

    kind: str  # layer | updater
    type: str
    plugin: str
    version: str

    def describe(self) -> str:
        version = f" {self.version}" if self.version else ""
        return f"plugin {self.kind} '{self.type}' ({self.plugin}{version})"


@dataclass(frozen=True)
class PlacementRequest:
    """What one job needs: its workers and separate server shards as (group, rank) pairs."""

    job_id: int
    workers: list[tuple[int, int]]
    servers: list[tuple[int, int]] = field(default_factory=list)
    slots_per_worker: int = 1
    gpus_per_worker: int = 0
    priority: int = 0
    owner_id: int = 0
    plugins: tuple[PluginNeed, ...] = ()
    memory_mb: int = 0  # each worker's cluster.resources.memory_mb (0: its slots' share)
    # Nodes its processes did not start on (or were stuck on): it goes elsewhere while the
    # other nodes could take it, and back to them only when none could.
    avoided: frozenset[str] = frozenset()

    # Server shards exchange parameters over the network; they need a CPU slot, never a GPU.
    SLOTS_PER_SERVER: ClassVar[int] = 1

    @classmethod
    def from_topology(
        cls,
        job_id: int,
        topology: Topology | Mapping[str, Any],
        *,
        priority: int = 0,
        owner_id: int = 0,
        plugins: Iterable[Mapping[str, str]] = (),
        avoided: Iterable[str] = (),
    ) -> PlacementRequest:
        """From a resolved Topology or its `to_dict()` form (as jobs store it), the plugin
        types the job uses (as jobs store them) and the nodes it avoids."""
        t: Mapping[str, Any] = topology if isinstance(topology, Mapping) else topology.to_dict()
        server_groups = int(t["nserver_groups"]) if t["server_worker_separate"] else 0
        return cls(
            job_id=job_id,
            workers=[
                (g, r)
                for g in range(int(t["nworker_groups"]))
                for r in range(int(t["nworkers_per_group"]))
            ],
            servers=[
                (g, r) for g in range(server_groups) for r in range(int(t["nservers_per_group"]))
            ],
            slots_per_worker=int(t["slots_per_worker"]),
            gpus_per_worker=int(t["gpus_per_worker"]),
            priority=priority,
            owner_id=owner_id,
            plugins=tuple(PluginNeed(**need) for need in plugins),
            memory_mb=int(t.get("memory_mb") or 0),
            avoided=frozenset(avoided),
        )

    @property
    def parameter_server(self) -> bool:
        """Whether its processes use the parameter-server Redis servers: those of a job with
        server shards do, and only those (dsl/topology.py requires shards of every framework
        that exchanges updates through them)."""
        return bool(self.servers)

    @property
    def slots(self) -> int:
        return len(self.workers) * self.slots_per_worker + len(self.servers) * self.SLOTS_PER_SERVER

    @property
    def gpus(self) -> int:
        return len(self.workers) * self.gpus_per_worker

    def describe(self) -> str:
        gpus = f" and {self.gpus} GPU(s)" if self.gpus else ""
        servers = f" + {len(self.servers)} server shard(s)" if self.servers else ""
        return f"{len(self.workers)} worker(s){servers}: {self.slots} slot(s){gpus}"


@dataclass(frozen=True)
class Assignment:
    role: str  # worker | server
    group: int
    rank: int
    node: str
    slots: int
    gpus: int
    devices: tuple[int, ...] = ()  # the node's GPUs it alone uses, by index


@dataclass(frozen=True)
class PlacementPlan:
    assignments: list[Assignment]

    def nodes(self) -> list[str]:
        return sorted({a.node for a in self.assignments})

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for a in self.assignments:
            counts[a.node] = counts.get(a.node, 0) + 1
        return ", ".join(f"{node} ({n})" for node, n in sorted(counts.items()))


def _take(nodes: dict[str, NodeCapacity], name: str, slots: int, gpus: int) -> tuple[int, ...]:
    """Take room on node `name`; the GPU indices taken (its lowest free ones)."""
    node = nodes[name]
    devices = node.free_devices(gpus)
    nodes[name] = replace(
        node,
        slots_used=node.slots_used + slots,
        gpus_used=node.gpus_used + gpus,
        devices_used=node.devices_used | set(devices),
    )
    return devices


def _place_group(
    nodes: dict[str, NodeCapacity], ranks: list[int], slots: int, gpus: int
) -> list[tuple[int, str, tuple[int, ...]]] | None:
    """Put one worker group on as few nodes as possible: (rank, node, GPU indices) or None."""
    placed: list[tuple[int, str, tuple[int, ...]]] = []
    remaining = list(ranks)
    while remaining:
        room = {name: node.fits(slots, gpus) for name, node in nodes.items()}
        candidates = [name for name, n in room.items() if n > 0]
        if not candidates:
            return None
        whole = [name for name in candidates if room[name] >= len(remaining)]
        if whole:
            # Best fit: the tightest node that takes the whole rest keeps big nodes free.
            # CPU-only work avoids GPU nodes so GPU jobs find them free.
            name = min(whole, key=lambda n: (room[n], 0 if gpus else nodes[n].free_gpus, n))
        else:
            name = min(candidates, key=lambda n: (-room[n], 0 if gpus else nodes[n].free_gpus, n))
        count = min(room[name], len(remaining))
        for rank in remaining[:count]:
            placed.append((rank, name, _take(nodes, name, slots, gpus)))
        remaining = remaining[count:]
    return placed


def plan_placement(
    request: PlacementRequest, nodes: Sequence[NodeCapacity]
) -> PlacementPlan | None:
    """Place every process of `request` on `nodes` (lost nodes, and for a parameter-server
    job the nodes that cannot reach its Redis, are skipped), or None.

    Workers of one job all have the same size, so filling nodes greedily finds a placement
    whenever one exists; servers take one slot each, and the slots left after the workers do
    not depend on where the workers went.
    """
    free = {node.name: node for node in sorted(nodes, key=lambda n: n.name) if node.takes(request)}
    assignments: list[Assignment] = []
    groups: dict[int, list[int]] = {}
    for group, rank in request.workers:
        groups.setdefault(group, []).append(rank)
    for group, ranks in sorted(groups.items()):
        if request.slots_per_worker <= 0:
            return None
        placed = _place_group(free, ranks, request.slots_per_worker, request.gpus_per_worker)
        if placed is None:
            return None
        assignments += [
            Assignment(
                "worker",
                group,
                rank,
                node,
                request.slots_per_worker,
                request.gpus_per_worker,
                devices,
            )
            for rank, node, devices in placed
        ]
    for group, rank in request.servers:
        # Spread shards: each goes to the node with the most free slots (least GPUs on ties).
        candidates = [n for n in free.values() if n.fits(request.SLOTS_PER_SERVER, 0)]
        if not candidates:
            return None
        node = min(candidates, key=lambda n: (-n.free_slots, n.free_gpus, n.name))
        _take(free, node.name, request.SLOTS_PER_SERVER, 0)
        assignments.append(Assignment("server", group, rank, node.name, 1, 0))
    return PlacementPlan(assignments)


def unreachable_note(request: PlacementRequest, nodes: Sequence[NodeCapacity]) -> str:
    """Why alive `nodes` take no process of `request` (it uses the parameter-server Redis and
    they cannot reach it): "; node-2 cannot reach parameter-server Redis 10.0.0.3:6379: ...",
    or ""."""
    if not request.parameter_server:
        return ""
    return "".join(
        f"; {node.name} cannot reach parameter-server Redis {unreachable}"
        for node in sorted(nodes, key=lambda n: n.name)
        if node.alive
        for unreachable in node.ps_unreachable
    )


def plugin_error_note(nodes: Sequence[NodeCapacity]) -> str:
    """Why alive `nodes` take no job at all (a plugin failed to load in their agent):
    "; node-2 takes no jobs: plugin broken (/p/broken.py) failed to load: ...", or ""."""
    return "".join(
        f"; {node.name} takes no jobs: {node.plugin_error}"
        for node in sorted(nodes, key=lambda n: n.name)
        if node.alive and node.plugin_error
    )


def missing_plugin(request: PlacementRequest, nodes: Sequence[NodeCapacity]) -> str | None:
    """Why no alive node can ever take `request`: "needs plugin layer 'rmsnorm' (mylayers 1.2);
    no node has it", or None."""
    alive = [node for node in nodes if node.alive]
    for need in request.plugins:
        if not any(node.has(need) for node in alive):
            return f"needs {need.describe()}; no node has it" + plugin_error_note(alive)
    if request.plugins and not any(node.takes(request) for node in alive):
        needs = ", ".join(need.describe() for need in request.plugins)
        return f"needs {needs}; no node has them all" + plugin_error_note(alive)
    return None


def elsewhere(request: PlacementRequest, usable: Sequence[NodeCapacity]) -> frozenset[str]:
    """The nodes `request` keeps away from: those it avoids, while the other `usable` nodes
    could take it were they idle; none when they could not (it goes back to those it avoids
    rather than waiting for ever)."""
    if not request.avoided:
        return frozenset()
    others = [node for node in usable if node.name not in request.avoided]
    return request.avoided if fits_empty_cluster(request, others) else frozenset()


def fits_empty_cluster(request: PlacementRequest, nodes: Sequence[NodeCapacity]) -> bool:
    """Could the job ever run on these (alive) nodes, were they idle?"""
    empty = [replace(node, slots_used=0, gpus_used=0) for node in nodes]
    return plan_placement(request, empty) is not None


@dataclass(frozen=True)
class OwnerShare:
    """What one user's placed jobs hold now, and their placement quotas (None: no limit)."""

    jobs: int = 0
    slots: int = 0
    gpus: int = 0
    max_jobs: int | None = None
    max_slots: int | None = None
    max_gpus: int | None = None

    def refuses(self, request: PlacementRequest) -> str | None:
        """Why placing `request` now would pass a quota of its owner, or None."""
        if self.max_jobs is not None and self.jobs + 1 > self.max_jobs:
            return (
                f"waiting for its owner's quota running_jobs: {self.jobs} of {self.max_jobs} "
                "job(s) placed"
            )
        if self.max_slots is not None and self.slots + request.slots > self.max_slots:
            return (
                f"waiting for its owner's quota slots: {self.slots} of {self.max_slots} held, "
                f"needs {request.slots}"
            )
        if self.max_gpus is not None and self.gpus + request.gpus > self.max_gpus:
            return (
                f"waiting for its owner's quota gpus: {self.gpus} of {self.max_gpus} held, "
                f"needs {request.gpus}"
            )
        return None

    def plus(self, request: PlacementRequest) -> OwnerShare:
        return replace(
            self,
            jobs=self.jobs + 1,
            slots=self.slots + request.slots,
            gpus=self.gpus + request.gpus,
        )


def order_queue(
    requests: Iterable[PlacementRequest], shares: Mapping[int, OwnerShare] | None = None
) -> list[PlacementRequest]:
    """Scheduling order: higher priority first; then owners holding fewer slots (`shares`),
    taking turns (an owner's n-th queued job after every owner's (n-1)-th); then first
    submitted (lower id). scheduler/store/job_page.py numbers queue positions by the same key."""
    shares = shares or {}
    turn: dict[int, int] = {}
    keyed = []
    for request in sorted(requests, key=lambda r: (-r.priority, r.job_id)):
        rank = turn.get(request.owner_id, 0)
        turn[request.owner_id] = rank + 1
        held = shares[request.owner_id].slots if request.owner_id in shares else 0
        keyed.append(((-request.priority, held, rank, request.job_id), request))
    return [request for _, request in sorted(keyed, key=lambda item: item[0])]


@dataclass(frozen=True)
class QueueDecision:
    """One scheduling pass: the jobs to start now and why each other job waits."""

    placed: list[tuple[PlacementRequest, PlacementPlan]]
    waiting: dict[int, str]  # job id -> reason
    order: list[int]  # job ids in queue order


def plan_queue(
    requests: Iterable[PlacementRequest],
    nodes: Sequence[NodeCapacity],
    shares: Mapping[int, OwnerShare] | None = None,
) -> QueueDecision:
    """Place queued jobs in fair order until the first one that does not fit now.

    Jobs behind one that does not fit wait, whatever their size (no overtaking, so no
    starvation and no partial placement that could deadlock). A job too big for the whole
    cluster is passed over: it cannot run until nodes join, and must not hold the queue. So is
    a job whose owner's placed jobs (`shares`, counting those placed in this pass) hold their
    quota.
    """
    free = list(nodes)
    alive = [node for node in nodes if node.alive]
    owners = dict(shares or {})
    placed: list[tuple[PlacementRequest, PlacementPlan]] = []
    waiting: dict[int, str] = {}
    ordered = order_queue(requests, owners)
    head: int | None = None
    for request in ordered:
        usable = [node for node in alive if node.takes(request)]
        lacking = missing_plugin(request, alive)
        if lacking is not None:
            waiting[request.job_id] = lacking
            continue
        if not fits_empty_cluster(request, usable):
            total_slots = sum(n.slots for n in usable)
            total_gpus = sum(n.gpus for n in usable)
            waiting[request.job_id] = (
                f"needs {request.describe()}; the cluster cannot fit it even when idle "
                f"({len(usable)} node(s), {total_slots} slot(s), {total_gpus} GPU(s))"
                + unreachable_note(request, alive)
                + plugin_error_note(alive)
            )
            continue
        share = owners.get(request.owner_id, OwnerShare())
        over_quota = share.refuses(request)
        if over_quota is not None:
            waiting[request.job_id] = over_quota
            continue
        if head is not None:
            waiting[request.job_id] = f"waiting behind job {head}"
            continue
        away = elsewhere(request, usable)
        plan = plan_placement(request, [node for node in free if node.name not in away])
        if plan is None:
            head = request.job_id
            avoiding = f" on nodes other than {', '.join(sorted(away))}" if away else ""
            waiting[request.job_id] = (
                f"waiting for free resources{avoiding}: needs {request.describe()}"
                + unreachable_note(request, alive)
                + plugin_error_note(alive)
            )
            continue
        free = _apply(free, plan)
        owners[request.owner_id] = share.plus(request)
        placed.append((request, plan))
    return QueueDecision(placed, waiting, [r.job_id for r in ordered])


def _apply(nodes: list[NodeCapacity], plan: PlacementPlan) -> list[NodeCapacity]:
    by_name = {node.name: node for node in nodes}
    for a in plan.assignments:
        node = by_name[a.node]
        by_name[a.node] = replace(
            node,
            slots_used=node.slots_used + a.slots,
            gpus_used=node.gpus_used + a.gpus,
            devices_used=node.devices_used | set(a.devices),
        )
    return [by_name[node.name] for node in nodes]
