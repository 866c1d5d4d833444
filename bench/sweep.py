"""Sweeps through the service (issue 13), four figures from one run on this machine.

The service is a real stack (scheduler/stack.py, what `trainyard up` starts): an embedded
Redis, the API, the scheduler and one node agent with 2 slots, each a process of its own over
a SQLite file in a temporary directory. Sweeps are submitted with the SDK (POST /sweeps) and
measured from the store afterwards. The trials train examples/mnist1d_cnn.yaml (1 torch
thread each) with three keys searched (SPACE), evaluated on the test set every 100 steps.

1. ASHA against a full random search: one sweep of --trials trials with `algorithm: random`
   and `pruner: {type: none}`, then the same with `pruner: {type: asha, min_steps: 100,
   reduction_factor: 3}` (rungs at 100, 300, 900, 2700). Same seed: Optuna's RandomSampler
   gives trial k the same values in both (checked). Steps trained are the trials' `step`
   column (the last step they reported; a pruned trial may have gone on for less than
   disp_freq more). Target: ASHA's steps / the full search's <= 1/3 at the same best accuracy.
2. `max_parallel: 2` against `max_parallel: 1` on the node's 2 slots: the same sweep of
   --scale-trials trials of --scale-steps steps, no pruner; wall time from submission to the
   sweep's end. Target: >= 1.6x.
3. Per-trial overhead, in the sweeps of 2 (which report every step: disp_freq 1): from the
   trial job's creation by the scheduler's sweep thread to the worker's report of its first
   step (Job.created_at -> the first metric's worker time), so it covers placement, Celery
   dispatch, the agent's hand-over to its standby process, compiling the job, loading the
   data and one step. Target: p50 <= 0.5 s.
4. Ray Tune (bench/sweep_ray.py) over the trials of 1, in trial order, 2 at a time, ASHA
   with the same rungs (grace_period 100, reduction_factor 3, max_t = train_steps), each trial
   training with our Trainer in a Ray actor. Wall time to the best trial: ours from just before
   the SDK's submit to the best trial job's end as the service recorded it; Ray's from just
   before Tuner.fit() to Tune's on_trial_complete for its best trial. The stack's start and
   ray.init are not counted. Target: ours <= Ray's.

    .venv/bin/python bench/sweep.py [--trials 16] [--steps 3000] [--scale-trials 6]
        [--scale-steps 1000] [--json out.json] [--plot docs/img/sweep_bench.png] [--no-ray]
    .venv/bin/python bench/sweep.py --smoke      # a quick run: small everything, < 2 minutes
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from sweep_ray import RayRun, run_ray

from contract.settings import Settings
from scheduler.db import Database
from scheduler.models import Job, JobState, Metric, Sweep
from scheduler.stack import Stack
from sdk.client import Client
from sdk.sweeps import Sweep as SweepHandle

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mnist1d_cnn.yaml"
SLOTS = 2
TEST_FREQ = 100
MIN_STEPS, REDUCTION = 100, 3
SEED = 0
SPACE = {
    "updater.lr.base": {"loguniform": [0.001, 0.3]},
    "updater.momentum": {"uniform": [0.5, 0.99]},
    "neuralnet.layers.fc1.units": {"choice": [32, 64, 128, 256]},
}


def sweep_document(
    *, trials: int, steps: int, max_parallel: int, asha: bool, disp_freq: int | None = None
) -> dict[str, Any]:
    """mnist1d_cnn.yaml shortened to `steps`, tested every TEST_FREQ steps, swept over SPACE."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["name"] = f"bench-{'asha' if asha else 'full'}-p{max_parallel}"
    doc["train_steps"] = steps
    doc["test"] = {"freq": TEST_FREQ, "steps": 0}
    if disp_freq is not None:
        doc["disp_freq"] = disp_freq
    pruner = {"type": "asha", "min_steps": MIN_STEPS, "reduction_factor": REDUCTION}
    doc["search"] = {
        "metric": "test/accuracy",
        "mode": "max",
        "algorithm": "random",
        "pruner": pruner if asha else {"type": "none"},
        "max_trials": trials,
        "max_parallel": max_parallel,
        "seed": SEED,
        "space": SPACE,
    }
    return doc


