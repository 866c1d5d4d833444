"""A job's objective, resolved once from the job, and the rules of the sections that read it
(validate, objective, early_stop, a sweep's metric): every misuse a located error."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dsl.compiler import compile_job
from dsl.errors import JobSpecError, SpecIssue
from dsl.layers.base import BuildContext
from dsl.objective import (
    evaluation_metrics,
    resolve_objective,
    resolve_search,
    selection_warnings,
)
from dsl.schema import JobSpec

CTX = BuildContext(sample_shape=(1, 8, 8), num_classes=10)
REGRESSION = BuildContext(
    sample_shape=(20, 2), num_classes=None, label_shape=(1,), label_is_index=False
)

JOB = """\
name: t
data: {source: digits, batch_size: 8}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc, type: dense, srclayers: [data], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 100
"""
ADDING = """\
name: adding
data: {source: synthetic, task: sequence, num_samples: 200}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: gru, type: gru, srclayers: [data], hidden: 8, output: last}
    - {name: out, type: dense, srclayers: [gru], units: 1}
    - {name: loss, type: euclidean_loss, srclayers: [out]}
train_one_batch: {alg: bptt}
updater: {type: adam, lr: {base: 0.01}}
train_steps: 100
"""
RBM = """\
name: rbm
data: {source: digits}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: flat, type: flatten, srclayers: [data]}
    - {name: rbm, type: rbm, srclayers: [flat], hidden: 16}
