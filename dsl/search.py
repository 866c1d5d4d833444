"""The `search:` section: a job that has one is a sweep, a hyperparameter search over trials.

Each trial is the base job (the document without `search`) with one value set at every path of
the `space`, applied like `--set` overrides (layers by name: `neuralnet.layers.fc1.units`). The
section's keys are validated here (pydantic); dsl/search_checks.py holds its rules against the
base job. The scheduler samples the values (with Optuna) and runs the trials.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from dsl.config import StrictModel
from dsl.objective import Mode, Objective
from dsl.overrides import apply_overrides
from dsl.source import ParsedDocument, read_document

Algorithm = Literal["grid", "random", "tpe", "cmaes", "gp", "nsga2"]
PrunerType = Literal["asha", "hyperband", "median", "pbt", "none"]
# Algorithms that optimise several objectives at once (Optuna's multi-objective samplers).
MULTI_OBJECTIVE = ("nsga2", "random", "tpe", "grid")
MAX_TRIALS = 10_000
MAX_CHOICES = 256
# Each value checked at submission compiles the base job once (dsl/search_checks.py): bounded,
# so that no document holds a server for long.
MAX_PROBES = 256
SCALARS = (str, builtins.int, float, bool, type(None))
SPACE_FORMS = (
    "{loguniform: [low, high]}, {uniform: [low, high]}, {int: [low, high]} or "
    "{choice: [value, ...]}"
)


class PrunerConfig(StrictModel):
    """Early stopping of trials that trail the others at the same step (Optuna's pruners)."""

    type: PrunerType = Field(
        description="asha: successive halving (asynchronous); hyperband: several halving "
        "brackets; median: stop below the median of earlier trials; none: never stop early"
    )
    min_steps: int = Field(
        default=1,
        ge=1,
        description="asha, hyperband: the first rung (steps a trial runs before it can be "
        "stopped); median: steps before any trial is stopped",
    )
    reduction_factor: int = Field(
        default=3, ge=2, description="asha, hyperband: 1 / the share of trials a rung promotes"
    )

    interval: int | None = Field(
        default=None,
        ge=1,
        description="pbt: steps between exploit/explore rounds (a generation); divides train_steps",
    )
    quantile: float = Field(
        default=0.25,
        gt=0,
        le=0.5,
        description="pbt: the bottom share of the population that continues from the top "
        "share's checkpoints",
    )
    perturb: tuple[float, float] = Field(
        default=(0.8, 1.2),
        description="pbt: each numeric value a loser takes from a winner is multiplied by one of "
        "these two factors (chosen at random), then kept inside its range",
    )

    @model_validator(mode="after")
    def _positive(self) -> PrunerConfig:
        if any(factor <= 0 for factor in self.perturb):
            raise ValueError(f"perturb factors must be above 0, not {list(self.perturb)}")
        return self


class SpaceEntry(StrictModel):
    """The values one path takes: exactly one of the four forms."""

    loguniform: tuple[float, float] | None = Field(
        default=None, description="a float between the bounds, sampled on a log scale (> 0)"
    )
    uniform: tuple[float, float] | None = Field(
        default=None, description="a float between the bounds"
    )
    int: tuple[builtins.int, builtins.int] | None = Field(
        default=None, description="a whole number between the bounds, both included"
    )
    choice: list[Any] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CHOICES,
        description="one of these plain values (numbers, strings, true/false, null)",
    )

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"a space entry is one of {SPACE_FORMS}")
        return data

    @model_validator(mode="after")
    def _one_form(self) -> SpaceEntry:
        given = [k for k in ("loguniform", "uniform", "int", "choice") if self._get(k) is not None]
        if len(given) != 1:
            raise ValueError(f"a space entry is one of {SPACE_FORMS}")
        if self.choice is not None:
            bad = [value for value in self.choice if not isinstance(value, SCALARS)]
            if bad:
                raise ValueError(
                    f"choice values are plain values (numbers, strings, true/false, null); "
                    f"{bad[0]!r} is not"
                )
            seen = [repr(value) for value in self.choice]
            twice = next((text for text in seen if seen.count(text) > 1), None)
            if twice is not None:
                raise ValueError(f"choice lists {twice} twice")
            return self
        low, high = self.bounds
        if low > high:
            raise ValueError(f"the bounds are reversed: low {low} is above high {high}")
        if self.loguniform is not None and low <= 0:
            raise ValueError(f"loguniform bounds must be above 0 (the low bound is {low})")
        return self

    def _get(self, kind: str) -> Any:
        return getattr(self, kind)

    @property
    def kind(self) -> str:
        return next(
            k for k in ("loguniform", "uniform", "int", "choice") if self._get(k) is not None
        )

    @property
    def bounds(self) -> tuple[float, float]:
        low, high = self._get(self.kind)
        return low, high

    def grid_values(self) -> list[Any] | None:
        """The values a grid enumerates; None for a continuous range."""
        if self.choice is not None:
            return list(self.choice)
        if self.int is not None:
            return list(range(self.int[0], self.int[1] + 1))
        return None

    def grid_size(self) -> builtins.int:
        if self.int is not None:
            return self.int[1] - self.int[0] + 1
        return len(self.choice or [])

    def probes(self) -> list[Any]:
        """The values checked at submission: every choice, the bounds, and a value inside a
        continuous range (a whole-number key fails there)."""
        if self.choice is not None:
            return list(self.choice)
        low, high = self.bounds
        if self.int is not None:
            return [self.int[0], self.int[1]] if low != high else [self.int[0]]
        if low == high:
            return [low]
        # Off the middle, so a range of whole numbers still probes a fraction.
        share = 0.382
        if self.loguniform is not None:
            return [low, high, math.exp(math.log(low) + share * math.log(high / low))]
        return [low, high, low + share * (high - low)]


