"""What "best" means for a job: its objective, a metric of an evaluation split and whether
higher or lower is better.

The `objective:` section names it; left out, it is resolved from the job (`resolve_objective`),
once, when the job is checked: the service stores the resolved objective in the job's execution
spec, so that it reads it without compiling, and the trainer resolves the same one. The
sections that read the objective (`validate`, `early_stop`, `checkpoint.keep_best`, a sweep's
`search.metric`) have their rules here, `objective_issues`, run in the compiler's cross-field
step. Nothing here compiles the net: the metrics a job reports are known from its layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from dsl.config import StrictModel
from dsl.errors import SpecIssue
from dsl.registry import did_you_mean
from dsl.source import SourceMap

if TYPE_CHECKING:
    from dsl.schema import JobSpec
    from dsl.search import SearchConfig
    from dsl.topology import Topology

Mode = Literal["min", "max"]
VALIDATION, TEST = "val", "test"
# Whether a higher or a lower value is better, for every metric an evaluation reports.
MODES: dict[str, Mode] = {"accuracy": "max", "loss": "min", "recon_error": "min"}
# The default objective's metric: the first of these the job reports.
PREFERRED = ("accuracy", "loss", "recon_error")
VALIDATION_HINT = "add data.validation_fraction (e.g. 0.1): the validation split"


class Objective(StrictModel):
    metric: str = Field(min_length=1, max_length=64, description="a metric the trials report")
    mode: Mode = Field(description="max: higher is better; min: lower is better")


class ObjectiveConfig(StrictModel):
    """The job's objective: which evaluation metric says how good the net is."""

    metric: str = Field(
        min_length=1,
        max_length=64,
        description="an evaluation metric the job reports: val/<name> (the validation split) or "
        "test/<name>, e.g. val/accuracy, val/loss",
    )
    mode: Mode | None = Field(
        default=None,
        description="max: higher is better; min: lower is better; default the metric's own "
        "(accuracy max; loss and recon_error min)",
    )


def mode_of(metric: str) -> Mode | None:
    """Whether a higher or lower `metric` is better, when its name says (accuracy, loss, ...)."""
    return MODES.get(metric.rpartition("/")[2])


def evaluation_metrics(spec: JobSpec) -> list[str]:
    """The names (without the split) of what an evaluation of `spec`'s net reports: the loss
    and the metrics of the layers that run in the test phase; a metric two layers report is
    also reported as <layer>/<name>."""
    if spec.train_one_batch.alg == "cd":
        return ["recon_error"]
    names: dict[str, None] = {}
    for layer in spec.neuralnet.expanded().layers:
        if layer.include is not None and "test" not in layer.include:
            continue
        if layer.type.endswith("_loss"):
            names["loss"] = None
        for name in layer.reports:
            names[name] = None
            names[f"{layer.name}/{name}"] = None
    return list(names)


def resolve_objective(spec: JobSpec) -> Objective:
    """The job's objective: the `objective:` section (its mode from the metric's name when
    not given), or else, in order: val/accuracy (max) when the job has a validation split and
    reports accuracy; val/loss (min) with a validation split; test/accuracy (max); test/loss
    (min); for an rbm trained by cd, recon_error (min)."""
    if spec.objective is not None:
        metric = spec.objective.metric
        return Objective(metric=metric, mode=spec.objective.mode or mode_of(metric) or "max")
    split = VALIDATION if spec.data.has_validation() else TEST
    reported = evaluation_metrics(spec)
    name = next((name for name in PREFERRED if name in reported), "loss")
    return Objective(metric=f"{split}/{name}", mode=MODES[name])


def resolve_search(spec: JobSpec) -> SearchConfig | None:
    """The job's `search:` with what it left out filled in: `metric` defaults to the job's
    objective, `mode` to the metric's own (accuracy max; loss min)."""
    search = spec.search
    if search is None or search.objectives:
        return search
    if search.metric is None:
        objective = resolve_objective(spec)
        return search.model_copy(update={"metric": objective.metric, "mode": objective.mode})
    if search.mode is None and mode_of(search.metric) is not None:
        return search.model_copy(update={"mode": mode_of(search.metric)})
    return search


BIAS_HINT = "add data.validation_fraction and use val/..."


