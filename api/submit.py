"""Reading a job submission from a request (YAML or JSON) and checking it for the caller."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from fastapi import HTTPException, Query, Request
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.schemas import PRIORITY_RANGE, AssignmentOut, PlacementOut, SubmitRequest
from contract.settings import Settings
from dsl.errors import JobSpecError, SpecIssue
from dsl.topology import Topology
from scheduler.admission.checks import CheckedJob, CheckedSweep, check_job, check_sweep
from scheduler.placement.cluster import node_capacities
from scheduler.placement.plan import (
    PlacementRequest,
    fits_empty_cluster,
    plan_placement,
    unreachable_note,
)
from scheduler.store.models import Job, JobState, User

YAML_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
JSON_TYPE = "application/json"

EXAMPLE_YAML = """name: digits-mlp
data: {source: digits, batch_size: 64}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: innerproduct, srclayers: [data], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc1]}
updater: {type: sgd, lr: {base: 0.05}}
train_steps: 500
"""

# The body is read by hand (YAML or JSON), so its forms are declared for the OpenAPI document.
SUBMIT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "the job as YAML, or JSON {spec, overrides, priority}",
        "content": {
            **{
                media: {"schema": {"type": "string"}, "example": EXAMPLE_YAML}
                for media in sorted(YAML_TYPES)
            },
            JSON_TYPE: {
                "schema": SubmitRequest.model_json_schema(),
                "example": {"spec": EXAMPLE_YAML, "overrides": {"train_steps": 100}},
            },
        },
    }
}


@dataclass(frozen=True)
class Submission:
    document: str | dict[str, Any]
    spec_yaml: str
    overrides: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    base_dir: str | None = None


def _json_problem(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or 'body'}: {item['msg']}"
        for item in error.errors()
    )


async def read_submission(
    request: Request,
    priority: Annotated[
        int | None,
        Query(
            ge=-PRIORITY_RANGE,
            le=PRIORITY_RANGE,
            description="higher runs first (overrides a priority in a JSON body)",
        ),
    ] = None,
) -> Submission:
    """The submitted job from the body; the size cap was applied as it arrived."""
    body = await request.body()
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == JSON_TYPE:
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as error:
            raise HTTPException(422, f"the body is not valid JSON: {error}") from None
        try:
            parsed = SubmitRequest.model_validate(payload)
        except ValidationError as error:
            raise HTTPException(422, _json_problem(error)) from None
        spec = parsed.spec
        try:
            spec_yaml = spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False)
        except RecursionError:
            raise HTTPException(422, "the job document is nested too deeply") from None
        return Submission(
            document=spec,
            spec_yaml=spec_yaml,
            overrides=parsed.overrides,
            priority=parsed.priority if priority is None else priority,
            base_dir=parsed.base_dir,
        )
    if media and media not in YAML_TYPES:
        raise HTTPException(
            415,
            f"content type '{media}' is not accepted; send the job as YAML "
            f"({', '.join(sorted(YAML_TYPES))}) or as JSON ({JSON_TYPE})",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HTTPException(422, f"the job is not UTF-8 text: {error}") from None
    return Submission(document=text, spec_yaml=text, priority=priority or 0)


def submission_base_dir(submission: Submission, settings: Settings) -> Path:
    """The folder the job's relative file paths resolve against (admins only)."""
    base = settings.resolved_data_dir()
    if submission.base_dir:
        base = base / Path(submission.base_dir).expanduser()  # an absolute one replaces it
    return base


def check_submission(
    session: Session, user: User, submission: Submission, settings: Settings
) -> CheckedJob:
    try:
        return check_job(
            submission.document,
            session=session,
            owner=user,
            overrides=submission.overrides,
            cache_dir=settings.cache_dir(),
            base_dir=submission_base_dir(submission, settings),
        )
    except RecursionError:
        raise _too_deep() from None


def check_sweep_submission(
    session: Session, user: User, submission: Submission, settings: Settings
) -> CheckedSweep:
    try:
        return check_sweep(
            submission.document,
            session=session,
            owner=user,
            overrides=submission.overrides,
            cache_dir=settings.cache_dir(),
            base_dir=submission_base_dir(submission, settings),
        )
    except RecursionError:
        raise _too_deep() from None


def refuse_sweep(checked: CheckedJob) -> None:
    """POST /jobs takes jobs: a document with a search section is a sweep, with a route of
    its own (its answer is a sweep, not a job)."""
    if checked.spec.search is not None:
        raise JobSpecError(
            checked.compiled.source.issue(
                ("search",),
                "a document with a search section is a sweep, and this route takes jobs",
                "submit it to POST /api/v1/sweeps (`trainyard submit` does), or remove search",
            )
        )


def _too_deep() -> JobSpecError:
    return JobSpecError(
        SpecIssue(
            "<document>",
            "the job document is nested too deeply",
            hint="a job is a few levels of mappings and lists",
        )
    )


def placement_preview(session: Session, topology: Topology, priority: int) -> PlacementOut:
    """Where the scheduler would put the job if it were placed now, or why it would wait."""
    nodes = node_capacities(session)
    alive = [node for node in nodes if node.alive]
    request = PlacementRequest.from_topology(0, topology, priority=priority)
    if not alive:
        return PlacementOut(
            feasible=False,
            reason="no node agent is alive; start one with `trainyard worker` (or `trainyard up`)",
            assignments=[],
        )
    plan = plan_placement(request, nodes)
    if plan is None:
        usable = [node for node in alive if node.takes(request)]
        # Nodes that cannot reach the parameter-server Redis may reach it later: not "never".
        note = unreachable_note(request, alive)
        if fits_empty_cluster(request, usable):
            free_slots = sum(node.free_slots for node in usable)
            free_gpus = sum(node.free_gpus for node in usable)
            reason = (
                f"would wait for free resources: needs {request.describe()}; free now: "
                f"{free_slots} slot(s), {free_gpus} GPU(s){note}"
            )
        else:
            reason = (
                f"{'cannot run on this cluster now' if note else 'can never run on this cluster'}"
                f": needs {request.describe()}; it has {len(usable)} node(s), "
                f"{sum(n.slots for n in usable)} slot(s), {sum(n.gpus for n in usable)} GPU(s)"
                f"{note}"
            )
        return PlacementOut(feasible=False, reason=reason, assignments=[])
    ahead = session.scalar(
        select(func.count()).where(Job.state == JobState.QUEUED, Job.priority >= priority)
    )
    reason = f"fits now: {plan.describe()}"
    if ahead:
        reason += f"; {ahead} queued job(s) would be placed first"
    return PlacementOut(
        feasible=True,
        reason=reason,
        assignments=[AssignmentOut(**a.__dict__) for a in plan.assignments],
    )
