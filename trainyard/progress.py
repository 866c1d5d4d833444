"""Following a service job in the terminal: a rich progress bar fed by the REST API."""

from __future__ import annotations

import threading
import time
from typing import Protocol, TypeVar

from rich.console import Console

from trainyard.console import format_stats, training_progress
from trainyard.models import JobOut


class Followed(Protocol):
    """What following asks of a job: a `trainyard.jobs.Job`, which calls it."""

    info: JobOut

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def done(self) -> bool: ...
    def refresh(self) -> object: ...
    def latest_metrics(self) -> dict[str, float]: ...


J = TypeVar("J", bound=Followed)


def _status(job: Followed, latest: dict[str, float]) -> str:
    if job.state == "QUEUED":
        where = job.info.queue_position
        return "queued" + (f" (position {where})" if where is not None else "")
    if job.state == "SCHEDULED":
        return "scheduled, starting"
    return format_stats(latest)


def follow_with_progress(
    job: J,
    *,
    timeout: float | None = None,
    poll: float = 1.0,
    console: Console | None = None,
    stop: threading.Event | None = None,
) -> J:
    """Poll the job and its newest metrics every `poll` seconds until it ends (or `stop` is
    set: then it returns the job as it is, and the terminal is left tidy)."""
    from trainyard.errors import WaitTimeout

    deadline = None if timeout is None else time.monotonic() + timeout
    latest: dict[str, float] = {}
    with training_progress(console or Console()) as bar:
        task = bar.add_task(
            f"job {job.id} {job.name}", total=job.info.train_steps or None, stats=""
        )
        while True:
            job.refresh()
            if job.step > 0 or job.done:
                latest.update(job.latest_metrics())
            bar.update(task, completed=job.step, stats=_status(job, latest))
            if job.done:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job.id} is still {job.state} after {timeout}s")
            if stop is None:
                time.sleep(poll)
            elif stop.wait(poll):
                return job
