"""What a run reports, and to whom: the display window's training figures every disp_freq steps
(and at the last step), and every figure, event, checkpoint and log line handed to the run's
sinks (workers/metrics.py). The trainer calls `Reporting.after_step` after each of its steps
(workers/trainer.py); evaluations and checkpoints report through it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from contract.stream import EventRecord, MetricRecord
from workers.algorithms import BatchResult
from workers.metrics import MetricSink

if TYPE_CHECKING:
    from workers.trainer import Trainer


class Window:
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


class Reporting:
    """One worker's reports: its display window, and its sinks. Metrics carry the worker's
    `group` and its `rank` inside the group; events are the writer's alone."""

    def __init__(self, sinks: Sequence[MetricSink], *, group: int, rank: int, writer: bool) -> None:
        self.sinks = list(sinks)
        self.group, self.rank, self.writer = group, rank, writer
        self.window = Window()
        self.last_train: dict[str, float] = {}  # the latest window's figures

    def begin(self) -> None:
        """A new window, as the steps begin (its samples per second count from here)."""
        self.window = Window()

    def after_step(self, trainer: Trainer, result: BatchResult, samples: int) -> bool:
        """Add the step just done (`samples` samples) to the window; every disp_freq steps and
        at the last step, report the window; False when the loss diverged."""
        self.window.add(result, samples)
        step, spec = trainer.step, trainer.spec
        if step % spec.disp_freq and step != spec.train_steps:
            return True
        self.last_train = self.window.report()
        loss = self.last_train.get("train/loss", math.nan)
        if not math.isfinite(loss):
            self.log(f"step {step}: training diverged (loss {loss})")
            return False
        self.emit(step, {**self.last_train, "lr": trainer.updater.lr_at(step - 1)})
        self.window = Window()
        return True

    def emit(self, step: int, values: dict[str, float]) -> None:
        record = MetricRecord(step, values, group=self.group, rank=self.rank)
        for sink in self.sinks:
            sink.emit(record)

    def event(self, step: int, message: str) -> None:
        """One of the job's events (a run that stopped early), from the writer alone."""
        if self.writer:
            for sink in self.sinks:
                sink.emit(EventRecord(step, message))

    def checkpoint(self, step: int, path: Path, *, best: bool) -> None:
        for sink in self.sinks:
            sink.checkpoint(step, path, best=best)

    def log(self, line: str) -> None:
        for sink in self.sinks:
            sink.log(line)
