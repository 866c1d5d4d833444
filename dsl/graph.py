"""Resolve the layer DAG: names, sources, phases, cycles and topological order."""

from __future__ import annotations

from dataclasses import dataclass

from dsl.errors import SpecIssue
from dsl.layers.base import LAYERS, LayerConfig, Phase
from dsl.registry import did_you_mean
from dsl.source import SourceMap

PHASES: tuple[Phase, ...] = ("train", "test")


@dataclass(frozen=True)
class SourceRef:
    """A source of a layer: a layer name and, for multi-output layers, which output."""

    layer: str
    output: int | None = None

    @classmethod
    def parse(cls, text: str) -> SourceRef:
        name, sep, index = text.partition(":")
        if sep and index.isdigit():
            return cls(name, int(index))
        return cls(text)

    def __str__(self) -> str:
        return self.layer if self.output is None else f"{self.layer}:{self.output}"


def phases_of(layer: LayerConfig) -> tuple[Phase, ...]:
    return tuple(layer.include) if layer.include else PHASES


def resolve_dag(
    layers: list[LayerConfig], source: SourceMap
) -> tuple[list[LayerConfig], list[SpecIssue]]:
    """Order layers so that every layer follows its sources; report every problem found."""
    issues: list[SpecIssue] = []
    index: dict[str, int] = {}
    for i, layer in enumerate(layers):
        if layer.name in index:
            issues.append(
                source.issue(
                    ("neuralnet", "layers", i, "name"),
                    f"layer name '{layer.name}' is used twice",
                    "give each layer a unique name",
                )
            )
        index.setdefault(layer.name, i)

    names = list(index)
    deps: dict[str, list[str]] = {}
    for i, layer in enumerate(layers):
        cls = LAYERS.get(layer.type)
        low, high = cls.arity
        count = len(layer.srclayers)
        if count < low or (high is not None and count > high):
            want = f"{low}" if low == high else f"{low} to {high if high is not None else 'any'}"
            issues.append(
                source.issue(
                    ("neuralnet", "layers", i, "srclayers"),
                    f"layer '{layer.name}' ({layer.type}) takes {want} source layer(s), "
                    f"got {count}",
                )
            )
        deps[layer.name] = []
        for j, text in enumerate(layer.srclayers):
            ref = SourceRef.parse(text)
            path = ("neuralnet", "layers", i, "srclayers", j)
            if ref.layer not in index:
                issues.append(
                    source.issue(
                        path,
                        f"layer '{layer.name}' names source '{ref.layer}', which is not a layer",
                        did_you_mean(ref.layer, names) or f"layers: {', '.join(names)}",
                    )
                )
                continue
            src = layers[index[ref.layer]]
            outputs = src.num_outputs()
            if ref.output is not None and ref.output >= outputs:
                issues.append(
                    source.issue(
                        path,
                        f"'{text}': layer '{src.name}' has {outputs} output(s)",
                        f"use {src.name}:0 .. {src.name}:{outputs - 1}",
                    )
                )
            elif ref.output is None and outputs > 1:
                issues.append(
                    source.issue(
                        path,
                        f"layer '{src.name}' has {outputs} outputs; say which one",
                        f"write '{src.name}:0', '{src.name}:1', ...",
                    )
                )
            missing = [p for p in phases_of(layer) if p not in phases_of(src)]
            if missing:
                issues.append(
                    source.issue(
                        path,
                        f"layer '{layer.name}' runs in phase {missing[0]} but its source "
                        f"'{src.name}' does not",
                        "make the layer's include a subset of its source's",
                    )
                )
            deps[layer.name].append(ref.layer)

    order = _toposort(layers, deps, index, source, issues)

    consumed = {dep for srcs in deps.values() for dep in srcs}
    for i, layer in enumerate(layers):
        if layer.name not in consumed and not LAYERS.get(layer.type).terminal:
            issues.append(
                source.issue(
                    ("neuralnet", "layers", i, "name"),
                    f"the output of layer '{layer.name}' is not used by any layer",
                    "connect it as a source of another layer, or remove it",
                )
            )
    return order, issues


def _toposort(
    layers: list[LayerConfig],
    deps: dict[str, list[str]],
    index: dict[str, int],
    source: SourceMap,
    issues: list[SpecIssue],
) -> list[LayerConfig]:
    """Kahn's algorithm, stable in the order the user wrote the layers."""
    remaining = {name: set(srcs) for name, srcs in deps.items()}
    order: list[str] = []
    while True:
        ready = [n for n in index if n in remaining and not remaining[n]]
        if not ready:
            break
        for name in ready:
            order.append(name)
            del remaining[name]
        for srcs in remaining.values():
            srcs.difference_update(ready)
    if remaining:
        cycle = ", ".join(sorted(remaining))
        first = min(index[n] for n in remaining)
        issues.append(
            source.issue(
                ("neuralnet", "layers", first, "srclayers"),
                f"the layers {cycle} form a cycle through their srclayers",
                "a net must be a DAG; recurrent connections belong inside rnn/lstm/gru layers",
            )
        )
    return [layers[index[name]] for name in order]
