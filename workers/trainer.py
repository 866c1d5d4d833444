"""The training loop: one readable piece shared by the local trainer and distributed workers.

A run restores where it stands and then repeats a step `train_steps` times: `train_one_batch`
(the job's algorithm: loss and gradients), `apply_update`, `report` every disp_freq steps,
`validate` every validate.freq steps (the objective's best step, whose checkpoint keep_best
keeps, and early stopping: workers/selection.py), `evaluate` the test split every test.freq
steps and `checkpoint` (the user's every checkpoint.freq steps, the service's restart points
every few minutes). The loop does not assume it runs alone: a worker passes its rank and world
size (it then trains on its part of each global batch), and what its framework changes in a step
(how the update is applied, what runs at the start, how checkpoints map to its tensors, how a
split is evaluated, how the workers agree to stop) comes in through `StepHooks`, built by
workers/parallel.py before the trainer. Every forward pass runs in the job's
`precision` (workers/precision.py), through the compiled net (torch.compile) when the job asks for
`compile` (workers/compiled_net.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from contract.rundir import CHECKPOINTS, RESTART, SUMMARY, checkpoint_path
from contract.stream import EventRecord, MetricRecord
from dsl.compiler import CompiledJob
from dsl.model_card import MODEL_KEY, DataFacts, ModelCard
from dsl.objective import resolve_objective
from dsl.schema import JobSpec
from workers.algorithms import ALGORITHMS, BatchResult
from workers.checkpoint import (
    Checkpoint,
    CheckpointError,
    RestartClock,
    load_checkpoint,
    load_matching_params,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
    write_json_atomic,
)
from workers.compiled_net import CompiledNet
from workers.data import Dataset, restore_stream, stream_meta
from workers.evaluation import evaluate_whole
from workers.metrics import MetricSink
from workers.precision import precision_for
from workers.selection import META_KEY, Selection
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


def validation_due(spec: JobSpec, done: int) -> bool:
    """Whether the trainer evaluates the validation split once `done` steps are done (it
    always does at the end)."""
    if not spec.data.has_validation():
        return False
    return done == spec.train_steps or bool(spec.validate.freq and done % spec.validate.freq == 0)


def selection_due(spec: JobSpec, done: int) -> bool:
    """Whether the objective is measured once `done` steps are done: a step where keep_best
    may save the best checkpoint, or early stopping end the run."""
    if resolve_objective(spec).metric.startswith("val/"):
        return validation_due(spec, done)
    return done == spec.train_steps or bool(spec.test.freq and done % spec.test.freq == 0)


class _Window:
    """The figures of one display window: each step's values are kept as they came, device
    tensors, and summed at the report, so that a step adds no device operation and never waits
    for the device (a GPU step's host time is the trainer's cost there, bench/overhead.py).

    The sums are the step-by-step fp32 sums the window always made (`np.add.accumulate` adds
    in order, in fp32, as `sum = sum + value` did on the device), so the reported figures are
    the same to the bit. Every `FOLD` steps the values kept so far are summed into the host's
    running sums, which bounds what a long window (a large disp_freq) holds, at one wait for the
    device per `FOLD` steps."""

    FOLD = 1024

    def __init__(self) -> None:
        self.kept: dict[str, list[torch.Tensor]] = {}
        self.sums: dict[str, np.float32] = {}
        self.count = 0
        self.samples = 0
        self.started = time.perf_counter()

    def add(self, result: BatchResult, samples: int) -> None:
        for key, tensor in {"loss": result.loss, **result.metrics}.items():
            self.kept.setdefault(key, []).append(tensor)
        self.count += 1
        self.samples += samples
        if len(self.kept["loss"]) >= self.FOLD:
            self._fold()

    def _fold(self) -> None:
        """Sum the kept values into the running sums, in step order, in fp32."""
        for key, tensors in self.kept.items():
            values = torch.stack(tensors).float().cpu().numpy()  # (steps,)
            if key in self.sums:
                values = np.concatenate([[self.sums[key]], values]).astype(np.float32)
            with np.errstate(over="ignore", invalid="ignore"):  # a diverged loss sums to inf/nan
                self.sums[key] = np.add.accumulate(values)[-1]
        self.kept = {}

    def report(self) -> dict[str, float]:
        self._fold()
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        out = {f"train/{k}": float(v) / self.count for k, v in self.sums.items()}
        out["samples_per_sec"] = self.samples / elapsed
        return out


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
        self.sinks = list(sinks)
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
        # Asked every disp_freq steps when synced: each answer is a collective.
        self.restart_clock = (
            RestartClock(options.restart_seconds)
            if hooks.restart_sync is None
            else RestartClock(
                options.restart_seconds, every=self.spec.disp_freq, sync=hooks.restart_sync
            )
        )
        self.step = 0
        self.last_test: dict[str, float] = {}
        self.last_val: dict[str, float] = {}
        self.last_train: dict[str, float] = {}
        self.saved: tuple[int, Path] | None = None  # the latest checkpoint: its step, its file
        self.objective = resolve_objective(self.spec)
        self.selection = Selection()
        self.validated = -1  # the step of the latest validation
        self.best_file: Path | None = None  # keep_best's checkpoint
        self.stopped_early: str | None = None
        self.checkpoint_dir = options.run_dir / CHECKPOINTS
        self.compiled_net = CompiledNet(self.net, enabled=self.spec.compile, log=self.log)
        # Every checkpoint describes its model, so that the file alone rebuilds the net.
        info = dataset.info
        facts = DataFacts(
            sample_shape=info.sample_shape,
            x_dtype=info.x_dtype,
            num_classes=info.num_classes,
            label_shape=info.label_shape,
            label_is_index=info.label_is_index,
            vocabulary=info.vocabulary,
            categories=info.categories,
        )
        self.model_card = ModelCard(self.spec, facts).to_json()

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
        summary = Summary(
            status=status,
            steps=self.step,
            metrics={**self.last_train, **self.last_val, **self.last_test},
            wall_time=time.perf_counter() - started,
            checkpoint=str(self.saved[1]) if self.saved else None,
            best=Best(
                self.objective.metric,
                self.objective.mode,
                self.selection.best,
                self.selection.best_step,
                str(self.best_file) if self.best_file else None,
            ),
            stopped_early=self.stopped_early,
        )
        if self.options.is_writer:
            write_json_atomic(self.options.run_dir / SUMMARY, summary.to_json())
        return summary

    def loop(self, on_step: Callable[[int], None] | None = None) -> str:
        """The steps up to train_steps, or to the validation that stops the run early; how
        they ended: succeeded, diverged, drained or cancelled."""
        spec = self.spec
        window = _Window()
        if self.selection.exhausted(spec.early_stop):  # restored from where it stopped early
            assert spec.early_stop is not None
            self.stopped_early = self.selection.stop_message(
                self.objective, self.step, spec.early_stop
            )
            return "succeeded"
        while self.step < spec.train_steps:
            if self.options.should_stop():
                return self.stop()
            # Asked by every worker at this same point: a synced clock's answer is a collective.
            restart_point = self.restart_clock.due(self.step + 1)
            x, y = next(self.batches)
            result = self.train_one_batch(x, y)
            self.apply_update()
            window.add(result, len(x))
            self.step += 1
            if self.step % spec.disp_freq == 0 or self.step == spec.train_steps:
                if not self.report(window):
                    return "diverged"
                window = _Window()
            # The last step, and the validation that stops the run, are finished by `finish`:
            # evaluations first, then the last checkpoint, which holds what they selected.
            last = self.step == spec.train_steps
            stop = validation_due(spec, self.step) and not last and self.validate()
            if spec.test.freq and self.step % spec.test.freq == 0 and not last:
                self.evaluate_and_report()
            if not (stop or last):
                self.checkpoint(restart_point)
            if on_step is not None:
                on_step(self.step)
            if stop:
                break
        return "succeeded"

    # -- the steps, in their order -------------------------------------------------------------
    def train_one_batch(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        """The batch's loss and metrics, its gradients left in the parameters' `.grad`."""
        return self.compiled_net.run(lambda: self._gradients(x, y))

    def _gradients(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        self.updater.zero_grad()
        return self.hooks.train_one_batch(self, x, y)

    def apply_update(self) -> None:
        self.hooks.apply_update(self, self.step)

    def report(self, window: _Window) -> bool:
        """Emit the display window's training figures; False when the loss diverged."""
        self.last_train = window.report()
        loss = self.last_train.get("train/loss", math.nan)
        if not math.isfinite(loss):
            self.log(f"step {self.step}: training diverged (loss {loss})")
            return False
        self.emit({**self.last_train, "lr": self.updater.lr_at(self.step - 1)})
        return True

    def evaluate_and_report(self) -> None:
        self.last_test = self.evaluate()
        self.emit(self.last_test)
        self.select(self.last_test)

    def validate(self, *, final: bool = False) -> bool:
        """Evaluate the validation split and report it; whether the run stops early here
        (every worker gets the same answer; never at the `final` step)."""
        self.last_val = self.evaluate("val")
        self.validated = self.step
        self.emit(self.last_val)
        self.select(self.last_val)
        early_stop = self.spec.early_stop
        if final or early_stop is None:
            return False
        if not self.hooks.agree(self.selection.exhausted(early_stop)):
            return False
        self.stopped_early = self.selection.stop_message(self.objective, self.step, early_stop)
        self.log(self.stopped_early)
        if self.options.is_writer:
            for sink in self.sinks:
                sink.emit(EventRecord(self.step, self.stopped_early))
        return True

    def select(self, figures: dict[str, float]) -> None:
        """The objective's value among an evaluation's `figures`: a new best is kept
        (checkpoint.keep_best), the validations without an improvement are counted."""
        if self.objective.metric not in figures:
            return
        early_stop = self.spec.early_stop
        min_delta = early_stop.min_delta if early_stop is not None else 0.0
        value = figures[self.objective.metric]
        improved = self.selection.observe(self.objective, self.step, value, min_delta)
        if improved and self.spec.checkpoint.keep_best and self.options.is_writer:
            self.save_checkpoint(best=True)

    def checkpoint(self, restart_point: bool) -> None:
        """The writer's save after a step before the last: the user's checkpoint every
        checkpoint.freq steps, else a restart point when the clock said so."""
        spec = self.spec
        if not self.options.is_writer:
            return
        if spec.checkpoint.freq and self.step % spec.checkpoint.freq == 0:
            self.save_checkpoint()
        elif restart_point:
            self.save_restart_point()

    def stop(self) -> str:
        """Stopped from outside; a drain saves a restart point first, to continue elsewhere."""
        status = "drained" if self.options.drain() else "cancelled"
        # A save that is a collective waits for peers, which may be stopping at another step.
        if status == "drained" and self.options.is_writer and self.hooks.restart_sync is None:
            self.save_restart_point()
        return status

    def finish(self) -> None:
        """After the last step (or the validation that stopped the run early): the validation
        figures unless this step has them, the test figures, and a checkpoint unless the step
        saved one."""
        if self.x_val is not None and self.validated != self.step:
            self.validate(final=True)
        self.evaluate_and_report()
        if self.options.is_writer and (self.saved is None or self.saved[0] != self.step):
            self.save_checkpoint()

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

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, *, best: bool = False) -> Path:
        """The user's checkpoint of this step; `best`: the objective's best so far, which
        keep_best keeps whatever `keep` deletes (saved once: a step saved already is marked)."""
        if self.saved is None or self.saved[0] != self.step:
            path = self._write_checkpoint()
            self.saved = (self.step, path)
        elif best:  # saved anyway: marked, and the best before it goes unless kept anyway
            path = self.saved[1]
            prune_checkpoints(self.checkpoint_dir, self.spec.checkpoint.keep, protect=self.step)
        else:
            return self.saved[1]
        if best:
            self.best_file = path
        for sink in self.sinks:
            sink.checkpoint(self.step, path, best=best)
        return path

    def save_restart_point(self) -> Path:
        """A restart point (the service's, apart from the user's checkpoints). Two are kept: the
        service may need the older one (scheduler/recovery/actions.py: resume_point)."""
        path = self._write_checkpoint(self.options.run_dir / RESTART, keep=2)
        self.log(f"step {self.step}: restart point {path.name}")
        return path

    def _write_checkpoint(self, directory: Path | None = None, keep: int | None = None) -> Path:
        buffers = {
            f"{name}/{local}": buf
            for name, module in self.net.named_layers()
            for local, buf in module.named_buffers()
        }
        ckpt = Checkpoint(
            step=self.step,
            params={name: p.detach() for name, p in self.net.named_params().items()},
            buffers=buffers,
            updater=self.updater.state_tensors(),
            rng=self._rng_states(),
            meta={
                "job": self.spec.name,
                **stream_meta(self.batches),
                META_KEY: self.selection.to_meta(),
                MODEL_KEY: self.model_card,
                **self.precision.state(),
            },
        )
        # keep_best's checkpoint stays, whatever `keep` deletes.
        kept = self.selection.best_step if self.spec.checkpoint.keep_best else None
        return save_checkpoint(
            directory or self.checkpoint_dir,
            self.hooks.checkpoint_out(ckpt),
            self.spec.checkpoint.keep if keep is None else keep,
            protect=kept if directory is None else None,
        )

    def restore(self) -> None:
        """Continue from the service's restart point, or the run's latest checkpoint
        (`--resume`), or start from init_from."""
        path = self.options.resume_from
        if path is None and self.options.resume:
            try:
                path = resolve_checkpoint(self.checkpoint_dir)
            except ValueError:
                self.log("resume: no checkpoint yet, starting from step 0")
        if path is not None:
            ckpt = self.hooks.checkpoint_in(load_checkpoint(path))
            load_matching_params(self.net.named_params(), ckpt)
            self._load_buffers(ckpt)
            self.updater.load_state_tensors(ckpt.updater)
            self.precision.load_state(ckpt.meta)
            self._load_rng_states(ckpt.rng)
            self.selection = Selection.from_meta(ckpt.meta.get(META_KEY))
            if self.spec.checkpoint.keep_best and self.selection.best_step is not None:
                kept = checkpoint_path(self.checkpoint_dir, self.selection.best_step)
                self.best_file = kept if kept.is_file() else None
            self.step = ckpt.step
            restore_stream(self.batches, ckpt.meta)
            self.log(f"resumed from {path.name} at step {self.step}")
            return
        if self.options.start_step:
            self.step = self.options.start_step
            per_epoch = self.batches.steps_per_epoch
            self.batches.restore(
                {"epoch": self.step // per_epoch, "position": self.step % per_epoch}
            )
            self.log(f"restarted alone at step {self.step}; parameters from the server shards")
            return
        init_from = self.spec.checkpoint.init_from
        if init_from is not None and not isinstance(init_from, str):
            what = f"job {init_from.job}" if init_from.job else f"model {init_from.model}"
            raise CheckpointError(
                f"checkpoint.init_from: {what} is on the service; the service finds its "
                "checkpoint (trainyard submit), or `trainyard train` downloads it"
            )
        if init_from:
            where = Path(init_from)
            if not where.is_absolute():
                where = self.options.base_dir / where
            try:
                ckpt = self.hooks.checkpoint_in(load_checkpoint(resolve_checkpoint(where)))
                loaded = load_matching_params(self.net.named_params(), ckpt)
            except CheckpointError as exc:
                raise CheckpointError(f"checkpoint.init_from: {exc}") from None
            self._load_buffers(ckpt)
            self.log(f"initialised {len(loaded)} parameters from {where}: {', '.join(loaded)}")

    def _train_rng_key(self) -> str:
        """The training generator lives on the job's device, and a CPU generator's state does
        not fit a CUDA one's: each is saved under its own key (a CPU job's under "train")."""
        return "train" if self.device.type == "cpu" else f"train_{self.device.type}"

    def _rng_states(self) -> dict[str, torch.Tensor]:
        states = {self._train_rng_key(): self.generator.get_state()}
        states["global"] = torch.get_rng_state()
        if self.device.type == "cuda":
            states["global_cuda"] = torch.cuda.get_rng_state(self.device)
        return states

    def _load_rng_states(self, states: dict[str, torch.Tensor]) -> None:
        key = self._train_rng_key()
        own = states.get(key)
        # A checkpoint from before the keys were apart holds a CUDA job's state under "train".
        if own is not None and own.numel() == self.generator.get_state().numel():
            self.generator.set_state(own)
        elif any(name.startswith("train") for name in states):
            self.log(
                f"the checkpoint's training generator was on another device; on "
                f"{self.device.type} it starts again from the job's seed"
            )
        if "global" in states:
            torch.set_rng_state(states["global"])
        if "global_cuda" in states and self.device.type == "cuda":
            torch.cuda.set_rng_state(states["global_cuda"], self.device)

    def _load_buffers(self, ckpt: Checkpoint) -> None:
        with torch.no_grad():
            for name, module in self.net.named_layers():
                for local, buf in module.named_buffers():
                    saved = ckpt.buffers.get(f"{name}/{local}")
                    if saved is not None and saved.shape == buf.shape:
                        buf.copy_(saved)

    # -- reporting -------------------------------------------------------------------------
    def emit(self, values: dict[str, float]) -> None:
        record = MetricRecord(
            self.step, values, group=self.options.group, rank=self.options.metric_rank
        )
        for sink in self.sinks:
            sink.emit(record)

    def log(self, line: str) -> None:
        for sink in self.sinks:
            sink.log(line)