def selection_warnings(spec: JobSpec) -> list[str]:
    """What a submission is warned of, though valid: selecting on the test split (a sweep's
    metric, or the checkpoint keep_best keeps) makes the selected score optimistic."""
    search = resolve_search(spec)
    return (search_warnings(search) if search is not None else []) + job_warnings(spec)


def search_warnings(search: SearchConfig) -> list[str]:
    """A sweep that selects its best trial on the test split (its `search` as resolved)."""
    return [
        f"the sweep selects on {objective.metric}: selecting on the test split biases the "
        f"best trial's score; {BIAS_HINT}"
        for objective in search.objective_list()
        if objective.metric.startswith(f"{TEST}/")
    ]


def job_warnings(spec: JobSpec) -> list[str]:
    """A job that keeps the checkpoint that is best on the test split."""
    objective = resolve_objective(spec)
    if spec.checkpoint.keep_best and objective.metric.startswith(f"{TEST}/"):
        return [
            f"checkpoint.keep_best keeps the best {objective.metric}: selecting a checkpoint "
            f"on the test split biases its score; {BIAS_HINT}"
        ]
    return []


def on_test_split(metric: str) -> str | None:
    """The test split's counterpart of a validation metric (val/accuracy: test/accuracy): what
    the trial or checkpoint it selected scores on data the selection never saw. None for a
    metric of no validation."""
    split, _, name = metric.partition("/")
    return f"{TEST}/{name}" if split == VALIDATION and name else None


def objective_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    """The rules of `objective`, `validate` and `early_stop` against the rest of the job."""
    issues = []
    has_validation = spec.data.has_validation()
    if spec.objective is not None:
        issues += _metric_issues(spec, spec.objective.metric, ("objective", "metric"), source)
    if "validate" in spec.model_fields_set and not has_validation:
        issues.append(
            source.issue(
                ("validate",),
                "validate evaluates the validation split, and the job has none",
                VALIDATION_HINT,
            )
        )
    if spec.early_stop is not None:
        issues += _early_stop_issues(spec, topology, source)
    return issues


def _metric_issues(
    spec: JobSpec, metric: str, at: tuple[str, ...], source: SourceMap
) -> list[SpecIssue]:
    split, _, name = metric.partition("/")
    reported = evaluation_metrics(spec)
    known = [f"{s}/{n}" for s in (VALIDATION, TEST) for n in reported]
    if split not in (VALIDATION, TEST) or name not in reported:
        hint = did_you_mean(metric, known) or f"this job reports: {', '.join(known)}"
        return [
            source.issue(
                at,
                f"'{metric}' is not a metric of this job's evaluations: the objective is "
                "val/<name> (the validation split) or test/<name>",
                hint,
            )
        ]
    if split == VALIDATION and not spec.data.has_validation():
        return [
            source.issue(
                at,
                f"{metric} is measured on the validation split, and the job has none",
                VALIDATION_HINT,
            )
        ]
    return []


def _early_stop_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    issues = []
    objective = resolve_objective(spec)
    if not objective.metric.startswith(f"{VALIDATION}/"):
        given = spec.objective is not None
        hint = (
            f"use objective: {{metric: val/{objective.metric.partition('/')[2]}}}"
            if given and spec.data.has_validation()
            else f"{VALIDATION_HINT}; the objective then defaults to "
            f"val/{objective.metric.partition('/')[2]}"
        )
        issues.append(
            source.issue(
                ("early_stop",),
                f"early_stop watches the objective on the validation split, and the job's "
                f"objective is {objective.metric}"
                + ("" if given else " (its default: the job has no validation split)"),
                hint,
            )
        )
    if topology.servers:
        issues.append(
            source.issue(
                ("early_stop",),
                f"early_stop stops every worker at one step, which the workers of framework "
                f"{topology.framework} cannot agree on: they exchange updates through server "
                "shards, each on its own",
                "use framework allreduce with one worker group (or local), or remove early_stop",
            )
        )
    if spec.search is not None and spec.search.pruner.type == "pbt":
        issues.append(
            source.issue(
                ("early_stop",),
                "pbt trains its members in generations of interval steps; early_stop would end "
                "a member's generation early",
                "remove early_stop, or use pruner asha, hyperband or median",
            )
        )
    return issues
