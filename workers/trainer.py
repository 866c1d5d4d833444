"""The training loop: one readable piece shared by the local trainer and distributed workers.

A run restores where it stands and then repeats a step `train_steps` times: `train_one_batch`
(the job's algorithm: loss and gradients), `apply_update`, then what follows a step, each in a
room of its own with an `after_step` the loop calls in this order: `reporting` (the display
window's figures every disp_freq steps: workers/reporting.py), `evaluation` (the validation split
every validate.freq steps, the objective's best step, whose checkpoint keep_best keeps, and
early stopping; the test split every test.freq steps: workers/evaluation.py) and
`checkpointing` (the user's checkpoints every checkpoint.freq steps, the service's restart
points every few minutes: workers/checkpoint.py); their `finish` ends the run. The loop does not
assume it runs alone: a worker passes its rank and world size (it then trains on its part of
each global batch), and what its framework changes in a step (how the update is applied, what
runs at the start, how checkpoints map to its tensors, how a split is evaluated, how the workers
agree to stop) comes in through `StepHooks`, built by workers/parallel.py before the trainer.
Every forward pass runs in the job's `precision` (workers/precision.py), through the compiled
net (torch.compile) when the job asks for `compile` (workers/compiled_net.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.rundir import SUMMARY
from dsl.compiler import CompiledJob
from workers.algorithms import ALGORITHMS, BatchResult
from workers.checkpoint import Checkpoint, Checkpointing, write_json_atomic
from workers.compiled_net import CompiledNet
from workers.data import Dataset
from workers.evaluation import Evaluation, evaluate_whole
from workers.metrics import MetricSink
from workers.precision import precision_for
from workers.reporting import Reporting
from workers.updaters import ParamEntry, Updater


@dataclass
class TrainOptions:
    run_dir: Path
    device: str = "cpu"
    resume: bool = False
    rank: int = 0  # which part of every batch this worker takes (of `world`)
    world: int = 1
    group: int = 0
    # The worker's rank inside its group, which metrics carry; default `rank` (the same but for
    # the parameter server's workers, whose batch parts are numbered across groups).
    group_rank: int | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    should_stop: Callable[[], bool] = lambda: False
    # Whether a stop is the node agent's drain (SIGTERM): the run saves a restart point first.
    drain: Callable[[], bool] = lambda: False
    # The service's restart points: the file this attempt continues from, and how often the
    # writer saves one (seconds of training; 0: never).
    resume_from: Path | None = None
    restart_seconds: float = 0.0
    # An asynchronous worker restarted alone: the step it goes on from (its parameters come
    # from the server shards, its data position from the step).
    start_step: int = 0
    # Whether this worker writes the run's checkpoints and summary; default: part 0 of the
    # batches does (the stages of a pipeline all read part 0, and only the first one writes).
    writes: bool | None = None

    @property
    def is_writer(self) -> bool:
        return self.rank == 0 if self.writes is None else self.writes

    @property
    def metric_rank(self) -> int:
        """The rank metrics carry with `group`: the worker's rank inside its group."""
        return self.rank if self.group_rank is None else self.group_rank


@dataclass
class Best:
    """The objective's best value over the run's evaluations, and where it was measured."""

    metric: str
    mode: str
    value: float | None
    step: int | None
    checkpoint: str | None = None  # keep_best's file

    def to_json(self) -> dict[str, object]:
        value = self.value if self.value is None or math.isfinite(self.value) else None
        return {**vars(self), "value": value}


@dataclass
class Summary:
    status: str
    steps: int
    metrics: dict[str, float]
    wall_time: float
    checkpoint: str | None = None
    best: Best | None = None
    stopped_early: str | None = None  # why the run ended before train_steps

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "steps": self.steps,
            # JSON has no NaN or Infinity (a diverged run's loss): such values become null.
            "metrics": {k: v if math.isfinite(v) else None for k, v in self.metrics.items()},
            "wall_time": round(self.wall_time, 3),
            "checkpoint": self.checkpoint,
            "best": self.best.to_json() if self.best is not None else None,
            "stopped_early": self.stopped_early,
        }


