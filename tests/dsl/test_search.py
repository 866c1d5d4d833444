"""The `search:` section: its keys, its rules against the base job, and the space's values
compiled into the base job, each problem located in the sweep's YAML."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dsl.compiler import compile_job
from dsl.errors import JobSpecError, SpecIssue
from dsl.layers.base import BuildContext
from dsl.objective import resolve_search
from dsl.search import base_document
from dsl.search_checks import space_issues

CTX = BuildContext(sample_shape=(1, 8, 8), num_classes=10)

BASE = """\
name: t
data: {source: digits, batch_size: 8}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: dense, srclayers: [data], units: 16}
    - {name: relu1, type: relu, srclayers: [fc1]}
    - {name: fc2, type: dense, srclayers: [relu1], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc2]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 100
test: {freq: 20}
"""

SEARCH = """\
search:
  metric: test/accuracy
  mode: max
  algorithm: tpe
  pruner: {type: asha, min_steps: 20, reduction_factor: 3}
  max_trials: 8
  max_parallel: 2
  seed: 0
  space:
    updater.lr.base: {loguniform: [0.001, 0.3]}
    updater.momentum: {uniform: [0.5, 0.9]}
    neuralnet.layers.fc1.units: {choice: [8, 16, 32]}
    cluster.framework: {choice: [local, allreduce]}
"""


def sweep(search: str = SEARCH, base: str = BASE) -> str:
    return base + search


def issues_of(text: str) -> list[SpecIssue]:
    with pytest.raises(JobSpecError) as info:
        compile_job(text, CTX, filename="sweep.yaml")
    return info.value.issues


def only_issue(text: str) -> SpecIssue:
    [issue] = issues_of(text)
    return issue


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def probe(text: str) -> list[SpecIssue]:
    """The space's values compiled into the base job, as the service checks them."""
    compiled = compile_job(text, CTX, filename="sweep.yaml")
    assert compiled.spec.search is not None
    base = base_document(text)

    def compile_trial(values: Mapping[str, Any]) -> object:
        return compile_job(base, CTX, overrides=values)

    return space_issues(compiled.spec.search, compiled.source, compile_trial)


def test_a_sweep_compiles_its_base_job_and_keeps_the_search() -> None:
    job = compile_job(sweep(), CTX)
    search = job.spec.search
    assert search is not None
    assert [row.out_shape for row in job.table if row.name == "fc1"] == [[16]]  # the base value
    assert search.space["updater.lr.base"].kind == "loguniform"
    assert search.space["neuralnet.layers.fc1.units"].choice == [8, 16, 32]
    assert (search.trial_count(), search.max_parallel, search.pruner.type) == (8, 2, "asha")
    assert [(o.metric, o.mode) for o in search.objective_list()] == [("test/accuracy", "max")]
    assert probe(sweep()) == []


def test_base_document_drops_the_search_and_applies_overrides() -> None:
    base = base_document(sweep(), {"train_steps": 7})
    assert "search" not in base and base["train_steps"] == 7
    assert compile_job(base, CTX).spec.search is None


def test_a_path_not_in_the_base_job_is_located_with_a_suggestion() -> None:
    text = sweep(SEARCH.replace("neuralnet.layers.fc1.units", "neuralnet.layers.fc11.units"))
    issue = only_issue(text)
    assert issue.path == "search.space.neuralnet.layers.fc11.units"
    assert issue.line == line_of(text, "fc11.units") and issue.column == 5
    assert issue.message == "the base job has no layer named 'fc11' in 'neuralnet.layers'"
    assert issue.hint == "did you mean 'fc1'?"
    issue = only_issue(sweep(SEARCH.replace("updater.momentum", "updater.momentun")))
    assert "no key 'momentun' under 'updater'" in issue.message
    assert issue.hint == "did you mean 'momentum'?"
    issue = only_issue(sweep(SEARCH.replace("updater.momentum", "updater.lr.base.x")))
    assert "'updater.lr.base' is 0.1 in the base job, not a mapping" in issue.message


def test_reversed_bounds_and_a_loguniform_bound_at_zero() -> None:
    text = sweep(SEARCH.replace("[0.5, 0.9]", "[0.9, 0.5]"))
    issue = only_issue(text)
    assert (issue.path, issue.line) == ("search.space.updater.momentum", line_of(text, "momentum"))
    assert issue.message == "the bounds are reversed: low 0.9 is above high 0.5"
    issue = only_issue(sweep(SEARCH.replace("[0.001, 0.3]", "[0, 0.3]")))
    assert issue.path == "search.space.updater.lr.base"
    assert issue.message == "loguniform bounds must be above 0 (the low bound is 0.0)"


