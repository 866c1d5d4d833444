"""Max and average pooling over sequences (pool1d) and images (pool2d): SINGA's Pooling layer.

Output sizes round down (torch's floor mode); average pooling counts padded zeros in the mean.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from dsl.layers.base import (
    BuildContext,
    Layer,
    LayerConfig,
    LayerShapeError,
    Shape,
    expect_rank,
    register_layer,
)
from dsl.layers.conv import (
    INPUT_LAYOUT,
    NonNegInt,
    NonNegPair,
    PosInt,
    PosPair,
    as_tuple,
    window_out_shape,
)

PoolMethod = Literal["max", "avg"]


class Pool(Layer):
    def __init__(
        self,
        method: PoolMethod,
        kernel: tuple[int, ...],
        stride: tuple[int, ...],
        padding: tuple[int, ...],
    ) -> None:
        super().__init__()
        self.method, self.kernel, self.stride, self.padding = method, kernel, stride, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, L) -> (B, C, L') or (B, C, H, W) -> (B, C, H', W'); channels pool independently
        if len(self.kernel) == 1:
            if self.method == "max":
                return F.max_pool1d(x, self.kernel, self.stride, self.padding)
            return F.avg_pool1d(x, self.kernel, self.stride, self.padding)
        if self.method == "max":
            return F.max_pool2d(x, self.kernel, self.stride, self.padding)
        return F.avg_pool2d(x, self.kernel, self.stride, self.padding)

    def extra_repr(self) -> str:
        return f"{self.method}, kernel={self.kernel}, stride={self.stride}, padding={self.padding}"


class PoolConfigBase(LayerConfig):
    """Keys and builder shared by pool1d and pool2d; not a layer type of its own."""

    ndim: ClassVar[int]

    method: PoolMethod = Field(default="max", description="max or avg (mean) over each window")
    kernel: PosPair = Field(description="window size; an int or [height, width] for pool2d")
    stride: PosPair | None = Field(
        default=None, description="step between windows; default the kernel (no overlap)"
    )
    padding: NonNegPair = Field(
        default=0, description="padding on both sides of each axis; at most half the kernel"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        shape = in_shapes[0]
        expect_rank(shape, (self.ndim + 1,), INPUT_LAYOUT[self.ndim])
        kernel = as_tuple(self.kernel, self.ndim)
        stride = kernel if self.stride is None else as_tuple(self.stride, self.ndim)
        padding = as_tuple(self.padding, self.ndim)
        # torch refuses windows that could lie entirely in the padding
        if any(p > k // 2 for p, k in zip(padding, kernel, strict=True)):
            raise LayerShapeError(
                f"padding {list(padding)} exceeds half the kernel {list(kernel)}",
                hint="use padding of at most kernel // 2",
                field="padding",
            )
        out = window_out_shape(shape[1:], kernel, stride, padding, (1,) * self.ndim)
        return Pool(self.method, kernel, stride, padding), (shape[0], *out)


@register_layer("pool1d")
class Pool1dConfig(PoolConfigBase):
    """Pooling along the length of a (channels, length) source."""

    ndim: ClassVar[int] = 1

    type: Literal["pool1d"]
    kernel: PosInt = Field(description="window length")
    stride: PosInt | None = Field(
        default=None, description="step between windows; default the kernel (no overlap)"
    )
    padding: NonNegInt = Field(
        default=0, description="padding at both ends; at most half the kernel"
    )


@register_layer("pool2d", "pooling")
class Pool2dConfig(PoolConfigBase):
    """Pooling over the height and width of a (channels, height, width) source."""

    ndim: ClassVar[int] = 2

    type: Literal["pool2d", "pooling"]
