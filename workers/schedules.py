"""SINGA's learning-rate schedules (ChangeMethod) as plain functions of the step.

Each schedule is `(step, cfg, total) -> lr`, registered by name with `@register_schedule`; `total`
is the horizon for the schedules that need one (cosine, and linear without `freq`). `lr_at` picks
the schedule, resolves the horizon and applies the linear warm-up. Steps count from 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from dsl.registry import Registry
from dsl.updater_config import LRConfig

Schedule = Callable[[int, LRConfig, int], float]

SCHEDULES: Registry[Schedule] = Registry("learning-rate schedule")
register_schedule = SCHEDULES.register

K = TypeVar("K")


def _knob(value: K | None, name: str, cfg: LRConfig) -> K:
    """A knob the config validator guarantees; checked again for configs built without it."""
    if value is None:
        raise ValueError(f"schedule '{cfg.schedule}' needs lr.{name}")
    return value


@register_schedule("fixed")
def fixed(step: int, cfg: LRConfig, total: int) -> float:
    """`base` at every step."""
    return cfg.base


@register_schedule("step")
def step_decay(step: int, cfg: LRConfig, total: int) -> float:
    """`base * gamma ** floor(step / freq)` (SINGA kStep)."""
    gamma, freq = _knob(cfg.gamma, "gamma", cfg), _knob(cfg.freq, "freq", cfg)
    return cfg.base * gamma ** (step // freq)


@register_schedule("linear")
def linear(step: int, cfg: LRConfig, total: int) -> float:
    """`(1 - r) * base + r * final` with `r = min(step / freq, 1)` (SINGA kLinear).

    Without `freq` the decay spans the horizon `total`; after it the rate stays at `final`.
    """
    span = cfg.freq if cfg.freq is not None else _horizon(cfg, total)
    r = min(step / span, 1.0)
    return (1.0 - r) * cfg.base + r * cfg.final


@register_schedule("exponential")
def exponential(step: int, cfg: LRConfig, total: int) -> float:
    """`base / 2 ** (step / freq)`: halves every `freq` steps (SINGA kExponential)."""
    freq = _knob(cfg.freq, "freq", cfg)
    return cfg.base / 2.0 ** (step / freq)


@register_schedule("inverse")
def inverse(step: int, cfg: LRConfig, total: int) -> float:
    """`base * (1 + gamma * step) ** (-power)` (SINGA kInverse)."""
    gamma, power = _knob(cfg.gamma, "gamma", cfg), _knob(cfg.power, "power", cfg)
    return cfg.base * (1.0 + gamma * step) ** (-power)


@register_schedule("inverse_t")
def inverse_t(step: int, cfg: LRConfig, total: int) -> float:
    """`base / (1 + step / final)`: halves after `final` steps (SINGA kInverseT)."""
    if cfg.final <= 0:
        raise ValueError("schedule 'inverse_t' needs lr.final > 0")
    return cfg.base / (1.0 + step / cfg.final)


@register_schedule("fixed_step")
def fixed_step(step: int, cfg: LRConfig, total: int) -> float:
    """`values[i]` for the last `steps[i] <= step`; `base` before `steps[0]` (SINGA kFixedStep)."""
    steps, values = _knob(cfg.steps, "steps", cfg), _knob(cfg.values, "values", cfg)
    lr = cfg.base
    for start, value in zip(steps, values, strict=True):
        if step < start:
            break
        lr = value
    return lr


@register_schedule("cosine")
def cosine(step: int, cfg: LRConfig, total: int) -> float:
    """`final + 0.5 * (base - final) * (1 + cos(pi * min(step, T) / T))`, `T` the horizon."""
    horizon = _horizon(cfg, total)
    progress = min(step, horizon) / horizon
    return cfg.final + 0.5 * (cfg.base - cfg.final) * (1.0 + math.cos(math.pi * progress))


def _horizon(cfg: LRConfig, total: int) -> int:
    if total <= 0:
        raise ValueError(
            f"schedule '{cfg.schedule}' needs a horizon: set lr.total_steps or give the job "
            f"train_steps > 0 (got {total})"
        )
    return total


def lr_at(step: int, cfg: LRConfig, total_steps: int) -> float:
    """The learning rate for 0-based `step`.

    `cfg.total_steps`, when set, overrides `total_steps` (the job's train_steps) as the horizon.
    Warm-up multiplies the schedule's own value at `step` by `(step + 1) / warmup_steps` while
    `step < warmup_steps`, so the rate climbs in equal increments from `schedule(0) / warmup` and
    meets the schedule at step `warmup_steps - 1`. During warm-up it is thus in
    `(0, schedule(step)]`, which is within `(0, base]` for every schedule that does not rise above
    `base`.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    total = cfg.total_steps if cfg.total_steps is not None else total_steps
    lr = SCHEDULES.get(cfg.schedule)(step, cfg, total)
    if step < cfg.warmup_steps:
        lr *= (step + 1) / cfg.warmup_steps
    return lr