def test_a_space_entry_has_exactly_one_known_form() -> None:
    issue = only_issue(sweep(SEARCH.replace("{uniform: [0.5, 0.9]}", "{normal: [0.5, 0.9]}")))
    assert issue.path == "search.space.updater.momentum.normal"
    assert issue.message == "unknown key 'normal'" and issue.hint == "did you mean 'uniform'?"
    issue = only_issue(sweep(SEARCH.replace("{uniform: [0.5, 0.9]}", "0.5")))
    assert issue.message.startswith("a space entry is one of {loguniform: [low, high]}")
    issue = only_issue(
        sweep(SEARCH.replace("{uniform: [0.5, 0.9]}", "{uniform: [1, 2], int: [1, 2]}"))
    )
    assert issue.message.startswith("a space entry is one of")
    issue = only_issue(sweep(SEARCH.replace("[8, 16, 32]", "[8, 16, 8]")))
    assert issue.message == "choice lists 8 twice"
    issue = only_issue(sweep(SEARCH.replace("[8, 16, 32]", "[8, {a: 1}]")))
    assert "{'a': 1} is not" in issue.message


def test_a_choice_that_makes_a_layer_invalid_is_reported_at_its_entry() -> None:
    text = sweep(SEARCH.replace("[8, 16, 32]", "[8, 0, 32]"))
    [issue] = probe(text)
    assert issue.path == "search.space.neuralnet.layers.fc1.units"
    assert (issue.line, issue.column) == (line_of(text, "fc1.units"), 5)
    assert issue.message.startswith(
        "choice value 0 gives an invalid job: neuralnet.layers[1].units: Input should be greater"
    )


def test_a_system_setting_choice_is_compiled_too() -> None:
    text = sweep(SEARCH.replace("[local, allreduce]", "[local, warp]"))
    [issue] = probe(text)
    assert issue.path == "search.space.cluster.framework"
    assert issue.message.startswith("choice value 'warp' gives an invalid job: cluster.framework")


def test_a_continuous_range_on_a_whole_number_key_is_refused() -> None:
    text = sweep(SEARCH.replace("{choice: [8, 16, 32]}", "{uniform: [8, 32]}"))
    [issue] = probe(text)
    assert issue.path == "search.space.neuralnet.layers.fc1.units"
    assert "valid integer" in issue.message
    assert issue.hint == "the key takes whole numbers: use {int: [low, high]}"
    assert probe(sweep(SEARCH.replace("{choice: [8, 16, 32]}", "{int: [8, 32]}"))) == []


def test_bounds_outside_what_the_key_accepts() -> None:
    text = sweep(SEARCH.replace("[0.5, 0.9]", "[0.5, 1.5]"))
    [issue] = probe(text)  # momentum must be below 1
    assert issue.path == "search.space.updater.momentum"
    assert issue.message.startswith("uniform value 1.5 gives an invalid job: updater.momentum")


def test_a_grid_enumerates_choices_and_int_ranges_only() -> None:
    grid = SEARCH.replace("algorithm: tpe", "algorithm: grid").replace("  max_trials: 8\n", "")
    grid = grid.replace("  pruner: {type: asha, min_steps: 20, reduction_factor: 3}\n", "")
    issues = issues_of(sweep(grid))
    assert {i.path for i in issues} == {
        "search.space.updater.lr.base",
        "search.space.updater.momentum",
    }
    assert all("a grid enumerates values, and" in i.message for i in issues)
    grid = grid.replace("{loguniform: [0.001, 0.3]}", "{choice: [0.01, 0.1]}")
    grid = grid.replace("{uniform: [0.5, 0.9]}", "{int: [0, 0]}")
    job = compile_job(sweep(grid), CTX)
    assert job.spec.search is not None and job.spec.search.trial_count() == 2 * 1 * 3 * 2
    issue = only_issue(
        sweep(grid.replace("  max_parallel: 2", "  max_trials: 5\n  max_parallel: 2"))
    )
    assert issue.path == "search.max_trials"
    assert issue.message.startswith("the grid has 12 points (2 x 1 x 3 x 2)")


def test_a_grid_too_large_says_its_size() -> None:
    grid = SEARCH.replace("algorithm: tpe", "algorithm: grid").replace("  max_trials: 8\n", "")
    grid = grid.replace("{loguniform: [0.001, 0.3]}", "{int: [1, 1000]}")
    grid = grid.replace("{uniform: [0.5, 0.9]}", "{int: [1, 100]}")
    issue = only_issue(sweep(grid))
    assert issue.path == "search.space"
    assert issue.message == (
        "the grid has 600,000 points (1000 x 100 x 3 x 2); a sweep runs at most 10,000"
    )


