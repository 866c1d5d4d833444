"""The rules of a `search:` section (dsl/search.py) between its keys and against the base job.

`search_issues` runs in the compiler's cross-field step (no compiling); `space_issues` compiles
the base job with the values each space entry can produce and reports a value that gives an
invalid job at its entry. Every issue is located in the sweep's YAML.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dsl.errors import JobSpecError, Path, SpecIssue
from dsl.frameworks import FRAMEWORK_SPECS
from dsl.objective import mode_of
from dsl.registry import did_you_mean
from dsl.search import MAX_PROBES, MAX_TRIALS, MULTI_OBJECTIVE, SearchConfig, SpaceEntry
from dsl.source import SourceMap

if TYPE_CHECKING:
    from dsl.schema import JobSpec


def search_issues(spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    """The section's rules between its keys and against the base job (no compiling)."""
    search = spec.search
    if search is None:
        return []
    at = ("search",)
    issues = _objective_issues(search, source)
    issues += _pruner_issues(search, spec.train_steps, source)
    if search.pruner.type == "pbt":
        issues += _pbt_issues(search, spec, source)
    else:
        issues += _trial_count_issues(search, source)
    probes = sum(len(entry.probes()) for entry in search.space.values())
    if probes > MAX_PROBES:
        issues.append(
            source.issue(
                (*at, "space"),
                f"the space has {probes} values to check (every choice, and 3 for each range); "
                f"a sweep is checked with at most {MAX_PROBES}",
                "list fewer choices, or give a range ({int: [low, high]}) instead",
            )
        )
    base = spec.model_dump(mode="json", exclude={"search"})
    for path in search.space:
        problem = _path_problem(base, path)
        if problem is not None:
            issues.append(source.issue((*at, "space", path), *problem))
    return issues


def _objective_issues(search: SearchConfig, source: SourceMap) -> list[SpecIssue]:
    at: Path = ("search",)
    issues = []
    if search.objectives and (search.metric or search.mode):
        issues.append(
            source.issue(
                (*at, "objectives"),
                "give either metric and mode (one objective) or objectives (several), not both",
            )
        )
    elif search.metric and search.mode is None and mode_of(search.metric) is None:
        issues.append(
            source.issue(
                (*at, "metric"),
                f"say whether a higher or a lower {search.metric} is better",
                "add mode: max or mode: min",
            )
        )
    if search.algorithm == "nsga2" and not search.objectives:
        issues.append(
            source.issue(
                (*at, "algorithm"),
                "algorithm nsga2 searches several objectives, and the search names one",
                "list them: objectives: [{metric: val/accuracy, mode: max}, "
                "{metric: train/loss, mode: min}], or use algorithm tpe for one metric",
            )
        )
    if search.objectives and search.algorithm not in MULTI_OBJECTIVE:
        issues.append(
            source.issue(
                (*at, "algorithm"),
                f"algorithm {search.algorithm} optimises one objective, and the search has "
                f"{len(search.objectives)}",
                f"use one of {', '.join(MULTI_OBJECTIVE)}",
            )
        )
    if search.objectives and search.pruner.type != "none":
        issues.append(
            source.issue(
                (*at, "pruner", "type"),
                "pruning compares one metric, and the search has several objectives",
                "use pruner: {type: none}",
            )
        )
    return issues