def _job_algorithm(trainer: Trainer, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
    return trainer.algorithm(trainer.net, x, y, trainer.spec, trainer.generator, trainer.precision)


def _local_update(trainer: Trainer, step: int) -> None:
    trainer.updater.step(step)


def _as_it_is(ckpt: Checkpoint) -> Checkpoint:
    return ckpt


def _alone(flag: bool) -> bool:
    return flag


@dataclass(frozen=True, kw_only=True)
class StepHooks:
    """What a framework changes in a step, built before the trainer (workers/parallel.py); the
    defaults are the local trainer's own. Each hook is handed the trainer when it runs."""

    # The batch's loss and gradients: a pipeline's stage runs its part of the schedule instead.
    train_one_batch: Callable[[Trainer, torch.Tensor, torch.Tensor], BatchResult] = _job_algorithm
    # From gradients to new parameters: replicas exchange gradients first (all-reduce), or
    # hand them to parameter-server shards and take the parameters back.
    apply_update: Callable[[Trainer, int], None] = _local_update
    # After `restore`, before the first step: replicas take the shards' or rank 0's values so
    # that every one starts from the same parameters.
    at_start: tuple[Callable[[Trainer], None], ...] = ()
    # A split's figures ("val" or "test"): a pipeline's stages pass it through all of them.
    evaluate: Callable[[Trainer, str], dict[str, float]] = evaluate_whole
    # A worker holding parts of the net maps between its tensors and the whole-net checkpoint,
    # whose format is the same whatever the framework.
    checkpoint_out: Callable[[Checkpoint], Checkpoint] = _as_it_is
    checkpoint_in: Callable[[Checkpoint], Checkpoint] = _as_it_is
    # Set where saving is a collective (parts of the net joined first): hands every worker rank
    # 0's answer, so that the workers agree on the steps they save restart points at. None: the
    # writer saves on its own, also when it is drained.
    restart_sync: Callable[[bool], bool] | None = None
    # Hands every worker rank 0's answer to "stop early now?", so that all stop at one step.
    agree: Callable[[bool], bool] = _alone


class Trainer:
    """One worker's training: its net, its part of every batch, its framework's hooks."""

    def __init__(
        self,
        job: CompiledJob,
        dataset: Dataset,
        options: TrainOptions,
        sinks: Sequence[MetricSink] = (),
        *,
        hooks: StepHooks = StepHooks(),
    ) -> None:
        self.job, self.spec, self.options, self.hooks = job, job.spec, options, hooks
        torch.manual_seed(self.spec.seed)  # layers that draw from the global stream (dropout)
        self.device = torch.device(options.device)
        self.precision = precision_for(self.spec.precision, self.device)
        self.net = job.net.to(self.device)
        self.data = dataset
        self.x_test = dataset.x_test.to(self.device)
        self.y_test = dataset.y_test.to(self.device)
        self.x_val = dataset.x_val.to(self.device) if dataset.x_val is not None else None
        self.y_val = dataset.y_val.to(self.device) if dataset.y_val is not None else None
        self.batches = dataset.train_batches(
            self.spec.data.batch_size,
            seed=self.spec.seed,
            rank=options.rank,
            world=options.world,
            shuffle=self.spec.data.shuffle,
            device=self.device,
        )
        specs = self.net.param_specs()
        self.updater = Updater(
            [
                ParamEntry(name, param, specs[name].lr_scale, specs[name].wd_scale)
                for name, param in self.net.named_params().items()
            ],
            self.spec.updater,
            total_steps=self.spec.train_steps,
            scaler=self.precision.scaler,
        )
        self.algorithm = ALGORITHMS.get(self.spec.train_one_batch.alg)
        self.generator = torch.Generator(device=self.device).manual_seed(self.spec.seed + 7)
        self.step = 0
        # What follows a step, in the order the loop calls them.
        self.reporting = Reporting(
            sinks, group=options.group, rank=options.metric_rank, writer=options.is_writer
        )
        self.evaluation = Evaluation(self.spec)
        self.checkpointing = Checkpointing(
            self.spec, options, dataset.info, restart_sync=hooks.restart_sync
        )
        self.compiled_net = CompiledNet(self.net, enabled=self.spec.compile, log=self.reporting.log)

    # -- a run -----------------------------------------------------------------------------
    def run(self, on_step: Callable[[int], None] | None = None) -> Summary:
        """Train from where the run stands (a restart point, a checkpoint, init_from) to the
        end or a stop; the summary, which the writer also leaves in the run directory."""
        started = time.perf_counter()
        self.restore()
        for start in self.hooks.at_start:
            start(self)
        self.net.train()
        try:
            status = self.loop(on_step)
        finally:
            self.batches.close()  # a streamed dataset's reader thread
        if status == "succeeded":
            self.finish()
        evaluation, saved = self.evaluation, self.checkpointing.saved
        best_file = self.checkpointing.best_file
        summary = Summary(
            status=status,
            steps=self.step,
            metrics={**self.reporting.last_train, **evaluation.last_val, **evaluation.last_test},
            wall_time=time.perf_counter() - started,
            checkpoint=str(saved[1]) if saved else None,
            best=Best(
                evaluation.objective.metric,
                evaluation.objective.mode,
                evaluation.selection.best,
                evaluation.selection.best_step,
                str(best_file) if best_file else None,
            ),
            stopped_early=evaluation.stopped_early,
        )
        if self.options.is_writer:
            write_json_atomic(self.options.run_dir / SUMMARY, summary.to_json())
        return summary

    def loop(self, on_step: Callable[[int], None] | None = None) -> str:
        """The steps up to train_steps, or to the validation that stops the run early; how
        they ended: succeeded, diverged, drained or cancelled."""
        spec = self.spec
        self.reporting.begin()
        if self.evaluation.stopped_already(self):  # restored from where it stopped early
            return "succeeded"
        while self.step < spec.train_steps:
            if self.options.should_stop():
                return self.stop()
            # Asked by every worker at this same point: a synced clock's answer is a collective.
            restart_point = self.checkpointing.restart_clock.due(self.step + 1)
            x, y = next(self.batches)
            result = self.train_one_batch(x, y)
            self.apply_update()
            self.step += 1
            if not self.reporting.after_step(self, result, len(x)):
                return "diverged"
            # The last step, and the validation that stops the run, are finished by `finish`:
            # evaluations first, then the last checkpoint, which holds what they selected.
            stop = self.evaluation.after_step(self)
            if not stop:
                self.checkpointing.after_step(self, restart_point)
            if on_step is not None:
                on_step(self.step)
            if stop:
                break
        return "succeeded"

    # -- the steps, in their order -------------------------------------------------------------
    def restore(self) -> None:
        """Where the run starts: a restart point, the latest checkpoint, or init_from."""
        self.checkpointing.restore(self)

    def train_one_batch(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        """The batch's loss and metrics, its gradients left in the parameters' `.grad`."""
        return self.compiled_net.run(lambda: self._gradients(x, y))

    def _gradients(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        self.updater.zero_grad()
        return self.hooks.train_one_batch(self, x, y)

    def apply_update(self) -> None:
        self.hooks.apply_update(self, self.step)

    def stop(self) -> str:
        """Stopped from outside; a drain saves a restart point first, to continue elsewhere."""
        status = "drained" if self.options.drain() else "cancelled"
        # A save that is a collective waits for peers, which may be stopping at another step.
        if status == "drained" and self.options.is_writer and self.hooks.restart_sync is None:
            self.checkpointing.save_restart_point(self)
        return status

    def finish(self) -> None:
        """After the last step (or the validation that stopped the run early): the validation
        figures unless this step has them, the test figures, and a checkpoint unless the step
        saved one."""
        self.evaluation.finish(self)
        self.checkpointing.finish(self)

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Loss and metrics over a split ("test" or "val") as `<split>/<name>`, as the
        framework evaluates it."""
        return self.hooks.evaluate(self, split)

    def eval_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The samples and labels of an evaluation split, on the device, and how many batches
        of it an evaluation takes (0: all)."""
        if split == "test":
            return self.x_test, self.y_test, self.spec.test.steps
        if split == "val" and self.x_val is not None and self.y_val is not None:
            return self.x_val, self.y_val, self.spec.validate.steps
        raise ValueError(f"the job has no {split} split to evaluate")