def test_objectives_metric_and_algorithm_rules() -> None:
    issue = only_issue(sweep(SEARCH.replace("algorithm: tpe", "algorithm: nsga2")))
    assert issue.path == "search.algorithm" and "nsga2 searches several objectives" in issue.message
    no_mode = SEARCH.replace("  mode: max\n", "")
    issue = only_issue(sweep(no_mode.replace("test/accuracy", "samples_per_sec")))
    assert issue.path == "search.metric" and issue.hint == "add mode: max or mode: min"
    # A metric whose name says which way is better needs no mode.
    resolved = resolve_search(compile_job(sweep(no_mode), CTX).spec)
    assert resolved is not None and resolved.objective_list()[0].mode == "max"
    multi = SEARCH.replace(
        "  metric: test/accuracy\n  mode: max\n",
        "  objectives: [{metric: test/accuracy, mode: max}, {metric: train/loss, mode: min}]\n",
    ).replace("algorithm: tpe", "algorithm: nsga2")
    assert only_issue(sweep(multi)).path == "search.pruner.type"  # pruning needs one metric
    multi = multi.replace("{type: asha, min_steps: 20, reduction_factor: 3}", "{type: none}")
    search = compile_job(sweep(multi), CTX).spec.search
    assert search is not None and [o.mode for o in search.objective_list()] == ["max", "min"]
    issue = only_issue(sweep(multi.replace("nsga2", "cmaes")))
    assert issue.path == "search.algorithm" and "optimises one objective" in issue.message


PBT = "{type: pbt, interval: 25, quantile: 0.25, perturb: [0.8, 1.2]}"
PBT_SEARCH = (
    SEARCH.replace("{type: asha, min_steps: 20, reduction_factor: 3}", PBT)
    .replace("  max_trials: 8\n", "")
    .replace("max_parallel: 2", "max_parallel: 4")
    .replace("    cluster.framework: {choice: [local, allreduce]}\n", "")
)


def test_population_based_training_is_checked_against_the_base_job() -> None:
    search = compile_job(sweep(PBT_SEARCH), CTX).spec.search
    assert search is not None and search.pruner.perturb == (0.8, 1.2)
    assert search.trial_count(100) == 16  # 4 members x 4 generations of 25 steps
    text = sweep(PBT_SEARCH.replace("interval: 25", "interval: 30"))
    issue = only_issue(text)
    assert (issue.path, issue.line) == ("search.pruner.interval", line_of(text, "pbt"))
    assert issue.message.startswith("interval 30 does not divide train_steps 100")
    assert issue.hint == "use a divisor of 100 below it, e.g. 5, 10, 20"
    issue = only_issue(sweep(PBT_SEARCH.replace("quantile: 0.25", "quantile: 0.6")))
    assert issue.path == "search.pruner.quantile" and "less than or equal to 0.5" in issue.message
    issue = only_issue(sweep(PBT_SEARCH.replace("[0.8, 1.2]", "[0.8, -1]")))
    assert issue.path == "search.pruner" and "perturb factors must be above 0" in issue.message
    issue = only_issue(sweep(PBT_SEARCH.replace("max_parallel: 4", "max_parallel: 3")))
    assert issue.path == "search.pruner.quantile" and "raise max_parallel to 4" in issue.hint
    issue = only_issue(sweep(PBT_SEARCH + "  max_trials: 16\n"))
    assert issue.path == "search.max_trials"
    issue = only_issue(sweep(PBT_SEARCH + "    train_steps: {int: [50, 100]}\n"))
    assert issue.path == "search.space.train_steps"
    issue = only_issue(sweep(PBT_SEARCH, BASE + "cluster: {framework: allreduce}\n"))
    assert issue.path == "cluster.framework" and "which local jobs do" in issue.message
    issue = only_issue(sweep(SEARCH.replace("min_steps: 20,", "min_steps: 20, interval: 5,")))
    assert issue.path == "search.pruner.interval" and issue.message.startswith(
        "interval is for pbt"
    )
    only = (
        PBT_SEARCH.split("  space:")[0]
        + "  space:\n    neuralnet.layers.fc1.units: {choice: [8, 16]}\n"
    )
    issue = only_issue(sweep(only))
    assert issue.path == "search.space" and "only choices" in issue.message


def test_pruner_rules() -> None:
    issue = only_issue(sweep(SEARCH.replace("min_steps: 20", "min_steps: 100")))
    assert issue.path == "search.pruner.min_steps" and "not below train_steps 100" in issue.message
    issue = only_issue(sweep(SEARCH.replace("type: asha", "type: median")))
    assert issue.path == "search.pruner.reduction_factor"
    assert only_issue(sweep(SEARCH.replace("  max_trials: 8\n", ""))).message.startswith(
        "algorithm tpe needs max_trials"
    )


def test_the_values_checked_at_submission_are_bounded() -> None:
    many = ", ".join(str(n) for n in range(1, 201))
    text = sweep(
        SEARCH.replace("[8, 16, 32]", f"[{many}]").replace("[local, allreduce]", f"[{many}]")
    )
    issue = only_issue(text)
    assert issue.path == "search.space"
    assert issue.message.startswith("the space has 406 values to check")
