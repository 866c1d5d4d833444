"""The transformer's layers over a sequence of vectors (T, D): multi-head self-attention and
the position vectors added to each time step."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from dsl.init import ParamSpec
from dsl.layers.base import (
    BuildContext,
    Layer,
    LayerConfig,
    LayerShapeError,
    Shape,
    expect_rank,
    register_layer,
)


class Attention(Layer):
    """Query, key and value projections in one matrix `w_qkv` (3D, D), the heads' outputs
    joined and projected by `w_out` (D, D); biases `b_qkv` and `b_out`."""

    def __init__(self, dim: int, heads: int, causal: bool, dropout: float) -> None:
        super().__init__()
        self.heads, self.causal, self.dropout = heads, causal, dropout
        self.w_qkv = nn.Parameter(torch.empty(3 * dim, dim))
        self.b_qkv = nn.Parameter(torch.empty(3 * dim))
        self.w_out = nn.Parameter(torch.empty(dim, dim))
        self.b_out = nn.Parameter(torch.empty(dim))

    def default_param(self, role: str) -> ParamSpec:
        if role.startswith("b_"):
            return ParamSpec(init="constant", value=0.0)
        return ParamSpec(init="xavier")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, dim = x.shape
        qkv = F.linear(x, self.w_qkv, self.b_qkv)  # (B, T, 3D)
        # (B, T, 3D) -> 3 x (B, H, T, D/H), views of it
        q, k, v = (
            part.view(batch, steps, self.heads, dim // self.heads).transpose(1, 2)
            for part in qkv.split(dim, dim=2)
        )
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=self.causal,
        )  # (B, H, T, D/H)
        out = out.transpose(1, 2).reshape(batch, steps, dim)  # heads joined: (B, T, D)
        return F.linear(out, self.w_out, self.b_out)

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        steps, dim = in_shapes[0]
        projections = 2 * steps * (self.w_qkv.numel() + self.w_out.numel())
        # QK^T and the weighted sum of the values: T x T x D multiply-adds each
        scores = 2 * 2 * steps * steps * dim
        return projections + scores

    def extra_repr(self) -> str:
        return f"heads={self.heads}, causal={self.causal}, dropout={self.dropout}"


@register_layer("attention")
class AttentionConfig(LayerConfig):
    """Multi-head self-attention over the time axis of a (T, D) source, with its query, key,
    value and output projections: softmax(Q K^T / sqrt(D / heads)) V per head."""

    type: Literal["attention"]
    heads: int = Field(default=1, gt=0, description="attention heads; must divide D")
    causal: bool = Field(
        default=False, description="each step attends only to itself and earlier steps"
    )
    dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="dropout of the attention weights in training"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        shape = in_shapes[0]
        expect_rank(shape, (2,), "a sequence of vectors (T, D)")
        dim = shape[1]
        if dim % self.heads:
            raise LayerShapeError(
                f"{self.heads} heads do not divide the source's {dim} features",
                hint=f"use a number of heads that divides {dim}",
                field="heads",
            )
        return Attention(dim, self.heads, self.causal, self.dropout), shape


def sinusoids(length: int, dim: int) -> torch.Tensor:
    """The transformer's fixed position code: sin and cos of the position at geometrically
    spaced frequencies, (length, dim)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table


class LearnedPositions(Layer):
    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(max_len, dim))

    def default_param(self, role: str) -> ParamSpec:
        return ParamSpec(init="gaussian", std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, D) + (T, D); the whole table when T is max_len (no slice to back-propagate)
        return x + (self.w if x.shape[1] == len(self.w) else self.w[: x.shape[1]])


class FixedPositions(Layer):
    table: torch.Tensor

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        # a buffer so that it follows the net's device and dtype; rebuilt, never saved
        self.register_buffer("table", sinusoids(max_len, dim), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[1]]


@register_layer("positional_embedding")
class PositionalEmbeddingConfig(LayerConfig):
    """Adds a vector for its position to each time step of a (T, D) source: learned (a table
    `w` of `max_len` rows) or sinusoidal (the fixed sin/cos code, no parameters)."""

    type: Literal["positional_embedding"]
    kind: Literal["learned", "sinusoidal"] = Field(
        default="learned", description="learned: a trained table; sinusoidal: the fixed code"
    )
    max_len: int | None = Field(
        default=None, gt=0, description="the most time steps; default the source's T"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        shape = in_shapes[0]
        expect_rank(shape, (2,), "a sequence of vectors (T, D)")
        steps, dim = shape
        max_len = self.max_len or steps
        if steps > max_len:
            raise LayerShapeError(
                f"the source has {steps} time steps, more than max_len {max_len}",
                hint=f"set max_len to {steps} or more",
                field="max_len",
            )
        if self.kind == "learned":
            return LearnedPositions(max_len, dim), shape
        return FixedPositions(max_len, dim), shape
