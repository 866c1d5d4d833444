"""The trainer's reports: the display window's figures (workers/reporting.py)."""

from __future__ import annotations

import pytest
import torch

from workers.algorithms import BatchResult
from workers.reporting import Window


def test_display_window_sums_step_by_step_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window keeps each step's values and sums them at the report (and every FOLD steps):
    the same fp32 sums, to the bit, as adding each step's value on the device as it came."""
    monkeypatch.setattr(Window, "FOLD", 7)
    torch.manual_seed(0)
    losses = [torch.rand(()) * 10.0 ** (step % 6 - 3) for step in range(50)]
    window = Window()
    for step, loss in enumerate(losses):
        metrics = {"accuracy": (loss * 3).to(torch.bfloat16)}
        if step % 3 == 0:  # a metric some steps lack is summed over the steps that have it
            metrics["sometimes"] = loss.double() / 7
        window.add(BatchResult(loss, metrics), samples=8)
    sums: dict[str, torch.Tensor] = {}
    for step, loss in enumerate(losses):
        values = {"loss": loss, "accuracy": (loss * 3).to(torch.bfloat16)}
        if step % 3 == 0:
            values["sometimes"] = loss.double() / 7
        for key, value in values.items():
            sums[key] = sums[key] + value.float() if key in sums else value.float()
    figures = window.report()
    assert {k: v for k, v in figures.items() if k != "samples_per_sec"} == {
        f"train/{key}": float(total) / 50 for key, total in sums.items()
    }
