"""Token indices to vectors: a learnt embedding table and a fixed one-hot code."""

from __future__ import annotations

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


def check_indices(x: torch.Tensor, size: int, layer: str, key: str) -> torch.Tensor:
    """`x` as int64 indices, raising a clear error instead of torch's bare index failure."""
    x = x.long()
    # Traced (torch.compile, torch.export), the values are not known: the check would stop the
    # trace; an exported net's inputs are checked by whoever feeds it (dsl/inference.py).
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    if x.numel() and not tracing:
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= size:
            raise IndexError(
                f"{layer} got index {low if low < 0 else high}, outside [0, {size}); "
                f"`{key}` must cover every index in the data"
            )
    return x


def _size_or_classes(value: int | None, ctx: BuildContext, key: str, layer: str) -> int:
    if value is not None:
        return value
    if ctx.num_classes is None:
        raise LayerShapeError(
            f"{layer} needs `{key}`: the data source does not say how many classes it has",
            hint=f"set `{key}` to the number of distinct token indices",
            field=key,
        )
    return ctx.num_classes


class Embedding(Layer):
    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.w = nn.Parameter(torch.empty(vocab_size, dim))

    def default_param(self, role: str) -> ParamSpec:
        # Unit-variance rows as torch's nn.Embedding: xavier's fans would shrink the vectors with
        # the vocabulary size, which has nothing to do with how the rows are used.
        return ParamSpec(init="gaussian", std=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T) int -> (B, T, dim)
        return F.embedding(check_indices(x, self.vocab_size, "embedding", "vocab_size"), self.w)


@register_layer("embedding")
class EmbeddingConfig(LayerConfig):
    """A learnt vector of `dim` values per token index; input (T,) or () indices."""

    type: Literal["embedding"]
    vocab_size: int | None = Field(
        default=None, gt=0, description="number of token indices; default the data's class count"
    )
    dim: int = Field(gt=0, description="length of each token's vector")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        expect_rank(in_shapes[0], (0, 1), "token indices (T,) or ()")
        vocab = _size_or_classes(self.vocab_size, ctx, "vocab_size", "embedding")
        return Embedding(vocab, self.dim), (*in_shapes[0], self.dim)


class OneHot(Layer):
    dtype_probe: torch.Tensor

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth
        # An empty buffer so the code follows the net's .to()/.double(): the one-hot vectors must
        # have the dtype of the layers they feed.
        self.register_buffer("dtype_probe", torch.empty(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T) int -> (B, T, depth) float
        x = check_indices(x, self.depth, "onehot", "depth")
        return F.one_hot(x, self.depth).to(self.dtype_probe.dtype)


@register_layer("onehot")
class OneHotConfig(LayerConfig):
    """A fixed one-hot vector of length `depth` per token index; input (T,) or () indices."""

    type: Literal["onehot"]
    depth: int | None = Field(
        default=None, gt=0, description="length of the one-hot vectors; default the class count"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        expect_rank(in_shapes[0], (0, 1), "token indices (T,) or ()")
        depth = _size_or_classes(self.depth, ctx, "depth", "onehot")
        return OneHot(depth), (*in_shapes[0], depth)
