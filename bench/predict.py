"""Prediction throughput: `trainyard predict` against a plain `torch.no_grad()` loop over the same
loaded module and batch size, and ONNX Runtime against torch (information), on CPU.

For each example (examples/digits_mlp.yaml, examples/mnist1d_cnn.yaml), a model is trained here
for a few hundred steps (the weights do not change the cost) and loaded once with
`trainyard.load_model`. Its test split, repeated to `--samples` samples, is written to an .npy
file. Then, in one process, one torch thread each, alternately `--repeats` times:

- predict: `trainyard.predicting.predict_file`, what `trainyard predict` runs after loading the
  model: the .npy read through a memory map a batch at a time, each batch checked and scored,
  the scores written through a memory map into the output .npy;
- loop: the baseline, the same module on the same samples already in memory as one tensor,
  `model(x[i:i+B])` under `torch.no_grad()`, the scores kept in a list;
- onnxruntime: the model exported with `trainyard export --format onnx`, run by an ONNX Runtime
  session (CPU, one intra-op thread) on the same in-memory batches.

The figure is samples per second, the median of the repeats; the ratio predict / loop is the
target (>= 0.9). `trainyard predict` as a command adds its start (importing torch, building the
net: about a second) once per file; `--command` times that too, for information.

    .venv/bin/python bench/predict.py [--samples 200000] [--batch-size 1024] [--repeats 5]
        [--examples digits_mlp mnist1d_cnn] [--command] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsl.compiler import compile_job  # noqa: E402
from dsl.export import export_model  # noqa: E402
from trainyard import load_model  # noqa: E402
from trainyard.loading import run_dir_checkpoint  # noqa: E402
from trainyard.predicting import predict_file  # noqa: E402
from workers.data import TrainingData  # noqa: E402
from workers.trainer import Trainer, TrainOptions  # noqa: E402

EXAMPLES = ("digits_mlp", "mnist1d_cnn")


def train(name: str, folder: Path, steps: int) -> tuple[Path, np.ndarray]:
    """A run directory of the example after `steps` steps, and its test split."""
    overrides = {"train_steps": steps, "test.freq": 0, "checkpoint.freq": 0, "disp_freq": steps}
    text = (ROOT / "examples" / f"{name}.yaml").read_text()
    data = TrainingData(cache_dir=folder / "cache")
    compiled = compile_job(text, data, overrides=overrides)
    run_dir = folder / name
    Trainer(compiled, data.dataset, TrainOptions(run_dir=run_dir)).run()
    return run_dir, data.dataset.x_test.numpy()


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def measure(name: str, folder: Path, args: argparse.Namespace) -> dict[str, object]:
    run_dir, x_test = train(name, folder, args.steps)
    reps = -(-args.samples // len(x_test))
    x = np.ascontiguousarray(np.concatenate([x_test] * reps)[: args.samples])
    source, out = folder / f"{name}-x.npy", folder / f"{name}-scores.npy"
    np.save(source, x)
    model = load_model(run_dir_checkpoint(run_dir))
    tensor = torch.from_numpy(x)
    batch = args.batch_size
    onnx_file = export_model(model, "onnx", folder / f"{name}.onnx")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        str(onnx_file), options, providers=["CPUExecutionProvider"]
    )

    def predict() -> None:
        predict_file(model, source, out, batch_size=batch)

    def loop() -> None:
        kept = []
        with torch.no_grad():
            for start in range(0, len(tensor), batch):
                kept.append(model(tensor[start : start + batch]))

    def ort() -> None:
        kept = []
        for start in range(0, len(x), batch):
            kept.append(session.run(None, {"x": x[start : start + batch]})[0])

    ways = {"predict": predict, "loop": loop, "onnxruntime": ort}
    for work in ways.values():  # warm: caches, allocator, the file in the page cache
        work()
    seconds: dict[str, list[float]] = {key: [] for key in ways}
    for _ in range(args.repeats):
        for key, work in ways.items():
            seconds[key].append(timed(work))
    with torch.no_grad():
        np.testing.assert_allclose(np.load(out), model(tensor).numpy(), atol=1e-4, rtol=0)
    rate = {key: args.samples / statistics.median(values) for key, values in seconds.items()}
    result: dict[str, object] = {
        "example": name,
        "samples": args.samples,
        "batch_size": batch,
        "samples_per_sec": {key: round(value) for key, value in rate.items()},
        "predict_vs_loop": round(rate["predict"] / rate["loop"], 3),
        "onnxruntime_vs_torch": round(rate["onnxruntime"] / rate["loop"], 3),
    }
    if args.command:
        command = [sys.executable, "-m", "scheduler", "predict", str(run_dir)]
        command += ["-i", str(source), "-o", str(out), "--batch-size", str(batch)]
        wall = timed(lambda: subprocess.run(command, check=True, capture_output=True))
        result["command_samples_per_sec"] = round(args.samples / wall)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="training steps of each model")
    parser.add_argument("--command", action="store_true", help="also time the whole command")
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    parser.add_argument("--json", type=Path)
    args = smoke.parse(parser, samples=1024, repeats=1, steps=5, examples=["digits_mlp"])
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        for name in args.examples:
            result = measure(name, Path(tmp), args)
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
