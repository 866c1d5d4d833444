"""Checking a submitted sweep: its document checked as a job (scheduler/admission/checks.py), then
its base job compiled with the values each entry of its search space can produce."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from dsl.budget import CompileBudget
from dsl.errors import JobSpecError
from dsl.objective import resolve_search
from dsl.search import SearchConfig, base_document
from dsl.search_checks import space_issues
from dsl.source import ParsedDocument
from scheduler.admission.checks import CheckedJob, check_job, not_a_sweep
from scheduler.store.models import User
from scheduler.store.sweeps import NewSweep
from scheduler.sweeps.warm_start import warm_start_issues


@dataclass(frozen=True)
class CheckedSweep:
    """A sweep document checked: its base job compiled, every value of its space too."""

    checked: CheckedJob  # the whole document: the base job's net, the search validated
    search: SearchConfig
    base_job: dict[str, Any]  # the document without `search`, the overrides applied

    def to_new_sweep(
        self,
        *,
        spec_yaml: str,
        overrides: Mapping[str, Any],
        base_dir: Path,
        priority: int = 0,
    ) -> NewSweep:
        return NewSweep(
            name=self.checked.spec.name,
            spec_yaml=spec_yaml,
            overrides=dict(overrides),
            base_job=self.base_job,
            search=self.search.model_dump(mode="json", exclude_unset=True),
            base_dir=str(base_dir),
            priority=priority,
        )


def check_sweep(
    document: str | Mapping[str, Any] | ParsedDocument,
    *,
    session: Session,
    owner: User,
    cache_dir: Path,
    base_dir: Path,
    artifacts: Path,
    overrides: Mapping[str, Any] | None = None,
    budget: CompileBudget | None = None,
) -> CheckedSweep:
    """`check_job` for a document with a `search:` section, then the base job compiled with the
    values each space entry can produce (dsl.search_checks.space_issues): a value that gives
    an invalid job is a located error at its entry. A document without one is refused. The
    probes count against the document's `budget`."""
    checked = check_job(
        document,
        session=session,
        owner=owner,
        cache_dir=cache_dir,
        base_dir=base_dir,
        artifacts=artifacts,
        overrides=overrides,
        budget=budget,
    )
    # Its metric and mode filled in (the base job's objective by default), as the sweep stores it.
    search = resolve_search(checked.spec)
    if search is None:
        raise JobSpecError(not_a_sweep(checked.compiled.source))
    base = base_document(document, overrides)

    def compile_trial(values: Mapping[str, Any]) -> object:
        return check_job(
            base,
            session=session,
            owner=owner,
            cache_dir=cache_dir,
            base_dir=base_dir,
            artifacts=artifacts,
            overrides=values,
            budget=budget,
        )

    issues = space_issues(search, checked.compiled.source, compile_trial)
    issues += warm_start_issues(session, owner, search, checked.compiled.source)
    if issues:
        raise JobSpecError(issues)
    return CheckedSweep(checked, search, base)
