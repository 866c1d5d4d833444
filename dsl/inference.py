"""The inference net: a trained job's net as a plain `torch.nn.Module` that scores samples.

Every checkpoint a trainer writes carries its model card (dsl/model_card.py: the job's execution
spec and the facts of its data) in its metadata, so one file is
enough to rebuild the net anywhere: the Python client (`trainyard.load_model`), the exports
(`dsl/export.py`), `trainyard predict` and the service all call `load_inference_net` or
`inference_net`.

The net is the job's test phase without what reads labels (loss and metric layers) and without
the layers the scores do not depend on, in eval mode (dropout is the identity). Its input is a
batch in the data's sample shape and dtype; its output the scores that fed the first loss
layer: class scores (logits) for softmax_loss, or their softmax with `probabilities`, the
prediction for euclidean_loss.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open
from torch import nn

from dsl.errors import JobSpecError
from dsl.graph import SourceRef
from dsl.layers.base import LAYERS, StatefulLayer
from dsl.model_card import MODEL_KEY, ModelCard
from dsl.net import NeuralNet, Step, module_key

DTYPES = {"float32": torch.float32, "int64": torch.int64}


class InferenceError(ValueError):
    """A model cannot be built, loaded or run as asked; `str()` says why and what to do."""


@dataclass
class LoadedCheckpoint:
    step: int
    card: ModelCard
    params: dict[str, torch.Tensor]  # by `<layer>/<param>`
    buffers: dict[str, torch.Tensor]


def read_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """A checkpoint file's step, model card, parameters and buffers (not its updater state)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = dict(handle.metadata() or {})
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise InferenceError(f"cannot read checkpoint {path}: {exc}") from None
    if MODEL_KEY not in meta:
        raise InferenceError(
            f"checkpoint {path} has no model card (it was written before checkpoints described "
            "their model, or by another program); train the job again to get one"
        )
    card = _read_card(meta[MODEL_KEY], Path(path))
    groups: dict[str, dict[str, torch.Tensor]] = {"param": {}, "buffer": {}}
    for key, tensor in tensors.items():
        prefix, _, name = key.partition("/")
        if prefix in groups:
            groups[prefix][name] = tensor
    return LoadedCheckpoint(
        step=int(meta.get("step", "0")),
        card=card,
        params=groups["param"],
        buffers=groups["buffer"],
    )


def _read_card(text: str, path: Path) -> ModelCard:
    """The checkpoint's model card; a layer type this process does not know (a plugin's it
    has not loaded) or a card that does not validate is an InferenceError."""
    try:
        return ModelCard.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:  # pydantic's and json's are ValueErrors
        try:
            unknown = sorted(set(_layer_types(json.loads(text).get("spec"))) - set(LAYERS))
        except (ValueError, AttributeError):
            unknown = []
        if unknown:
            raise InferenceError(
                f"checkpoint {path.name} is of a net with layer type(s) {', '.join(unknown)}, "
                "which this process does not know: a plugin's (docs/plugins.md); load it here "
                "too (TRAINYARD_PLUGINS, or install its package)"
            ) from None
        first = [f"it has no {exc}"] if isinstance(exc, KeyError) else str(exc).splitlines()[:3]
        raise InferenceError(
            f"the model card of checkpoint {path.name} does not describe a job: " + " ".join(first)
        ) from None


def _layer_types(spec: Any) -> Iterator[str]:
    """The layer types a raw job spec names, inside repeated blocks too."""
    items = spec.get("neuralnet", {}).get("layers", []) if isinstance(spec, dict) else []
    todo = list(items)
    while todo:
        item = todo.pop()
        if not isinstance(item, dict):
            continue
        if item.get("type") == "repeat":
            todo.extend(item.get("layers", []))
        elif isinstance(item.get("type"), str):
            yield item["type"]


