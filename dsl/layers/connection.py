"""Layers that join and divide the flow between layers: concat, slice, split and add.

`concat_dim` and `slice_dim` count the batch as axis 0 (SINGA numbering), so 1 is the first axis
of each sample; that is also the tensor axis the module works on.
"""

from __future__ import annotations

from itertools import pairwise
from typing import ClassVar, Literal

import torch
from pydantic import Field, model_validator

from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape, register_layer


def _check_axis(dim: int, shape: Shape, key: str) -> None:
    """`dim` (SINGA numbering) must name the batch or an axis of `shape`."""
    if dim > len(shape):
        raise LayerShapeError(
            f"{key}={dim} does not exist in a source of shape {list(shape)} per sample "
            f"(axes 1..{len(shape)}, 0 being the batch)",
            hint=f"pick a {key} between 0 and the source's rank",
            field=key,
        )


class Concat(Layer):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


@register_layer("concat", "concate")
class ConcatConfig(LayerConfig):
    """Joins its sources along `concat_dim`; all other axes must agree."""

    type: Literal["concat", "concate"]
    concat_dim: int = Field(
        default=1, ge=0, description="axis to join along; 0 is the batch, 1 the first sample axis"
    )

    arity: ClassVar[tuple[int, int | None]] = (2, None)

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        first = in_shapes[0]
        _check_axis(self.concat_dim, first, "concat_dim")
        axis = self.concat_dim - 1  # per-sample axis; -1 when joining batches
        for i, shape in enumerate(in_shapes[1:], start=1):
            others_agree = len(shape) == len(first) and all(
                a == b for j, (a, b) in enumerate(zip(shape, first, strict=True)) if j != axis
            )
            if not others_agree:
                raise LayerShapeError(
                    f"source {i} has shape {list(shape)} but source 0 has {list(first)}; "
                    f"all axes except concat_dim={self.concat_dim} must be equal",
                    hint="reshape the sources or concatenate along the axis where they differ",
                )
        if axis < 0:
            return Concat(0), first
        joined = sum(shape[axis] for shape in in_shapes)
        return Concat(self.concat_dim), (*first[:axis], joined, *first[axis + 1 :])


class Slice(Layer):
    def __init__(self, dim: int, sizes: list[int] | None, parts: int) -> None:
        super().__init__()
        # sizes is None when slicing the batch, whose size is only known at run time
        self.dim, self.sizes, self.parts = dim, sizes, parts

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.sizes is not None:
            return tuple(torch.split(x, self.sizes, dim=self.dim))
        if x.shape[0] < self.parts:
            raise ValueError(f"cannot slice a batch of {x.shape[0]} into {self.parts} parts")
        # near-equal parts: a short last batch still goes to every consumer
        return tuple(torch.tensor_split(x, self.parts, dim=0))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, sizes={self.sizes}, parts={self.parts}"


@register_layer("slice")
class SliceConfig(LayerConfig):
    """Cuts its source along `slice_dim` into several outputs, addressed as `<name>:<i>`.

    Give either `num_slices` (equal parts) or `slice_points` (cut positions). Slicing the batch
    (`slice_dim: 0`) takes `num_slices` only and splits each batch as evenly as it can.
    """

    type: Literal["slice"]
    slice_dim: int = Field(
        default=1, ge=0, description="axis to cut; 0 is the batch, 1 the first sample axis"
    )
    num_slices: int | None = Field(
        default=None, gt=0, description="number of equal parts; must divide the axis"
    )
    slice_points: list[int] | None = Field(
        default=None,
        min_length=1,
        description="increasing positions along the axis where one part ends and the next begins",
    )

    @model_validator(mode="after")
    def _one_way_to_cut(self) -> SliceConfig:
        if (self.num_slices is None) == (self.slice_points is None):
            raise ValueError("give exactly one of num_slices and slice_points")
        points = self.slice_points
        if points is not None:
            if points[0] <= 0 or any(b <= a for a, b in pairwise(points)):
                raise ValueError(f"slice_points must be positive and increasing, got {points}")
            if self.slice_dim == 0:
                raise ValueError(
                    "slicing the batch (slice_dim 0) takes num_slices, not slice_points"
                )
        return self

    def num_outputs(self) -> int:
        if self.num_slices is not None:
            return self.num_slices
        return len(self.slice_points or ()) + 1

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, list[Shape]]:
        shape = in_shapes[0]
        _check_axis(self.slice_dim, shape, "slice_dim")
        parts = self.num_outputs()
        if self.slice_dim == 0:
            return Slice(0, None, parts), [shape] * parts
        axis = self.slice_dim - 1
        size = shape[axis]
        if self.slice_points is not None:
            if self.slice_points[-1] >= size:
                raise LayerShapeError(
                    f"slice_points {self.slice_points} must lie inside the axis of size {size}",
                    hint=f"use points between 1 and {size - 1}",
                    field="slice_points",
                )
            bounds = [0, *self.slice_points, size]
            sizes = [b - a for a, b in pairwise(bounds)]
        elif size % parts:
            raise LayerShapeError(
                f"an axis of size {size} does not divide into {parts} equal parts",
                hint="use slice_points for unequal parts",
                field="num_slices",
            )
        else:
            sizes = [size // parts] * parts
        out = [(*shape[:axis], s, *shape[axis + 1 :]) for s in sizes]
        return Slice(self.slice_dim, sizes, parts), out


class Identity(Layer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@register_layer("split")
class SplitConfig(LayerConfig):
    """Hands its source on unchanged to every layer that names it (SINGA's Split).

    Consumers address it by its plain name; the gradients they send back are summed.
    """

    type: Literal["split"]
    num_splits: int | None = Field(
        default=None, gt=0, description="number of consumers; documentation only, not enforced"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return Identity(), in_shapes[0]


class Add(Layer):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return total


@register_layer("add")
class AddConfig(LayerConfig):
    """Elementwise sum of sources of identical shape (e.g. a residual connection)."""

    type: Literal["add"]

    arity: ClassVar[tuple[int, int | None]] = (2, None)

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        first = in_shapes[0]
        for i, shape in enumerate(in_shapes[1:], start=1):
            if shape != first:
                raise LayerShapeError(
                    f"source {i} has shape {list(shape)} but source 0 has {list(first)}; "
                    "add needs identical shapes",
                    hint="reshape the sources or use concat",
                )
        return Add(), first
