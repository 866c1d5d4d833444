"""Learning-rate schedules against their closed forms, warm-up, and the lr config's validation."""

from __future__ import annotations

import math
from typing import Any, get_args

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dsl.updater_config import LRConfig, ScheduleName
from workers.schedules import SCHEDULES, lr_at

torch.set_num_threads(1)


def lr(**fields: Any) -> LRConfig:
    return LRConfig.model_validate(fields)


def test_every_schedule_name_is_registered() -> None:
    assert sorted(get_args(ScheduleName)) == SCHEDULES.names()


@pytest.mark.parametrize("step", [0, 1, 999, 5000])
def test_fixed(step: int) -> None:
    assert lr_at(step, lr(base=0.3), 100) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("step", "expected"), [(0, 0.05), (999, 0.05), (1000, 0.025), (2500, 0.0125)]
)
def test_step(step: int, expected: float) -> None:
    cfg = lr(base=0.05, schedule="step", gamma=0.5, freq=1000)
    assert lr_at(step, cfg, 0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("step", "expected"), [(0, 1.0), (25, 0.775), (50, 0.55), (100, 0.1), (400, 0.1)]
)
def test_linear_over_freq_then_stays_at_final(step: int, expected: float) -> None:
    cfg = lr(base=1.0, schedule="linear", final=0.1, freq=100)
    assert lr_at(step, cfg, 10_000) == pytest.approx(expected)


def test_linear_without_freq_spans_the_horizon() -> None:
    cfg = lr(base=1.0, schedule="linear", final=0.0)
    assert lr_at(50, cfg, 200) == pytest.approx(0.75)
    assert lr_at(300, cfg, 200) == pytest.approx(0.0)
    fixed_horizon = lr(base=1.0, schedule="linear", total_steps=100)
    assert lr_at(50, fixed_horizon, 200) == pytest.approx(0.5)


@pytest.mark.parametrize("step", [0, 10, 100, 250])
def test_exponential_halves_every_freq(step: int) -> None:
    cfg = lr(base=0.8, schedule="exponential", freq=100)
    assert lr_at(step, cfg, 0) == pytest.approx(0.8 / 2 ** (step / 100))
    assert lr_at(100, cfg, 0) == pytest.approx(0.4)


@pytest.mark.parametrize("step", [0, 1, 10, 1000])
def test_inverse(step: int) -> None:
    cfg = lr(base=0.1, schedule="inverse", gamma=1e-3, power=0.75)
    assert lr_at(step, cfg, 0) == pytest.approx(0.1 * (1 + 1e-3 * step) ** -0.75)


@pytest.mark.parametrize(("step", "expected"), [(0, 0.6), (50, 0.4), (100, 0.3), (500, 0.1)])
def test_inverse_t(step: int, expected: float) -> None:
    cfg = lr(base=0.6, schedule="inverse_t", final=100)
    assert lr_at(step, cfg, 0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("step", "expected"), [(0, 0.5), (9, 0.5), (10, 0.1), (19, 0.1), (20, 0.01), (10_000, 0.01)]
)
def test_fixed_step(step: int, expected: float) -> None:
    cfg = lr(base=0.5, schedule="fixed_step", steps=[10, 20], values=[0.1, 0.01])
    assert lr_at(step, cfg, 0) == pytest.approx(expected)


@pytest.mark.parametrize(("step", "expected"), [(0, 1.0), (50, 0.55), (100, 0.1), (150, 0.1)])
def test_cosine(step: int, expected: float) -> None:
    cfg = lr(base=1.0, schedule="cosine", final=0.1)
    assert lr_at(step, cfg, 100) == pytest.approx(expected)
    assert lr_at(25, cfg, 100) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))


def test_cosine_total_steps_overrides_the_job_horizon() -> None:
    cfg = lr(base=1.0, schedule="cosine", total_steps=10)
    assert lr_at(5, cfg, 1000) == pytest.approx(0.5)


def test_cosine_without_a_horizon_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"needs a horizon.*total_steps"):
        lr_at(0, lr(base=1.0, schedule="cosine"), 0)


def test_warmup_ramps_linearly_to_the_schedule() -> None:
    cfg = lr(base=0.4, schedule="step", gamma=0.5, freq=3, warmup_steps=4)
    # schedule values 0.4, 0.4, 0.4, 0.2, 0.2 at steps 0..4
    expected = [0.4 * 1 / 4, 0.4 * 2 / 4, 0.4 * 3 / 4, 0.2 * 4 / 4, 0.2]
    assert [lr_at(s, cfg, 0) for s in range(5)] == pytest.approx(expected)


@given(
    schedule=st.sampled_from(["fixed", "step", "exponential", "inverse", "inverse_t", "cosine"]),
    base=st.floats(1e-5, 10.0),
    warmup=st.integers(1, 500),
    step=st.integers(0, 499),
)
def test_warmup_stays_in_zero_to_base(schedule: str, base: float, warmup: int, step: int) -> None:
    knobs: dict[str, dict[str, Any]] = {
        "fixed": {},
        "step": {"gamma": 0.5, "freq": 7},
        "exponential": {"freq": 50},
        "inverse": {"gamma": 0.01, "power": 0.5},
        "inverse_t": {"final": 30},
        "cosine": {"final": 0.0},
    }
    cfg = lr(base=base, schedule=schedule, warmup_steps=warmup, **knobs[schedule])
    value = lr_at(min(step, warmup - 1), cfg, 10_000)
    assert 0 < value <= base


def test_negative_step_is_rejected() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        lr_at(-1, lr(base=1.0), 10)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"schedule": "fixed_step", "steps": [1, 2], "values": [0.1]}, "equal length"),
        ({"schedule": "fixed_step", "steps": [5, 5], "values": [0.1, 0.2]}, "strictly increasing"),
        ({"schedule": "fixed_step", "steps": [1]}, "needs values"),
        ({"schedule": "step", "freq": 10}, "needs gamma"),
        ({"schedule": "inverse", "gamma": 0.1}, "needs power"),
        ({"schedule": "inverse_t"}, "needs final"),
        ({"schedule": "inverse_t", "final": 0}, "final > 0"),
        ({"schedule": "fixed", "gamma": 0.5}, "does not use gamma"),
        ({"schedule": "cosine", "freq": 10}, "does not use freq"),
    ],
)
def test_cross_field_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        lr(base=0.1, **fields)


@pytest.mark.parametrize(
    "fields",
    [{"base": 0.0}, {"base": 0.1, "warmup_steps": -1}, {"base": 0.1, "schedule": "poly"}],
)
def test_field_errors(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        LRConfig.model_validate(fields)


def test_explicit_null_knob_is_not_given() -> None:
    assert lr(base=0.1, gamma=None).gamma is None
    with pytest.raises(ValidationError, match="needs gamma"):
        lr(base=0.1, schedule="step", freq=3, gamma=None)
