"""A client generated from the live OpenAPI document, as a user of another language would make
one: openapi-python-client, without a warning, clean operation and body names, then submit
(the YAML as bytes, and the JSON form) -> wait -> metrics against the session's real stack."""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = (ROOT / "examples" / "digits_mlp.yaml").read_text()
PACKAGE = "trainyard_generated"
OPERATION_ID = re.compile(r"^[a-z]+(-[a-z]+)*$")


@pytest.fixture(scope="module")
def document(stack: RunningStack) -> dict[str, Any]:
    response = httpx.get(f"{stack.url}/api/v1/openapi.json", timeout=30)
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


@pytest.fixture(scope="module")
def generated(
    document: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ModuleType]:
    where = tmp_path_factory.mktemp("generated")
    spec = where / "openapi.json"
    spec.write_text(json.dumps(document))
    # Its post-hook formats the code with ruff: this environment's.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec)),
            *("--meta", "none", "--output-path", str(where / PACKAGE)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Warning" not in output and "Unsupported" not in output, output
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(where))
        for name in [n for n in sys.modules if n.split(".")[0] == PACKAGE]:
            del sys.modules[name]


def test_operations_and_bodies_have_clean_names(document: dict[str, Any]) -> None:
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), sorted(ids)
    assert all(OPERATION_ID.match(i) for i in ids), [i for i in ids if not OPERATION_ID.match(i)]
    assert {"jobs-submit", "jobs-list", "jobs-get", "jobs-metrics", "tokens-create"} <= set(ids)
    schemas = document["components"]["schemas"]
    assert not [name for name in schemas if name.startswith("Body_") or "ApiV1" in name]
    body = document["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/SubmitRequest"}
    assert "SubmitRequest" in schemas


def _wait(generated: ModuleType, client: Any, job_id: int) -> Any:
    jobs_get = importlib.import_module(f"{PACKAGE}.api.jobs.jobs_get")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = jobs_get.sync(job_id, client=client)
        if job.state.value in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end")


def test_a_generated_client_submits_waits_and_reads_metrics(
    stack: RunningStack, generated: ModuleType
) -> None:
    submit = importlib.import_module(f"{PACKAGE}.api.jobs.jobs_submit")
    metrics = importlib.import_module(f"{PACKAGE}.api.jobs.jobs_metrics")
    models = importlib.import_module(f"{PACKAGE}.models")
    types = importlib.import_module(f"{PACKAGE}.types")
    client = generated.AuthenticatedClient(base_url=stack.url, token=stack.token)
    short = DIGITS.replace("train_steps: 2000", "train_steps: 40").replace(
        "disp_freq: 100", "disp_freq: 10"
    )
    as_bytes = submit.sync(client=client, body=types.File(payload=io.BytesIO(short.encode())))
    assert isinstance(as_bytes, models.JobDetail), as_bytes
    as_json = submit.sync(
        client=client,
        body=models.SubmitRequest(
            spec=DIGITS,
            overrides=models.SubmitRequestOverrides.from_dict(
                {"train_steps": 30, "disp_freq": 10, "name": "generated-json"}
            ),
        ),
    )
    assert isinstance(as_json, models.JobDetail) and as_json.name == "generated-json"
    for job, steps in ((as_bytes, [10, 20, 30, 40]), (as_json, [10, 20, 30])):
        assert _wait(generated, client, job.id).state.value == "SUCCEEDED"
        series = metrics.sync(job.id, client=client, name=["train/loss"])
        assert isinstance(series, models.MetricsOut)
        [loss] = series.series
        assert [point[0] for point in loss.points] == steps
    wrong = metrics.sync_detailed(as_bytes.id, client=client, name=["train/los"])
    assert wrong.status_code == 404
    assert "did you mean 'train/loss'?" in wrong.parsed.detail