def _pruner_issues(search: SearchConfig, train_steps: int, source: SourceMap) -> list[SpecIssue]:
    at = ("search", "pruner")
    pruner = search.pruner
    issues = []
    if pruner.type in ("median", "none") and "reduction_factor" in pruner.model_fields_set:
        issues.append(
            source.issue(
                (*at, "reduction_factor"),
                f"reduction_factor is for asha and hyperband; pruner {pruner.type} has none",
            )
        )
    if pruner.type == "none" and "min_steps" in pruner.model_fields_set:
        issues.append(source.issue((*at, "min_steps"), "pruner none stops no trial: no min_steps"))
    pbt_keys = ("interval", "quantile", "perturb")
    if pruner.type != "pbt":
        for key in (k for k in pbt_keys if k in pruner.model_fields_set):
            issues.append(
                source.issue((*at, key), f"{key} is for pbt; pruner {pruner.type} has none")
            )
    else:
        for key in ("min_steps", "reduction_factor"):
            if key in pruner.model_fields_set:
                issues.append(
                    source.issue(
                        (*at, key),
                        f"pbt has no {key}: it compares the population every interval steps",
                    )
                )
        return issues
    if pruner.type != "none" and pruner.min_steps >= train_steps:
        issues.append(
            source.issue(
                (*at, "min_steps"),
                f"min_steps {pruner.min_steps} is not below train_steps {train_steps}: no "
                "trial would be stopped early",
                f"use fewer than {train_steps}",
            )
        )
    return issues


# Keys PBT sets itself for each generation's job, or that a continued job cannot change.
PBT_FIXED = ("train_steps", "cluster", "checkpoint", "pipeline")


