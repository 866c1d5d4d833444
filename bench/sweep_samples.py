"""Issue 13's first figure over several samples of trials, not one: for each seed, a full random
search and the same trials under ASHA (and, with --pruners, Hyperband), through the service.

bench/sweep.py measures the figure on one sample (seed 0), where the best trial is a slow
starter that every early rung stops. This asks how often that happens: each seed gives
Optuna's RandomSampler another 16 sets of values from the same space (SPACE in bench/sweep.py),
and the pruned sweeps run exactly those (checked). Per seed and pruner it prints the steps
trained against the full search's, the best accuracy each found, and whether the pruned sweep
reached the full search's best (equal or higher) with at most a third of its steps. The
full search's test-accuracy curves are written to --json, so a rung's decisions can be read
against them.

    .venv/bin/python bench/sweep_samples.py [--seeds 0 1 2 3 4] [--pruners asha hyperband]
        [--trials 16] [--steps 3000] [--min-steps 100] [--reduction-factor 3] [--json out.json]

A pruner is `asha` or `hyperband` with --min-steps and --reduction-factor, or names its own as
TYPE:MIN_STEPS:REDUCTION_FACTOR (`--pruners asha asha:300:4` runs both after each full search).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import smoke
from sweep import MIN_STEPS, REDUCTION, SLOTS, run_sweep, service, sweep_document
from sweep_report import SweepRun

from scheduler.store.database import Database
from scheduler.store.models import Job, Metric
from scheduler.store.states import JobState

TARGET = 1 / 3


@dataclass
class Outcome:
    seed: int
    pruner: str
    steps_ratio: float
    best_full: float
    best_full_trial: int
    best_pruned: float
    best_pruned_trial: int | None
    pruned: int  # trials stopped early

    @property
    def reached(self) -> bool:
        return self.best_pruned >= self.best_full

    @property
    def met(self) -> bool:
        return self.reached and self.steps_ratio <= TARGET


def curves(db: Database, sweep: SweepRun) -> dict[int, list[tuple[int, float]]]:
    """Each trial's test accuracy at each test pass: {trial number: [(step, accuracy)]}."""
    with db.session() as session:
        rows = session.execute(
            select(Job.trial_number, Metric.step, Metric.value)
            .join(Metric, Metric.job_id == Job.id)
            .where(Job.sweep_id == sweep.sweep_id, Metric.name == "test/accuracy")
            .order_by(Job.trial_number, Metric.step)
        ).all()
    found: dict[int, list[tuple[int, float]]] = {t.number: [] for t in sweep.trials}
    for number, step, value in rows:
        found[int(number or 0)].append((int(step), float(value)))
    return found


def pruner_setting(text: str) -> str:
    """`asha`, `hyperband`, or either with its rungs: `asha:300:4`."""
    kind, *rungs = text.split(":")
    if kind not in ("asha", "hyperband") or len(rungs) not in (0, 2):
        raise argparse.ArgumentTypeError(f"{text!r}: expected asha or hyperband[:MIN:FACTOR]")
    if rungs and not all(part.isdigit() for part in rungs):
        raise argparse.ArgumentTypeError(f"{text!r}: the rungs are two whole numbers")
    return text


def outcome(seed: int, pruner: str, full: SweepRun, pruned: SweepRun) -> Outcome:
    if [t.params for t in full.trials] != [t.params for t in pruned.trials]:
        raise SystemExit(f"seed {seed}: the two sweeps sampled different values")
    if full.best_value is None or full.best_trial is None:
        raise SystemExit(f"seed {seed}: the full search found no best trial")
    return Outcome(
        seed=seed,
        pruner=pruner,
        steps_ratio=pruned.steps / full.steps,
        best_full=full.best_value,
        best_full_trial=full.best_trial,
        best_pruned=pruned.best_value if pruned.best_value is not None else 0.0,
        best_pruned_trial=pruned.best_trial,
        pruned=sum(t.state == JobState.PRUNED for t in pruned.trials),
    )


def show(outcomes: list[Outcome]) -> None:
    print("\n| seed | pruner | steps / full | best found (trial) | full's best (trial) | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for o in outcomes:
        print(
            f"| {o.seed} | {o.pruner} | {o.steps_ratio:.3f} | {o.best_pruned:.3f} "
            f"({o.best_pruned_trial}) | {o.best_full:.3f} ({o.best_full_trial}) | "
            f"{'yes' if o.met else 'no'} |"
        )
    for pruner in dict.fromkeys(o.pruner for o in outcomes):
        mine = [o for o in outcomes if o.pruner == pruner]
        met = sum(o.met for o in mine)
        reached = sum(o.reached for o in mine)
        print(
            f"{pruner}: met in {met} of {len(mine)} samples (reached the best in {reached}; "
            f"steps / full {min(o.steps_ratio for o in mine):.3f}-"
            f"{max(o.steps_ratio for o in mine):.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--pruners", nargs="+", type=pruner_setting, default=["asha"])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3000, help="train_steps of each trial")
    parser.add_argument("--min-steps", type=int, default=MIN_STEPS, help="the first rung")
    parser.add_argument("--reduction-factor", type=int, default=REDUCTION)
    parser.add_argument("--json", type=Path, default=None, help="outcomes and the full curves")
    args = smoke.parse(parser, seeds=[0], trials=2, steps=200)
    outcomes: list[Outcome] = []
    recorded: dict[int, dict[int, list[tuple[int, float]]]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="sweep-samples-") as tmp,
        service(Path(tmp)) as (client, db, _),
    ):
        common = {"trials": args.trials, "steps": args.steps, "max_parallel": SLOTS}
        for seed in args.seeds:
            full_doc = sweep_document(**common, pruner="none", seed=seed)
            full = run_sweep(client, db, f"seed {seed}, full random", full_doc)
            recorded[seed] = curves(db, full)
            for pruner in args.pruners:
                kind, *rungs = pruner.split(":")
                rung = [int(part) for part in rungs] or [args.min_steps, args.reduction_factor]
                doc = sweep_document(
                    **common,
                    pruner=kind,
                    seed=seed,
                    min_steps=rung[0],
                    reduction=rung[1],
                )
                found = run_sweep(client, db, f"seed {seed}, {pruner}", doc)
                outcomes.append(outcome(seed, pruner, full, found))
    show(outcomes)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "outcomes": [vars(o) for o in outcomes],
                    "curves": {seed: found for seed, found in recorded.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
