"""The layer contract: a pydantic config paired with the builder of its torch module.

A layer type is one class deriving from `LayerConfig`, registered with `@register_layer(...)`. Its
`build()` receives the output shapes of its source layers (per sample, without the batch
dimension) and returns the module and its own output shape. Adding a layer type is one new class
in one file; the compiler, the schema and the docs pick it up from the registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from dsl.config import StrictModel
from dsl.init import ParamSpec
from dsl.registry import Registry

Shape = tuple[int, ...]
Phase = Literal["train", "test"]


class LayerShapeError(ValueError):
    """A layer cannot accept the shapes it is given; the compiler locates it in the YAML."""

    def __init__(self, message: str, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint, self.field = message, hint, field


@dataclass(frozen=True)
class BuildContext:
    """What a builder may know beyond its sources' shapes: facts of the data source."""

    sample_shape: Shape = ()
    num_classes: int | None = None
    label_shape: Shape = ()
    label_is_index: bool = True
    # Training samples, where they were loaded: a batch larger than the split is refused.
    train_samples: int | None = None


class Layer(nn.Module):
    """Base of compiled layers. `forward(*inputs)` takes one tensor per source layer.

    Loss layers (`is_loss`) and metric layers (`is_metric`) get the batch's labels as their last
    input. Parameters are the module's own direct `nn.Parameter`s; their local names (`w`, `b`)
    become `<layer>/<param>` in the net.
    """

    is_loss: ClassVar[bool] = False
    is_metric: ClassVar[bool] = False
    stateful: ClassVar[bool] = False
    # Whether the module gave its parameters their first values itself (a plugin's module);
    # otherwise the compiler initialises them from their `param:` settings.
    initialises_itself: ClassVar[bool] = False

    def param_role(self, local_name: str) -> str:
        """Which `param:` key configures the parameter called `local_name`."""
        return local_name

    def default_param(self, role: str) -> ParamSpec:
        if role == "b":
            return ParamSpec(init="constant", value=0.0)
        return ParamSpec(init="xavier")

    def metrics(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Scalar metrics a loss or metric layer reports besides the loss (no gradients)."""
        return {}

    def forward_flops(self, in_shapes: list[Shape], out_shape: Shape | list[Shape]) -> int:
        """An estimate of the forward pass's floating-point operations for one sample, from
        which the pipeline planner balances its stages without running the net. Layers that
        multiply by weight matrices or kernels count their multiply-adds; the others are bound
        by memory, and each element they read or write takes about as long as ten operations
        of a matrix product (measured on a CPU core)."""
        outputs = out_shape if isinstance(out_shape, list) else [out_shape]
        read = sum(math.prod(shape) for shape in in_shapes)
        return 10 * max(read, sum(math.prod(shape) for shape in outputs))


class StatefulLayer(Layer):
    """A recurrent layer that carries hidden state across chunks of a sequence (bptt)."""

    stateful: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.state: Any = None

    def reset_state(self) -> None:
        self.state = None

    def detach_state(self) -> None:
        if isinstance(self.state, tuple):
            self.state = tuple(s.detach() for s in self.state)
        elif self.state is not None:
            self.state = self.state.detach()


class LayerConfig(StrictModel):
    """Keys every layer has. Subclasses add their own and narrow `type` to a Literal."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$", description="unique layer name")
    type: str
    srclayers: list[str] = Field(default_factory=list, description="names of the source layers")
    include: list[Phase] | None = Field(
        default=None, description="phases the layer takes part in; default both"
    )
    partition_dim: Literal[-1, 0, 1] | None = Field(
        default=None, description="0: split the batch, 1: split features; default the net's"
    )
    param: dict[str, ParamSpec] = Field(default_factory=dict, description="per-parameter settings")

    # How many sources the layer takes: (min, max); None as max means any number.
    arity: ClassVar[tuple[int, int | None]] = (1, 1)
    # Whether the layer may end the net (losses, metrics, an rbm trained by cd).
    terminal: ClassVar[bool] = False
    # Whether its module reads the batch's labels (`is_loss` or `is_metric`): known before the
    # module is built, so that a pipeline's stage lists can be checked with the other keys.
    reads_labels: ClassVar[bool] = False
    # The metrics its module reports besides the loss (`Layer.metrics`), known before it is
    # built: a job's objective names one of them (dsl/objective.py).
    reports: ClassVar[tuple[str, ...]] = ()

    # How many outputs the layer produces (slice produces several).
    def num_outputs(self) -> int:
        return 1

    def build(self, in_shapes: list[Shape], ctx: BuildContext) -> tuple[Layer, Shape | list[Shape]]:
        raise TypeError(f"layer type {self.type!r} defines no build()")


LAYERS: Registry[type[LayerConfig]] = Registry("layer type")


def register_layer(
    *names: str,
) -> Callable[[type[LayerConfig]], type[LayerConfig]]:
    """`@register_layer("dense", "innerproduct")` on a LayerConfig subclass."""
    return LAYERS.register(*names)


def expect_rank(shape: Shape, ranks: tuple[int, ...], what: str) -> None:
    if len(shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise LayerShapeError(
            f"expects a source of rank {want} per sample ({what}), got shape {list(shape)}",
            hint="insert a reshape or flatten layer before it",
        )
