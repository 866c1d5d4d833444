"""The rules of a `search:` section (dsl/search.py) between its keys and against the base job.

`search_issues` runs in the compiler's cross-field step (no compiling); `space_issues` compiles
the base job with the values each space entry can produce and reports a value that gives an
invalid job at its entry. Every issue is located in the sweep's YAML.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dsl.errors import JobSpecError, Path, SpecIssue
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
    elif not search.objectives and not search.metric:
        issues.append(
            source.issue(
                at,
                "a search needs the metric that judges the trials",
                "e.g. metric: test/accuracy and mode: max",
            )
        )
    elif search.metric and search.mode is None:
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
                "list them: objectives: [{metric: test/accuracy, mode: max}, "
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
