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
4. Ours against Ray Tune (bench/sweep_ray.py): the ASHA sweep of 1 (the same trials, in
   trial order, 2 at a time) and Ray Tune's ASHAScheduler over the same values with the same
   rungs (grace_period = min_steps, the same reduction_factor, max_t = train_steps, one
   bracket), each Ray trial training with our Trainer in a Ray actor. The figure is the wall
   time to the best trial: ours from just before the SDK's submit to the best trial job's end
   as the service recorded it; Ray's from its clock's start (below) to Tune's
   on_trial_complete for its best trial that trained to the end. It is measured in
   --repeats sittings, each of four sides run one after the other: ours cold, Ray cold, ours
   warm, Ray warm (even sittings put Ray first at each footing, so that neither side always
   meets the machine's load first); the load average is recorded when each side's clock
   starts and when it ends. Each of our sides has a stack of its own, started for it and
   stopped after it; each of Ray's a ray.init() and ray.shutdown() of its own. MNIST-1D's
   files are generated once before the sittings (not counted) and read by every side.
   - Ours cold: submitted as soon as the new stack's API answers /healthz (what `trainyard
     up` waits for). Counted: the API's first submit (compiling the job, creating the sweep),
     the scheduler's first sweep pass, which starts its trial-checking process
     (scheduler/daemon/trial_checks.py: started on first use, a fresh interpreter that
     imports torch to compile the trials), the first placement, the agent's first fork, and
     whatever is still starting. Not counted: the stack's start (Redis, schema, the three
     processes), which includes the node agent's fork server importing torch: the agent
     starts it at once, and the API, which imports torch itself before it answers, is the
     last to be ready, so by the submit the fork server has mostly or wholly imported torch
     (a probe found libtorch mapped in it when the API first answered, 2 starts of 2).
   - Ray cold: the clock from just before Tuner.fit(), after ray.init() (Ray's services,
     perhaps idle worker interpreters, not counted). Counted: the actors' start, their import
     of torch and of our packages, loading the data, Tune's first trials.
   - Cold, each side's service start counted: the same two runs, from before our stack's
     start and before ray.init(); this puts the fork server's torch import on the clock.
   - Ours warm: after a warm-up sweep of one trial of WARMUP_STEPS steps per slot on the same
     stack (the API has compiled a job, the scheduler placed trials, the fork server forked);
     the clock from just before the timed sweep's submit.
   - Ray warm: one warm-up trial of WARMUP_STEPS steps on each of its 2 actors, reused for the
     timed trials; the clock from the end of the last warm-up trial.
   Each footing's ratio is ours / Ray's, per sitting, and their median. Until 2026-11-26 only
   ours warm was measured, against Ray cold and then Ray warm. Target: ours <= Ray's, warm.
   Ours is a service (API, SQL, Redis, a scheduler's passes) and Ray a library in one driver:
   the gap that remains on each footing is what the service costs a sweep.

    .venv/bin/python bench/sweep.py [--trials 16] [--steps 3000] [--scale-trials 6]
        [--scale-steps 1000] [--scale-repeats 3] [--min-steps 100] [--reduction-factor 3]
        [--repeats 1] [--json out.json] [--plot docs/img/sweep_bench.png] [--no-ray]
    .venv/bin/python bench/sweep.py --versus-only --repeats 3    # figure 4 alone
    .venv/bin/python bench/sweep.py --smoke      # a quick run: small everything, about 2 min

--no-ray leaves Ray Tune out (it is in the `bench` extra only, which CI does not install):
figure 4's sittings then run our sides alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from sweep_ray import WARMUP_STEPS, RayRun, run_ray
from sweep_report import (
    Side,
    Sitting,
    SweepRun,
    Trial,
    figures,
    our_side,
    plot,
    ray_side,
    show,
    show_versus,
    versus,
)

from contract.settings import Settings
from dsl.compiler import compile_job
from scheduler.cli.redis_server import free_port
from scheduler.cli.stack import Stack
from scheduler.store.database import Database
from scheduler.store.models import Job, Metric, Sweep
from scheduler.store.states import JobState
from trainyard import Client
from trainyard.sweeps import Sweep as SweepHandle
from workers.data import TrainingData

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
            _unix(sweep.created_at) or submitted,
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


@contextmanager
def stack_at(data_dir: Path) -> Iterator[tuple[Client, Database, Settings]]:
    """A BenchStack started now over a SQLite file in `data_dir`, returned as soon as its API
    answers (what `trainyard up` waits for), nothing warmed."""
    settings = Settings(data_dir=data_dir, host="127.0.0.1", port=free_port())
    stack = BenchStack(settings, say=print)
    stack.start()
    db = Database(settings.sql_url())
    try:
        yield Client(stack.url, stack.token), db, settings
    finally:
        db.dispose()
        stack.stop()


@contextmanager
def service(tmp: Path) -> Iterator[tuple[Client, Database, Settings]]:
    """A BenchStack over a SQLite file under `tmp`, warmed up: a client and the store."""
    with stack_at(tmp / "data") as (client, db, settings):
        # Warm-up: the API imports torch and generates MNIST-1D's cache on its first check.
        client.validate(sweep_document(trials=1, steps=10, max_parallel=1, pruner="none"))
        yield client, db, settings


def make_data_cache(doc: dict[str, Any], cache: Path) -> None:
    """The data set's files in `cache`, made before either side of figure 4 runs: each side
    reads them and neither generates them."""
    compile_job({k: v for k, v in doc.items() if k != "search"}, TrainingData(cache_dir=cache))


def ours_versus(data_dir: Path, cache: Path, doc: dict[str, Any], footing: str) -> Side:
    """Our ASHA sweep on a stack started for it. Cold: submitted as soon as the stack's API
    answers. Warm: after a warm-up sweep of one short trial per slot, as Ray's warm-up."""
    shutil.copytree(cache, data_dir / "cache")  # the data set's files, as Ray's side has them
    launched = time.time()
    with stack_at(data_dir) as (client, db, _):
        if footing == "warm":
            warm_up = sweep_document(
                trials=SLOTS, steps=WARMUP_STEPS, max_parallel=SLOTS, pruner="none"
            )
            run_sweep(client, db, "ours, warm-up", warm_up)
        before = os.getloadavg()
        run = run_sweep(client, db, f"ours {footing}", doc)
        after = os.getloadavg()
    return our_side(run, footing, launched, before, after)


def ray_versus(
    configs: list[dict[str, Any]],
    base: dict[str, Any],
    args: argparse.Namespace,
    cache: Path,
    workdir: Path,
    footing: str,
) -> Side:
    run = run_ray(
        configs,
        base=base,
        min_steps=args.min_steps,
        reduction_factor=args.reduction_factor,
        parallel=SLOTS,
        cache=cache,
        workdir=workdir,
        warm=footing == "warm",
    )
    side = ray_side(run, footing, args.steps)
    reached = f"{side.to_best:.1f} s" if side.to_best is not None else "none trained to the end"
    print(
        f"Ray Tune {footing}: fit() {side.wall:.1f} s from its clock, {side.steps} steps, best "
        f"trial {side.best[0] if side.best else '-'} after {reached}",
        flush=True,
    )
    return side


def versus_sittings(args: argparse.Namespace, tmp: Path, doc: dict[str, Any]) -> list[Sitting]:
    """Figure 4: --repeats sittings of ours cold, Ray cold, ours warm, Ray warm (odd sittings
    in this order, even ones with Ray first at each footing), each on its own stack or Ray."""
    cache = tmp / "cache"
    make_data_cache(doc, cache)
    base = {k: v for k, v in doc.items() if k != "search"}
    configs: list[dict[str, Any]] = []
    sittings = []
    for number in range(1, args.repeats + 1):
        sides = []
        for footing in ("cold", "warm"):
            for ours in (True, False) if number % 2 else (False, True):
                where = tmp / f"sitting{number}-{'ours' if ours else 'ray'}-{footing}"
                if ours:
                    side = ours_versus(where, cache, doc, footing)
                    assert isinstance(side.run, SweepRun)
                    params = [t.params for t in side.run.trials]
                    if configs and params != configs:
                        raise SystemExit("our sweeps sampled different values: not comparable")
                    configs = params
                elif not args.no_ray:
                    side = ray_versus(configs, base, args, cache, where, footing)
                else:
                    continue
                sides.append(side)
        sittings.append(Sitting(number, sides))
    return sittings


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
    parser.add_argument("--repeats", type=int, default=1, help="sittings of figure 4")
    parser.add_argument(
        "--versus-only", action="store_true", help="figure 4 alone (ours against Ray Tune)"
    )
    parser.add_argument("--smoke", action="store_true", help="3 trials of 200 steps, 2 of 100")
    parser.add_argument(
        "--no-ray", action="store_true", help="leave Ray Tune out (figure 4: ours alone)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--plot", type=Path, default=None, help="best accuracy against time")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.plot and args.versus_only:
        parser.error("--plot draws figure 1's sweeps, which --versus-only leaves out")
    if args.smoke:
        args.trials, args.steps, args.scale_trials, args.scale_steps = 3, 200, 2, 100
        args.scale_repeats = args.repeats = 1
    base_disp = int(yaml.safe_load(EXAMPLE.read_text())["disp_freq"])
    common = {"trials": args.trials, "steps": args.steps, "max_parallel": SLOTS}
    asha_doc = sweep_document(
        **common, pruner="asha", min_steps=args.min_steps, reduction=args.reduction_factor
    )
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        if not args.versus_only:
            full, asha, pairs, timed = figures_1_to_3(args, Path(tmp), asha_doc)
            if [t.params for t in full.trials] != [t.params for t in asha.trials]:
                raise SystemExit("the two sweeps sampled different values: not comparable")
        sittings = versus_sittings(args, Path(tmp), asha_doc)
    if not args.versus_only:
        found = figures(full, asha, pairs, timed, steps=args.steps, disp_freq=base_disp)
        show(full, asha, found, args.steps)
        first = sittings[0].side(ours=True, footing="cold")
        assert first is not None and isinstance(first.run, SweepRun)
        if [t.params for t in full.trials] != [t.params for t in first.run.trials]:
            raise SystemExit("figure 4's sweeps sampled other values than figure 1's")
    against = versus(sittings)
    show_versus(sittings, against)
    if args.json:
        figured = (
            {}
            if args.versus_only
            else {
                "figures": asdict(found),
                "sweeps": [asdict(run) for run in (full, asha, *chain(*pairs), *timed)],
            }
        )
        args.json.write_text(
            json.dumps(
                {
                    **figured,
                    "versus": asdict(against),
                    "sittings": [asdict(sitting) for sitting in sittings],
                },
                indent=1,
            )
        )
    if args.plot:
        ray = sittings[0].side(ours=False, footing="warm")
        plot(
            full,
            asha,
            ray.run if ray and isinstance(ray.run, RayRun) else None,
            args.steps,
            args.plot,
        )
        print(f"plot: {args.plot}")


def figures_1_to_3(
    args: argparse.Namespace, tmp: Path, asha_doc: dict[str, Any]
) -> tuple[SweepRun, SweepRun, list[tuple[SweepRun, SweepRun]], tuple[SweepRun, SweepRun]]:
    """The full random search and ASHA's sweep (figure 1), the pairs of figure 2 and the pair
    that reports every step (figure 3), on one warm stack."""
    with service(tmp) as (client, db, _):
        common = {"trials": args.trials, "steps": args.steps, "max_parallel": SLOTS}
        full = run_sweep(client, db, "full random", sweep_document(**common, pruner="none"))
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
    return full, asha, pairs, timed


if __name__ == "__main__":
    main()
