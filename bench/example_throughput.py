"""Training throughput of an example job on one device: samples a second through the trainer.

The example is compiled as `trainyard train` compiles it and trained `--steps` steps by the
Trainer on `--device` (cpu, cuda) with its own or the given `--precision` and `--compile`;
evaluations and checkpoints are off. The clock runs from the end of step `--warmup` (data and
kernels warm, compilation done) to the last step, waiting for the device at both ends. No
baseline: bench/gpu_check.sh reports the figure beside bench/overhead.py's ratios.

    .venv/bin/python bench/example_throughput.py examples/mnist1d_cnn.yaml [--device cuda]
        [--steps 300] [--warmup 20] [--precision bf16] [--compile]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
import torch
import yaml

from dsl.compiler import compile_job
from workers.data import TrainingData
from workers.trainer import Trainer, TrainOptions

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "example", type=Path, nargs="?", default=ROOT / "examples" / "mnist1d_cnn.yaml"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default=None)
    parser.add_argument("--compile", action="store_true")
    args = smoke.parse(parser, steps=12, warmup=4)
    job = yaml.safe_load(args.example.read_text())
    job |= {"train_steps": args.steps, "disp_freq": args.steps}
    job["test"] = {"freq": 0, "steps": 0}
    job["checkpoint"] = {"freq": 0, "keep": 1}
    job.pop("validate", None)
    if args.precision:
        job["precision"] = args.precision
    if args.compile:
        job["compile"] = True
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    marks: dict[str, float] = {}

    def clock(step: int) -> None:
        if step == args.warmup:
            sync()
            marks["start"] = time.perf_counter()
        elif step == args.steps:
            sync()
            marks["end"] = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        loaded = TrainingData(cache_dir=Path(tmp) / "cache", base_dir=ROOT)
        compiled = compile_job(job, loaded)
        options = TrainOptions(run_dir=Path(tmp) / "run", device=args.device, base_dir=ROOT)
        Trainer(compiled, loaded.dataset, options).run(on_step=clock)
    steps = args.steps - args.warmup
    seconds = marks["end"] - marks["start"]
    batch = int(job["data"]["batch_size"])
    print(
        json.dumps(
            {
                "example": args.example.name,
                "device": args.device,
                "precision": job.get("precision", "fp32"),
                "compile": bool(job.get("compile", False)),
                "steps_timed": steps,
                "steps_per_s": round(steps / seconds, 1),
                "samples_per_s": round(steps * batch / seconds),
            }
        )
    )


if __name__ == "__main__":
    main()
