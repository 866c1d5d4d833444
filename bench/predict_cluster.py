"""Batch prediction on the cluster: a run on 2 workers against the same run on 1 worker, on one
`trainyard up` with a node of 2 slots, in one process, alternately `--repeats` times.

A model of `--example` (default examples/mnist1d_cnn.yaml: a CNN, enough work per sample that
scoring, not start-up, is most of a run) is trained on the stack for a few steps (the weights do
not change the cost). A dataset of `--samples` random samples of its sample shape is uploaded
once. Each run is timed from its POST /jobs/{id}/predictions to its state SUCCEEDED as
GET /predictions/{pid} reports it (polled every 50 ms): placement, the workers' start through
the node's fork server, the model's build, reading and scoring the shards, writing them and
assembling the one output .npy. Start-up is measured as a 1-worker run of `--small` samples,
and reported as a share of the 1-worker run. The figure is the median of the repeats; the
target is 2 workers >= 1.6x one.

    .venv/bin/python bench/predict_cluster.py [--samples 400000] [--repeats 3]
        [--example mnist1d_cnn] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from bench.load import start_stack  # noqa: E402
from dsl.model_card import read_model_card  # noqa: E402

TRAIN = {"train_steps": 20, "test.freq": 0, "checkpoint.freq": 20}


def start(data_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """`trainyard up` with one node of 2 slots, taking datasets up to 1 GiB."""
    return start_stack(data_dir, 2, log, TRAINYARD_MAX_DATASET_BYTES=str(1 << 30))


def wait_job(api: httpx.Client, job_id: int) -> dict[str, object]:
    while True:
        info = api.get(f"/jobs/{job_id}").json()
        if info["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return dict(info)
        time.sleep(0.2)


def timed_run(api: httpx.Client, job_id: int, dataset: str, workers: int) -> float:
    started = time.perf_counter()
    answer = api.post(f"/jobs/{job_id}/predictions", json={"dataset": dataset, "workers": workers})
    answer.raise_for_status()
    run = answer.json()["id"]
    while True:
        info = api.get(f"/predictions/{run}").json()
        if info["state"] == "SUCCEEDED":
            return time.perf_counter() - started
        if info["state"] in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"prediction run {run} {info['state']}: {info['error']}")
        time.sleep(0.05)


def upload(api: httpx.Client, name: str, x: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=x)
    answer = api.post(
        "/datasets", files={"file": (f"{name}.npz", buffer.getvalue())}, data={"name": name}
    )
    answer.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", default="mnist1d_cnn")
    parser.add_argument("--samples", type=int, default=400_000)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = smoke.parse(parser, samples=2000, small=100, repeats=1)
    with tempfile.TemporaryDirectory() as folder:
        data_dir = Path(folder) / "data"
        data_dir.mkdir()
        process, url, token = start(data_dir, Path(folder) / "up.log")
        try:
            api = httpx.Client(
                base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=600
            )
            text = (ROOT / "examples" / f"{args.example}.yaml").read_text()
            submitted = api.post("/jobs", json={"spec": text, "overrides": TRAIN})
            submitted.raise_for_status()
            job = wait_job(api, int(submitted.json()["id"]))
            assert job["state"] == "SUCCEEDED", job
            job_id = int(str(job["id"]))
            shape = sample_shape(api, job_id)
            rng = np.random.default_rng(0)
            upload(api, "big", rng.standard_normal((args.samples, *shape)).astype(np.float32))
            upload(api, "small", rng.standard_normal((args.small, *shape)).astype(np.float32))
            timed_run(api, job_id, "small", 1)  # warm: the fork server's first fork, caches
            one, two, small = [], [], []
            for _ in range(args.repeats):
                small.append(timed_run(api, job_id, "small", 1))
                one.append(timed_run(api, job_id, "big", 1))
                two.append(timed_run(api, job_id, "big", 2))
        finally:
            process.terminate()
            process.wait(timeout=60)
    result = {
        "example": args.example,
        "samples": args.samples,
        "one_worker_s": statistics.median(one),
        "two_workers_s": statistics.median(two),
        "speedup": statistics.median(one) / statistics.median(two),
        "startup_s": statistics.median(small),
        "startup_share_of_one_worker": statistics.median(small) / statistics.median(one),
        "load_average": os.getloadavg(),
        "runs": {"one": one, "two": two, "small": small},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def sample_shape(api: httpx.Client, job_id: int) -> tuple[int, ...]:
    """The model's sample shape, from the job's checkpoint (downloaded)."""
    checkpoint = api.get(f"/jobs/{job_id}/checkpoints").json()[-1]
    data = api.get(f"/jobs/{job_id}/checkpoints/{checkpoint['step']}").content
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as handle:
        handle.write(data)
        handle.flush()
        card = read_model_card(handle.name)
    assert card is not None
    return tuple(card.data.sample_shape)


if __name__ == "__main__":
    main()
