"""Repeated blocks: layers written once and repeated (`type: repeat`), and their expansion.

A block is an item of `neuralnet.layers`:

    - name: block
      type: repeat
      times: 4
      srclayers: [pos]
      layers:
        - {name: ln, type: layernorm, srclayers: [block]}
        - {name: att, type: attention, srclayers: [ln], heads: 4, causal: true}
        - {name: res, type: add, srclayers: [block, att]}

Copy i of the block's layer `ln` is the layer `block.i.ln`. Inside the block, the block's own
name is the copy's input (the block's source for copy 0, the previous copy's output for the
others) and the names of its layers are the copy's; outside it, the block's name is the last
copy's output. `expand_layers` is the one expansion, a pure function: the compiler, the
pipeline's checks and planner, and any budget of layers read the net through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from dsl.config import StrictModel
from dsl.errors import Path
from dsl.graph import SourceRef
from dsl.layers.base import LAYERS, LayerConfig

# A net of more layers than this is refused before it is expanded: expanding costs memory in
# the process that checks the job (the API), and a block multiplies what a document holds.
MAX_EXPANDED_LAYERS = 10_000
MAX_TIMES = 1_000


def layer_union() -> Any:
    """The registered layer types as one pydantic union, told apart by `type`."""
    classes = list(dict.fromkeys(cls for _, cls in LAYERS.items()))
    return Annotated[Union[tuple(classes)], Field(discriminator="type")]  # noqa: UP007


if TYPE_CHECKING:
    AnyLayer = LayerConfig
else:
    AnyLayer = layer_union()


class RepeatBlock(StrictModel):
    """A block of layers written once and repeated `times` times; copy i of its layer `x` is
    named `<block>.<i>.<x>`. Inside the block its own name is the copy's input; outside, the
    last copy's output."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$", description="unique block name")
    type: Literal["repeat"]
    times: int = Field(ge=1, le=MAX_TIMES, description="how many copies, one after another")
    srclayers: list[str] = Field(
        min_length=1, max_length=1, description="the layer whose output the first copy reads"
    )
    output: str | None = Field(
        default=None, description="the block's layer whose output is a copy's; default the last"
    )
    layers: list[AnyLayer] = Field(min_length=1, description="the layers of one copy")

    @model_validator(mode="after")
    def _names(self) -> RepeatBlock:
        names = [layer.name for layer in self.layers]
        if self.name in names:
            raise ValueError(
                f"a layer of block '{self.name}' has the block's name, which inside the block "
                "means the copy's input; rename the layer"
            )
        if self.output is not None and self.output not in names:
            raise ValueError(
                f"output '{self.output}' is not a layer of the block; its layers: "
                + ", ".join(names)
            )
        return self

    @property
    def last(self) -> str:
        """The block's layer whose output leaves each copy."""
        return self.output or self.layers[-1].name

    def copy_name(self, index: int, layer: str) -> str:
        return f"{self.name}.{index}.{layer}"


NetItem = LayerConfig | RepeatBlock


@dataclass(frozen=True)
class ExpandedNet:
    """The layers of a net with its blocks expanded, each with where it was written."""

    layers: list[LayerConfig]
    # Path of each layer under `neuralnet.layers`: (i,) or (i, "layers", j) inside block i.
    origins: list[Path]
    # Block name -> its copies' layer names, first copy first.
    blocks: dict[str, list[list[str]]]

    def aliases(self) -> dict[Path, Path]:
        """Where each expanded layer's path points in the document (for located errors)."""
        return {
            ("neuralnet", "layers", i): ("neuralnet", "layers", *origin)
            for i, origin in enumerate(self.origins)
            if origin != (i,)
        }


def expanded_count(items: Sequence[NetItem]) -> int:
    """How many layers the net has once its blocks are expanded, without expanding them."""
    return sum(
        item.times * len(item.layers) if isinstance(item, RepeatBlock) else 1 for item in items
    )


def expand_layers(items: Sequence[NetItem]) -> ExpandedNet:
    """Every block of `items` replaced by its copies, their sources renamed."""
    blocks = {item.name: item for item in items if isinstance(item, RepeatBlock)}
    outside = {name: block.copy_name(block.times - 1, block.last) for name, block in blocks.items()}
    layers: list[LayerConfig] = []
    origins: list[Path] = []
    copies: dict[str, list[list[str]]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, RepeatBlock):
            sources = [_rename(text, outside) for text in item.srclayers]
            layers.append(item if sources == item.srclayers else _copy(item, item.name, sources))
            origins.append((i,))
            continue
        own = {layer.name for layer in item.layers}
        copy_input = _rename(item.srclayers[0], outside)
        copies[item.name] = []
        for index in range(item.times):
            names = {name: item.copy_name(index, name) for name in own}
            inside = {**outside, **names, item.name: copy_input}
            for j, layer in enumerate(item.layers):
                sources = [_rename(text, inside) for text in layer.srclayers]
                layers.append(_copy(layer, names[layer.name], sources))
                origins.append((i, "layers", j))
            copies[item.name].append([names[layer.name] for layer in item.layers])
            copy_input = names[item.last]
    return ExpandedNet(layers, origins, copies)


def _rename(text: str, names: dict[str, str]) -> str:
    ref = SourceRef.parse(text)
    if ref.layer not in names:
        return text
    return str(SourceRef(names[ref.layer], ref.output))


def _copy(layer: LayerConfig, name: str, sources: list[str]) -> LayerConfig:
    # model_copy does not validate: copies carry dotted names no document may write
    return layer.model_copy(update={"name": name, "srclayers": sources})


def expand_stage(names: Sequence[str], net: ExpandedNet) -> tuple[list[str], list[int]]:
    """A stage's list with each block (`block`) or copy (`block.2`) it names replaced by its
    layers, and for each name the position in the written list it comes from."""
    out: list[str] = []
    written: list[int] = []
    for j, name in enumerate(names):
        block, _, index = name.partition(".")
        if block in net.blocks and not index:
            group = [layer for copy in net.blocks[block] for layer in copy]
        elif block in net.blocks and index.isdigit() and int(index) < len(net.blocks[block]):
            group = net.blocks[block][int(index)]
        else:
            group = [name]
        out += group
        written += [j] * len(group)
    return out, written
