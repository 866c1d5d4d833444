"""bench/sweep.py's peer: the same trials under Ray Tune's ASHAScheduler, trained in-process.

Each Ray trial is a function trainable that compiles the same job document with the trial's
values and trains it with our Trainer (the code a node agent's worker process runs), one
torch thread, reporting test/accuracy to Tune at every test pass; Ray decides at its rungs
from those reports. Ray is installed by the `bench` extra only (pip install -e '.[bench]').
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.stream import MetricRecord
from dsl.compiler import compile_job
from workers.data import TrainingData
from workers.metrics import Emitted, JsonlSink
from workers.trainer import Trainer, TrainOptions

ROOT = Path(__file__).resolve().parent.parent
METRIC = "test/accuracy"
WARMUP_STEPS = 20  # a warm-up trial's: its actor imports torch and loads the data, no more


@dataclass
class RayTrial:
    number: int
    params: dict[str, Any]
    value: float | None  # its last reported test/accuracy
    step: int  # the step of its last report
    ended: float  # unix time Tune recorded it complete (or stopped)


Load = tuple[float, float, float]  # os.getloadavg(): over 1, 5 and 15 minutes


@dataclass
class RayRun:
    launched: float  # unix time just before ray.init()
    started: float  # unix time the clock started (run_ray: before fit() or after warm-up)
    ended: float  # Tuner.fit() returned
    trials: list[RayTrial]
    load_started: Load  # the load average when the clock started ...
    load_ended: Load  # ... and when fit() returned


class TuneReport:
    """A MetricSink that reports each test pass to Tune (the call through which Ray's
    scheduler stops a trial)."""

    def emit(self, record: Emitted) -> None:
        from ray import tune

        if isinstance(record, MetricRecord) and METRIC in record.values:
            tune.report({"accuracy": record.values[METRIC], "step": record.step})

    def log(self, line: str) -> None:
        return None

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        return None

    def close(self) -> None:
        return None


def train_trial(
    config: dict[str, Any],
    *,
    configs: list[dict[str, Any]],
    base: dict[str, Any],
    cache: str,
    runs: str,
) -> None:
    """One trial in a Ray actor: what a node agent's worker process does with a trial job,
    with Tune's report in place of the job's Redis stream."""
    import torch

    torch.set_num_threads(1)
    number = config["trial"]
    data = TrainingData(cache_dir=Path(cache))
    # A warm-up trial (a negative number) trains the base job briefly, before any rung.
    overrides = configs[number] if number >= 0 else {"train_steps": WARMUP_STEPS}
    job = compile_job(base, data, overrides=overrides)
    run_dir = Path(runs) / f"trial-{number}-{time.monotonic_ns()}"  # a reused actor's next
    jsonl = JsonlSink(run_dir)
    try:
        trainer = Trainer(job, data.dataset, TrainOptions(run_dir=run_dir), [jsonl, TuneReport()])
        status = trainer.run().status
    finally:
        jsonl.close()
    if status != "succeeded":
        raise RuntimeError(f"trial {number}: training {status}")


def run_ray(
    configs: list[dict[str, Any]],
    *,
    base: dict[str, Any],
    min_steps: int,
    reduction_factor: int,
    parallel: int,
    cache: Path,
    workdir: Path,
    warm: bool = True,
) -> RayRun:
    """Ray Tune over `configs` in order (a grid over their indices), `parallel` at a time on
    a local Ray of `parallel` CPUs, ASHA with the sweep's rungs, reusing actors. ray.init is
    not on the clock (RayRun.launched is the time before it).

    `warm`: `parallel` warm-up trials of WARMUP_STEPS steps run first, one on each actor, and
    the clock starts when the last of them ends, so the timed trials run on actors that have
    imported torch and loaded the data (as our fork server's workers have). Cold: the clock
    starts before Tuner.fit(), the actors' start and imports counted."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ended: dict[int, float] = {}
    warmups = [-(n + 1) for n in range(parallel)] if warm else []
    warm_load: list[Load] = []

    class Ended(tune.Callback):
        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any):
            ended[trial.config["trial"]] = time.time()
            if warmups and not warm_load and all(n in ended for n in warmups):
                warm_load.append(os.getloadavg())  # the warm clock starts now

    launched = time.time()
    ray.init(
        num_cpus=parallel,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=200 * 1024 * 1024,
        # The actors import this module and the repository's packages, as the driver does.
        runtime_env={"env_vars": {"PYTHONPATH": f"{ROOT}:{ROOT / 'bench'}"}},
    )
    try:
        trainable = tune.with_parameters(
            train_trial,
            configs=configs,
            base=base,
            cache=str(cache),
            runs=str(workdir / "runs"),
        )
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space={"trial": tune.grid_search([*warmups, *range(len(configs))])},
            tune_config=tune.TuneConfig(
                metric="accuracy",
                mode="max",
                scheduler=ASHAScheduler(
                    time_attr="step",
                    max_t=int(base["train_steps"]),
                    grace_period=min_steps,
                    reduction_factor=reduction_factor,
                    brackets=1,
                ),
                max_concurrent_trials=parallel,
                reuse_actors=True,  # not Ray's default: one torch import per actor, not trial
            ),
            run_config=tune.RunConfig(
                name="sweep-bench",
                storage_path=str(workdir / "ray"),
                verbose=0,
                callbacks=[Ended()],
            ),
        )
        load_started = os.getloadavg()
        started = time.time()
        grid = tuner.fit()
        finished = time.time()
        load_ended = os.getloadavg()
    finally:
        ray.shutdown()
    if warmups:
        started = max(ended[n] for n in warmups)
        load_started = warm_load[0]
    trials = []
    for index in range(len(grid)):
        result = grid[index]
        number = (result.config or {})["trial"]
        if number < 0:
            continue
        metrics = result.metrics or {}
        trials.append(
            RayTrial(
                number,
                configs[number],
                metrics.get("accuracy"),
                int(metrics.get("step", 0)),
                ended.get(number, finished),
            )
        )
    return RayRun(
        launched,
        started,
        finished,
        sorted(trials, key=lambda t: t.number),
        load_started,
        load_ended,
    )
