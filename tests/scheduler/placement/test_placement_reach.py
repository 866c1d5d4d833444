"""Placement and nodes that cannot reach a parameter-server Redis: pure functions."""

from __future__ import annotations

import pytest

from dsl.frameworks import FRAMEWORK_SPECS
from dsl.schema import ClusterConfig
from dsl.topology import resolve_topology
from scheduler.placement.plan import (
    NodeCapacity,
    PlacementRequest,
    fits_empty_cluster,
    plan_placement,
    plan_queue,
    unreachable_note,
)

REFUSED = "10.0.0.3:6379: connection refused"


def node(name: str, slots: int, *, used: int = 0, unreachable: tuple[str, ...] = ()):
    return NodeCapacity(name, f"q.{name}", slots, slots_used=used, ps_unreachable=unreachable)


def ps_job(job_id: int, workers: int = 2, servers: int = 1) -> PlacementRequest:
    return PlacementRequest(
        job_id, workers=[(0, r) for r in range(workers)], servers=[(0, r) for r in range(servers)]
    )


def allreduce_job(job_id: int, workers: int = 2) -> PlacementRequest:
    return PlacementRequest(job_id, workers=[(0, r) for r in range(workers)])


def placed_on(request: PlacementRequest, nodes: list[NodeCapacity]) -> list[str] | None:
    plan = plan_placement(request, nodes)
    return None if plan is None else plan.nodes()


@pytest.mark.parametrize("framework", FRAMEWORK_SPECS.names())
def test_the_parameter_server_frameworks_are_the_ones_that_use_its_redis(framework: str) -> None:
    request = PlacementRequest.from_topology(
        1, resolve_topology(ClusterConfig.model_validate({"framework": framework}))
    )
    assert request.parameter_server == FRAMEWORK_SPECS.get(framework).needs_servers


def test_an_allreduce_hybrid_uses_the_parameter_server_redis() -> None:
    hybrid = ClusterConfig(
        framework="allreduce",
        nworker_groups=2,
        nworkers_per_group=2,
        nserver_groups=1,
        nservers_per_group=1,
        server_worker_separate=True,
    )
    assert PlacementRequest.from_topology(1, resolve_topology(hybrid)).parameter_server


def test_no_process_of_a_ps_job_goes_to_a_node_that_cannot_reach_its_redis() -> None:
    nodes = [node("a", 3), node("b", 8, unreachable=(REFUSED,))]
    assert placed_on(ps_job(1), nodes) == ["a"]  # b, the roomier node, is skipped
    # A job without server shards goes anywhere: best fit puts it on the smaller node...
    assert placed_on(allreduce_job(2, workers=3), nodes) == ["a"]
    # ... and on the unreachable one when only that one has the room.
    assert placed_on(allreduce_job(3, workers=5), nodes) == ["b"]
    assert placed_on(ps_job(4, workers=4), nodes) is None
    assert not fits_empty_cluster(ps_job(4, workers=4), nodes)


def test_the_reason_names_the_node_and_the_address_and_the_queue_moves_on() -> None:
    nodes = [node("node-1", 2), node("node-2", 4, unreachable=(REFUSED, "ps-2:6380: timeout"))]
    decision = plan_queue([ps_job(1), allreduce_job(2, workers=4)], nodes)
    assert [request.job_id for request, _ in decision.placed] == [2]
    assert decision.placed[0][1].nodes() == ["node-2"]
    assert decision.waiting == {
        1: "needs 2 worker(s) + 1 server shard(s): 3 slot(s); the cluster cannot fit it even "
        "when idle (1 node(s), 2 slot(s), 0 GPU(s)); node-2 cannot reach parameter-server "
        "Redis 10.0.0.3:6379: connection refused; node-2 cannot reach parameter-server Redis "
        "ps-2:6380: timeout"
    }


def test_a_ps_job_waiting_for_room_says_which_nodes_it_cannot_use() -> None:
    nodes = [node("node-1", 3, used=1), node("node-2", 4, unreachable=(REFUSED,))]
    decision = plan_queue([ps_job(1)], nodes)
    assert decision.waiting[1] == (
        "waiting for free resources: needs 2 worker(s) + 1 server shard(s): 3 slot(s); "
        "node-2 cannot reach parameter-server Redis 10.0.0.3:6379: connection refused"
    )


def test_only_alive_nodes_are_named_and_only_for_ps_jobs() -> None:
    lost = NodeCapacity("node-3", "q.node-3", 4, alive=False, ps_unreachable=(REFUSED,))
    nodes = [node("node-1", 4), node("node-2", 4, unreachable=(REFUSED,)), lost]
    assert unreachable_note(ps_job(1), nodes) == (
        "; node-2 cannot reach parameter-server Redis 10.0.0.3:6379: connection refused"
    )
    assert unreachable_note(allreduce_job(2), nodes) == ""
    assert unreachable_note(ps_job(3), [node("node-1", 4)]) == ""


def test_a_node_that_reaches_its_redis_again_takes_ps_jobs() -> None:
    before = [node("node-1", 4, unreachable=(REFUSED,))]
    assert placed_on(ps_job(1), before) is None
    assert placed_on(ps_job(1), [node("node-1", 4)]) == ["node-1"]
