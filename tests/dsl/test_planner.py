"""The pipeline planner and its costs: balanced cuts, the memory cap, written stages, the plan's
invariants and figures, and costs estimated from the net or measured on batches."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dsl import planner
from dsl.compiler import CompiledJob, compile_job
from dsl.costs import LayerCost, estimate_costs, profile_costs
from dsl.errors import JobSpecError
from dsl.layers.base import BuildContext
from dsl.planner import MB, PipelinePlan, pinned_last, plan_pipeline

CTX = BuildContext(sample_shape=(1, 8, 8), num_classes=10)


def job_of(layers: str, pipeline: str, batch_size: int = 16) -> CompiledJob:
    text = (
        "name: plan\n"
        f"data: {{source: digits, batch_size: {batch_size}}}\n"
        "neuralnet:\n  layers:\n"
        + "".join(f"    - {line.strip()}\n" for line in layers.strip().splitlines())
        + "updater: {type: sgd, lr: {base: 0.1}}\ntrain_steps: 1\n"
        + f"pipeline: {pipeline}\n"
    )
    return compile_job(text, CTX)


# One huge dense layer (16 -> 4096) and the one reading it among small ones: by layer count
# the even cut is after r2, by cost it is after big.
HEAVY = """
{name: data, type: input}
{name: fc1, type: dense, srclayers: [data], units: 16}
{name: r1, type: relu, srclayers: [fc1]}
{name: fc2, type: dense, srclayers: [r1], units: 16}
{name: r2, type: relu, srclayers: [fc2]}
{name: big, type: dense, srclayers: [r2], units: 4096}
{name: fc3, type: dense, srclayers: [big], units: 16}
{name: r3, type: relu, srclayers: [fc3]}
{name: fc4, type: dense, srclayers: [r3], units: 10}
{name: loss, type: softmax_loss, srclayers: [fc4]}
"""

# Four equally fast layers whose outputs differ in size (see test_a_memory_cap_moves_the_cut).
CHAIN = """
{name: data, type: input}
{name: l1, type: dense, srclayers: [data], units: 8}
{name: l2, type: dense, srclayers: [l1], units: 8}
{name: l3, type: dense, srclayers: [l2], units: 8}
{name: l4, type: dense, srclayers: [l3], units: 10}
{name: loss, type: softmax_loss, srclayers: [l4]}
"""
CHAIN_COSTS = {
    "data": (0.0, 0),
    "l1": (1.0, 2 * MB),
    "l2": (1.0, 6 * MB),
    "l3": (1.0, 1 * MB),
    "l4": (1.0, 1 * MB),
    "loss": (0.0, 0),
}

# Branches, a concat, a metric and a layer of the test phase only.
BRANCHED = """
{name: data, type: input}
{name: flat, type: flatten, srclayers: [data]}
{name: fc1, type: dense, srclayers: [flat], units: 32}
{name: r1, type: relu, srclayers: [fc1]}
{name: a, type: dense, srclayers: [r1], units: 16}
{name: b, type: dense, srclayers: [r1], units: 16}
{name: both, type: concat, srclayers: [a, b]}
{name: fc2, type: dense, srclayers: [both], units: 10}
{name: skip, type: dense, srclayers: [flat], units: 10}
{name: sum, type: add, srclayers: [fc2, skip]}
{name: loss, type: softmax_loss, srclayers: [sum]}
{name: acc, type: accuracy, srclayers: [sum], include: [test]}
"""


def check_invariants(job: CompiledJob, plan: PipelinePlan) -> None:
    """What the runtime relies on (dsl/planner.py's module docstring)."""
    order = [c.config.name for c in job.net.compiled]
    stage_of = plan.stage_of()
    assert sorted(stage_of) == sorted(order)
    assert sum(len(stage.layers) for stage in plan.stages) == len(order)  # exactly once
    for stage in plan.stages:
        assert stage.layers, "a stage runs nothing"
        assert list(stage.layers) == [name for name in order if name in stage.layers]
    last = len(plan.stages) - 1
    for layer in job.net.compiled:
        name = layer.config.name
        if layer.config.type == "input":
            assert stage_of[name] == 0
        if pinned_last(layer):
            assert stage_of[name] == last
        for ref in layer.sources:
            assert stage_of[ref.layer] <= stage_of[name], f"{name} reads a later {ref.layer}"
    assert plan.layer_lists() == [list(stage.layers) for stage in plan.stages]


def test_the_cut_balances_the_cost_around_a_heavy_layer() -> None:
    job = job_of(HEAVY, "{stages: 2, microbatches: 4}")
    plan = plan_pipeline(job)
    assert plan.layer_lists() == [
        ["data", "fc1", "r1", "fc2", "r2", "big"],
        ["fc3", "r3", "fc4", "loss"],
    ]
    times = [stage.time_ms for stage in plan.stages]
    assert 0.5 < times[0] / times[1] < 2
    check_invariants(job, plan)


def test_measured_costs_replace_the_estimates() -> None:
    job = job_of(HEAVY, "{stages: 3, microbatches: 4}")
    costs = {c.config.name: LayerCost(1.0, 1000) for c in job.net.compiled}
    costs["fc2"] = LayerCost(10.0, 1000)
    plan = plan_pipeline(job, costs)
    assert ("fc2",) in [stage.layers for stage in plan.stages]  # anything more would be slower
    assert plan.measured and plan.to_dict()["costs"] == "measured"
    assert max(stage.time_ms for stage in plan.stages) == 10.0
    check_invariants(job, plan)
    with pytest.raises(ValueError, match="costs lack the layers fc2"):
        plan_pipeline(job, {name: cost for name, cost in costs.items() if name != "fc2"})


def test_a_memory_cap_moves_the_cut() -> None:
    # 1f1b with 2 stages and 4 micro-batches: stage 0 keeps 2 micro-batches in flight, stage 1
    # one; a stage keeps its own outputs and what it receives. After l2 (2 ms | 2 ms) stage 0
    # keeps (2 + 6) MB x 2/4 = 4 MB; after l1 (1 ms | 3 ms) the stages keep 1 and 2.5 MB.
    free = plan_pipeline(job_of(CHAIN, "{stages: 2, microbatches: 4}"), CHAIN_COSTS)
    assert free.layer_lists() == [["data", "l1", "l2"], ["l3", "l4", "loss"]]
    assert [stage.activation_mb for stage in free.stages] == [4.0, 2.0]
    capped = job_of(CHAIN, "{stages: 2, microbatches: 4, max_stage_memory_mb: 3}")
    plan = plan_pipeline(capped, CHAIN_COSTS)
    assert plan.layer_lists() == [["data", "l1"], ["l2", "l3", "l4", "loss"]]
    assert [stage.activation_mb for stage in plan.stages] == [1.0, 2.5]
    assert plan.stages[1].inputs == ("l1",)
    check_invariants(capped, plan)


def test_a_cap_no_cut_fits_is_a_located_error() -> None:
    job = job_of(CHAIN, "{stages: 2, microbatches: 4, max_stage_memory_mb: 2}")
    with pytest.raises(JobSpecError) as info:
        plan_pipeline(job, CHAIN_COSTS)
    (issue,) = info.value.issues
    assert issue.path == "pipeline.max_stage_memory_mb"
    assert (issue.line, issue.column) == (13, 40)
    assert issue.message == (
        "no cut of the net into 2 stages keeps every stage's activations within 2 MB; the best "
        "cut keeps 2.5 MB on its fullest stage"
    )
    assert issue.hint == (
        "raise max_stage_memory_mb to 2.5, set rematerialize: true or use more microbatches "
        "(1f1b keeps at most one per stage in flight)"
    )


def test_rematerializing_keeps_only_what_a_stage_receives() -> None:
    # GPipe keeps all 4 micro-batches in flight. Without rematerializing, stage 0 keeps its 8 MB
    # and stage 1 the 6 MB it receives from l2 and its own 2 MB. With it, stage 0 recomputes a
    # quarter of its 8 MB at a time, and stage 1 keeps what it receives and recomputes 2 MB / 4.
    kept = job_of(CHAIN, "{stages: 2, microbatches: 4, schedule: gpipe}")
    assert [s.activation_mb for s in plan_pipeline(kept, CHAIN_COSTS).stages] == [8.0, 8.0]
    job = job_of(CHAIN, "{stages: 2, microbatches: 4, schedule: gpipe, rematerialize: true}")
    plan = plan_pipeline(job, CHAIN_COSTS)
    assert plan.layer_lists() == [["data", "l1", "l2"], ["l3", "l4", "loss"]]
    assert [stage.activation_mb for stage in plan.stages] == [2.0, 6.5]


def test_written_stages_are_taken_in_topological_order() -> None:
    job = job_of(CHAIN, "{stages: [[l1, data], [loss, l3, l2, l4]], schedule: gpipe}")
    plan = plan_pipeline(job)
    assert plan.layer_lists() == [["data", "l1"], ["l2", "l3", "l4", "loss"]]
    params = {row.name: row.params for row in job.table}
    assert plan.stages[0].params == params["l1"]
    assert plan.stages[1].params == params["l2"] + params["l3"] + params["l4"]
    check_invariants(job, plan)


def test_written_stages_over_the_cap_are_a_located_error() -> None:
    job = job_of(
        CHAIN, "{stages: [[data, l1, l2], [l3, l4, loss]], microbatches: 4, max_stage_memory_mb: 3}"
    )
    with pytest.raises(JobSpecError) as info:
        plan_pipeline(job, CHAIN_COSTS)
    (issue,) = info.value.issues
    assert issue.path == "pipeline.max_stage_memory_mb"
    assert issue.message == "stage 0 keeps 4.0 MB of activations, more than max_stage_memory_mb 3"
    assert issue.hint is not None and issue.hint.startswith("move layers out of stage 0, or ")


def test_a_net_too_large_to_search_is_a_located_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner, "MAX_SEARCH", 31)  # 2 stages x 8 body layers^2 / 2 = 64
    job = job_of(HEAVY, "{stages: 2, microbatches: 4}")
    with pytest.raises(JobSpecError) as info:
        plan_pipeline(job)
    (issue,) = info.value.issues
    assert issue.path == "pipeline.stages" and (issue.line, issue.column) == (17, 12)
    assert issue.message == (
        "the planner does not cut a net of 8 layers into 2 stages: it would weigh 64 candidate "
        "stages, more than its limit of 31"
    )
    assert issue.hint == "write the stages as lists of layer names, or use fewer stages"


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7, 8])
def test_every_cut_keeps_the_invariants(count: int) -> None:
    job = job_of(BRANCHED, f"{{stages: {count}, microbatches: 8}}")
    plan = plan_pipeline(job)
    assert len(plan.stages) == count
    check_invariants(job, plan)
    assert plan.stage_of()["acc"] == count - 1