def _pbt_issues(search: SearchConfig, spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    """Population-based training: a population of max_parallel members, each trained in
    generations of `interval` steps, continuing from checkpoints."""
    at: Path = ("search",)
    pruner, steps, population = search.pruner, spec.train_steps, search.max_parallel
    issues = []
    if pruner.interval is None:
        issues.append(
            source.issue(
                (*at, "pruner"),
                "pbt needs interval: the steps between rounds of exploit and explore",
                f"e.g. interval: {max(1, steps // 4)} (a divisor of train_steps {steps})",
            )
        )
    elif pruner.interval >= steps or steps % pruner.interval:
        divisors = [d for d in range(max(1, steps // 20), steps) if steps % d == 0][:3]
        issues.append(
            source.issue(
                (*at, "pruner", "interval"),
                f"interval {pruner.interval} does not divide train_steps {steps} into two or more "
                "generations of equal length",
                f"use a divisor of {steps} below it, e.g. {', '.join(map(str, divisors))}"
                if divisors
                else "raise train_steps",
            )
        )
    if population < 2:
        issues.append(
            source.issue(
                (*at, "max_parallel"),
                f"pbt trains a population of max_parallel members, and max_parallel is "
                f"{population}",
                "give at least 2 (4 or more for a quantile of 0.25)",
            )
        )
    elif int(pruner.quantile * population) < 1:
        issues.append(
            source.issue(
                (*at, "pruner", "quantile"),
                f"quantile {pruner.quantile} of a population of {population} is no member: "
                "none would ever be replaced",
                f"raise max_parallel to {math.ceil(1 / pruner.quantile)}, or the quantile",
            )
        )
    if search.max_trials is not None:
        issues.append(
            source.issue(
                (*at, "max_trials"),
                "pbt runs one trial per member and generation (max_parallel x train_steps / "
                "interval): no max_trials",
                "leave max_trials out",
            )
        )
    if search.algorithm == "grid":
        issues.append(
            source.issue(
                (*at, "algorithm"),
                "pbt samples its first generation and perturbs it; a grid enumerates points",
                "use algorithm random or tpe",
            )
        )
    if not FRAMEWORK_SPECS.get(spec.cluster.framework).in_one_process:
        issues.append(
            source.issue(
                ("cluster", "framework"),
                f"pbt continues members from their checkpoints, which local jobs do; framework "
                f"{spec.cluster.framework} does not",
                "use framework: local",
            )
        )
    for path in search.space:
        if path.split(".")[0] in PBT_FIXED:
            issues.append(
                source.issue(
                    (*at, "space", path),
                    f"pbt sets train_steps and continues checkpoints: it cannot search {path}",
                )
            )
    if all(entry.choice is not None for entry in search.space.values()):
        issues.append(
            source.issue(
                (*at, "space"),
                "pbt perturbs numeric values (uniform, loguniform, int), and the space has "
                "only choices",
                "search a rate or a size with {loguniform: [low, high]} or {int: [low, high]}",
            )
        )
    return issues


def _trial_count_issues(search: SearchConfig, source: SourceMap) -> list[SpecIssue]:
    at: Path = ("search",)
    if search.algorithm != "grid":
        if search.max_trials is None:
            return [
                source.issue(
                    at,
                    f"algorithm {search.algorithm} needs max_trials: how many trials to run",
                    "e.g. max_trials: 16",
                )
            ]
        return []
    issues = []
    for path, entry in search.space.items():
        if entry.grid_values() is None:
            issues.append(
                source.issue(
                    (*at, "space", path),
                    f"a grid enumerates values, and {entry.kind} is a continuous range",
                    "give the values: {choice: [...]} or {int: [low, high]}",
                )
            )
    if issues:
        return issues
    size = search.grid_size()
    sizes = " x ".join(str(entry.grid_size()) for entry in search.space.values())
    if size > MAX_TRIALS:
        return [
            source.issue(
                (*at, "space"),
                f"the grid has {size:,} points ({sizes}); a sweep runs at most {MAX_TRIALS:,}",
                "give fewer values, or sample the space: algorithm random or tpe",
            )
        ]
    if search.max_trials is not None and search.max_trials != size:
        return [
            source.issue(
                (*at, "max_trials"),
                f"the grid has {size} points ({sizes}) and runs one trial each; max_trials "
                f"is {search.max_trials}",
                f"leave max_trials out, or set it to {size}",
            )
        ]
    return []


def _path_problem(base: Any, dotted: str) -> tuple[str, str | None] | None:
    """Why `dotted` names nothing in the base job (its validated document), or None."""
    parts = dotted.split(".")
    if not all(parts):
        return f"'{dotted}' is not a dotted path", "e.g. updater.lr.base"
    if parts[0] == "search":
        return "a search cannot search its own settings", None
    node, walked = base, "the top level"
    for depth, part in enumerate(parts):
        if isinstance(node, dict):
            if part not in node:
                known = sorted(node)
                hint = did_you_mean(part, known) or f"keys there: {', '.join(known)}"
                return f"the base job has no key '{part}' under {walked}", hint
            node = node[part]
        elif isinstance(node, list):
            named = {item.get("name"): item for item in node if isinstance(item, dict)}
            if part in named:
                node = named[part]
            elif part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                names = [str(name) for name in named if name is not None]
                hint = did_you_mean(part, names) or f"names there: {', '.join(names)}"
                item = "layer" if walked == "'neuralnet.layers'" else "item"
                return f"the base job has no {item} named '{part}' in {walked}", hint
        else:
            return (
                f"{walked} is {node!r} in the base job, not a mapping",
                f"set {walked} in the base job first",
            )
        walked = f"'{'.'.join(parts[: depth + 1])}'"
    return None


TrialCompiler = Callable[[Mapping[str, Any]], object]


def space_issues(
    search: SearchConfig, source: SourceMap, compile_trial: TrialCompiler
) -> list[SpecIssue]:
    """Compile the base job with each value a space entry can produce (every choice, the
    bounds and a value inside a range), the other paths at their base values. A value that
    gives an invalid job is reported at its entry, with the job's own error.

    `compile_trial(overrides)` compiles the base job with those overrides, raising a
    `JobSpecError` for an invalid one.
    """
    issues: list[SpecIssue] = []
    for path, entry in search.space.items():
        for value in entry.probes():
            try:
                compile_trial({path: value})
            except JobSpecError as exc:
                issues += [_at_entry(source, path, entry, value, issue) for issue in exc.issues]
    return issues


def _at_entry(
    source: SourceMap, path: str, entry: SpaceEntry, value: Any, issue: SpecIssue
) -> SpecIssue:
    hint = issue.hint
    if entry.kind in ("uniform", "loguniform") and "valid integer" in issue.message:
        hint = "the key takes whole numbers: use {int: [low, high]}"
    return source.issue(
        ("search", "space", path),
        f"{entry.kind} value {value!r} gives an invalid job: {issue.path}: {issue.message}",
        hint,
    )
