"""Convolution over sequences (conv1d) and images (conv2d): SINGA's Convolution layer.

Also home of the sliding-window arithmetic that the pooling layers share.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from dsl.layers.base import (
    BuildContext,
    Layer,
    LayerConfig,
    LayerShapeError,
    Shape,
    expect_rank,
    register_layer,
)

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
# 2-d windows take one int for both axes or a (height, width) pair.
PosPair = PosInt | tuple[PosInt, PosInt]
NonNegPair = NonNegInt | tuple[NonNegInt, NonNegInt]

AXIS_NAMES = {1: ("length",), 2: ("height", "width")}
INPUT_LAYOUT = {1: "(C, L)", 2: "(C, H, W)"}


def as_tuple(value: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """An int or per-axis tuple as a per-axis tuple."""
    return (value,) * ndim if isinstance(value, int) else tuple(value)


def window_out(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Positions a sliding window takes along one axis (floor mode, as torch computes it)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def window_out_shape(
    spatial: Shape,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
) -> Shape:
    """Output spatial shape of a window sliding over `spatial`; LayerShapeError if it never fits."""
    names = AXIS_NAMES[len(spatial)]
    out = []
    for name, size, k, s, p, d in zip(
        names, spatial, kernel, stride, padding, dilation, strict=True
    ):
        span = d * (k - 1) + 1
        if size + 2 * p < span:
            raise LayerShapeError(
                f"the window spans {span} positions but the input {name} is {size}"
                + (f" ({size + 2 * p} with padding)" if p else ""),
                hint="use a smaller kernel (or dilation) or more padding",
                field="kernel",
            )
        out.append(window_out(size, k, s, p, d))
    return tuple(out)


class Conv(Layer):
    """Convolution with its own weight `w` (filters, in_channels/groups, *kernel) and bias `b`."""

    def __init__(
        self,
        in_channels: int,
        filters: int,
        kernel: tuple[int, ...],
        stride: tuple[int, ...],
        padding: tuple[int, ...],
        dilation: tuple[int, ...],
        groups: int,
        bias: bool,
    ) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(filters, in_channels // groups, *kernel))
        self.b = nn.Parameter(torch.empty(filters)) if bias else None
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, C, L) -> (B, filters, L') or (B, C, H, W) -> (B, filters, H', W')
        conv = F.conv1d if self.w.dim() == 3 else F.conv2d
        return conv(x, self.w, self.b, self.stride, self.padding, self.dilation, self.groups)

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        # A multiply-add per kernel weight at every output position: out_shape (filters, *L').
        assert not isinstance(out_shape, list)
        return 2 * self.w.numel() * math.prod(out_shape[1:])


class ConvConfigBase(LayerConfig):
    """Keys and builder shared by conv1d and conv2d; not a layer type of its own."""

    ndim: ClassVar[int]

    filters: int = Field(gt=0, description="number of output channels (feature maps)")
    kernel: PosPair = Field(description="window size; an int or [height, width] for conv2d")
    stride: PosPair = Field(default=1, description="step between windows")
    padding: NonNegPair = Field(default=0, description="zeros added on both sides of each axis")
    dilation: PosPair = Field(default=1, description="spacing between the window's taps")
    groups: int = Field(
        default=1,
        gt=0,
        description="split channels into this many groups convolved separately; must divide "
        "both the input channels and `filters`",
    )
    bias: bool = Field(default=True, description="whether the layer has a bias `b`")

    @model_validator(mode="after")
    def _groups_divide_filters(self) -> ConvConfigBase:
        if self.filters % self.groups:
            raise ValueError(f"filters={self.filters} is not divisible by groups={self.groups}")
        return self

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        shape = in_shapes[0]
        expect_rank(shape, (self.ndim + 1,), INPUT_LAYOUT[self.ndim])
        channels, spatial = shape[0], shape[1:]
        if channels % self.groups:
            raise LayerShapeError(
                f"{channels} input channels are not divisible by groups={self.groups}",
                hint="choose groups dividing the number of input channels",
                field="groups",
            )
        kernel, stride, padding, dilation = (
            as_tuple(v, self.ndim) for v in (self.kernel, self.stride, self.padding, self.dilation)
        )
        out = window_out_shape(spatial, kernel, stride, padding, dilation)
        module = Conv(
            channels, self.filters, kernel, stride, padding, dilation, self.groups, self.bias
        )
        return module, (self.filters, *out)


@register_layer("conv1d")
class Conv1dConfig(ConvConfigBase):
    """1-d convolution over a (channels, length) source."""

    ndim: ClassVar[int] = 1

    type: Literal["conv1d"]
    kernel: PosInt = Field(description="window length")
    stride: PosInt = Field(default=1, description="step between windows")
    padding: NonNegInt = Field(default=0, description="zeros added at both ends")
    dilation: PosInt = Field(default=1, description="spacing between the window's taps")


@register_layer("conv2d", "convolution")
class Conv2dConfig(ConvConfigBase):
    """2-d convolution over a (channels, height, width) source."""

    ndim: ClassVar[int] = 2

    type: Literal["conv2d", "convolution"]
