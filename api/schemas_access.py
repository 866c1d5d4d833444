"""Request and response bodies of tokens (/tokens) and quotas (/quota, /users/{name}/quota)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from scheduler.store.users import MAX_EXPIRY_DAYS

TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 _.@:-]{0,99}$"
USER_NAME_PATTERN = r"^[^/]{1,100}$"


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=TOKEN_NAME_PATTERN,
        description="unique among the user's tokens: letters, digits, space, '_.@:-'",
    )
    expires_in_days: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EXPIRY_DAYS,
        description="unset: it expires with the token that mints it (never, if that one never "
        "does)",
    )
    user: str | None = Field(
        default=None,
        max_length=100,
        description="admins only: whose token (default the caller's own)",
    )


class TokenOut(BaseModel):
    id: int
    name: str
    user: str = Field(description="the token's owner")
    created_at: datetime
    expires_at: datetime | None = Field(description="unset: never expires")
    last_used_at: datetime | None = Field(description="to the minute")


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: shown this once, only its hash is stored")


class StreamTicket(BaseModel):
    ticket: str = Field(description="pass as ?ticket= to GET /jobs/{job_id}/stream, once")
    job_id: int
    expires_in: int = Field(description="seconds left to open the stream with it")


QUOTA_FIELDS_DOC = {
    "running_jobs": "jobs placed at once; more wait in the queue",
    "slots": "worker slots held by placed jobs; more wait in the queue",
    "gpus": "GPUs held by placed jobs; more wait in the queue",
    "train_steps": "largest train_steps of a submitted job (403 past it)",
    "dataset_bytes": "bytes of uploaded datasets kept (403 past it)",
    "artifact_bytes": "bytes of checkpoints kept; submissions get 403 while past it",
    "submissions_per_minute": "jobs and sweeps submitted in any minute (429 past it)",
    "validations_per_minute": "documents checked by POST /jobs/validate in any minute (429 past "
    "it)",
    "queued_jobs": "jobs waiting in the queue at once (submissions get 403 past it)",
    "sweep_trials": "the largest search.max_trials of a sweep (403 past it)",
}


class QuotaLimits(BaseModel):
    """One value per quota; null: no limit."""

    running_jobs: int | None = Field(description=QUOTA_FIELDS_DOC["running_jobs"])
    slots: int | None = Field(description=QUOTA_FIELDS_DOC["slots"])
    gpus: int | None = Field(description=QUOTA_FIELDS_DOC["gpus"])
    train_steps: int | None = Field(description=QUOTA_FIELDS_DOC["train_steps"])
    dataset_bytes: int | None = Field(description=QUOTA_FIELDS_DOC["dataset_bytes"])
    artifact_bytes: int | None = Field(description=QUOTA_FIELDS_DOC["artifact_bytes"])
    submissions_per_minute: int | None = Field(
        description=QUOTA_FIELDS_DOC["submissions_per_minute"]
    )
    validations_per_minute: int | None = Field(
        description=QUOTA_FIELDS_DOC["validations_per_minute"]
    )
    queued_jobs: int | None = Field(description=QUOTA_FIELDS_DOC["queued_jobs"])
    sweep_trials: int | None = Field(description=QUOTA_FIELDS_DOC["sweep_trials"])


class QuotaUsage(BaseModel):
    running_jobs: int = Field(description="scheduled and running jobs")
    queued_jobs: int = Field(description="jobs waiting in the queue")
    slots: int = Field(description="slots their live processes hold")
    gpus: int
    dataset_bytes: int
    artifact_bytes: int = Field(description="checkpoints of the user's jobs")


class QuotaOut(BaseModel):
    user: str
    limits: QuotaLimits = Field(description="in force: the user's own where set, else defaults")
    overrides: list[str] = Field(description="the quotas set for this user (not the defaults)")
    usage: QuotaUsage


class QuotaUpdate(BaseModel):
    """The quotas to change: a number sets the user's own, null returns to the default;
    absent quotas stay as they are."""

    model_config = ConfigDict(extra="forbid")

    running_jobs: int | None = Field(default=None, ge=0, le=2**31 - 1)
    slots: int | None = Field(default=None, ge=0, le=2**31 - 1)
    gpus: int | None = Field(default=None, ge=0, le=2**31 - 1)
    train_steps: int | None = Field(default=None, ge=1, le=2**31 - 1)
    dataset_bytes: int | None = Field(default=None, ge=0, le=2**63 - 1)
    artifact_bytes: int | None = Field(default=None, ge=0, le=2**63 - 1)
    submissions_per_minute: int | None = Field(default=None, ge=1, le=2**31 - 1)
    validations_per_minute: int | None = Field(default=None, ge=1, le=2**31 - 1)
    queued_jobs: int | None = Field(default=None, ge=0, le=2**31 - 1)
    sweep_trials: int | None = Field(default=None, ge=1, le=2**31 - 1)
