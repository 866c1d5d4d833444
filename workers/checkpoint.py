"""Checkpoints as safetensors files: parameters, buffers, updater state, random-number
generator states and the step; and a run's checkpointing (`Checkpointing`): what it saves and
when, and where it starts from.

Writes are atomic (a temporary file, synced, renamed into place), so a crash never leaves a
torn checkpoint; only the newest `keep` files stay (and the best one, when it is protected).
Nothing is pickled. `RestartClock` says when the writer saves the service's restart points.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from contract.rundir import CHECKPOINTS, RESTART, checkpoint_path, list_checkpoints
from dsl.model_card import MODEL_KEY, DataFacts, ModelCard
from dsl.schema import JobSpec
from workers.data import restore_stream, stream_meta
from workers.selection import META_KEY, Selection

if TYPE_CHECKING:
    from workers.data import DataInfo
    from workers.trainer import Trainer, TrainOptions


class CheckpointError(ValueError):
    """A checkpoint cannot be read or does not fit the net."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, no permission)."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Checkpoint:
    step: int
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    updater: dict[str, torch.Tensor] = field(default_factory=dict)
    # Generator states (uint8 tensors), so a resumed run draws the same noise (cd sampling,
    # dropout) as an uninterrupted one.
    rng: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)


def save_checkpoint(
    directory: Path, ckpt: Checkpoint, keep: int, *, protect: int | None = None
) -> Path:
    """Write `ckpt` to `directory` and delete all but the newest `keep` there, except the
    checkpoint of step `protect` (the best one, which checkpoint.keep_best keeps)."""
    tensors: dict[str, torch.Tensor] = {}
    for prefix, group in (
        ("param", ckpt.params),
        ("buffer", ckpt.buffers),
        ("updater", ckpt.updater),
        ("rng", ckpt.rng),
    ):
        for name, tensor in group.items():
            tensors[f"{prefix}/{name}"] = tensor.detach().to("cpu").contiguous()
    meta = {**ckpt.meta, "step": str(ckpt.step), "format": "trainyard-1"}
    final = checkpoint_path(directory, ckpt.step)
    tmp = final.with_suffix(".tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata=meta)
        _fsync(tmp)  # the bytes are on disk before the name points at them
        os.replace(tmp, final)
        _fsync(directory)  # and the rename itself survives a crash of the machine
    except (OSError, SafetensorError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        # safetensors words an OSError as "Error while serializing: I/O error: <why> (os error N)"
        found = re.search(r"I/O error: (.*) \(os error \d+\)", reason)
        reason = found.group(1) if found else reason
        raise CheckpointWriteError(
            f"cannot write checkpoint {final.name} to {directory}: {reason}; "
            "the earlier checkpoints are unchanged"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    prune_checkpoints(directory, keep, protect=protect)
    return final


def prune_checkpoints(directory: Path, keep: int, *, protect: int | None = None) -> None:
    """Delete all but the newest `keep` checkpoints of `directory`, and the one of step
    `protect`."""
    for step, old in list_checkpoints(directory)[:-keep]:
        if step != protect:
            old.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> Checkpoint:
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = dict(handle.metadata() or {})
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from None
    groups: dict[str, dict[str, torch.Tensor]] = {
        "param": {},
        "buffer": {},
        "updater": {},
        "rng": {},
    }
    for key, tensor in tensors.items():
        prefix, _, name = key.partition("/")
        if prefix in groups:
            groups[prefix][name] = tensor
    return Checkpoint(
        step=int(meta.get("step", "0")),
        params=groups["param"],
        buffers=groups["buffer"],
        updater=groups["updater"],
        rng=groups["rng"],
        meta=meta,
    )


def resolve_checkpoint(location: Path) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory or checkpoint folder."""
    if location.is_file():
        return location
    for directory in (location / CHECKPOINTS, location):
        found = list_checkpoints(directory)
        if found:
            return found[-1][1]
    raise CheckpointError(f"no checkpoint found at {location}")


def load_matching_params(net_params: dict[str, torch.nn.Parameter], ckpt: Checkpoint) -> list[str]:
    """Copy parameters whose names match into the net; return the names loaded.

    A name present in both with different shapes is an error, since silently skipping it
    would train from a half-initialised net.
    """
    loaded = []
    with torch.no_grad():
        for name, param in net_params.items():
            if name not in ckpt.params:
                continue
            source = ckpt.params[name]
            if source.shape != param.shape:
                raise CheckpointError(
                    f"parameter {name}: checkpoint has shape {list(source.shape)}, "
                    f"the net has {list(param.shape)}"
                )
            param.copy_(source.to(param.device, param.dtype))
            loaded.append(name)
    return loaded


def write_json_atomic(path: Path, payload: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


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


class Checkpointing:
    """One worker's checkpointing: the user's checkpoints (every checkpoint.freq steps, the
    objective's best for keep_best, the last), the service's restart points (every
    restart_seconds of training), both the writer's alone, and the restore before the first
    step (a restart point, the run's latest checkpoint, or init_from). A checkpoint holds the
    whole net whatever the framework: the trainer's `checkpoint_out` and `checkpoint_in` hooks
    map between it and a worker's tensors. The trainer calls `after_step` after each of its
    steps and `finish` after the last (workers/trainer.py)."""

    def __init__(
        self,
        spec: JobSpec,
        options: TrainOptions,
        info: DataInfo,
        *,
        restart_sync: Callable[[bool], bool] | None,
    ) -> None:
        self.directory = options.run_dir / CHECKPOINTS
        # Asked every disp_freq steps when synced: each answer is a collective.
        self.restart_clock = (
            RestartClock(options.restart_seconds)
            if restart_sync is None
            else RestartClock(options.restart_seconds, every=spec.disp_freq, sync=restart_sync)
        )
        self.saved: tuple[int, Path] | None = None  # the latest checkpoint: its step, its file
        self.best_file: Path | None = None  # keep_best's checkpoint
        # Every checkpoint describes its model, so that the file alone rebuilds the net.
        facts = DataFacts(
            sample_shape=info.sample_shape,
            x_dtype=info.x_dtype,
            num_classes=info.num_classes,
            label_shape=info.label_shape,
            label_is_index=info.label_is_index,
            vocabulary=info.vocabulary,
            categories=info.categories,
        )
        self.model_card = ModelCard(spec, facts).to_json()

    def after_step(self, trainer: Trainer, restart_point: bool) -> None:
        """The writer's save after a step before the last (the last step's is `finish`'s): the
        user's checkpoint every checkpoint.freq steps, else a restart point when the clock said
        so (`restart_point`, asked before the step)."""
        spec = trainer.spec
        if not trainer.options.is_writer or trainer.step == spec.train_steps:
            return
        if spec.checkpoint.freq and trainer.step % spec.checkpoint.freq == 0:
            self.save(trainer)
        elif restart_point:
            self.save_restart_point(trainer)

    def finish(self, trainer: Trainer) -> None:
        """After the last step's evaluations: the writer's checkpoint, unless the step saved
        one already; it holds what they selected."""
        if trainer.options.is_writer and (self.saved is None or self.saved[0] != trainer.step):
            self.save(trainer)

    def save(self, trainer: Trainer, *, best: bool = False) -> Path:
        """The user's checkpoint of this step; `best`: the objective's best so far, which
        keep_best keeps whatever `keep` deletes (saved once: a step saved already is marked)."""
        if self.saved is None or self.saved[0] != trainer.step:
            path = self._write(trainer)
            self.saved = (trainer.step, path)
        elif best:  # saved anyway: marked, and the best before it goes unless kept anyway
            path = self.saved[1]
            prune_checkpoints(self.directory, trainer.spec.checkpoint.keep, protect=trainer.step)
        else:
            return self.saved[1]
        if best:
            self.best_file = path
        trainer.reporting.checkpoint(trainer.step, path, best=best)
        return path

    def save_restart_point(self, trainer: Trainer) -> Path:
        """A restart point (the service's, apart from the user's checkpoints). Two are kept: the
        service may need the older one (scheduler/recovery/actions.py: resume_point)."""
        path = self._write(trainer, trainer.options.run_dir / RESTART, keep=2)
        trainer.reporting.log(f"step {trainer.step}: restart point {path.name}")
        return path

    def _write(
        self, trainer: Trainer, directory: Path | None = None, keep: int | None = None
    ) -> Path:
        spec, net, selection = trainer.spec, trainer.net, trainer.evaluation.selection
        buffers = {
            f"{name}/{local}": buf
            for name, module in net.named_layers()
            for local, buf in module.named_buffers()
        }
        ckpt = Checkpoint(
            step=trainer.step,
            params={name: p.detach() for name, p in net.named_params().items()},
            buffers=buffers,
            updater=trainer.updater.state_tensors(),
            rng=self._rng_states(trainer),
            meta={
                "job": spec.name,
                **stream_meta(trainer.batches),
                META_KEY: selection.to_meta(),
                MODEL_KEY: self.model_card,
                **trainer.precision.state(),
            },
        )
        # keep_best's checkpoint stays, whatever `keep` deletes.
        kept = selection.best_step if spec.checkpoint.keep_best else None
        return save_checkpoint(
            directory or self.directory,
            trainer.hooks.checkpoint_out(ckpt),
            spec.checkpoint.keep if keep is None else keep,
            protect=kept if directory is None else None,
        )

    def restore(self, trainer: Trainer) -> None:
        """Continue from the service's restart point, or the run's latest checkpoint
        (`--resume`), or start from init_from: the trainer's net, updater, generators, step,
        data position and selection as they were saved."""
        options, spec, log = trainer.options, trainer.spec, trainer.reporting.log
        path = options.resume_from
        if path is None and options.resume:
            try:
                path = resolve_checkpoint(self.directory)
            except ValueError:
                log("resume: no checkpoint yet, starting from step 0")
        if path is not None:
            ckpt = trainer.hooks.checkpoint_in(load_checkpoint(path))
            load_matching_params(trainer.net.named_params(), ckpt)
            self._load_buffers(trainer, ckpt)
            trainer.updater.load_state_tensors(ckpt.updater)
            trainer.precision.load_state(ckpt.meta)
            self._load_rng_states(trainer, ckpt.rng)
            selection = Selection.from_meta(ckpt.meta.get(META_KEY))
            trainer.evaluation.selection = selection
            if spec.checkpoint.keep_best and selection.best_step is not None:
                kept = checkpoint_path(self.directory, selection.best_step)
                self.best_file = kept if kept.is_file() else None
            trainer.step = ckpt.step
            restore_stream(trainer.batches, ckpt.meta)
            log(f"resumed from {path.name} at step {trainer.step}")
            return
        if options.start_step:
            trainer.step = options.start_step
            per_epoch = trainer.batches.steps_per_epoch
            trainer.batches.restore(
                {"epoch": trainer.step // per_epoch, "position": trainer.step % per_epoch}
            )
            log(f"restarted alone at step {trainer.step}; parameters from the server shards")
            return
        init_from = spec.checkpoint.init_from
        if init_from is not None and not isinstance(init_from, str):
            what = f"job {init_from.job}" if init_from.job else f"model {init_from.model}"
            raise CheckpointError(
                f"checkpoint.init_from: {what} is on the service; the service finds its "
                "checkpoint (trainyard submit), or `trainyard train` downloads it"
            )
        if init_from:
            where = Path(init_from)
            if not where.is_absolute():
                where = options.base_dir / where
            try:
                ckpt = trainer.hooks.checkpoint_in(load_checkpoint(resolve_checkpoint(where)))
                loaded = load_matching_params(trainer.net.named_params(), ckpt)
            except CheckpointError as exc:
                raise CheckpointError(f"checkpoint.init_from: {exc}") from None
            self._load_buffers(trainer, ckpt)
            log(f"initialised {len(loaded)} parameters from {where}: {', '.join(loaded)}")

    @staticmethod
    def _train_rng_key(trainer: Trainer) -> str:
        """The training generator lives on the job's device, and a CPU generator's state does
        not fit a CUDA one's: each is saved under its own key (a CPU job's under "train")."""
        return "train" if trainer.device.type == "cpu" else f"train_{trainer.device.type}"

    def _rng_states(self, trainer: Trainer) -> dict[str, torch.Tensor]:
        states = {self._train_rng_key(trainer): trainer.generator.get_state()}
        states["global"] = torch.get_rng_state()
        if trainer.device.type == "cuda":
            states["global_cuda"] = torch.cuda.get_rng_state(trainer.device)
        return states

    def _load_rng_states(self, trainer: Trainer, states: dict[str, torch.Tensor]) -> None:
        device, generator = trainer.device, trainer.generator
        own = states.get(self._train_rng_key(trainer))
        # A checkpoint from before the keys were apart holds a CUDA job's state under "train".
        if own is not None and own.numel() == generator.get_state().numel():
            generator.set_state(own)
        elif any(name.startswith("train") for name in states):
            trainer.reporting.log(
                f"the checkpoint's training generator was on another device; on "
                f"{device.type} it starts again from the job's seed"
            )
        if "global" in states:
            torch.set_rng_state(states["global"])
        if "global_cuda" in states and device.type == "cuda":
            torch.cuda.set_rng_state(states["global_cuda"], device)

    @staticmethod
    def _load_buffers(trainer: Trainer, ckpt: Checkpoint) -> None:
        with torch.no_grad():
            for name, module in trainer.net.named_layers():
                for local, buf in module.named_buffers():
                    saved = ckpt.buffers.get(f"{name}/{local}")
                    if saved is not None and saved.shape == buf.shape:
                        buf.copy_(saved)