def test_the_plan_s_figures() -> None:
    job = job_of(CHAIN, "{stages: 2, microbatches: 4}")
    plan = plan_pipeline(job, CHAIN_COSTS)
    k, m = 2, 4
    assert plan.bubble == (k - 1) / (m + k - 1)
    assert plan.ideal_speedup == k * m / (m + k - 1)
    assert plan.balance == 1.0  # 2 ms and 2 ms
    assert plan.expected_speedup == plan.ideal_speedup
    lopsided = plan_pipeline(job, {**CHAIN_COSTS, "l4": (3.0, MB)})  # 2 ms | 3 ms at best
    assert [stage.time_ms for stage in lopsided.stages] == [3.0, 3.0]  # l1-l3 | l4
    skewed = {**CHAIN_COSTS, "l1": (5.0, MB)}
    plan = plan_pipeline(job, skewed)
    assert [stage.time_ms for stage in plan.stages] == [5.0, 3.0]
    assert plan.balance == 8.0 / (2 * 5.0)
    assert math.isclose(plan.expected_speedup, 1.6 * 0.8)
    out = json.loads(json.dumps(plan.to_dict()))
    assert out["stages"][0] == {
        "layers": ["data", "l1"],
        "rank": 0,
        "params": 64 * 8 + 8,
        "time_ms": 5.0,
        "activation_mb": 0.5,
        "inputs": [],
    }
    assert out["schedule"] == "1f1b" and out["costs"] == "measured"
    assert out["bubble"] == plan.bubble and out["expected_speedup"] == plan.expected_speedup


