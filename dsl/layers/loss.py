"""Loss and metric layers. Each gets one tensor per source and then the batch's labels.

Class scores are (C,) per sample with an index label (), or a sequence (T, C) with labels (T,);
a sequence counts every time step as one prediction.
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


def check_scores(shape: Shape, ctx: BuildContext, layer: str, topk: int) -> None:
    """Raise unless class scores of `shape` fit the data's labels and top-`topk` makes sense."""
    expect_rank(shape, (1, 2), "class scores (C,) or a sequence of them (T, C)")
    if not ctx.label_is_index:
        raise LayerShapeError(
            f"{layer} needs class-index labels, but the data's labels are real values",
            hint="use euclidean_loss for real-valued targets",
        )
    if ctx.label_shape != shape[:-1]:
        raise LayerShapeError(
            f"{layer} gets scores of shape {list(shape)}, which need labels of shape "
            f"{list(shape[:-1])}, but the data's labels have shape {list(ctx.label_shape)}",
            hint="give one score per class for every label: (C,) for a class label, (T, C) "
            "for a sequence of labels",
        )
    classes = shape[-1]
    if ctx.num_classes is not None and classes < ctx.num_classes:
        raise LayerShapeError(
            f"{layer} gets {classes} class scores per prediction, but the data has "
            f"{ctx.num_classes} classes",
            hint=f"make the layer feeding it produce {ctx.num_classes} outputs",
        )
    if topk > classes:
        raise LayerShapeError(
            f"topk {topk} exceeds the {classes} classes", hint="lower `topk`", field="topk"
        )


def flat_scores(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # (B, C) or (B, T, C) -> (N, C); labels (B,) or (B, T) -> (N,) int64. Tensors already in
    # that form are passed as they are: a reshape to the same shape is a call and an autograd
    # node that every step of a classifier would pay for nothing.
    if scores.dim() != 2:
        scores = scores.reshape(-1, scores.shape[-1])
    if labels.dim() != 1:
        labels = labels.reshape(-1)
    return scores, labels if labels.dtype == torch.int64 else labels.long()


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Fraction of predictions whose label is among the `k` highest scores (0-d tensor)."""
    scores, labels = flat_scores(scores, labels)
    # mean(dtype=) converts the hits as it reads them (CPU), or as its own first step (CUDA):
    # the value of .to(dtype).mean() to the bit, without a separate call and tensor.
    if k == 1:
        return (scores.argmax(1) == labels).mean(dtype=scores.dtype)
    top = scores.topk(k, dim=1).indices  # (N, k)
    return (top == labels.unsqueeze(1)).any(1).mean(dtype=scores.dtype)


class SoftmaxLoss(Layer):
    is_loss: ClassVar[bool] = True

    def __init__(self, topk: int) -> None:
        super().__init__()
        self.topk = topk

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(*flat_scores(scores, labels))

    def metrics(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        scores, labels = inputs
        # The net reports the loss itself; computing it again here would cost a second pass.
        return {"accuracy": topk_accuracy(scores, labels, self.topk)}


@register_layer("softmax_loss")
class SoftmaxLossConfig(LayerConfig):
    """Softmax cross-entropy of the source's class scores (logits) against the labels."""

    terminal: ClassVar[bool] = True
    reads_labels: ClassVar[bool] = True
    reports: ClassVar[tuple[str, ...]] = ("accuracy",)

    type: Literal["softmax_loss"]
    topk: int = Field(
        default=1, gt=0, description="reported accuracy counts a label among the top k scores"
    )

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        check_scores(in_shapes[0], ctx, "softmax_loss", self.topk)
        return SoftmaxLoss(self.topk), ()


class EuclideanLoss(Layer):
    is_loss: ClassVar[bool] = True

    def forward(
        self, prediction: torch.Tensor, target: torch.Tensor, *_labels: torch.Tensor
    ) -> torch.Tensor:
        # With one source `target` is the batch's labels; with two it is the second source and
        # the labels that follow are not used.
        diff = prediction - target.reshape(prediction.shape).to(prediction.dtype)
        return 0.5 * diff.pow(2).reshape(diff.shape[0], -1).sum(1).mean()


def _squeezed(shape: Shape) -> Shape:
    return tuple(d for d in shape if d != 1)


@register_layer("euclidean_loss")
class EuclideanLossConfig(LayerConfig):
    """Half the squared distance to the target, summed per sample, averaged over the batch.

    The target is the second source if there is one (an autoencoder's input), otherwise the
    batch's labels. Shapes that differ only by size-1 axes count as equal, so a prediction (1,)
    fits a scalar label.
    """

    terminal: ClassVar[bool] = True
    reads_labels: ClassVar[bool] = True

    type: Literal["euclidean_loss"]

    arity: ClassVar[tuple[int, int | None]] = (1, 2)

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        prediction = in_shapes[0]
        target, what = (
            (in_shapes[1], "the second source")
            if len(in_shapes) == 2
            else (ctx.label_shape, "the data's labels")
        )
        if _squeezed(prediction) != _squeezed(target):
            raise LayerShapeError(
                f"euclidean_loss compares a prediction of shape {list(prediction)} with a "
                f"target of shape {list(target)} ({what})",
                hint="make the first source produce the target's shape",
            )
        return EuclideanLoss(), ()


class Accuracy(Layer):
    is_metric: ClassVar[bool] = True

    def __init__(self, topk: int) -> None:
        super().__init__()
        self.topk = topk

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return topk_accuracy(scores, labels, self.topk)

    def metrics(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"accuracy": self(*inputs)}


@register_layer("accuracy")
class AccuracyConfig(LayerConfig):
    """Top-k accuracy of the source's class scores against the labels (a metric, no gradient)."""

    terminal: ClassVar[bool] = True
    reads_labels: ClassVar[bool] = True
    reports: ClassVar[tuple[str, ...]] = ("accuracy",)

    type: Literal["accuracy"]
    topk: int = Field(default=1, gt=0, description="count a label among the top k scores as hit")

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape]:
        check_scores(in_shapes[0], ctx, "accuracy", self.topk)
        return Accuracy(self.topk), ()