@dataclass
class Trial:
    number: int
    params: dict[str, Any]
    state: str
    value: float | None
    step: int
    created: float  # unix times: the job's creation by the sweep thread, ...
    scheduled: float | None  # ... its placement, ...
    started: float | None  # ... RUNNING recorded, ...
    first_report: float | None  # ... the worker's first metric (at step first_step) ...
    first_step: int | None
    ended: float | None  # ... and its end as recorded


@dataclass
class SweepRun:
    label: str
    submitted: float  # unix time just before the SDK's submit
    ended: float
    best_trial: int | None
    best_value: float | None
    trials: list[Trial]

    @property
    def wall(self) -> float:
        return self.ended - self.submitted

    @property
    def steps(self) -> int:
        return sum(t.step for t in self.trials)

    def to_best(self) -> float | None:
        best = next((t for t in self.trials if t.number == self.best_trial), None)
        return best.ended - self.submitted if best and best.ended else None


def _unix(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def collect(db: Database, label: str, sweep_id: int, submitted: float) -> SweepRun:
    """The sweep's trials and their moments, from the store."""
    with db.session() as session:
        sweep = session.get_one(Sweep, sweep_id)
        jobs = session.scalars(
            select(Job).where(Job.sweep_id == sweep_id).order_by(Job.trial_number)
        ).all()
        trials = []
        for job in jobs:
            first = session.execute(
                select(Metric.step, Metric.at)
                .where(Metric.job_id == job.id)
                .order_by(Metric.at)
                .limit(1)
            ).first()
            value = (job.summary or {}).get("test/accuracy")
            trials.append(
                Trial(
                    number=int(job.trial_number or 0),
                    params=dict(job.overrides),
                    state=str(job.state),
                    value=float(value) if isinstance(value, int | float) else None,
                    step=job.step,
                    created=_unix(job.created_at) or 0.0,
                    scheduled=_unix(job.scheduled_at),
                    started=_unix(job.started_at),
                    first_report=first.at if first else None,
                    first_step=first.step if first else None,
                    ended=_unix(job.ended_at),
                )
            )
        return SweepRun(
            label,
            submitted,
            _unix(sweep.ended_at) or time.time(),
            sweep.best_trial,
            sweep.best_value,
            trials,
        )


def run_sweep(client: Client, db: Database, label: str, doc: dict[str, Any]) -> SweepRun:
    submitted = time.time()
    handle = client.submit(doc)
    assert isinstance(handle, SweepHandle)
    handle.wait(timeout=1800, poll=0.5)
    found = collect(db, label, handle.id, submitted)
    ended = sum(t.state == JobState.PRUNED for t in found.trials)
    print(
        f"{label}: {handle.state} in {found.wall:.1f} s, {len(found.trials)} trials "
        f"({ended} pruned), {found.steps} steps, best trial {found.best_trial} "
        f"({found.best_value})",
        flush=True,
    )
    return found


class BenchStack(Stack):
    """`trainyard up`'s stack with a node of SLOTS slots and no GPU."""

    def child_env(self) -> dict[str, str]:
        env = super().child_env()
        env.update(TRAINYARD_NODE_SLOTS=str(SLOTS), TRAINYARD_NODE_GPUS="0")
        return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Figures:
    steps_ratio: float
    steps_ratio_bound: float  # pruned trials counted with disp_freq - 1 more steps each
    best_full: float | None
    best_asha: float | None
    speedup: float
    overhead_p50: float
    overhead_p90: float
    overhead_parts: dict[str, float]  # p50 of each part of the overhead
    overhead_by_sweep: dict[str, float]  # p50 in each sweep
    # The ASHA sweep's trials (reporting every disp_freq steps): created -> first report.
    asha_first_report_p50: float
    ours_to_best: float | None
    ray_to_best: float | None
    ray_wall: float | None
    ray_steps: int | None
    ray_best: tuple[int, float] | None


def ray_best(ray: RayRun, steps: int) -> tuple[int, float, float] | None:
    """(trial, value, seconds to it) of the best trial that trained to the end."""
    done = [t for t in ray.trials if t.step >= steps and t.value is not None]
    if not done:
        return None
    best = max(done, key=lambda t: (t.value, -t.number))
    assert best.value is not None
    return best.number, best.value, best.ended - ray.started


def figures(
    full: SweepRun,
    asha: SweepRun,
    serial: SweepRun,
    parallel: SweepRun,
    ray: RayRun | None,
    *,
    steps: int,
    disp_freq: int,
) -> Figures:
    pruned = sum(t.state == JobState.PRUNED for t in asha.trials)
    overheads: list[float] = []
    parts: dict[str, list[float]] = {
        "created -> placed": [],
        "placed -> running": [],
        "running -> step": [],
    }
    by_sweep: dict[str, list[float]] = {}
    for run in (serial, parallel):
        for trial in run.trials:
            if trial.first_report is None or trial.scheduled is None or trial.started is None:
                continue
            overheads.append(trial.first_report - trial.created)
            by_sweep.setdefault(run.label, []).append(trial.first_report - trial.created)
            parts["created -> placed"].append(trial.scheduled - trial.created)
            parts["placed -> running"].append(trial.started - trial.scheduled)
            parts["running -> step"].append(trial.first_report - trial.started)
    found = ray_best(ray, steps) if ray else None
    return Figures(
        steps_ratio=asha.steps / full.steps,
        steps_ratio_bound=(asha.steps + pruned * (disp_freq - 1)) / full.steps,
        best_full=full.best_value,
        best_asha=asha.best_value,
        speedup=serial.wall / parallel.wall,
        overhead_p50=statistics.median(overheads),
        overhead_p90=percentile(overheads, 0.9),
        overhead_parts={name: statistics.median(values) for name, values in parts.items()},
        overhead_by_sweep={name: statistics.median(values) for name, values in by_sweep.items()},
        asha_first_report_p50=statistics.median(
            t.first_report - t.created for t in asha.trials if t.first_report is not None
        ),
        ours_to_best=asha.to_best(),
        ray_to_best=found[2] if found else None,
        ray_wall=ray.ended - ray.started if ray else None,
        ray_steps=sum(t.step for t in ray.trials) if ray else None,
        ray_best=(found[0], found[1]) if found else None,
    )


def show(runs: list[SweepRun], ray: RayRun | None, f: Figures, steps: int) -> None:
    full, asha, serial, parallel = runs
    ray_by = {t.number: t for t in ray.trials} if ray else {}
    asha_by = {t.number: t for t in asha.trials}
    print("\n| trial | " + " | ".join(SPACE) + " | full | ASHA (step) | Ray ASHA (step) |")
    print("| --- " * (len(SPACE) + 4) + "|")
    for t in full.trials:
        a, r = asha_by.get(t.number), ray_by.get(t.number)
        values = " | ".join(f"{t.params.get(path, ''):.4g}" for path in SPACE)
        ours = f"{a.value:.3f} ({a.step})" if a and a.value is not None else "-"
        theirs = f"{r.value:.3f} ({r.step})" if r and r.value is not None else "-"
        shown = f"{t.value:.3f}" if t.value is not None else t.state
        print(f"| {t.number} | {values} | {shown} | {ours} | {theirs} |")
    ray_to = f"{f.ray_to_best:.1f} s" if f.ray_to_best is not None else "-"
    ours_to = f"{f.ours_to_best:.1f} s" if f.ours_to_best is not None else "-"
    to_ratio = (
        f"{f.ours_to_best / f.ray_to_best:.2f}"
        if f.ours_to_best is not None and f.ray_to_best
        else "-"
    )
    print("\n| figure | measured | baseline | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    print(
        f"| steps trained, ASHA / full random ({len(full.trials)} trials of {steps}) | "
        f"{asha.steps:,} | {full.steps:,} | **{f.steps_ratio:.3f}** "
        f"(<= {f.steps_ratio_bound:.3f}) | <= 0.333 |"
    )
    print(
        f"| best test accuracy, ASHA / full random | {f.best_asha or 0:.4f} "
        f"(trial {asha.best_trial}) | {f.best_full or 0:.4f} (trial {full.best_trial}) | "
        f"{'equal' if f.best_asha == f.best_full else 'differ'} | equal |"
    )
    print(
        f"| sweep wall time, max_parallel 2 against 1 | {parallel.wall:.1f} s | "
        f"{serial.wall:.1f} s | **{f.speedup:.2f}x** | >= 1.6x |"
    )
    print(
        f"| per-trial overhead p50 (p90), created -> first step | {f.overhead_p50:.3f} s "
        f"({f.overhead_p90:.3f} s) | | | <= 0.5 s |"
    )
    print(
        f"| wall time to the best trial, ours / Ray Tune | {ours_to} | {ray_to} | "
        f"**{to_ratio}** | <= 1 |"
    )
    parts = ", ".join(f"{name} {value:.3f} s" for name, value in f.overhead_parts.items())
    print(f"\noverhead p50 by part: {parts}")
    each = ", ".join(f"{name} {value:.3f} s" for name, value in f.overhead_by_sweep.items())
    print(f"overhead p50 by sweep: {each}")
    print(
        f"ASHA sweep: created -> first report (at step {asha.trials[0].first_step}) "
        f"p50 {f.asha_first_report_p50:.3f} s"
    )
    if ray is not None:
        print(
            f"Ray Tune: fit() {f.ray_wall or 0:.1f} s, {f.ray_steps or 0:,} steps reported, "
            f"best {f.ray_best}; ours: ASHA sweep {asha.wall:.1f} s, {asha.steps:,} steps"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3000, help="train_steps of each trial")
    parser.add_argument("--scale-trials", type=int, default=6)
    parser.add_argument("--scale-steps", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="3 trials of 200 steps, 2 of 100")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Tune out")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--plot", type=Path, default=None, help="best accuracy against time")
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.steps, args.scale_trials, args.scale_steps = 3, 200, 2, 100
    base_disp = int(yaml.safe_load(EXAMPLE.read_text())["disp_freq"])
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp) / "data", host="127.0.0.1", port=free_port())
        stack = BenchStack(settings, say=print)
        stack.start()
        db = Database(settings.sql_url())
        try:
            client = Client(stack.url, stack.token)
            # Warm-up: the API imports torch and generates MNIST-1D's cache on its first check.
            client.validate(sweep_document(trials=1, steps=10, max_parallel=1, asha=False))
            common = {"trials": args.trials, "steps": args.steps, "max_parallel": SLOTS}
            full = run_sweep(client, db, "full random", sweep_document(**common, asha=False))
            asha = run_sweep(client, db, "ASHA", sweep_document(**common, asha=True))
            scale = {"trials": args.scale_trials, "steps": args.scale_steps, "asha": False}
            serial = run_sweep(
                client, db, "max_parallel 1", sweep_document(**scale, max_parallel=1, disp_freq=1)
            )
            parallel = run_sweep(
                client, db, "max_parallel 2", sweep_document(**scale, max_parallel=2, disp_freq=1)
            )
        finally:
            db.dispose()
            stack.stop()
        if [t.params for t in full.trials] != [t.params for t in asha.trials]:
            raise SystemExit("the two sweeps sampled different values: not comparable")
        ray = None
        if not args.no_ray:
            base = sweep_document(**common, asha=True)
            del base["search"]
            ray = run_ray(
                [t.params for t in full.trials],
                base=base,
                min_steps=MIN_STEPS,
                reduction_factor=REDUCTION,
                parallel=SLOTS,
                cache=settings.cache_dir(),
                workdir=Path(tmp),
            )
    found = figures(full, asha, serial, parallel, ray, steps=args.steps, disp_freq=base_disp)
    show([full, asha, serial, parallel], ray, found, args.steps)
    if args.json:
        runs = [asdict(run) for run in (full, asha, serial, parallel)]
        args.json.write_text(
            json.dumps(
                {"figures": asdict(found), "sweeps": runs, "ray": asdict(ray) if ray else None},
                indent=1,
            )
        )
    if args.plot:
        plot(full, asha, ray, args.steps, args.plot)
        print(f"plot: {args.plot}")


def plot(full: SweepRun, asha: SweepRun, ray: RayRun | None, steps: int, path: Path) -> None:
    """The best completed trial's accuracy so far against seconds since submission."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def curve(start: float, done: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
        xs, ys, best = [0.0], [0.0], 0.0
        for ended, value in sorted(done):
            best = max(best, value)
            xs.append(ended - start)
            ys.append(best)
        return xs, ys

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in (full, asha):
        done = [
            (t.ended, t.value)
            for t in run.trials
            if t.state == JobState.SUCCEEDED and t.ended and t.value is not None
        ]
        ax.step(*curve(run.submitted, done), where="post", label=f"trainyard, {run.label}")
    if ray is not None:
        done = [(t.ended, t.value) for t in ray.trials if t.step >= steps and t.value is not None]
        ax.step(*curve(ray.started, done), where="post", label="Ray Tune, ASHA")
    ax.set_xlabel("seconds since submission")
    ax.set_ylabel("best test accuracy so far")
    ax.set_ylim(0.5, 1)
    ax.set_title(f"mnist1d CNN, {len(full.trials)} random trials of {steps} steps, 2 slots")
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
