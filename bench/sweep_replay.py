"""Replays full random searches' recorded test-accuracy curves (bench/sweep_samples.py --json)
through Optuna's SuccessiveHalvingPruner at many settings, to see which first rung and
reduction factor would have reached each sample's best with at most a third of its steps.

The replay is a model of the service, not a measurement: the trials start in number order on
--slots slots, every step takes the same time, a trial reports its test accuracy at each test
pass, and the pruner decides at each report, as the service's ingester does. A pruned trial
counts the steps up to its last report. Use it to choose settings, then measure them on other
seeds through the service with bench/sweep_samples.py.

    .venv/bin/python bench/sweep_replay.py /tmp/samples.json [--slots 2]
        [--min-steps 100 200 300] [--reduction-factors 3 4 5]
"""

from __future__ import annotations

import argparse
import heapq
import json
from dataclasses import dataclass
from pathlib import Path

import optuna
import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
from optuna.pruners import SuccessiveHalvingPruner

Curve = list[tuple[int, float]]


@dataclass
class Replayed:
    steps: int
    full_steps: int
    best: float
    full_best: float

    @property
    def met(self) -> bool:
        return self.best >= self.full_best and self.steps * 3 <= self.full_steps


def replay(curves: list[Curve], *, slots: int, min_steps: int, reduction: int) -> Replayed:
    """Runs the trials `slots` at a time; returns the steps trained and the best final value."""
    study = optuna.create_study(
        direction="maximize",
        pruner=SuccessiveHalvingPruner(min_resource=min_steps, reduction_factor=reduction),
    )
    trials = [study.ask() for _ in curves]
    # Events (time, trial number, index of its report); a trial started at `start` reaches
    # its report at `step` at start + step.
    events: list[tuple[int, int, int]] = []
    waiting = list(range(len(curves)))
    trained = [0] * len(curves)
    finals: list[float] = []

    def start(at: int) -> None:
        if waiting:
            number = waiting.pop(0)
            heapq.heappush(events, (at + curves[number][0][0], number, 0))

    for _ in range(slots):
        start(0)
    while events:
        at, number, index = heapq.heappop(events)
        step, value = curves[number][index]
        trained[number] = step
        trials[number].report(value, step)
        last = index == len(curves[number]) - 1
        if last or trials[number].should_prune():
            if last:
                finals.append(value)
            start(at)
            continue
        heapq.heappush(events, (at + curves[number][index + 1][0] - step, number, index + 1))
    return Replayed(
        steps=sum(trained),
        full_steps=sum(curve[-1][0] for curve in curves),
        best=max(finals),
        full_best=max(curve[-1][1] for curve in curves),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("samples", type=Path, help="bench/sweep_samples.py --json output")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--min-steps", type=int, nargs="+", default=[100, 200, 300, 500])
    parser.add_argument("--reduction-factors", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    args = smoke.parse(parser, min_steps=[100], reduction_factors=[2])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    recorded: dict[str, dict[str, Curve]] = json.loads(args.samples.read_text())["curves"]
    seeds = sorted(recorded, key=int)
    print("| min_steps | reduction_factor | " + " | ".join(f"seed {s}" for s in seeds) + " | met |")
    print("| --- " * (len(seeds) + 3) + "|")
    for min_steps in args.min_steps:
        for reduction in args.reduction_factors:
            cells, met = [], 0
            for seed in seeds:
                curves = [recorded[seed][k] for k in sorted(recorded[seed], key=int)]
                found = replay(curves, slots=args.slots, min_steps=min_steps, reduction=reduction)
                met += found.met
                mark = "" if found.best >= found.full_best else " (missed best)"
                cells.append(f"{found.steps / found.full_steps:.3f}{mark}")
            print(f"| {min_steps} | {reduction} | " + " | ".join(cells) + f" | {met} |")


if __name__ == "__main__":
    main()
