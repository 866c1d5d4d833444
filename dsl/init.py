"""Parameter initialisers and the per-parameter config (`param: {w: {...}, b: {...}}`)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from dsl.config import StrictModel

InitName = Literal["constant", "uniform", "gaussian", "xavier", "glorot", "msra", "he"]


class ParamSpec(StrictModel):
    """How one parameter starts and how the updater treats it."""

    init: InitName = Field(default="constant", description="the initialiser")
    value: float = Field(default=0.0, description="constant: the value")
    low: float = Field(default=-0.05, description="uniform: lower bound")
    high: float = Field(default=0.05, description="uniform: upper bound")
    mean: float = Field(default=0.0, description="gaussian: mean")
    std: float = Field(default=0.01, ge=0.0, description="gaussian: standard deviation")
    mode: Literal["fan_in", "fan_out", "avg"] | None = Field(
        default=None,
        description="fan used by xavier/msra: fan_in, fan_out or their average; "
        "default avg for xavier (Glorot) and fan_in for msra (He)",
    )
    lr_scale: float = Field(default=1.0, ge=0.0, description="multiplies the learning rate")
    wd_scale: float = Field(default=1.0, ge=0.0, description="multiplies the weight decay")


def fans(shape: torch.Size) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out as (out, in, *kernel)."""
    if len(shape) < 2:
        return int(shape[0]) if shape else 1, int(shape[0]) if shape else 1
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return int(shape[1]) * receptive, int(shape[0]) * receptive


def _fan(shape: torch.Size, mode: str) -> float:
    fan_in, fan_out = fans(shape)
    return {"fan_in": fan_in, "fan_out": fan_out, "avg": (fan_in + fan_out) / 2}[mode]


@torch.no_grad()
def initialise(tensor: torch.Tensor, spec: ParamSpec, generator: torch.Generator) -> None:
    """Fill `tensor` in place as `spec` says, drawing from `generator` for reproducibility."""
    if spec.init == "constant":
        tensor.fill_(spec.value)
    elif spec.init == "uniform":
        tensor.uniform_(spec.low, spec.high, generator=generator)
    elif spec.init == "gaussian":
        tensor.normal_(spec.mean, spec.std, generator=generator)
    elif spec.init in ("xavier", "glorot"):
        bound = math.sqrt(3.0 / _fan(tensor.shape, spec.mode or "avg"))
        tensor.uniform_(-bound, bound, generator=generator)
    else:  # msra / he: gaussian scaled for ReLU
        std = math.sqrt(2.0 / _fan(tensor.shape, spec.mode or "fan_in"))
        tensor.normal_(0.0, std, generator=generator)
