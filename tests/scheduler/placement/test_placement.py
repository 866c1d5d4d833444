"""Gang placement and the queue policy: pure functions, no database, no broker."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from dsl.schema import ClusterConfig, PipelineConfig
from dsl.topology import resolve_topology
from scheduler.placement.plan import (
    NodeCapacity,
    PlacementPlan,
    PlacementRequest,
    fits_empty_cluster,
    order_queue,
    plan_placement,
    plan_queue,
)


def node(name: str, slots: int, gpus: int = 0, *, used: int = 0, alive: bool = True):
    return NodeCapacity(name, f"q.{name}", slots, gpus, slots_used=used, alive=alive)


def job(job_id: int, workers: int, *, groups: int = 1, servers: int = 0, slots: int = 1,
        gpus: int = 0, priority: int = 0) -> PlacementRequest:  # fmt: skip
    return PlacementRequest(
        job_id,
        workers=[(g, r) for g in range(groups) for r in range(workers)],
        servers=[(0, r) for r in range(servers)],
        slots_per_worker=slots,
        gpus_per_worker=gpus,
        priority=priority,
    )


def usage(plan: PlacementPlan) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for a in plan.assignments:
        slots, gpus = out.get(a.node, (0, 0))
        out[a.node] = (slots + a.slots, gpus + a.gpus)
    return out


def test_a_local_job_takes_one_slot_on_one_node() -> None:
    plan = plan_placement(job(1, 1), [node("a", 4)])
    assert plan is not None
    [only] = plan.assignments
    assert (only.role, only.group, only.rank, only.node, only.slots, only.gpus) == (
        "worker", 0, 0, "a", 1, 0,
    )  # fmt: skip


def test_gang_placement_is_all_or_nothing() -> None:
    nodes = [node("a", 2), node("b", 2, used=1)]  # 3 free slots
    assert plan_placement(job(1, 4), nodes) is None
    assert plan_placement(job(1, 3), nodes) is not None
    decision = plan_queue([job(1, 4)], nodes)
    assert decision.placed == []
    assert "waiting for free resources" in decision.waiting[1]


def test_a_group_goes_to_as_few_nodes_as_possible() -> None:
    nodes = [node("a", 2), node("b", 4), node("c", 8)]
    plan = plan_placement(job(1, 4), nodes)
    assert plan is not None
    assert plan.nodes() == ["b"]  # the tightest node that takes the whole group
    plan = plan_placement(job(1, 10), nodes)
    assert plan is not None
    # The largest node first, then the tightest one that takes the rest.
    assert usage(plan) == {"c": (8, 0), "a": (2, 0)}


def test_workers_needing_several_slots_do_not_split_across_nodes() -> None:
    plan = plan_placement(job(1, 2, slots=3), [node("a", 4), node("b", 4)])
    assert plan is not None
    assert usage(plan) == {"a": (3, 0), "b": (3, 0)}
    assert plan_placement(job(1, 3, slots=3), [node("a", 4), node("b", 4)]) is None


def test_servers_take_one_slot_each_and_spread() -> None:
    request = job(1, 2, servers=2)
    plan = plan_placement(request, [node("a", 3), node("b", 2)])
    assert plan is not None
    servers = [a for a in plan.assignments if a.role == "server"]
    assert [(s.slots, s.gpus) for s in servers] == [(1, 0), (1, 0)]
    assert sum(s for s, _ in usage(plan).values()) == request.slots == 4
    assert plan_placement(job(1, 2, servers=4), [node("a", 3), node("b", 2)]) is None


def test_from_topology_matches_the_framework_presets() -> None:
    sandblaster = resolve_topology(ClusterConfig(framework="sandblaster"))
    request = PlacementRequest.from_topology(7, sandblaster)
    assert request.workers == [(0, 0), (0, 1)] and request.servers == [(0, 0)]
    assert request.slots == 3
    downpour_topology = resolve_topology(ClusterConfig(framework="downpour"))
    downpour = PlacementRequest.from_topology(8, downpour_topology)
    assert downpour.workers == [(0, 0), (1, 0)] and len(downpour.servers) == 1
    # The stored dict form (Job.topology) gives the same request.
    assert PlacementRequest.from_topology(7, sandblaster.to_dict()) == request
    allreduce = resolve_topology(
        ClusterConfig.model_validate(
            {"framework": "allreduce", "resources": {"gpus_per_worker": 1, "slots_per_worker": 2}}
        )
    )
    request = PlacementRequest.from_topology(9, allreduce)
    assert (request.slots, request.gpus, request.servers) == (4, 2, [])


def test_gpu_accounting() -> None:
    gpu_node = NodeCapacity("g", "q.g", slots=8, gpus=2)
    assert plan_placement(job(1, 3, gpus=1), [gpu_node]) is None
    plan = plan_placement(job(1, 2, gpus=1), [gpu_node])
    assert plan is not None and usage(plan) == {"g": (2, 2)}
    busy = replace(gpu_node, gpus_used=1)
    assert plan_placement(job(2, 2, gpus=1), [busy]) is None
    # Two GPU jobs in one pass: the second sees the GPUs the first took.
    decision = plan_queue([job(1, 1, gpus=2), job(2, 1, gpus=1)], [gpu_node])
    assert [r.job_id for r, _ in decision.placed] == [1]
    assert "waiting for free resources" in decision.waiting[2]


def test_each_process_gets_gpus_of_its_own_by_index() -> None:
    gpu_node = NodeCapacity("g", "q.g", slots=8, gpus=4)
    # Two jobs in one pass, then a third once GPU 1 (of the first) is in use by a live process.
    decision = plan_queue([job(1, 2, gpus=1), job(2, 1, gpus=2)], [gpu_node])
    devices = {r.job_id: [a.devices for a in p.assignments] for r, p in decision.placed}
    assert devices == {1: [(0,), (1,)], 2: [(2, 3)]}
    busy = replace(gpu_node, gpus_used=1, devices_used=frozenset({1}))
    plan = plan_placement(job(3, 3, gpus=1), [busy])
    assert plan is not None and [a.devices for a in plan.assignments] == [(0,), (2,), (3,)]
    cpu = plan_placement(job(4, 1), [gpu_node])
    assert cpu is not None and cpu.assignments[0].devices == ()


def test_a_worker_asking_more_memory_than_a_nodes_share_goes_elsewhere() -> None:
    small = NodeCapacity("a-small", "q.a", slots=4, memory_mb=4096)  # 1024 MB a slot
    large = NodeCapacity("b-large", "q.b", slots=4, memory_mb=16384)
    request = replace(job(1, 1), memory_mb=2048)
    plan = plan_placement(request, [small, large])
    assert plan is not None and plan.nodes() == ["b-large"]
    assert plan_placement(request, [small]) is None
    assert plan_placement(replace(request, slots_per_worker=2), [small]) is not None


def test_a_job_that_did_not_start_on_a_node_goes_elsewhere_while_it_can() -> None:
    """A job whose processes did not start on node a is placed on b; while b is full it waits
    for b, saying so; and when b could never take it (too small), it goes back to a rather than
    wait for ever."""
    nodes = [node("a", 2), node("b", 2)]
    assert plan_queue([job(1, 2)], nodes).placed[0][1].nodes() == ["a"]  # a, unless avoided
    avoiding = replace(job(1, 2), avoided=frozenset({"a"}))
    [(_, plan)] = plan_queue([avoiding], nodes).placed
    assert plan.nodes() == ["b"]
    busy = plan_queue([avoiding], [node("a", 2), node("b", 2, used=1)])
    assert not busy.placed
    assert busy.waiting == {
        1: "waiting for free resources on nodes other than a: needs 2 worker(s): 2 slot(s)"
    }
    [(_, back)] = plan_queue([avoiding], [node("a", 2), node("b", 1)]).placed
    assert back.nodes() == ["a"]


def test_cpu_work_leaves_gpu_nodes_free() -> None:
    nodes = [NodeCapacity("gpu", "q.gpu", slots=8, gpus=4), node("cpu", 8)]
    plan = plan_placement(job(1, 2), nodes)
    assert plan is not None and plan.nodes() == ["cpu"]


def test_queue_order_is_priority_then_submission() -> None:
    requests = [job(3, 1), job(1, 1), job(2, 1, priority=5), job(4, 1, priority=5)]
    assert [r.job_id for r in order_queue(requests)] == [2, 4, 1, 3]
    decision = plan_queue(requests, [node("a", 2)])
    assert [r.job_id for r, _ in decision.placed] == [2, 4]
    assert decision.order == [2, 4, 1, 3]


def test_strict_fifo_a_waiting_head_blocks_smaller_jobs_behind_it() -> None:
    nodes = [node("a", 4, used=2)]  # 2 free now, 4 when idle
    decision = plan_queue([job(1, 3), job(2, 1)], nodes)
    assert decision.placed == []
    assert decision.waiting[2] == "waiting behind job 1"
    # A higher-priority job goes first even though it was submitted later.
    decision = plan_queue([job(1, 3), job(2, 1, priority=1)], nodes)
    assert [r.job_id for r, _ in decision.placed] == [2]


def test_no_deadlock_two_gangs_that_fit_only_one_at_a_time() -> None:
    nodes = [node("a", 2), node("b", 2)]
    decision = plan_queue([job(1, 3), job(2, 3)], nodes)
    assert [r.job_id for r, _ in decision.placed] == [1]  # one whole gang, not two halves
    [(_, plan)] = decision.placed
    used = usage(plan)
    after = [replace(n, slots_used=used.get(n.name, (0, 0))[0]) for n in nodes]
    assert plan_queue([job(2, 3)], after).placed == []
    # When job 1 ends its slots are free again and job 2 runs.
    assert [r.job_id for r, _ in plan_queue([job(2, 3)], nodes).placed] == [2]


def test_a_job_too_big_for_the_cluster_does_not_block_others() -> None:
    nodes = [node("a", 4), node("b", 4)]
    huge = job(1, 20, priority=10)
    assert not fits_empty_cluster(huge, nodes)
    decision = plan_queue([huge, job(2, 2), job(3, 8, gpus=1)], nodes)
    assert [r.job_id for r, _ in decision.placed] == [2]
    assert "cannot fit it even when idle" in decision.waiting[1]
    assert "2 node(s), 8 slot(s), 0 GPU(s)" in decision.waiting[1]
    assert "cannot fit it even when idle" in decision.waiting[3]


def test_lost_nodes_are_not_used() -> None:
    nodes = [node("a", 2), node("b", 8, alive=False)]
    assert plan_placement(job(1, 4), nodes) is None
    plan = plan_placement(job(1, 2), nodes)
    assert plan is not None and plan.nodes() == ["a"]
    decision = plan_queue([job(1, 4), job(2, 1)], nodes)
    assert "cannot fit it even when idle (1 node(s), 2 slot(s)" in decision.waiting[1]
    assert [r.job_id for r, _ in decision.placed] == [2]


nodes_strategy = st.lists(
    st.builds(
        lambda i, slots, gpus, used, gused, alive: NodeCapacity(
            f"n{i}", f"q{i}", slots, gpus, min(used, slots), min(gused, gpus), alive
        ),
        st.integers(0, 1000),
        st.integers(1, 8),
        st.integers(0, 4),
        st.integers(0, 8),
        st.integers(0, 4),
        st.booleans(),
    ),
    max_size=5,
    unique_by=lambda n: n.name,
)


@settings(max_examples=300, deadline=None)
@given(
    nodes=nodes_strategy,
    groups=st.integers(1, 3),
    per_group=st.integers(1, 4),
    servers=st.integers(0, 3),
    slots=st.integers(1, 3),
    gpus=st.integers(0, 2),
)
def test_plans_are_valid_and_found_whenever_one_exists(
    nodes: list[NodeCapacity], groups: int, per_group: int, servers: int, slots: int, gpus: int
) -> None:
    request = job(1, per_group, groups=groups, servers=servers, slots=slots, gpus=gpus)
    plan = plan_placement(request, nodes)
    alive = [n for n in nodes if n.alive]
    # Workers are all the same size, so a placement exists exactly when the nodes have room
    # for that many of them and the slots left over take the servers.
    room = sum(n.fits(slots, gpus) for n in alive)
    left = sum(n.free_slots for n in alive) - len(request.workers) * slots
    assert (plan is not None) == (room >= len(request.workers) and left >= len(request.servers))
    if plan is None:
        return
    placed = sorted((a.role, a.group, a.rank) for a in plan.assignments)
    wanted = sorted(
        [("worker", g, r) for g, r in request.workers]
        + [("server", g, r) for g, r in request.servers]
    )
    assert placed == wanted
    by_name = {n.name: n for n in alive}
    taken = [(a.node, i) for a in plan.assignments for i in a.devices]
    assert len(taken) == len(set(taken)) == len(request.workers) * gpus  # never shared
    for name, (used_slots, used_gpus) in usage(plan).items():
        assert name in by_name  # never a lost node
        assert used_slots <= by_name[name].free_slots
        assert used_gpus <= by_name[name].free_gpus


RMSNORM = {"kind": "layer", "type": "rmsnorm", "plugin": "trainyard_rmsnorm", "version": "1.2"}


def test_a_plugin_job_goes_only_to_nodes_with_the_plugin() -> None:
    with_it = replace(node("b", 4), plugins={"trainyard_rmsnorm": "1.2"})
    older = replace(node("c", 8), plugins={"trainyard_rmsnorm": "1.1"})
    topology = resolve_topology(ClusterConfig(framework="allreduce", nworkers_per_group=2))
    request = PlacementRequest.from_topology(7, topology, plugins=[RMSNORM])
    plan = plan_placement(request, [node("a", 8), with_it, older])
    assert plan is not None and plan.nodes() == ["b"]
    # without the plugin the job would take the tightest node that fits it, not b
    assert plan_placement(replace(request, plugins=()), [node("a", 2), with_it]).nodes() == ["a"]  # type: ignore[union-attr]


def test_a_plugin_job_no_node_has_waits_with_the_reason() -> None:
    request = PlacementRequest.from_topology(
        7, resolve_topology(ClusterConfig()), plugins=[RMSNORM]
    )
    other = job(8, 1)
    older = replace(node("c", 8), plugins={"trainyard_rmsnorm": "1.1"})
    decision = plan_queue([request, other], [node("a", 8), older])
    assert decision.waiting == {
        7: "needs plugin layer 'rmsnorm' (trainyard_rmsnorm 1.2); no node has it"
    }
    assert [placed.job_id for placed, _ in decision.placed] == [8]


BROKEN = "plugin broken (/p/broken.py) failed to load: RuntimeError: no"


def test_a_node_whose_plugin_failed_takes_no_jobs_and_says_why() -> None:
    broken = replace(node("a", 8), plugin_error=BROKEN)  # first by name, and roomiest
    plan = plan_placement(job(7, 1), [broken, node("b", 4)])
    assert plan is not None and plan.nodes() == ["b"]
    decision = plan_queue([job(7, 2)], [broken])
    assert decision.placed == []
    assert decision.waiting[7].endswith(f"; a takes no jobs: {BROKEN}"), decision.waiting
    # a plugin job the failed node would have the plugin for: not "no node has it" alone
    request = PlacementRequest.from_topology(
        8, resolve_topology(ClusterConfig()), plugins=[RMSNORM]
    )
    assert plan_queue([request], [broken, node("b", 4)]).waiting == {
        8: f"needs plugin layer 'rmsnorm' (trainyard_rmsnorm 1.2); no node has it; "
        f"a takes no jobs: {BROKEN}"
    }


def test_an_asynchronous_pipelines_stages_go_together_and_its_shards_apart() -> None:
    """2 downpour pipelines of 2 stages and a shard per stage: each pipeline's stages on one
    node (they talk at every micro-batch), the shards spread over what is left."""
    topology = resolve_topology(ClusterConfig(framework="downpour"), PipelineConfig(stages=2))
    request = PlacementRequest.from_topology(10, topology)
    assert request.workers == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert request.servers == [(0, 0), (0, 1)] and request.slots == 6
    plan = plan_placement(request, [node("a", 3), node("b", 3)])
    assert plan is not None
    where = {(a.role, a.group, a.rank): a.node for a in plan.assignments}
    assert where[("worker", 0, 0)] == where[("worker", 0, 1)]
    assert where[("worker", 1, 0)] == where[("worker", 1, 1)]
    assert where[("worker", 0, 0)] != where[("worker", 1, 0)]
    assert usage(plan) == {"a": (3, 0), "b": (3, 0)}
    assert plan_placement(request, [node("a", 5)]) is None  # all or nothing
