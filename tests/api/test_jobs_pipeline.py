"""GET /jobs/{id}/pipeline: a pipelined job's plan, and the timelines its stages publish to the
job's stream (real records, read into SQL by the real ingester), on both SQL backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from contract.stream import JobStream, TimelineRecord
from dsl.planner import plan_pipeline
from scheduler.ingest.ingester import ingest_once
from tests.conftest import compile_with_data

ROOT = Path(__file__).resolve().parents[2]
MLP = yaml.safe_load((ROOT / "examples" / "digits_mlp.yaml").read_text())
STAGES = [["data", "fc1", "tanh1"], ["fc2", "tanh2", "fc3", "loss"]]


def pipelined(**pipeline: Any) -> str:
    return yaml.safe_dump({**MLP, "pipeline": pipeline}, sort_keys=False)


def get_pipeline(api: Any, job_id: object, user: str = "alice") -> Any:
    return api.client.get(f"/api/v1/jobs/{job_id}/pipeline", headers=api.auth(user))


def test_a_pipelined_jobs_plan_and_its_stages_latest_timelines(api: Any) -> None:
    job_id = api.submit(pipelined(stages=STAGES, microbatches=2))["id"]
    before = get_pipeline(api, job_id)
    assert before.status_code == 200, before.text
    assert before.json() == {
        "stages": STAGES,
        "microbatches": 2,
        "schedule": "1f1b",
        "virtual_stages": 1,
        "piece_stages": [0, 1],
        "rematerialize": False,
        "replicas": 1,
        "timelines": [],
    }
    # What the stages publish every disp_freq steps; stage 0's second record replaces its first.
    stream = JobStream(api.redis, api.keys, job_id)
    stream.publish(TimelineRecord(100, (("F", 0, 0.0, 0.5, 0), ("B", 0, 2.0, 3.0, 0)), rank=0))
    stream.publish(TimelineRecord(100, (("F", 0, 0.5, 1.0, 1), ("B", 0, 1.0, 2.0, 1)), rank=1))
    stream.publish(
        TimelineRecord(200, (("F", 0, 0.0, 0.25, 0), ("F", 1, 0.25, 0.5, 0), ("B", 1, 2.0, 2.5, 0)))
    )
    ingest_once(api.db, api.redis, api.keys)
    timelines = get_pipeline(api, job_id).json()["timelines"]
    assert timelines == [
        {
            "group": 0,
            "rank": 0,
            "step": 200,
            "events": [
                {"kind": "F", "microbatch": 0, "start": 0.0, "end": 0.25, "piece": 0},
                {"kind": "F", "microbatch": 1, "start": 0.25, "end": 0.5, "piece": 0},
                {"kind": "B", "microbatch": 1, "start": 2.0, "end": 2.5, "piece": 0},
            ],
        },
        {
            "group": 0,
            "rank": 1,
            "step": 100,
            "events": [
                {"kind": "F", "microbatch": 0, "start": 0.5, "end": 1.0, "piece": 1},
                {"kind": "B", "microbatch": 0, "start": 1.0, "end": 2.0, "piece": 1},
            ],
        },
    ]
    # An admin sees it too; another user, and anyone without a token, do not.
    assert get_pipeline(api, job_id, "admin").json()["timelines"] == timelines
    other = get_pipeline(api, job_id, "bob")
    assert other.status_code == 404 and other.json()["detail"] == f"no job {job_id}"
    assert api.client.get(f"/api/v1/jobs/{job_id}/pipeline").status_code == 401


def test_stages_given_by_count_are_planned_as_the_workers_plan_them(
    api: Any, cache_dir: Path
) -> None:
    document = pipelined(stages=2, microbatches=4, schedule="gpipe", rematerialize=True)
    document += "cluster: {framework: allreduce, nworker_groups: 2}\n"
    job_id = api.submit(document)["id"]
    body = get_pipeline(api, job_id).json()
    compiled, _ = compile_with_data(document, cache_dir=cache_dir)
    assert body["stages"] == plan_pipeline(compiled).layer_lists()
    assert body["stages"][0][0] == "data" and body["stages"][-1][-1] == "loss"
    assert (body["microbatches"], body["schedule"], body["rematerialize"]) == (4, "gpipe", True)
    assert body["replicas"] == 2


def test_a_job_without_a_pipeline_has_none(api: Any) -> None:
    job_id = api.submit(yaml.safe_dump(MLP))["id"]
    response = get_pipeline(api, job_id)
    assert response.status_code == 404
    assert response.json() == {"detail": f"job {job_id} has no pipeline", "errors": []}
    assert get_pipeline(api, 424242).status_code == 404