class SearchConfig(StrictModel):
    """A sweep: trials of the base job with values from `space`, sampled by `algorithm`."""

    metric: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="the metric a trial is judged by (its last reported value), e.g. "
        "val/accuracy; default the base job's objective",
    )
    mode: Mode | None = Field(
        default=None,
        description="max: higher `metric` is better; min: lower is better; default the metric's "
        "own (accuracy max; loss min)",
    )
    objectives: list[Objective] | None = Field(
        default=None,
        min_length=2,
        description="several metrics at once (instead of metric and mode): the result is the "
        "Pareto front",
    )
    algorithm: Algorithm = Field(
        default="tpe",
        description="grid: every combination; random; tpe: tree-structured Parzen estimator; "
        "cmaes: CMA evolution strategy; gp: Gaussian process; nsga2: genetic, several "
        "objectives",
    )
    pruner: PrunerConfig = Field(
        default_factory=lambda: PrunerConfig(type="none"),
        description="early stopping of trials that trail",
    )
    max_trials: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TRIALS,
        description="how many trials to run; a grid runs each of its points once",
    )
    max_parallel: int = Field(
        default=1, ge=1, le=1000, description="at most this many trials queued or running at once"
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="seeds the sampler: the same seed, the same trials",
    )
    space: dict[str, SpaceEntry] = Field(
        min_length=1,
        description="dotted path in the base job -> the values it takes; layers by name, e.g. "
        "neuralnet.layers.fc1.units",
    )
    warm_start: builtins.int | None = Field(
        default=None,
        ge=1,
        description="an earlier sweep's id (yours, with the same objectives and space paths): "
        "its finished trials whose values lie in this space seed this sweep's sampler",
    )

    def objective_list(self) -> list[Objective]:
        """The objectives, one for a single `metric` (dsl.objective.resolve_search fills in
        the metric and mode a search leaves out)."""
        if self.objectives:
            return list(self.objectives)
        return [Objective(metric=self.metric or "", mode=self.mode or "max")]

    def grid_size(self) -> builtins.int:
        return math.prod(entry.grid_size() for entry in self.space.values())

    def generations(self, train_steps: builtins.int) -> builtins.int:
        """pbt: how many rounds of `interval` steps the population trains."""
        return max(1, train_steps // (self.pruner.interval or train_steps))

    def trial_count(self, train_steps: builtins.int | None = None) -> builtins.int:
        """How many trials the sweep runs: max_trials, or the grid's size; for pbt, one per
        member and generation (each trains `interval` steps)."""
        if self.pruner.type == "pbt" and train_steps is not None:
            return self.max_parallel * self.generations(train_steps)
        if self.max_trials is not None:
            return self.max_trials
        return self.grid_size()


def base_document(
    document: str | Mapping[str, Any] | ParsedDocument,
    overrides: Mapping[str, Any] | None = None,
    filename: str = "<job>",
) -> dict[str, Any]:
    """The base job of a sweep document: parsed, with `overrides` applied, without `search`."""
    raw = read_document(document, filename).raw
    if overrides:
        raw = apply_overrides(raw, overrides)
    return {key: value for key, value in raw.items() if key != "search"}
