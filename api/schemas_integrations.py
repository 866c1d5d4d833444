"""Request and response bodies of a job's environment (/jobs/{id}/environment), comparing jobs
(/compare) and webhooks (/webhooks)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import finite
from scheduler.store.diff import Difference
from scheduler.store.models import JobEnvironment, JobOut, Webhook, aware
from scheduler.store.webhooks import MAX_URL


class EnvironmentOut(BaseModel):
    """What one worker process trained with, as it reported at its start."""

    group: int
    rank: int
    python: str
    torch: str
    cuda: str = Field(description="torch's CUDA version; empty: a build without CUDA")
    cudnn: str = Field(description="empty: none, or a process that trains on the CPU")
    nccl: str = Field(description="empty: none, or a process that trains on the CPU")
    devices: list[str] = Field(description="the devices the process may use")
    cpu_model: str
    cpu_count: int
    hostname: str
    trainyard_version: str
    trainyard_commit: str = Field(description="empty when the install is no git checkout")
    packages_hash: str = Field(
        description="SHA-256 of the installed packages' sorted name==version lines"
    )
    packages_total: int = Field(description="installed packages (the list: .../packages)")
    reported_at: datetime

    @classmethod
    def of(cls, row: JobEnvironment) -> EnvironmentOut:
        facts = {name: row.facts.get(name) for name in cls.model_fields} | {
            "group": row.group,
            "rank": row.rank,
            "reported_at": aware(row.reported_at),
        }
        defaults = {"devices": [], "cpu_count": 0, "packages_total": 0}
        return cls.model_validate(
            {k: (defaults.get(k, "") if v is None else v) for k, v in facts.items()}
        )


class JobEnvironmentOut(BaseModel):
    processes: list[EnvironmentOut] = Field(
        description="each worker process's, by group and rank (empty until one reports)"
    )
    differing: list[str] = Field(
        description="the facts not the same in every process (hostname, when on several nodes)"
    )


# A flattened setting or a fact: a scalar, or a list or mapping only when empty (settings) or a
# list of names (the devices).
Value = str | int | float | bool | list[str] | dict[str, Any] | None


class DifferenceOut(BaseModel):
    key: str = Field(description="a flattened key (settings: `updater.lr`), a fact or a package")
    values: list[Value] = Field(description="one per compared job, in their order (null: none)")

    @classmethod
    def of(cls, found: Difference) -> DifferenceOut:
        return cls(key=found.key, values=finite(found.values))


class CurveOut(BaseModel):
    job_id: int
    name: str
    steps: list[int]
    times: list[float] = Field(description="unix seconds of each point (the worker's clock)")
    values: list[float | None]


class MetricRowOut(BaseModel):
    name: str
    final: list[float | None] = Field(description="each job's value at its last step")
    min: list[float | None] = Field(description="each job's lowest value")
    max: list[float | None] = Field(description="each job's highest value")


class ComparisonOut(BaseModel):
    jobs: list[JobOut]
    curves: list[CurveOut] = Field(description="each job's metrics (group 0, rank 0)")
    metrics: list[MetricRowOut]
    settings: list[DifferenceOut] = Field(
        description="the settings (the job documents flattened) not the same in every job"
    )
    same_settings: int = Field(description="how many settings every job has alike")
    environments: list[dict[str, Any] | None] = Field(
        description="each job's first worker's environment (null: not reported)"
    )
    environment: list[DifferenceOut] = Field(description="its facts that differ")
    packages: list[DifferenceOut] = Field(description="installed packages whose version differs")


WebhookEvent = Literal["job.finished", "job.failed", "sweep.finished"]


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=1,
        max_length=MAX_URL,
        description="an http:// or https:// URL to POST to, at a public address",
    )
    events: list[WebhookEvent] = Field(
        min_length=1, max_length=3, description="which events it is told of"
    )


class WebhookOut(BaseModel):
    id: int
    url: str
    events: list[WebhookEvent]
    created_at: datetime
    last_status: str | None = Field(
        # Why a try failed is said in general words (scheduler/store/webhooks.py), never a
        # transport error's text; docs/integrations.md lists them.
        description="'delivered (HTTP 204)', 'not delivered (why); what next' (null: no try yet)"
    )
    last_event: str | None
    last_delivery_at: datetime | None
    pending: int = Field(description="deliveries waiting to be sent or retried")

    @classmethod
    def of(cls, hook: Webhook, pending: int) -> WebhookOut:
        return cls(
            id=hook.id,
            url=hook.url,
            events=hook.events,  # type: ignore[arg-type]
            created_at=aware(hook.created_at),
            last_status=hook.last_status,
            last_event=hook.last_event,
            last_delivery_at=aware(hook.last_delivery_at) if hook.last_delivery_at else None,
            pending=pending,
        )


class WebhookCreated(WebhookOut):
    secret: str = Field(
        description="signs every delivery (the Trainyard-Signature header); shown this once"
    )
