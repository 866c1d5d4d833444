"""bench/sweep.py's results: the trials of each sweep as the store recorded them, the four
figures computed from them (the fourth, ours against Ray Tune, from its sittings: Sitting), the
tables printed and the plot drawn."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweep_ray import Load, RayRun

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
    created: float  # the sweep's row written by the API (its checks done)
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


def ray_best(ray: RayRun, steps: int) -> tuple[int, float, float] | None:
    """(trial, value, seconds to it) of the best trial that trained to the end."""
    done = [t for t in ray.trials if t.step >= steps and t.value is not None]
    if not done:
        return None
    best = max(done, key=lambda t: (t.value, -t.number))
    assert best.value is not None
    return best.number, best.value, best.ended - ray.started


@dataclass
class Side:
    """One side of figure 4 in one sitting: ours or Ray Tune's, cold or warm, its clock from
    `started` (unix time)."""

    label: str  # "ours cold", "Ray Tune warm", ...
    ours: bool
    footing: str  # "cold" or "warm"
    launched: float  # unix time before the side's service started (our stack's, ray.init())
    started: float
    to_best: float | None  # seconds from `started` to the end of the best trial
    best: tuple[int, float] | None  # (trial, its test accuracy)
    wall: float  # seconds from `started` to the sweep's end (ours) or fit()'s return (Ray's)
    steps: int  # the trials' last reported steps, summed
    load_before: Load  # os.getloadavg() when the clock started ...
    load_after: Load  # ... and when the side ended
    run: SweepRun | RayRun

    def from_launch(self) -> float:
        """Seconds from before the service's start to the best trial's end."""
        assert self.to_best is not None
        return self.started - self.launched + self.to_best


def our_side(
    run: SweepRun, footing: str, launched: float, load_before: Load, load_after: Load
) -> Side:
    best = next((t for t in run.trials if t.number == run.best_trial), None)
    return Side(
        f"ours {footing}",
        True,
        footing,
        launched,
        run.submitted,
        run.to_best(),
        (best.number, best.value) if best and best.value is not None else None,
        run.wall,
        run.steps,
        load_before,
        load_after,
        run,
    )


def ray_side(run: RayRun, footing: str, steps: int) -> Side:
    found = ray_best(run, steps)
    return Side(
        f"Ray Tune {footing}",
        False,
        footing,
        run.launched,
        run.started,
        found[2] if found else None,
        (found[0], found[1]) if found else None,
        run.ended - run.started,
        sum(t.step for t in run.trials),
        run.load_started,
        run.load_ended,
        run,
    )


@dataclass
class Sitting:
    """Figure 4's sides, run one after the other (`sides` in the order they ran)."""

    number: int
    sides: list[Side]

    def side(self, *, ours: bool, footing: str) -> Side | None:
        return next((s for s in self.sides if s.ours == ours and s.footing == footing), None)

    def ratio(self, footing: str, *, from_launch: bool = False) -> float | None:
        """Ours / Ray Tune's time to the best trial, both on `footing`; `from_launch`: from
        before each side's service started (a warm side's warm-up would count too)."""
        ours, theirs = self.side(ours=True, footing=footing), self.side(ours=False, footing=footing)
        if ours is None or theirs is None or ours.to_best is None or not theirs.to_best:
            return None
        if from_launch:
            return ours.from_launch() / theirs.from_launch()
        return ours.to_best / theirs.to_best


@dataclass
class Versus:
    """Figure 4 over the sittings: ours / Ray Tune's time to the best trial, per footing."""

    warm: list[float]  # each sitting's ratio (where both sides reached a best trial)
    cold: list[float]
    cold_from_launch: list[float]  # cold, each side's service start counted too
    warm_median: float | None
    cold_median: float | None
    cold_from_launch_median: float | None


def versus(sittings: list[Sitting]) -> Versus:
    warm, cold, from_launch = (
        [r for s in sittings if (r := s.ratio(footing, from_launch=counted)) is not None]
        for footing, counted in (("warm", False), ("cold", False), ("cold", True))
    )

    def median(ratios: list[float]) -> float | None:
        return statistics.median(ratios) if ratios else None

    return Versus(warm, cold, from_launch, median(warm), median(cold), median(from_launch))


def figures(
    full: SweepRun,
    asha: SweepRun,
    pairs: list[tuple[SweepRun, SweepRun]],
    timed: tuple[SweepRun, SweepRun],
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
    )


