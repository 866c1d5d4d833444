"""Following a service job in the terminal: a rich progress bar fed by the REST API."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rich.console import Console

from trainyard.console import format_stats, training_progress

if TYPE_CHECKING:
    from trainyard.jobs import Job


def _status(job: Job, latest: dict[str, float]) -> str:
    if job.state == "QUEUED":
        where = job.info.queue_position
        return "queued" + (f" (position {where})" if where is not None else "")
    if job.state == "SCHEDULED":
        return "scheduled, starting"
    return format_stats(latest)


def follow_with_progress(
    job: Job,
    *,
    timeout: float | None = None,
    poll: float = 1.0,
    console: Console | None = None,
    stop: threading.Event | None = None,
) -> Job:
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
