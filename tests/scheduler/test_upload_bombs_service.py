"""Small files that unpack to hundreds of megabytes, uploaded to a real `trainyard up` and named
by a job, cost its API process no memory: the upload is taken in by a process of its own
(scheduler/store/intake.py), and the job is checked against the inventory stored then.

The API's peak resident memory (VmHWM of the real uvicorn process, reset before each file
through /proc/<pid>/clear_refs) must grow by less than 100 MB over the upload, the check
(POST /jobs/validate) and the submission:
- an .npz of 0.5 MB holding 512 MB of float32 zeros (loading it to describe it took 1.5 GB);
- a numeric .csv of 74 kB, one cell of 65,536 digits (uploads take no compressed .csv, so its
  honest equivalent is the table that a whole-table read widens: every cell of the array of
  strings it became was as wide as the longest, 1 GB);
- a Parquet table of 0.6 MB that converts to 512 MB of shards (the conversion ran in the API).
Jobs wait in the queue (quota running_jobs 0): what is measured is the service, not training.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.conftest import RunningStack
from tests.helpers.data_bombs import MB, npz_bomb, parquet_bomb, widening_csv
from trainyard import Client, Job

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def waiting_stack(stack_factory: Callable[..., RunningStack]) -> RunningStack:
    """A stack of its own whose jobs wait queued (no user may run one)."""
    return stack_factory(env={"TRAINYARD_QUOTA_RUNNING_JOBS": "0"})


def api_pid(stack: RunningStack) -> int:
    """The API server's process: the child of `trainyard up` running `scheduler api`."""
    children = psutil.Process(stack.process.pid).children()
    (api,) = [child for child in children if child.cmdline()[2:4] == ["scheduler", "api"]]
    return api.pid


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/{pid}/status has no {key}")


def job(name: str, dataset: str, classes: int = 2) -> dict[str, object]:
    return {
        "name": name,
        "data": {"source": "dataset", "name": dataset, "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "out", "type": "dense", "srclayers": ["data"], "units": classes},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["out"]},
            ]
        },
        "updater": {"type": "sgd", "lr": {"base": 0.1}},
        "train_steps": 10,
    }


BOMBS: dict[str, tuple[Callable[[Path], Path], str, str, int]] = {
    # name: (writer, file name, kind stored, features)
    "npz": (npz_bomb, "zeros.npz", "npz", 1024),
    "csv": (widening_csv, "wide.csv", "csv", 1),
    "parquet": (parquet_bomb, "zeros.parquet", "shards", 512),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_small_file_that_unpacks_large_costs_the_api_no_memory(
    bomb: str, waiting_stack: RunningStack, tmp_path: Path
) -> None:
    write, filename, kind, features = BOMBS[bomb]
    path = write(tmp_path / filename)
    assert path.stat().st_size < MB
    client = Client(waiting_stack.url, waiting_stack.token)
    pid = api_pid(waiting_stack)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM back to what it holds now
    before = status_kb(pid, "VmHWM")

    dataset = client.upload_dataset(path, f"{bomb}-bomb")
    assert dataset.kind == kind
    document = job(f"on-{bomb}", f"{bomb}-bomb")
    checked = client.validate(document)
    assert checked["layers"][0]["out_shape"] == [features]
    submitted = client.submit(document)
    assert isinstance(submitted, Job) and submitted.state == "QUEUED"

    grown_mb = (status_kb(pid, "VmHWM") - before) / 1024
    assert grown_mb < 100, f"the API's peak memory grew by {grown_mb:.0f} MB"