def _reached(value: float | None, step: int) -> str:
    return f"{value:.3f} ({step})" if value is not None else "-"


def show(full: SweepRun, asha: SweepRun, f: Figures, steps: int) -> None:
    """Figures 1-3: the trials of the full search and ASHA's, then the table."""
    asha_by = {t.number: t for t in asha.trials}
    paths = list(full.trials[0].params) if full.trials else []
    print("\n| trial | " + " | ".join(paths) + " | full | ASHA (step) |")
    print("| --- " * (len(paths) + 3) + "|")
    for t in full.trials:
        a = asha_by.get(t.number)
        values = " | ".join(f"{t.params.get(path, ''):.4g}" for path in paths)
        ours = _reached(a.value, a.step) if a else "-"
        shown = f"{t.value:.3f}" if t.value is not None else t.state
        print(f"| {t.number} | {values} | {shown} | {ours} |")
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
    parts = ", ".join(f"{name} {value:.3f} s" for name, value in f.overhead_parts.items())
    print(f"\noverhead p50 by part: {parts}")
    each = ", ".join(f"{name} {value:.3f} s" for name, value in f.overhead_by_sweep.items())
    print(f"overhead p50 by sweep: {each}")
    print(f"max_parallel 1 / 2 in the sweeps reporting every step: {f.speedup_every_step:.2f}x")
    print(
        f"ASHA sweep: created -> first report (at step {asha.trials[0].first_step}) "
        f"p50 {f.asha_first_report_p50:.3f} s"
    )


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "-"


def show_versus(sittings: list[Sitting], found: Versus) -> None:
    """Figure 4: each side of each sitting, the first sitting's trials, then the ratios."""
    print(
        "\n| sitting | side | to the best trial | best (trial, accuracy) | whole | steps "
        "| service start | load avg 1 min, before -> after |"
    )
    print("| --- " * 8 + "|")
    for sitting in sittings:
        for side in sitting.sides:
            best = f"{side.best[0]}, {side.best[1]:.3f}" if side.best else "-"
            # A warm side's start is followed by its warm-up, off the clock.
            start = side.started - side.launched if side.footing == "cold" else None
            print(
                f"| {sitting.number} | {side.label} | {_seconds(side.to_best)} | {best} | "
                f"{side.wall:.1f} s | {side.steps:,} | {_seconds(start)} | "
                f"{side.load_before[0]:.2f} -> {side.load_after[0]:.2f} |"
            )
    first = sittings[0]
    print(f"\nsitting {first.number}, each trial's last test accuracy (its step):")
    print("| trial | " + " | ".join(side.label for side in first.sides) + " |")
    print("| --- " * (len(first.sides) + 1) + "|")
    by_side = [{t.number: t for t in side.run.trials} for side in first.sides]
    for number in sorted(by_side[0]):
        cells = [
            _reached(trial.value, trial.step) if (trial := trials.get(number)) else "-"
            for trials in by_side
        ]
        print(f"| {number} | " + " | ".join(cells) + " |")
    for side in first.sides:
        if isinstance(side.run, SweepRun) and side.run.trials:
            t = min(side.run.trials, key=lambda trial: trial.created)
            if t.scheduled and t.started and t.first_report:
                print(
                    f"{side.label}, first trial: submit -> the sweep's row "
                    f"{side.run.created - side.started:.2f} s, -> the trial's "
                    f"{t.created - side.run.created:.2f} s, -> placed "
                    f"{t.scheduled - t.created:.2f} s, -> running {t.started - t.scheduled:.2f} s"
                    f", -> first report (step {t.first_step}) {t.first_report - t.started:.2f} s"
                )
    print("\n| figure | each sitting | median | target |")
    print("| --- | --- | --- | --- |")
    for name, ratios, median, target in (
        ("both warm", found.warm, found.warm_median, "<= 1"),
        ("both cold", found.cold, found.cold_median, "none"),
        (
            "both cold, each service's start counted",
            found.cold_from_launch,
            found.cold_from_launch_median,
            "none",
        ),
    ):
        each = ", ".join(f"{ratio:.2f}" for ratio in ratios) or "-"
        shown = f"**{median:.2f}**" if median is not None else "-"
        figure = f"wall time to the best trial, ours / Ray Tune, {name}"
        print(f"| {figure} | {each} | {shown} | {target} |")


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
