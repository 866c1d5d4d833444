"""Normalisation layers: SINGA's cross-channel LRN, batch and layer normalisation."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from dsl.init import ParamSpec
from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape, register_layer


def _expect_channels(shape: Shape) -> None:
    if not shape:
        raise LayerShapeError(
            "expects a source with a channel (or feature) axis, got a scalar per sample",
            hint="give it a source of shape (C, ...) or (F,)",
        )


class LRN(Layer):
    def __init__(self, size: int, alpha: float, beta: float, k: float) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch wants (B, C, *): feature vectors (B, F) get a length-1 trailing axis for the call
        if x.dim() == 2:
            return self.forward(x.unsqueeze(-1)).squeeze(-1)
        return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"size={self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


@register_layer("lrn")
class LRNConfig(LayerConfig):
    """Local response normalisation across neighbouring channels (SINGA/Caffe's LRN).

    b_c = a_c / (k + alpha / size * sum of a_j^2 over the `size` channels j centred on c)^beta
    """

    type: Literal["lrn"]
    size: int = Field(default=5, gt=0, description="channels in the window (odd, centred)")
    alpha: float = Field(default=1e-4, ge=0.0, description="scale of the sum of squares")
    beta: float = Field(default=0.75, ge=0.0, description="exponent of the normaliser")
    k: float = Field(default=1.0, gt=0.0, description="constant added to the normaliser")

    @field_validator("size")
    @classmethod
    def _odd(cls, size: int) -> int:
        # an even window has no centre channel
        if size % 2 == 0:
            raise ValueError(f"size must be odd, got {size}")
        return size

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        _expect_channels(in_shapes[0])
        return LRN(self.size, self.alpha, self.beta, self.k), in_shapes[0]


class BatchNorm(Layer):
    """Scale `w` and shift `b` per channel; running statistics are buffers, not parameters."""

    running_mean: torch.Tensor
    running_var: torch.Tensor

    def __init__(self, channels: int, momentum: float, eps: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(channels))
        self.b = nn.Parameter(torch.empty(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.momentum, self.eps = momentum, eps

    def default_param(self, role: str) -> ParamSpec:
        # a fresh batchnorm layer starts as the identity on normalised inputs
        if role == "w":
            return ParamSpec(init="constant", value=1.0)
        return super().default_param(role)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, *) or (B, F): statistics per channel over the batch and any trailing axes;
        # training normalises with the batch's statistics, evaluation with the running ones
        return F.batch_norm(
            x,
            self.running_mean,
            self.running_var,
            self.w,
            self.b,
            training=self.training,
            momentum=self.momentum,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return f"{self.w.numel()}, momentum={self.momentum}, eps={self.eps}"


@register_layer("batchnorm")
class BatchNormConfig(LayerConfig):
    """Batch normalisation over the channel axis of (C, ...) or the features of (F,)."""

    type: Literal["batchnorm"]
    momentum: float = Field(
        default=0.1,
        gt=0.0,
        le=1.0,
        description="weight of each batch's statistics in the running mean and variance",
    )
    eps: float = Field(default=1e-5, gt=0.0, description="added to the variance for stability")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        _expect_channels(in_shapes[0])
        return BatchNorm(in_shapes[0][0], self.momentum, self.eps), in_shapes[0]


class LayerNorm(Layer):
    """Scale `w` and shift `b` of the last axis, whose values are normalised per position."""

    def __init__(self, features: int, eps: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(features))
        self.b = nn.Parameter(torch.empty(features))
        self.eps = eps

    def default_param(self, role: str) -> ParamSpec:
        # the identity on inputs of zero mean and unit variance, as torch's nn.LayerNorm starts
        if role == "w":
            return ParamSpec(init="constant", value=1.0)
        return super().default_param(role)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, ..., F): mean and variance over F at every position, the same in both phases
        return F.layer_norm(x, (self.w.numel(),), self.w, self.b, self.eps)

    def extra_repr(self) -> str:
        return f"{self.w.numel()}, eps={self.eps}"


@register_layer("layernorm")
class LayerNormConfig(LayerConfig):
    """Layer normalisation over the last axis of each position (of (F,), or (T, D) per step),
    with a learned scale and shift; training and evaluation compute the same."""

    type: Literal["layernorm"]
    eps: float = Field(default=1e-5, gt=0.0, description="added to the variance for stability")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        _expect_channels(in_shapes[0])
        return LayerNorm(in_shapes[0][-1], self.eps), in_shapes[0]
