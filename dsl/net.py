"""The compiled net: layers in topological order, run per phase."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from dsl.graph import SourceRef, phases_of
from dsl.init import ParamSpec
from dsl.layers.base import Layer, LayerConfig, Phase, Shape


@dataclass
class CompiledLayer:
    config: LayerConfig
    module: Layer
    out_shape: Shape | list[Shape]
    sources: list[SourceRef]


@dataclass
class NetOutput:
    loss: torch.Tensor | None
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor | tuple[torch.Tensor, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    name: str
    module: Layer
    sources: tuple[SourceRef, ...]
    is_input: bool
    wants_label: bool


def module_key(name: str) -> str:
    """A layer's key among torch's submodules, which may not hold a '.': the copy `block.0.ln`
    of a repeated block is the submodule `block/0/ln` (no written name holds a '/')."""
    return name.replace(".", "/")


class NeuralNet(nn.Module):
    """Runs the layers of one phase in order, feeding each its sources' outputs."""

    def __init__(self, layers: list[CompiledLayer]) -> None:
        super().__init__()
        self.compiled = layers
        self.layers = nn.ModuleDict(
            {module_key(layer.config.name): layer.module for layer in layers}
        )
        self._plans: dict[Phase, list[Step]] = {
            phase: [
                Step(
                    name=layer.config.name,
                    module=layer.module,
                    sources=tuple(layer.sources),
                    is_input=layer.config.type == "input",
                    wants_label=layer.module.is_loss or layer.module.is_metric,
                )
                for layer in layers
                if phase in phases_of(layer.config)
            ]
            for phase in ("train", "test")
        }
        # Asked at every step (bp resets the state of each batch): the few layers that have one.
        self._stateful = tuple(layer.module for layer in layers if layer.module.stateful)

    def steps(self, phase: Phase) -> list[Step]:
        """The layers `phase` runs, in order."""
        return list(self._plans[phase])

    def named_layers(self) -> list[tuple[str, Layer]]:
        """The layers' modules by their job-language names, in order."""
        return [(layer.config.name, layer.module) for layer in self.compiled]

    def named_params(self) -> dict[str, nn.Parameter]:
        """Parameters by their job-language names, `<layer>/<param>`."""
        return {
            f"{name}/{local}": param
            for name, module in self.named_layers()
            for local, param in module.named_parameters()
        }

    def param_specs(self) -> dict[str, ParamSpec]:
        specs = {}
        for layer in self.compiled:
            for local, _ in layer.module.named_parameters():
                role = layer.module.param_role(local)
                spec = layer.config.param.get(role) or layer.module.default_param(role)
                specs[f"{layer.config.name}/{local}"] = spec
        return specs

    def layer_modules(self) -> list[tuple[LayerConfig, Layer]]:
        return [(layer.config, layer.module) for layer in self.compiled]

    def reset_state(self) -> None:
        for module in self._stateful:
            module.reset_state()  # type: ignore[operator]

    def detach_state(self) -> None:
        for module in self._stateful:
            module.detach_state()  # type: ignore[operator]

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None,
        phase: Phase = "train",
        *,
        with_metrics: bool = False,
        stop_at: str | None = None,
    ) -> NetOutput:
        """Run the phase's layers; the loss is the sum of its loss layers' losses.

        `stop_at` ends the pass after that layer (the cd algorithm needs an rbm's input).
        """
        flow = self._flow(y, phase)
        losses: list[torch.Tensor] = []
        metrics: dict[str, torch.Tensor] = {}
        out: torch.Tensor | tuple[torch.Tensor, ...]
        for step in self._plans[phase]:
            if step.is_input:
                out = x
            elif not step.wants_label:
                out = flow.after_layer(step, step.module(*flow.inputs(step)))
            elif y is None:
                continue
            else:
                inputs = flow.inputs(step)
                inputs.append(flow.label(step))
                out = run_labelled(step, inputs, losses, metrics if with_metrics else None)
            flow.keep(step, out)
            if step.name == stop_at:
                break
        return NetOutput(loss=total_loss(losses), metrics=metrics, outputs=flow.outputs)

    def _flow(self, y: torch.Tensor | None, phase: Phase) -> Flow:
        """The bookkeeping of one pass; a net split over workers returns its own."""
        return Flow(y)


def run_labelled(
    step: Step,
    inputs: list[torch.Tensor],
    losses: list[torch.Tensor],
    metrics: dict[str, torch.Tensor] | None,
) -> torch.Tensor:
    """Run a layer that reads the labels (the last of `inputs`): a loss joins `losses`, and
    its metrics join `metrics` unless that is None."""
    out: torch.Tensor = step.module(*inputs)
    if step.module.is_loss:
        losses.append(out)
    if metrics is not None:
        with torch.no_grad():
            for key, value in step.module.metrics(*inputs).items():
                # A second layer reporting the same metric keeps its own name.
                metrics[key if key not in metrics else f"{step.name}/{key}"] = value
    return out


def total_loss(losses: list[torch.Tensor]) -> torch.Tensor | None:
    """The net's loss: the sum of its loss layers'; None without one."""
    if not losses:
        return None
    return losses[0] if len(losses) == 1 else torch.stack(losses).sum()


class Flow:
    """The outputs of one forward pass, and how a layer reads them.

    The hooks are where a net split over workers (workers/distributed/partition.py) differs:
    the layout a layer reads its sources and labels in, and what becomes of a layer's output
    (a feature-split layer gathers its slices).
    """

    def __init__(self, y: torch.Tensor | None) -> None:
        self.y = y
        self.outputs: dict[str, torch.Tensor | tuple[torch.Tensor, ...]] = {}

    def inputs(self, step: Step) -> list[torch.Tensor]:
        outputs = self.outputs  # a source with several outputs gives the one the ref names
        return [
            value[ref.output or 0] if isinstance(value := outputs[ref.layer], tuple) else value
            for ref in step.sources
        ]

    def label(self, step: Step) -> torch.Tensor:
        assert self.y is not None
        return self.y

    def after_layer(
        self, step: Step, out: torch.Tensor | tuple[torch.Tensor, ...]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return out

    def keep(self, step: Step, out: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        self.outputs[step.name] = out
