"""POST /jobs/validate and POST /jobs with a pipelined job: the planner's cut in the response
and in the stored execution spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scheduler.store.models import Job
from trainyard.models import ValidationOut as SdkValidation

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()


def test_validate_and_submit_a_pipelined_job(api: Any) -> None:
    document = MLP + "pipeline: {stages: 3, microbatches: 8}\n"
    url = "/api/v1/jobs/validate"
    response = api.client.post(url, content=document, headers=api.yaml_headers())
    assert response.status_code == 200, response.text
    body = response.json()
    plan = body["pipeline"]
    # Estimated from the shapes on the meta device, as `trainyard validate` estimates them.
    assert [stage["layers"] for stage in plan["stages"]] == [
        ["data", "fc1", "tanh1"],
        ["fc2"],
        ["tanh2", "fc3", "loss"],
    ]
    assert [stage["params"] for stage in plan["stages"]] == [16_640, 32_896, 1_290]
    assert [stage["inputs"] for stage in plan["stages"]] == [[], ["tanh1"], ["fc2"]]
    assert all(stage["time_ms"] > 0 and stage["activation_mb"] > 0 for stage in plan["stages"])
    assert (plan["microbatches"], plan["schedule"], plan["costs"]) == (8, "1f1b", "estimated")
    assert plan["bubble"] == pytest.approx(2 / 10)
    assert plan["ideal_speedup"] == pytest.approx(3 * 8 / 10)
    assert plan["expected_speedup"] == pytest.approx(plan["ideal_speedup"] * plan["balance"])
    assert body["topology"]["stages"] == 3 and body["topology"]["nworkers_per_group"] == 3
    assert SdkValidation.model_validate(body).pipeline is not None  # the SDK reads it

    # Workers run the planned cut, written out; the document stays as it was written.
    job = api.submit(document)
    with api.db.session() as session:
        stored = session.get(Job, job["id"])
        assert stored.spec["pipeline"] == {
            "stages": [["data", "fc1", "tanh1"], ["fc2"], ["tanh2", "fc3", "loss"]],
            "microbatches": 8,
        }
        assert stored.spec_yaml == document

    bad = api.client.post(
        url,
        content=document.replace("microbatches: 8", "microbatches: 5"),
        headers=api.yaml_headers(),
    )
    assert bad.status_code == 422
    (issue,) = bad.json()["errors"]
    assert issue["path"] == "pipeline.microbatches"
    assert (issue["line"], issue["column"]) == (document.count("\n"), 23)
    assert issue["message"] == "data.batch_size 64 does not split into 5 equal micro-batches"
    assert api.counts()[0] == 1