train_one_batch: {alg: cd}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 100
"""
VAL = {"data.validation_fraction": 0.1}


def spec(text: str, ctx: BuildContext = CTX, **overrides: Any) -> JobSpec:
    return compile_job(text, ctx, overrides=overrides).spec


def issues(text: str, ctx: BuildContext = CTX, **overrides: Any) -> list[SpecIssue]:
    with pytest.raises(JobSpecError) as info:
        compile_job(text, ctx, overrides=overrides, filename="job.yaml")
    return info.value.issues


def only(text: str, ctx: BuildContext = CTX, **overrides: Any) -> SpecIssue:
    [issue] = issues(text, ctx, **overrides)
    return issue


def objective(text: str, ctx: BuildContext = CTX, **overrides: Any) -> tuple[str, str]:
    found = resolve_objective(spec(text, ctx, **overrides))
    return found.metric, found.mode


def test_the_objective_defaults_in_order() -> None:
    # val/accuracy with a validation split and an accuracy; val/loss with a split; then test/.
    assert objective(JOB, **VAL) == ("val/accuracy", "max")
    assert objective(ADDING, REGRESSION, **VAL) == ("val/loss", "min")
    assert objective(JOB) == ("test/accuracy", "max")
    assert objective(ADDING, REGRESSION) == ("test/loss", "min")
    assert objective(RBM) == ("test/recon_error", "min")
    assert objective(RBM, **VAL) == ("val/recon_error", "min")


def test_a_sources_own_validation_split_counts_as_one() -> None:
    npz = {"data": {"source": "npz", "path": "d.npz", "x_val_key": "xv", "y_val_key": "yv"}}
    assert objective(JOB, **npz) == ("val/accuracy", "max")
    csv = {"data": {"source": "csv", "path": "d.csv", "val_path": "v.csv"}}
    assert objective(JOB, **csv) == ("val/accuracy", "max")


def test_a_given_objective_takes_its_mode_from_its_name_or_as_given() -> None:
    assert objective(JOB, **VAL, **{"objective.metric": "val/loss"}) == ("val/loss", "min")
    given = {"objective": {"metric": "val/loss", "mode": "max"}}
    assert objective(JOB, **VAL, **given) == ("val/loss", "max")
    # A metric layer that reports accuracy too: both names are known.
    layers = yaml.safe_load(JOB)["neuralnet"]["layers"]
    layers.append({"name": "top3", "type": "accuracy", "srclayers": ["fc"], "topk": 3})
    job = spec(JOB, **VAL, **{"neuralnet.layers": layers, "objective.metric": "val/top3/accuracy"})
    assert "top3/accuracy" in evaluation_metrics(job)
    assert resolve_objective(job).mode == "max"


def test_an_objective_the_job_does_not_report_is_located_with_the_names_it_does() -> None:
    issue = only(JOB, **VAL, **{"objective.metric": "val/acuracy"})
    assert issue.path == "objective.metric" and issue.hint == "did you mean 'val/accuracy'?"
    issue = only(ADDING, REGRESSION, **VAL, **{"objective.metric": "val/accuracy"})
    assert issue.path == "objective.metric" and "not a metric of this job" in issue.message
    assert issue.hint is not None and "val/loss" in issue.hint
    issue = only(JOB, **VAL, **{"objective.metric": "train/loss"})
    assert "val/<name> (the validation split) or test/<name>" in issue.message


def test_a_validation_metric_or_section_without_a_validation_split_is_located() -> None:
    text = JOB + "objective: {metric: val/accuracy}\n"
    issue = only(text)
    assert issue.path == "objective.metric" and issue.line == 10
    assert "the job has none" in issue.message and "validation_fraction" in (issue.hint or "")
    issue = only(JOB + "validate: {freq: 10}\n")
    assert issue.path == "validate" and issue.line == 10


def test_early_stop_needs_a_validation_objective() -> None:
    text = JOB + "early_stop: {patience: 3}\n"
    issue = only(text)
    assert issue.path == "early_stop" and issue.line == 10
    assert "objective is test/accuracy (its default" in issue.message
    assert issue.hint is not None and "validation_fraction" in issue.hint
    issue = only(text, **VAL, **{"objective.metric": "test/accuracy"})
    assert issue.hint == "use objective: {metric: val/accuracy}"
    assert resolve_objective(spec(text, **VAL)).metric == "val/accuracy"


def test_early_stop_needs_workers_that_step_together() -> None:
    text = JOB + "early_stop: {patience: 3}\n"
    for framework in ("sandblaster", "downpour", "hogwild"):
        issue = only(text, **VAL, **{"cluster.framework": framework})
        assert issue.path == "early_stop" and "server shards" in issue.message
    hybrid = {"cluster.framework": "allreduce", "cluster.nworker_groups": 2}
    hybrid |= {"cluster.nserver_groups": 1, "cluster.nservers_per_group": 1}
    hybrid |= {"cluster.server_worker_separate": True}
    assert "server shards" in only(text, **VAL, **hybrid).message
    assert spec(text, **VAL, **{"cluster.framework": "allreduce"}).early_stop is not None


def test_early_stop_is_no_pbt_members_business() -> None:
    text = JOB + (
        "early_stop: {patience: 3}\n"
        "search:\n"
        "  pruner: {type: pbt, interval: 25}\n"
        "  algorithm: random\n"
        "  max_parallel: 4\n"
        "  space: {updater.lr.base: {loguniform: [0.01, 0.5]}}\n"
    )
    issue = only(text, **VAL)
    assert issue.path == "early_stop" and "generations" in issue.message


def test_validation_keys_of_a_source_are_one_split() -> None:
    both = {"data.validation_fraction": 0.1, "data.val_path": "v.csv"}
    issue = only(JOB, **{"data.source": "csv", "data.path": "d.csv", **both})
    assert issue.path == "data" and "either validation_fraction or val_path" in issue.message
    half = {"data.source": "npz", "data.path": "d.npz", "data.x_val_key": "xv"}
    assert "give both" in only(JOB, **half).message
    assert only(JOB, **{"data.validation_fraction": 1.0}).path == "data.validation_fraction"


def test_a_sweep_selects_on_the_base_jobs_objective_by_default() -> None:
    search = (
        "search:\n"
        "  algorithm: random\n"
        "  max_trials: 4\n"
        "  pruner: {type: asha, min_steps: 10}\n"
        "  space: {updater.lr.base: {loguniform: [0.01, 0.5]}}\n"
    )
    resolved = resolve_search(spec(JOB + "validate: {freq: 10}\n" + search, **VAL))
    assert resolved is not None and (resolved.metric, resolved.mode) == ("val/accuracy", "max")
    # As the sweep stores it: metric and mode written out.
    stored = resolved.model_dump(mode="json", exclude_unset=True)
    assert (stored["metric"], stored["mode"]) == ("val/accuracy", "max")
    assert selection_warnings(spec(JOB + "validate: {freq: 10}\n" + search, **VAL)) == []


def test_selecting_on_the_test_split_is_allowed_with_a_warning() -> None:
    search = (
        "search:\n"
        "  metric: test/accuracy\n"
        "  algorithm: random\n"
        "  max_trials: 4\n"
        "  space: {updater.lr.base: {loguniform: [0.01, 0.5]}}\n"
    )
    [warning] = selection_warnings(spec(JOB + search))
    assert warning == (
        "the sweep selects on test/accuracy: selecting on the test split biases the best "
        "trial's score; add data.validation_fraction and use val/..."
    )
    # The base job's default objective, on the test split without a validation split.
    [warning] = selection_warnings(spec(JOB + search.replace("  metric: test/accuracy\n", "")))
    assert warning.startswith("the sweep selects on test/accuracy")
    [warning] = selection_warnings(spec(JOB, **{"checkpoint.keep_best": True}))
    assert warning.startswith("checkpoint.keep_best keeps the best test/accuracy")
    assert selection_warnings(spec(JOB, **VAL, **{"checkpoint.keep_best": True})) == []
