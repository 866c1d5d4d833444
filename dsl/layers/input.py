"""The input layer: where the batch's samples enter the net (SINGA's data/input layer)."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, PositiveInt

from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape, register_layer


class Input(Layer):
    """Passes the batch's x on unchanged; the net feeds it the samples, not a source layer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        return 0  # the batch is passed on, not computed


@register_layer("input")
class InputConfig(LayerConfig):
    """The samples of the data source, shaped as the data gives them (per sample)."""

    type: Literal["input"]
    shape: list[PositiveInt] | None = Field(
        default=None,
        description="expected per-sample shape of the data (without the batch dimension); "
        "building fails if the data source gives another",
    )

    arity: ClassVar[tuple[int, int | None]] = (0, 0)

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        if self.shape is not None and tuple(self.shape) != ctx.sample_shape:
            raise LayerShapeError(
                f"the data gives samples of shape {list(ctx.sample_shape)}, "
                f"but the input layer expects {self.shape}",
                hint="fix `shape` or remove it to accept the data's shape",
                field="shape",
            )
        return Input(), ctx.sample_shape
