"""Elementwise layers that keep their source's shape: activations and dropout."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape, register_layer

# SINGA's STanh constants (LeCun's scaled tanh): f(1) = 1 and f(-1) = -1
STANH_SCALE = 1.7159
STANH_SLOPE = 2.0 / 3.0


class ReLU(Layer):
    def __init__(self, negative_slope: float) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.negative_slope == 0.0:
            return F.relu(x)
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


@register_layer("relu")
class ReLUConfig(LayerConfig):
    """max(x, 0); with a `negative_slope`, the leaky variant max(x, 0) + slope * min(x, 0)."""

    type: Literal["relu"]
    negative_slope: float = Field(
        default=0.0, ge=0.0, description="slope for negative inputs; 0 is the plain ReLU"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return ReLU(self.negative_slope), in_shapes[0]


class Sigmoid(Layer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)


@register_layer("sigmoid")
class SigmoidConfig(LayerConfig):
    """1 / (1 + exp(-x))."""

    type: Literal["sigmoid"]

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return Sigmoid(), in_shapes[0]


class Tanh(Layer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


@register_layer("tanh")
class TanhConfig(LayerConfig):
    """Hyperbolic tangent."""

    type: Literal["tanh"]

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return Tanh(), in_shapes[0]


class STanh(Layer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return STANH_SCALE * torch.tanh(STANH_SLOPE * x)


@register_layer("stanh")
class STanhConfig(LayerConfig):
    """SINGA's scaled tanh: 1.7159 * tanh(2/3 * x)."""

    type: Literal["stanh"]

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return STanh(), in_shapes[0]


class GELU(Layer):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate}"


@register_layer("gelu")
class GELUConfig(LayerConfig):
    """x * Phi(x), Phi the standard normal's distribution function (the transformers' activation);
    `approximate: tanh` is GPT-2's tanh approximation of it."""

    type: Literal["gelu"]
    approximate: Literal["none", "tanh"] = Field(
        default="none", description="none: the exact erf form; tanh: GPT-2's approximation"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return GELU(self.approximate), in_shapes[0]


class SiLU(Layer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


@register_layer("silu")
class SiLUConfig(LayerConfig):
    """x * sigmoid(x) (also called swish)."""

    type: Literal["silu"]

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return SiLU(), in_shapes[0]


class Softmax(Layer):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, dim=-1)


@register_layer("softmax")
class SoftmaxConfig(LayerConfig):
    """Probabilities over the last axis (for training, prefer softmax_loss on the logits)."""

    type: Literal["softmax"]

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        # with a scalar per sample the last axis would be the batch's
        if not in_shapes[0]:
            raise LayerShapeError(
                "expects a source with at least one axis per sample, got a scalar",
                hint="softmax normalises over the last axis of each sample",
            )
        return Softmax(), in_shapes[0]


class Dropout(Layer):
    def __init__(self, ratio: float) -> None:
        super().__init__()
        self.ratio = ratio

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # inverted dropout: survivors are scaled by 1 / (1 - ratio) in training, so evaluation
        # is the identity
        return F.dropout(x, self.ratio, self.training)

    def extra_repr(self) -> str:
        return f"ratio={self.ratio}"


@register_layer("dropout")
class DropoutConfig(LayerConfig):
    """Zeroes each element with probability `ratio` during training; the identity in testing."""

    type: Literal["dropout"]
    ratio: float = Field(default=0.5, ge=0.0, lt=1.0, description="probability of dropping")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        return Dropout(self.ratio), in_shapes[0]
