"""bench/sweep.py's results: the trials of each sweep as the store recorded them, the four
figures computed from them, the tables printed and the plot drawn."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep_ray import RayRun

from scheduler.store.states import JobState


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
    sweep_id: int

    @property
    def wall(self) -> float:
        return self.ended - self.submitted

    @property
    def steps(self) -> int:
        return sum(t.step for t in self.trials)

    def to_best(self) -> float | None:
        best = next((t for t in self.trials if t.number == self.best_trial), None)
        return best.ended - self.submitted if best and best.ended else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Figures:
    steps_ratio: float
    steps_ratio_bound: float  # pruned trials counted with disp_freq - 1 more steps each
    best_full: float | None
    best_asha: float | None
    speedup: float  # the median of `speedups`
    speedups: list[float]  # max_parallel 1's wall time / 2's, each pair
    speedup_every_step: float  # the same, in the pair that reports every step (the overhead's)
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
    pairs: list[tuple[SweepRun, SweepRun]],
    timed: tuple[SweepRun, SweepRun],
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
    for run in timed:
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
        speedup=statistics.median(serial.wall / parallel.wall for serial, parallel in pairs),
        speedups=[serial.wall / parallel.wall for serial, parallel in pairs],
        speedup_every_step=timed[0].wall / timed[1].wall,
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


def show(full: SweepRun, asha: SweepRun, ray: RayRun | None, f: Figures, steps: int) -> None:
    ray_by = {t.number: t for t in ray.trials} if ray else {}
    asha_by = {t.number: t for t in asha.trials}
    paths = list(full.trials[0].params) if full.trials else []
    print("\n| trial | " + " | ".join(paths) + " | full | ASHA (step) | Ray ASHA (step) |")
    print("| --- " * (len(paths) + 4) + "|")
    for t in full.trials:
        a, r = asha_by.get(t.number), ray_by.get(t.number)
        values = " | ".join(f"{t.params.get(path, ''):.4g}" for path in paths)
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
    each = ", ".join(f"{ratio:.2f}x" for ratio in f.speedups)
    print(
        f"| sweep wall time, max_parallel 1 / 2, median of {len(f.speedups)} pairs | {each} | | "
        f"**{f.speedup:.2f}x** | >= 1.6x |"
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
    print(f"max_parallel 1 / 2 in the sweeps reporting every step: {f.speedup_every_step:.2f}x")
    print(
        f"ASHA sweep: created -> first report (at step {asha.trials[0].first_step}) "
        f"p50 {f.asha_first_report_p50:.3f} s"
    )
    if ray is not None:
        print(
            f"Ray Tune: fit() {f.ray_wall or 0:.1f} s, {f.ray_steps or 0:,} steps reported, "
            f"best {f.ray_best}; ours: ASHA sweep {asha.wall:.1f} s, {asha.steps:,} steps"
        )


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
