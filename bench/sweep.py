"""Sweeps through the service (issue 13), four figures from one run on this machine.

The service is a real stack (scheduler/cli/stack.py, what `trainyard up` starts): an embedded
Redis, the API, the scheduler and one node agent with 2 slots, each a process of its own over
a SQLite file in a temporary directory. Sweeps are submitted with the SDK (POST /sweeps) and
measured from the store afterwards. The trials train examples/mnist1d_cnn.yaml (1 torch
thread each) with three keys searched (SPACE), evaluated on the test set every 100 steps.

1. ASHA against a full random search: one sweep of --trials trials with `algorithm: random`
   and `pruner: {type: none}`, then the same with `pruner: {type: asha, min_steps: 100,
   reduction_factor: 3}` (rungs at 100, 300, 900, 2700; --min-steps and --reduction-factor
   change them). Same seed: Optuna's RandomSampler gives trial k the same values in both
   (checked). Steps trained are the trials' `step` column (the last step they reported; a
   pruned trial may have gone on for less than disp_freq more). Target: ASHA's steps / the
   full search's <= 1/3 at the same best accuracy.
2. `max_parallel: 2` against `max_parallel: 1` on the node's 2 slots: the same sweep of
   --scale-trials trials of --scale-steps steps, no pruner, run --scale-repeats times each,
   alternating; wall time from submission to the sweep's end. The figure is the median of
   the pairs' ratios (the machine is shared and noisy). Target: >= 1.6x.
3. Per-trial overhead, in one more such pair that reports every step (disp_freq 1): from the
   trial job's creation by the scheduler's sweep thread to the worker's report of its first
   step (Job.created_at -> the first metric's worker time), so it covers placement, Celery
   dispatch, the agent's fork of a worker process from its fork server, compiling the job,
   loading the data and one step. Target: p50 <= 0.5 s.
4. Ray Tune (bench/sweep_ray.py) over the trials of 1, in trial order, 2 at a time, ASHA
   with the same rungs (grace_period = min_steps, the same reduction_factor, max_t =
   train_steps, one bracket), each trial training with our Trainer in a Ray actor. Wall time
   to the best trial: ours from just before the SDK's submit to the best trial job's end as
   the service recorded it; Ray's to Tune's on_trial_complete for its best trial. The stack's
   start and ray.init are not counted. Ray runs twice, reported apart: warm (reusing actors,
   after one warm-up trial on each, the clock starting when they end: the same footing as our
   workers forked from a warm fork server; the figure the table compares) and cold (the clock
   from just before Tuner.fit(): the actors' start and torch import counted). Until
   2026-11-26 only the cold run was made and compared with our warm stack. Our side cold (a
   first sweep on a stack whose fork server has just started) is not measured here.
   Target: ours <= Ray's, warm.

    .venv/bin/python bench/sweep.py [--trials 16] [--steps 3000] [--scale-trials 6]
        [--scale-steps 1000] [--scale-repeats 3] [--min-steps 100] [--reduction-factor 3]
        [--json out.json] [--plot docs/img/sweep_bench.png] [--no-ray]
    .venv/bin/python bench/sweep.py --smoke      # a quick run: small everything, < 2 minutes
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from sweep_ray import run_ray
from sweep_report import SweepRun, Trial, figures, plot, ray_best, show

from contract.settings import Settings
from scheduler.cli.stack import Stack
from scheduler.store.database import Database
from scheduler.store.models import Job, Metric, Sweep
from scheduler.store.states import JobState
from trainyard import Client
from trainyard.sweeps import Sweep as SweepHandle

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
    *,
    trials: int,
    steps: int,
    max_parallel: int,
    pruner: str,
    disp_freq: int | None = None,
    min_steps: int = MIN_STEPS,
    reduction: int = REDUCTION,
    seed: int = SEED,
) -> dict[str, Any]:
    """mnist1d_cnn.yaml shortened to `steps`, tested every TEST_FREQ steps, swept over SPACE;
    `pruner` none (a full search), or asha or hyperband with these rungs."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["name"] = f"bench-{pruner}-p{max_parallel}-s{seed}"
    doc["train_steps"] = steps
    doc["test"] = {"freq": TEST_FREQ, "steps": 0}
    if disp_freq is not None:
        doc["disp_freq"] = disp_freq
    doc["search"] = {
        "metric": "test/accuracy",
        "mode": "max",
        "algorithm": "random",
        "pruner": (
            {"type": pruner, "min_steps": min_steps, "reduction_factor": reduction}
            if pruner != "none"
            else {"type": "none"}
        ),
        "max_trials": trials,
        "max_parallel": max_parallel,
        "seed": seed,
        "space": SPACE,
    }
    return doc


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
            sweep_id,
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


