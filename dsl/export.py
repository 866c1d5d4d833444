"""Exports of an inference net (dsl/inference.py) that run without Trainyard.

- `onnx`: through `torch.onnx.export`, the batch axis dynamic; the model's metadata (input name,
  shape and dtype, output, vocabulary for text jobs) in the ONNX file's `metadata_props`, under
  `trainyard`. Needs the `onnx` and `onnxscript` packages (`pip install 'trainyard[export]'`).
- `torch-export`: a `.pt2` program (`torch.export.save`), loadable with `torch.export.load` by a
  process that has torch alone; the metadata among its extra files (`trainyard.json`).

Both write the metadata in a JSON file beside the export too (`<file>.json`).

`python -m dsl.export CHECKPOINT FORMAT OUT [--probabilities]` runs one export in a process of
its own: the service runs it so, bounded in time (api/exports.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from dsl.inference import InferenceError, InferenceNet, load_inference_net

Format = Literal["onnx", "torch-export"]
FORMATS: tuple[Format, ...] = ("onnx", "torch-export")
SUFFIXES: dict[Format, str] = {"onnx": ".onnx", "torch-export": ".pt2"}
METADATA_KEY = "trainyard"  # the ONNX metadata_props entry that holds the model's metadata
EXAMPLE_BATCH = 2  # the example input's batch (any size above 1: 1 would be specialised)


def metadata_path(pt2: Path) -> Path:
    """Where the metadata of a `.pt2` export is written: beside it, `<file>.json`."""
    return pt2.with_name(pt2.name + ".json")


def export_model(model: InferenceNet, fmt: str, out: Path) -> Path:
    """Write `model` to `out` in format `fmt` (and its metadata); return the file written."""
    if fmt not in FORMATS:
        raise InferenceError(f"export format {fmt!r}: say one of {', '.join(FORMATS)}")
    model.eval()
    example = _example(model)
    batch = torch.export.Dim("batch", min=1)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = model.metadata()
    text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
    if fmt == "torch-export":
        try:
            program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
        except Exception as exc:  # torch's exporter raises many kinds; a located refusal
            raise InferenceError(_refusal(model, fmt, exc, example)) from None
        torch.export.save(program, str(out), extra_files={f"{METADATA_KEY}.json": text})
        metadata_path(out).write_text(text)
        return out
    _need_onnx()
    try:
        onnx_program = _onnx_program(
            model,
            (example,),
            input_names=["x"],
            output_names=[meta["output"]["name"]],
            dynamic_shapes=({0: batch},),
        )
    except Exception as exc:  # torch's exporter raises many kinds; a located refusal
        raise InferenceError(_refusal(model, fmt, exc, example)) from None
    proto = onnx_program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(meta, sort_keys=True)
    import onnx

    onnx.save(proto, str(out))
    metadata_path(out).write_text(text)
    return out


def _onnx_program(module: nn.Module, args: tuple[Any, ...], **options: Any) -> Any:
    with warnings.catch_warnings():
        # torch's exporter, at 2.13, asks pytree a question pytree has deprecated
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.onnx.export(module, args, dynamo=True, verbose=False, **options)
    assert program is not None
    return program


class _Alone(nn.Module):
    """One layer as a module of its own, to be exported alone."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.layer(*inputs)


def _refusal(model: InferenceNet, fmt: str, exc: Exception, example: torch.Tensor) -> str:
    """Why `model` cannot be exported as `fmt`: the first layer that cannot be exported alone,
    by name and type, with the operation the format lacks where torch names one."""
    reason = _reason(exc)
    inputs = model.layer_inputs(example)
    for name, layer in model.named_layers():
        alone = _Alone(layer).eval()
        try:
            if fmt == "onnx":
                _onnx_program(alone, inputs[name])
            else:
                torch.export.export(alone, inputs[name])
        except Exception as failed:
            return (
                f"the {fmt} export cannot carry layer '{name}' (type "
                f"{model.layer_type(name)}): {_reason(failed)}"
            )
    return f"the {fmt} export of job '{model.card.spec.name}' failed: {reason}"


def _reason(exc: Exception) -> str:
    """The operation torch says the format has no function for, else the error's first line."""
    text = str(exc)
    found = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", text)
    if found:
        return f"ONNX has no function for torch's {found.group(1)}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


def _example(model: InferenceNet) -> torch.Tensor:
    shape = (EXAMPLE_BATCH, *model.input_shape)
    if model.input_dtype == torch.int64:
        classes = model.card.data.num_classes or 2
        return torch.randint(0, classes, shape, generator=torch.Generator().manual_seed(0))
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _need_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise InferenceError(
            f"the onnx export needs the onnx and onnxscript packages ({exc.name} is missing): "
            "pip install 'trainyard[export]'"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsl.export", description=__doc__)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("format", choices=FORMATS)
    parser.add_argument("out", type=Path)
    parser.add_argument("--probabilities", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        model = load_inference_net(args.checkpoint, probabilities=args.probabilities)
        export_model(model, args.format, args.out)
    except InferenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
