"""Sweeps in the SDK: what `Client.submit` returns for a document with a `search:` section.

sweep = client.submit("sweep.yaml")    # a Sweep: the server runs its trials as jobs
sweep.wait(progress=True)              # a live table of the trials, until it ends
sweep.best()                           # TrialOut: number, job_id, params, value, ...
sweep.trials()                         # every trial, in trial order
sweep.importance()                     # ImportanceOut: each path's share of the metric
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from trainyard.errors import WaitTimeout
from trainyard.models import ImportanceOut, SweepDetail, SweepOut, TrialOut

if TYPE_CHECKING:
    from trainyard.client import Client
    from trainyard.jobs import Job

SWEEP_END_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


class Sweep:
    """A submitted sweep; `info` is its last fetched state (`refresh()` fetches a newer one):
    a SweepOut as listed, a SweepDetail (with its trials) when fetched by id."""

    def __init__(self, client: Client, info: SweepOut) -> None:
        self.client = client
        self.info = info

    def __repr__(self) -> str:
        return f"Sweep(id={self.id}, name={self.name!r}, state={self.state})"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def done(self) -> bool:
        return self.info.state in SWEEP_END_STATES

    @property
    def warnings(self) -> list[str]:
        """What the sweep is warned of (it selects on the test split)."""
        return self.info.warnings

    def refresh(self) -> Sweep:
        self.info = SweepDetail.model_validate(self.client.get_json(f"/sweeps/{self.id}"))
        return self

    def detail(self) -> SweepDetail:
        """The sweep with its trials, fetched now."""
        self.refresh()
        assert isinstance(self.info, SweepDetail)
        return self.info

    def trials(self) -> list[TrialOut]:
        return self.detail().trials

    def best(self) -> TrialOut | None:
        """The best trial so far (one objective); None before one completes."""
        return self.detail().best

    def pareto_front(self) -> list[TrialOut]:
        """Several objectives: the trials no other trial beats on every one."""
        return self.detail().pareto_front

    def importance(self, evaluator: str = "fanova", metric: str | None = None) -> ImportanceOut:
        """How much the metric depends on each path of the space (Optuna's evaluators; fANOVA
        by default). A Conflict while fewer than two trials have finished."""
        data = self.client.get_json(
            f"/sweeps/{self.id}/importance", evaluator=evaluator, metric=metric
        )
        return ImportanceOut.model_validate(data)

    def best_job(self) -> Job | None:
        best = self.best()
        return None if best is None else self.client.job(best.job_id)

    def cancel(self) -> Sweep:
        data = self.client.request("POST", f"/sweeps/{self.id}/cancel").json()
        self.info = SweepDetail.model_validate(data)
        return self

    def wait(
        self, progress: bool = False, timeout: float | None = None, poll: float = 1.0
    ) -> Sweep:
        """Block until the sweep ends (SUCCEEDED, FAILED, CANCELLED); return it refreshed.
        With `progress`, a live table of its trials."""
        if progress:
            return follow_sweep(self, timeout=timeout, poll=poll)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            _check_deadline(self, deadline, timeout)
            time.sleep(poll)
        return self


def _check_deadline(sweep: Sweep, deadline: float | None, timeout: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise WaitTimeout(f"sweep {sweep.id} is still {sweep.state} after {timeout}s")


def format_value(value: Any) -> str:
    """A parameter or metric value for a table: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def trial_table(detail: SweepDetail) -> Table:
    """The trials: number, job, state, progress, each parameter and the metric's value."""
    metric = detail.objectives[0].metric if len(detail.objectives) == 1 else "values"
    names = list(detail.search.get("space", {}))
    table = Table(title=f"sweep {detail.id} {detail.name}: trials", title_justify="left")
    for column in ("trial", "job", "state", "step", *names, metric):
        table.add_column(column, justify="left" if column == "state" else "right")
    for trial in detail.trials:
        step = f"{trial.step}/{trial.train_steps}"
        if trial.pruned_step is not None:
            step += f" (rung {trial.pruned_step})"
        if len(detail.objectives) > 1:
            result = ", ".join(format_value(v) for v in trial.values) if trial.values else "-"
        else:
            result = "-" if trial.value is None else format_value(trial.value)
        marked = "*" if trial.number == detail.best_trial else ""
        table.add_row(
            f"{trial.number}{marked}",
            str(trial.job_id),
            trial.state,
            step,
            *(format_value(trial.params.get(name, "-")) for name in names),
            result,
        )
    return table


def summary_line(detail: SweepOut) -> str:
    """One line: the state, the trials and the best one."""
    best = ""
    if detail.best_trial is not None and detail.best_value is not None:
        best = f"   best: trial {detail.best_trial} ({detail.objectives[0].metric} "
        best += f"{detail.best_value:.4g})"
    error = f"   error: {detail.error}" if detail.error else ""
    return (
        f"sweep {detail.id} [bold]{detail.state}[/]   trials {detail.trials_ended} ended, "
        f"{detail.trials_created} of {detail.trial_count} started{best}{error}"
    )


def follow_sweep(
    sweep: Sweep,
    *,
    timeout: float | None = None,
    poll: float = 1.0,
    console: Console | None = None,
    stop: threading.Event | None = None,
) -> Sweep:
    """Poll the sweep every `poll` seconds and show its trials live until it ends (or `stop`
    is set)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    console = console or Console()
    try:
        with Live(Text("waiting for the sweep"), console=console) as live:
            while True:
                detail = sweep.detail()
                live.update(Group(trial_table(detail), Text.from_markup(summary_line(detail))))
                if sweep.done:
                    return sweep
                _check_deadline(sweep, deadline, timeout)
                if stop is None:
                    time.sleep(poll)
                elif stop.wait(poll):
                    return sweep
    finally:
        if not console.is_terminal:  # a terminal's Live ends its last frame's line itself
            console.line()