@contextmanager
def service(tmp: Path) -> Iterator[tuple[Client, Database, Settings]]:
    """A BenchStack over a SQLite file under `tmp`, warmed up: a client and the store."""
    settings = Settings(data_dir=tmp / "data", host="127.0.0.1", port=free_port())
    stack = BenchStack(settings, say=print)
    stack.start()
    db = Database(settings.sql_url())
    try:
        client = Client(stack.url, stack.token)
        # Warm-up: the API imports torch and generates MNIST-1D's cache on its first check.
        client.validate(sweep_document(trials=1, steps=10, max_parallel=1, pruner="none"))
        yield client, db, settings
    finally:
        db.dispose()
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3000, help="train_steps of each trial")
    parser.add_argument("--scale-trials", type=int, default=6)
    parser.add_argument("--scale-steps", type=int, default=1000)
    parser.add_argument("--scale-repeats", type=int, default=3, help="pairs of figure 2")
    parser.add_argument(
        "--min-steps", type=int, default=MIN_STEPS, help="ASHA's first rung (both sides)"
    )
    parser.add_argument("--reduction-factor", type=int, default=REDUCTION, help="ASHA's (both)")
    parser.add_argument("--smoke", action="store_true", help="3 trials of 200 steps, 2 of 100")
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Tune out")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--plot", type=Path, default=None, help="best accuracy against time")
    args = parser.parse_args()
    if args.smoke:
        args.trials, args.steps, args.scale_trials, args.scale_steps = 3, 200, 2, 100
        args.scale_repeats = 1
    base_disp = int(yaml.safe_load(EXAMPLE.read_text())["disp_freq"])
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        with service(Path(tmp)) as (client, db, settings):
            common = {"trials": args.trials, "steps": args.steps, "max_parallel": SLOTS}
            full = run_sweep(client, db, "full random", sweep_document(**common, pruner="none"))
            asha_doc = sweep_document(
                **common, pruner="asha", min_steps=args.min_steps, reduction=args.reduction_factor
            )
            asha = run_sweep(client, db, "ASHA", asha_doc)
            scale = {"trials": args.scale_trials, "steps": args.scale_steps, "pruner": "none"}
            pairs = [
                (
                    run_sweep(
                        client, db, f"max_parallel 1 ({n})", sweep_document(**scale, max_parallel=1)
                    ),
                    run_sweep(
                        client, db, f"max_parallel 2 ({n})", sweep_document(**scale, max_parallel=2)
                    ),
                )
                for n in range(1, args.scale_repeats + 1)
            ]
            timed = (
                run_sweep(
                    client,
                    db,
                    "max_parallel 1, every step",
                    sweep_document(**scale, max_parallel=1, disp_freq=1),
                ),
                run_sweep(
                    client,
                    db,
                    "max_parallel 2, every step",
                    sweep_document(**scale, max_parallel=2, disp_freq=1),
                ),
            )
        if [t.params for t in full.trials] != [t.params for t in asha.trials]:
            raise SystemExit("the two sweeps sampled different values: not comparable")
        ray = ray_cold = None
        if not args.no_ray:
            base = dict(asha_doc)
            del base["search"]
            ray, ray_cold = (
                run_ray(
                    [t.params for t in full.trials],
                    base=base,
                    min_steps=args.min_steps,
                    reduction_factor=args.reduction_factor,
                    parallel=SLOTS,
                    cache=settings.cache_dir(),
                    workdir=Path(tmp) / ("warm" if warm else "cold"),
                    warm=warm,
                )
                for warm in (True, False)
            )
    found = figures(full, asha, pairs, timed, ray, steps=args.steps, disp_freq=base_disp)
    show(full, asha, ray, found, args.steps)
    if ray_cold is not None:
        cold = ray_best(ray_cold, args.steps)
        shown = f"{cold[2]:.1f} s" if cold else "not reached"
        print(f"Ray Tune cold (actor start and torch import counted): to the best trial {shown}")
    if args.json:
        scaled = [run for pair in pairs for run in pair]
        runs = [asdict(run) for run in (full, asha, *scaled, *timed)]
        args.json.write_text(
            json.dumps(
                {
                    "figures": asdict(found),
                    "sweeps": runs,
                    "ray": asdict(ray) if ray else None,
                    "ray_cold": asdict(ray_cold) if ray_cold else None,
                },
                indent=1,
            )
        )
    if args.plot:
        plot(full, asha, ray, args.steps, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
