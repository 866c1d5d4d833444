"""Layers that only rearrange their source: flatten and reshape (per sample; the batch stays)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator

from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape, register_layer


class Flatten(Layer):
    def __init__(self, axis: int) -> None:
        super().__init__()
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, d1, ..., dn) -> (B, d1, ..., d(axis-1), d(axis) * ... * dn)
        return x.flatten(self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


@register_layer("flatten")
class FlattenConfig(LayerConfig):
    """Merges the axes from `axis` on into one; axis 1 (the default) gives a vector per sample."""

    type: Literal["flatten"]
    axis: int = Field(
        default=1,
        ge=1,
        description="first axis to merge, counting the batch as axis 0 (SINGA numbering)",
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        shape = in_shapes[0]
        if self.axis > len(shape):
            raise LayerShapeError(
                f"axis {self.axis} does not exist in a source of shape {list(shape)} per sample "
                f"(axes 1..{len(shape)}, 0 being the batch)",
                hint="pick an axis between 1 and the source's rank",
                field="axis",
            )
        keep = shape[: self.axis - 1]
        return Flatten(self.axis), (*keep, math.prod(shape[self.axis - 1 :]))


class Reshape(Layer):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, *in) -> (B, *shape)
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return f"shape={list(self.shape)}"


@register_layer("reshape")
class ReshapeConfig(LayerConfig):
    """Gives each sample a new shape with the same number of elements."""

    type: Literal["reshape"]
    shape: list[int] = Field(
        min_length=1,
        description="new shape per sample (without the batch); one entry may be -1 to be "
        "inferred from the others",
    )

    @field_validator("shape")
    @classmethod
    def _valid_dims(cls, shape: list[int]) -> list[int]:
        if any(d == 0 or d < -1 for d in shape):
            raise ValueError(f"dims must be positive or -1, got {shape}")
        if shape.count(-1) > 1:
            raise ValueError(f"at most one dim may be -1, got {shape}")
        return shape

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        count = math.prod(in_shapes[0])
        known = math.prod(d for d in self.shape if d != -1)
        source = f"the source's shape {list(in_shapes[0])} ({count} elements per sample)"
        if -1 in self.shape:
            if count % known:
                raise LayerShapeError(
                    f"{source} cannot fill {self.shape}: {count} is not divisible by {known}",
                    hint="change the shape so its known dims divide the element count",
                    field="shape",
                )
            out = tuple(count // known if d == -1 else d for d in self.shape)
        elif known != count:
            raise LayerShapeError(
                f"{source} does not fit {self.shape} ({known} elements)",
                hint="the product of the new dims must equal the source's element count",
                field="shape",
            )
        else:
            out = tuple(self.shape)
        return Reshape(out), out