def test_estimates_count_multiply_adds_and_outputs() -> None:
    job = job_of(HEAVY, "{stages: 2, microbatches: 4}", batch_size=16)
    costs = estimate_costs(job)
    # big: 16 x 4096 weights, a multiply-add each per sample, forward and twice backward
    flops = 2 * 16 * 4096 * 16 * 3
    assert costs["big"].time_ms == pytest.approx(flops / 5e7)
    assert costs["big"].activation_bytes == 4096 * 4 * 16
    assert costs["data"].time_ms == 0.0
    assert costs["fc3"].time_ms == pytest.approx(costs["big"].time_ms)


def test_estimates_work_on_the_meta_device() -> None:
    with torch.device("meta"):
        job = job_of(HEAVY, "{stages: 2, microbatches: 4}")
    assert plan_pipeline(job).layer_lists()[0][-1] == "big"


def test_profiling_measures_every_layer_on_real_batches() -> None:
    job = job_of(
        """
        {name: data, type: input}
        {name: seq, type: reshape, srclayers: [data], shape: [8, 8]}
        {name: rnn, type: lstm, srclayers: [seq], hidden: 16, output: last}
        {name: norm, type: batchnorm, srclayers: [rnn]}
        {name: fc, type: dense, srclayers: [norm], units: 10}
        {name: loss, type: softmax_loss, srclayers: [fc]}
        {name: acc, type: accuracy, srclayers: [fc], include: [test]}
        """,
        "{stages: 2, microbatches: 2}",
    )
    before = {name: t.clone() for name, t in job.net.state_dict().items()}
    batch = (torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    costs = profile_costs(job, [batch, batch], repeats=2)
    assert sorted(costs) == sorted(c.config.name for c in job.net.compiled)
    # Batches of 8 samples, scaled to the job's batch of 16.
    assert costs["rnn"].activation_bytes == 16 * 16 * 4
    assert costs["data"] == LayerCost(0.0, 16 * 64 * 4)
    assert costs["acc"] == LayerCost(0.0, 0)  # not part of a training step
    assert all(costs[name].time_ms > 0 for name in ("seq", "rnn", "norm", "fc", "loss"))
    after = job.net.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # a copy ran
    plan = plan_pipeline(job, costs)
    assert plan.measured
    check_invariants(job, plan)


def test_virtual_stages_give_each_stage_its_pieces_round_robin_or_in_a_v() -> None:
    """K = 2 stages of 2 pieces each: the chain's four equal layers one piece each; stage 0
    runs pieces 0 and 2 round-robin, or 0 and 3 in ZB-V's V (so it also runs the loss)."""
    for schedule, first in (("interleaved_1f1b", [0, 2]), ("zbv", [0, 3])):
        job = job_of(
            CHAIN, f"{{stages: 2, microbatches: 4, schedule: {schedule}, virtual_stages: 2}}"
        )
        plan = plan_pipeline(job, CHAIN_COSTS)
        assert plan.count == 2 and plan.virtual_stages == 2
        assert [list(s.layers) for s in plan.stages] == [
            ["data", "l1"],
            ["l2"],
            ["l3"],
            ["l4", "loss"],
        ]
        assert plan.pieces_of(0) == first
        assert plan.worker_layers()[0] == [n for p in first for n in plan.stages[p].layers]
        assert plan.rank_times() == [2.0, 2.0] and plan.balance == 1.0
    # The papers' idle time with F = B = W: (K - 1) / V interleaved, a third of it with zero
    # bubble, none with ZB-V; M = 4.
    figures = {}
    for pipeline in (
        "schedule: 1f1b",
        "schedule: interleaved_1f1b, virtual_stages: 2",
        "schedule: zero_bubble",
        "schedule: zbv",
    ):
        plan = plan_pipeline(
            job_of(CHAIN, f"{{stages: 2, microbatches: 4, {pipeline}}}"), CHAIN_COSTS
        )
        figures[plan.schedule] = plan.ideal_speedup
    assert figures == pytest.approx(
        {"1f1b": 8 / 5, "interleaved_1f1b": 8 / 4.5, "zero_bubble": 8 / (4 + 1 / 3), "zbv": 2.0}
    )