class InferenceNet(nn.Module):
    """A job's net for prediction: `forward(x)` takes a batch (B, *sample_shape) and returns the
    scores that fed its loss layer (B, *score_shape), or their softmax with `probabilities`."""

    def __init__(
        self, net: NeuralNet, card: ModelCard, *, step: int = 0, probabilities: bool = False
    ) -> None:
        super().__init__()
        steps = net.steps("test")
        loss = next((s for s in steps if s.module.is_loss), None)
        if loss is None:
            raise InferenceError(
                f"job '{card.spec.name}' has no loss layer in its test phase, so no scores to "
                "predict (a net trained by cd, or a loss left out of testing)"
            )
        output = loss.sources[0]
        if probabilities and type(loss.module).__name__ != "SoftmaxLoss":
            raise InferenceError(
                f"probabilities are the softmax of class scores, and job '{card.spec.name}' "
                f"ends in a {_layer_type(net, loss.name)} layer, not softmax_loss"
            )
        needed = _needed(steps, output.layer)
        # (name, sources, is_input) of each layer the scores depend on, in order
        self.plan = [(s.name, s.sources, s.is_input) for s in steps if s.name in needed]
        # keyed as the training net keys them: a copy `block.0.ln` of a block is `block/0/ln`
        self.layers = nn.ModuleDict(
            {module_key(s.name): s.module for s in steps if s.name in needed and not s.is_input}
        )
        self.types = {c.config.name: c.config.type for c in net.compiled if c.config.name in needed}
        self.output = output
        self.card, self.step, self.probabilities = card, step, probabilities
        self.input_shape = tuple(card.data.sample_shape)
        self.input_dtype = DTYPES[card.data.x_dtype]
        self.score_shape = _score_shape(net, output)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = _pick(self._run(x), self.output)  # (B, *score_shape)
        return torch.softmax(scores, dim=-1) if self.probabilities else scores

    def _run(
        self, x: torch.Tensor, taken: dict[str, tuple[torch.Tensor, ...]] | None = None
    ) -> dict[str, torch.Tensor | tuple[torch.Tensor, ...]]:
        """Every layer's output; what each layer took in `taken`, where given."""
        outputs: dict[str, torch.Tensor | tuple[torch.Tensor, ...]] = {}
        for name, sources, is_input in self.plan:
            if is_input:
                outputs[name] = x
                continue
            module = self.layers[module_key(name)]
            if isinstance(module, StatefulLayer):
                module.reset_state()  # each batch on its own
            inputs = tuple(_pick(outputs, ref) for ref in sources)
            if taken is not None:
                taken[name] = inputs
            outputs[name] = module(*inputs)
        return outputs

    def named_layers(self) -> list[tuple[str, nn.Module]]:
        """The layers the scores depend on by their job-language names, in order."""
        return [
            (name, self.layers[module_key(name)]) for name, _, is_input in self.plan if not is_input
        ]

    def layer_type(self, name: str) -> str:
        """The job-language type of layer `name`."""
        return self.types[name]

    def layer_inputs(self, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
        """What each layer takes when the net scores `x`, by layer name (for telling which
        layer an export cannot carry)."""
        taken: dict[str, tuple[torch.Tensor, ...]] = {}
        with torch.no_grad():
            self._run(x, taken)
        return taken

    def check_input(self, x: torch.Tensor) -> torch.Tensor:
        """`x` as the net takes it: its samples reshaped to the sample shape where they hold
        as many values (a flat row of a CSV), in the input's dtype; else InferenceError."""
        if x.dim() == 0:
            raise InferenceError("the input is a single number, not a batch of samples")
        want = self.input_shape
        if tuple(x.shape[1:]) != want:
            if x[0].numel() != _numel(want):
                raise InferenceError(
                    f"the model takes samples of shape {list(want)} ({_numel(want)} values), "
                    f"and the input's samples have shape {list(x.shape[1:])}"
                )
            x = x.reshape(x.shape[0], *want)
        fractions = x.is_floating_point() and not torch.equal(x, x.round())
        if self.input_dtype == torch.int64 and fractions:
            raise InferenceError(
                "the model takes token ids (integers), and the input has fractions"
            )
        x = x.to(self.input_dtype)
        classes = self.card.data.num_classes
        if self.input_dtype == torch.int64 and classes is not None and x.numel():
            low, high = int(x.min()), int(x.max())
            if low < 0 or high >= classes:
                raise InferenceError(
                    f"the model takes token ids in [0, {classes}), and the input has "
                    f"{low if low < 0 else high}"
                )
        return x

    def metadata(self) -> dict[str, Any]:
        """What an export records beside the net: its input, output, vocabulary and the
        categories behind an uploaded table's indices."""
        spec = self.card.spec
        return {
            "job": spec.name,
            "step": self.step,
            "input": {
                "name": "x",
                "shape": ["batch", *self.input_shape],
                "dtype": self.card.data.x_dtype,
            },
            "output": {
                "name": "probabilities" if self.probabilities else "scores",
                "shape": ["batch", *self.score_shape],
                "dtype": "float32",
            },
            "num_classes": self.card.data.num_classes,
            "vocabulary": self.card.data.vocabulary,
            "categories": self.card.data.categories,
        }


def inference_net(loaded: LoadedCheckpoint, *, probabilities: bool = False) -> InferenceNet:
    """The inference net of a read checkpoint: built from its card, its parameters and buffers
    loaded (every one the net has; a missing or misshapen one is an InferenceError)."""
    from dsl.compiler import compile_job

    card = loaded.card
    try:
        compiled = compile_job(card.spec, card.data.build_context())
    except JobSpecError as exc:
        raise InferenceError(f"job '{card.spec.name}'s net does not build here: {exc}") from None
    model = InferenceNet(compiled.net, card, step=loaded.step, probabilities=probabilities)
    problems = []
    with torch.no_grad():
        for name, module in model.named_layers():
            for kind, found, tensors in (
                ("parameter", loaded.params, module.named_parameters()),
                ("buffer", loaded.buffers, module.named_buffers()),
            ):
                for local, tensor in tensors:
                    saved = found.get(f"{name}/{local}")
                    if saved is None:
                        if kind == "parameter":
                            problems.append(f"{kind} {name}/{local} is missing")
                    elif saved.shape != tensor.shape:
                        problems.append(
                            f"{kind} {name}/{local} has shape {list(saved.shape)}, "
                            f"the net {list(tensor.shape)}"
                        )
                    else:
                        tensor.copy_(saved.to(tensor.dtype))
    if problems:
        raise InferenceError(
            f"the checkpoint does not fit job '{card.spec.name}'s net: " + "; ".join(problems)
        )
    return model


def load_inference_net(path: str | Path, *, probabilities: bool = False) -> InferenceNet:
    """The inference net of a checkpoint file."""
    return inference_net(read_checkpoint(path), probabilities=probabilities)


def _needed(steps: list[Step], output: str) -> set[str]:
    """The layers `output` depends on, itself included."""
    by_name = {s.name: s for s in steps}
    needed, todo = set(), [output]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(ref.layer for ref in by_name[name].sources)
    return needed


def _score_shape(net: NeuralNet, ref: SourceRef) -> tuple[int, ...]:
    shape = next(c.out_shape for c in net.compiled if c.config.name == ref.layer)
    return tuple(shape[ref.output or 0] if isinstance(shape, list) else shape)


def _layer_type(net: NeuralNet, name: str) -> str:
    return next(c.config.type for c in net.compiled if c.config.name == name)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _pick(
    outputs: dict[str, torch.Tensor | tuple[torch.Tensor, ...]], ref: SourceRef
) -> torch.Tensor:
    value = outputs[ref.layer]
    if isinstance(value, tuple):
        return value[ref.output or 0]
    return value
