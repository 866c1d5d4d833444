"""The training loop: one readable piece shared by the local trainer and distributed workers.

A run is `train_one_batch` (the job's algorithm computes gradients) followed by the update,
repeated `train_steps` times, with `evaluate` every test.freq steps and `save_checkpoint` every
checkpoint.freq steps (and the service's restart points every few minutes). The loop does not
assume it runs alone: a worker passes its rank and world size (it then trains on its part of
each global batch) and may replace how the update is applied (`apply_update`), e.g. by pushing
gradients to parameter-server shards. Every forward pass runs in the job's `precision`
(workers/precision.py), through the compiled forward when the job asks for `compile`
(workers/compiled.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contract.records import MetricRecord
from contract.runs import RESTART
from dsl.compiler import CompiledJob
from workers.algorithms import ALGORITHMS, BatchResult, rbm_input
from workers.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    load_matching_params,
    resolve_checkpoint,
    save_checkpoint,
    write_json_atomic,
)
from workers.compiled import CompiledForward
from workers.data import Dataset, TrainBatches, eval_batches
from workers.metrics import MetricSink
from workers.precision import precision_for
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
class Summary:
    status: str
    steps: int
    metrics: dict[str, float]
    wall_time: float
    checkpoint: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "steps": self.steps,
            # JSON has no NaN or Infinity (a diverged run's loss): such values become null.
            "metrics": {k: v if math.isfinite(v) else None for k, v in self.metrics.items()},
            "wall_time": round(self.wall_time, 3),
            "checkpoint": self.checkpoint,
        }


class _Window:
    """Running sums of one display window, kept on the device until reported."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0
        self.samples = 0
        self.started = time.perf_counter()

    def add(self, result: BatchResult, samples: int) -> None:
        values = {"loss": result.loss, **result.metrics}
        for key, tensor in values.items():
            value = tensor.float()  # summed in fp32 whatever the forward computed in
            self.sums[key] = self.sums[key] + value if key in self.sums else value
        self.count += 1
        self.samples += samples

    def report(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        out = {f"train/{k}": float(v) / self.count for k, v in self.sums.items()}
        out["samples_per_sec"] = self.samples / elapsed
        return out


class RestartClock:
    """When the writer saves a restart point: every `seconds` of training. The answer for a
    step is computed once; with `sync` (a collective that hands every worker rank 0's answer)
    it is asked every `every` steps, so the workers that save together agree on the step."""

    def __init__(
        self,
        seconds: float,
        *,
        every: int = 1,
        sync: Callable[[bool], bool] | None = None,
    ) -> None:
        self.seconds, self.every, self.sync = seconds, every, sync
        self.last = time.monotonic()
        self._memo = (-1, False)

    def due(self, step: int) -> bool:
        if self._memo[0] == step:
            return self._memo[1]
        answer = False
        if self.seconds > 0 and step % self.every == 0:
            now = time.monotonic()
            answer = now - self.last >= self.seconds
            if self.sync is not None:
                answer = self.sync(answer)
            if answer:
                self.last = now
        self._memo = (step, answer)
        return answer


class Trainer:
    def __init__(
        self,
        job: CompiledJob,
        dataset: Dataset,
        options: TrainOptions,
        sinks: Sequence[MetricSink] = (),
    ) -> None:
        self.job, self.spec, self.options = job, job.spec, options
        self.sinks = list(sinks)
        torch.manual_seed(self.spec.seed)  # layers that draw from the global stream (dropout)
        self.device = torch.device(options.device)
        self.precision = precision_for(self.spec.precision, self.device)
        self.net = job.net.to(self.device)
        self.data = dataset
        self.x_test = dataset.x_test.to(self.device)
        self.y_test = dataset.y_test.to(self.device)
        self.batches = TrainBatches(
            dataset.x_train,
            dataset.y_train,
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
        self.apply_update: Callable[[int], None] = self.updater.step
        # A worker holding slices of the parameters maps between its tensors and the whole-model
        # checkpoint here (workers/parallel.py); a whole net saves and loads as it is.
        self.checkpoint_out: Callable[[Checkpoint], Checkpoint] = lambda ckpt: ckpt
        self.checkpoint_in: Callable[[Checkpoint], Checkpoint] = lambda ckpt: ckpt
        # Whether the writer can save on its own (a net split by feature or into stages joins
        # its parts in a collective first, only at steps every worker knows of).
        self.saves_alone = True
        self.restart_clock = RestartClock(options.restart_seconds)
        # Run after `restore` and before the first step: a worker fetches the shared parameters
        # (workers/distributed/ps/client.py) so every replica starts from the same values.
        self.start_hooks: list[Callable[[], None]] = []
        # How the test split is evaluated: a pipeline's stages replace it with a pass through
        # all of them (workers/distributed/pipeline.py).
        self.evaluate: Callable[[], dict[str, float]] = self.evaluate_whole
        self.step = 0
        self.last_test: dict[str, float] = {}
        self.last_train: dict[str, float] = {}
        self.checkpoint_dir = options.run_dir / "checkpoints"
        self.compiled = CompiledForward(self.net, enabled=self.spec.compile, log=self.log)

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

    # -- the steps of an iteration -----------------------------------------------------------
    def train_one_batch(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        result = self.compiled.run(lambda: self._gradients(x, y))
        self.apply_update(self.step)
        return result

    def _gradients(self, x: torch.Tensor, y: torch.Tensor) -> BatchResult:
        self.updater.zero_grad()
        return self.algorithm(self.net, x, y, self.spec, self.generator, self.precision)

    @torch.no_grad()
    def evaluate_whole(self) -> dict[str, float]:
        """Loss and metrics over the test split (or test.steps batches of it)."""
        return self.compiled.run(self._evaluate)

    def _evaluate(self) -> dict[str, float]:
        self.net.eval()
        sums: dict[str, float] = {}
        seen = 0
        cd = self.spec.train_one_batch.alg == "cd"
        for x, y in eval_batches(
            self.x_test, self.y_test, self.spec.data.batch_size, self.spec.test.steps
        ):
            if cd:
                values = self._cd_eval(x)
            else:
                self.net.reset_state()
                with self.precision.autocast():
                    out = self.net(x, y, "test", with_metrics=True)
                values = {k: float(v) for k, v in out.metrics.items()}
                if out.loss is not None:
                    values["loss"] = float(out.loss)
            for key, value in values.items():
                sums[key] = sums.get(key, 0.0) + value * len(x)
            seen += len(x)
        self.net.train()
        return {f"test/{k}": v / max(seen, 1) for k, v in sums.items()}

    def _cd_eval(self, x: torch.Tensor) -> dict[str, float]:
        # Its own stream: evaluating must not shift the training samples' noise, and the same
        # parameters should always give the same test figure.
        generator = torch.Generator(device=self.device).manual_seed(self.spec.seed + 11)
        with self.precision.autocast():
            rbm, v0 = rbm_input(self.net, x, "test")
            _, recon = rbm.cd_loss(v0, 1, generator)  # type: ignore[operator]
        return {"recon_error": float(recon)}

    def save_checkpoint(self) -> Path:
        path = self._write_checkpoint()
        for sink in self.sinks:
            sink.checkpoint(self.step, path)
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
            for name, module in self.net.layers.items()
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
                "epoch": str(self.batches.state()["epoch"]),
                "position": str(self.batches.state()["position"]),
                **self.precision.state(),
            },
        )
        return save_checkpoint(
            directory or self.checkpoint_dir,
            self.checkpoint_out(ckpt),
            self.spec.checkpoint.keep if keep is None else keep,
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
            ckpt = self.checkpoint_in(load_checkpoint(path))
            load_matching_params(self.net.named_params(), ckpt)
            self._load_buffers(ckpt)
            self.updater.load_state_tensors(ckpt.updater)
            self.precision.load_state(ckpt.meta)
            self._load_rng_states(ckpt.rng)
            self.step = ckpt.step
            self.batches.restore(
                {"epoch": int(ckpt.meta["epoch"]), "position": int(ckpt.meta["position"])}
            )
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
        if self.spec.checkpoint.init_from:
            where = Path(self.spec.checkpoint.init_from)
            if not where.is_absolute():
                where = self.options.base_dir / where
            try:
                ckpt = self.checkpoint_in(load_checkpoint(resolve_checkpoint(where)))
                loaded = load_matching_params(self.net.named_params(), ckpt)
            except CheckpointError as exc:
                raise CheckpointError(f"checkpoint.init_from: {exc}") from None
            self._load_buffers(ckpt)
            self.log(f"initialised {len(loaded)} parameters from {where}: {', '.join(loaded)}")

    def _rng_states(self) -> dict[str, torch.Tensor]:
        states = {"train": self.generator.get_state(), "global": torch.get_rng_state()}
        if self.device.type == "cuda":
            states["global_cuda"] = torch.cuda.get_rng_state(self.device)
        return states

    def _load_rng_states(self, states: dict[str, torch.Tensor]) -> None:
        if "train" in states:
            self.generator.set_state(states["train"])
        if "global" in states:
            torch.set_rng_state(states["global"])
        if "global_cuda" in states and self.device.type == "cuda":
            torch.cuda.set_rng_state(states["global_cuda"], self.device)

    def _load_buffers(self, ckpt: Checkpoint) -> None:
        with torch.no_grad():
            for name, module in self.net.layers.items():
                for local, buf in module.named_buffers():
                    saved = ckpt.buffers.get(f"{name}/{local}")
                    if saved is not None and saved.shape == buf.shape:
                        buf.copy_(saved)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, on_step: Callable[[int], None] | None = None) -> Summary:
        started = time.perf_counter()
        spec = self.spec
        self.restore()
        for hook in self.start_hooks:
            hook()
        self.net.train()
        window = _Window()
        status = "succeeded"
        checkpoint: Path | None = None
        saved_step = -1
        while self.step < spec.train_steps:
            if self.options.should_stop():
                status = "drained" if self.options.drain() else "cancelled"
                if status == "drained" and self.options.is_writer and self.saves_alone:
                    self.save_restart_point()
                break
            # Asked by every worker at this same point: a synced clock's answer is a collective.
            restart_point = self.restart_clock.due(self.step + 1)
            x, y = next(self.batches)
            result = self.train_one_batch(x, y)
            window.add(result, len(x))
            self.step += 1
            if self.step % spec.disp_freq == 0 or self.step == spec.train_steps:
                self.last_train = window.report()
                loss = self.last_train.get("train/loss", math.nan)
                if not math.isfinite(loss):
                    status = "diverged"
                    self.log(f"step {self.step}: training diverged (loss {loss})")
                    break
                self.emit({**self.last_train, "lr": self.updater.lr_at(self.step - 1)})
                window = _Window()
            if spec.test.freq and self.step % spec.test.freq == 0 and self.step < spec.train_steps:
                self.last_test = self.evaluate()
                self.emit(self.last_test)
            if (
                spec.checkpoint.freq
                and self.step % spec.checkpoint.freq == 0
                and self.options.is_writer
            ):
                checkpoint, saved_step = self.save_checkpoint(), self.step
            elif restart_point and self.options.is_writer and self.step < spec.train_steps:
                self.save_restart_point()
            if on_step is not None:
                on_step(self.step)
        if status == "succeeded":
            self.last_test = self.evaluate()
            self.emit(self.last_test)
            # Unless the loop has just saved this very step (train_steps a multiple of the freq).
            if self.options.is_writer and not (checkpoint and saved_step == self.step):
                checkpoint = self.save_checkpoint()
        summary = Summary(
            status=status,
            steps=self.step,
            metrics={**self.last_train, **self.last_test},
            wall_time=time.perf_counter() - started,
            checkpoint=str(checkpoint) if checkpoint else None,
        )
        if self.options.is_writer:
            write_json_atomic(self.options.run_dir / "summary.json", summary.to_json())
        return summary
