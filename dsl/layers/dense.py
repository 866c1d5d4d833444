"""Fully connected layer (SINGA's InnerProduct)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape, register_layer


class Dense(Layer):
    def __init__(self, in_features: int, units: int, bias: bool, axis: int) -> None:
        super().__init__()
        self.axis = axis
        self.w = nn.Parameter(torch.empty(units, in_features))
        self.b = nn.Parameter(torch.empty(units)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, *lead, *features) -> (B, *lead, in_features) -> (B, *lead, units); features on one
        # axis already are not flattened (flatten would hand back `x` itself, after a call).
        if x.dim() != self.axis + 1:
            x = x.flatten(self.axis)
        return F.linear(x, self.w, self.b)

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        # A multiply-add per weight at every position of the kept leading axes.
        assert not isinstance(out_shape, list)
        return 2 * self.w.numel() * math.prod(out_shape[:-1])


@register_layer("dense", "innerproduct")
class DenseConfig(LayerConfig):
    """`units` outputs from the features of the source.

    The axes from `axis` on (SINGA numbering: 0 is the batch) are flattened into the input
    features; axes before it are kept, so `axis: 2` applies the layer at every time step of a
    (T, H) sequence.
    """

    type: Literal["dense", "innerproduct"]
    units: int | None = Field(
        default=None, gt=0, description="output units; default the data's number of classes"
    )
    bias: bool = True
    axis: int = Field(default=1, ge=1, description="first axis of the input features (0 = batch)")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        shape = in_shapes[0]
        if self.axis > len(shape):
            raise LayerShapeError(
                f"axis {self.axis} is past the source's {len(shape)} per-sample axes",
                hint="axis 1 flattens every per-sample axis",
                field="axis",
            )
        units = self.units or ctx.num_classes
        if units is None:
            raise LayerShapeError(
                "units is not set and the data has no number of classes",
                hint="set units",
                field="units",
            )
        lead = shape[: self.axis - 1]
        layer = Dense(math.prod(shape[self.axis - 1 :]), units, self.bias, self.axis)
        return layer, (*lead, units)
