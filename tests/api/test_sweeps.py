"""The /sweeps endpoints in-process, against real SQL (both backends), the session's Redis and
real Optuna storage; the scheduler's sweep passes are run by hand (SweepRunner.run_once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from scheduler.daemon.sweep_thread import SweepRunner
from scheduler.store.lifecycle import transition
from scheduler.store.models import Job, Sweep
from scheduler.store.states import JobState
from scheduler.sweeps.study import close_storages

ROOT = Path(__file__).resolve().parents[2]
BASE = (ROOT / "examples" / "digits_mlp.yaml").read_text()
SEARCH = """
search:
  metric: test/accuracy
  mode: max
  algorithm: random
  max_trials: 3
  max_parallel: 2
  space:
    updater.lr.base: {loguniform: [0.01, 0.3]}
    neuralnet.layers.fc1.units: {choice: [16, 32]}
"""
SWEEP = BASE + SEARCH


def submit(api: Any, document: str = SWEEP, user: str = "alice") -> dict[str, Any]:
    response = api.client.post("/api/v1/sweeps", content=document, headers=api.yaml_headers(user))
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def run_pass(api: Any) -> None:
    SweepRunner(api.db, api.settings, api.redis, api.keys).run_once()
    close_storages()


def end_trial(api: Any, job_id: int, state: JobState, **summary: float) -> None:
    with api.db.session() as session:
        job = session.get_one(Job, job_id)
        job.summary = summary
        for step in (JobState.SCHEDULED, JobState.RUNNING, state):
            transition(session, job, step, "test")


def line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def test_submit_a_sweep_and_follow_it_to_its_best_trial(api: Any) -> None:
    sweep = submit(api)
    assert (sweep["state"], sweep["name"], sweep["owner"]) == ("RUNNING", "digits-mlp", "alice")
    assert (sweep["algorithm"], sweep["trial_count"], sweep["max_parallel"]) == ("random", 3, 2)
    assert sweep["objectives"] == [{"metric": "test/accuracy", "mode": "max"}]
    assert sweep["trials"] == [] and sweep["best"] is None and sweep["spec_yaml"] == SWEEP
    run_pass(api)
    url = f"/api/v1/sweeps/{sweep['id']}"
    detail = api.client.get(url, headers=api.auth()).json()
    assert [t["number"] for t in detail["trials"]] == [0, 1]
    first = detail["trials"][0]
    assert first["state"] == "QUEUED" and set(first["params"]) == {
        "updater.lr.base",
        "neuralnet.layers.fc1.units",
    }
    # Each trial is a job in the job list, with its sweep.
    listed = api.client.get("/api/v1/jobs", headers=api.auth()).json()["items"]
    assert sorted((j["sweep_id"], j["trial_number"]) for j in listed) == [
        (sweep["id"], 0),
        (sweep["id"], 1),
    ]
    job = api.client.get(f"/api/v1/jobs/{first['job_id']}", headers=api.auth()).json()
    assert job["overrides"] == first["params"] and job["pruned_step"] is None
    end_trial(api, first["job_id"], JobState.SUCCEEDED, **{"test/accuracy": 0.75})
    end_trial(api, detail["trials"][1]["job_id"], JobState.PRUNED, **{"test/accuracy": 0.2})
    run_pass(api)
    detail = api.client.get(url, headers=api.auth()).json()
    assert detail["best"]["number"] == 0 and detail["best"]["value"] == 0.75
    assert detail["best_job"]["id"] == first["job_id"] and detail["best_job"]["spec_yaml"]
    assert detail["trials"][1]["state"] == "PRUNED" and detail["trials_created"] == 3
    end_trial(api, detail["trials"][2]["job_id"], JobState.SUCCEEDED, **{"test/accuracy": 0.5})
    run_pass(api)
    detail = api.client.get(url, headers=api.auth()).json()
    assert (detail["state"], detail["best_trial"], detail["best_value"]) == ("SUCCEEDED", 0, 0.75)
    [listed_sweep] = api.client.get("/api/v1/sweeps", headers=api.auth()).json()["items"]
    assert listed_sweep["trials_ended"] == 3 and listed_sweep["state"] == "SUCCEEDED"


def test_a_sweep_selects_on_validation_and_shows_its_best_trials_test_figure(api: Any) -> None:
    """Without a metric it selects on the base job's objective, val/accuracy; its result shows
    the best trial's test/accuracy beside it. On the test split it is warned."""
    document = BASE.replace(
        "data: {source: digits", "data: {validation_fraction: 0.1, source: digits"
    ) + SEARCH.replace("  metric: test/accuracy\n  mode: max\n", "")
    assert "validation_fraction" in document
    sweep = submit(api, document)
    assert sweep["objectives"] == [{"metric": "val/accuracy", "mode": "max"}]
    assert sweep["warnings"] == [] and sweep["best_test"] is None
    assert sweep["search"]["metric"] == "val/accuracy"  # stored as resolved
    run_pass(api)
    url = f"/api/v1/sweeps/{sweep['id']}"
    trials = api.client.get(url, headers=api.auth()).json()["trials"]
    job = api.client.get(f"/api/v1/jobs/{trials[0]['job_id']}", headers=api.auth()).json()
    assert (job["objective"], job["objective_mode"]) == ("val/accuracy", "max")
    end_trial(
        api, trials[0]["job_id"], JobState.SUCCEEDED, **{"val/accuracy": 0.9, "test/accuracy": 0.8}
    )
    end_trial(
        api, trials[1]["job_id"], JobState.SUCCEEDED, **{"val/accuracy": 0.7, "test/accuracy": 0.85}
    )
    run_pass(api)
    detail = api.client.get(url, headers=api.auth()).json()
    assert (detail["best_trial"], detail["best_value"]) == (0, 0.9)
    assert detail["best_test"] == {"metric": "test/accuracy", "value": 0.8}

    on_test = submit(api)
    warning = (
        "the sweep selects on test/accuracy: selecting on the test split biases the best "
        "trial's score; add data.validation_fraction and use val/..."
    )
    assert on_test["warnings"] == [warning]
    listed = api.client.get("/api/v1/sweeps", headers=api.auth()).json()["items"]
    assert [item["warnings"] for item in listed] == [[warning], []]


def test_an_invalid_space_is_refused_with_located_errors(api: Any) -> None:
    before = api.counts()
    document = SWEEP.replace("[16, 32]", "[16, 0]").replace("[0.01, 0.3]", "[0.3, 0.01]")
    response = api.client.post("/api/v1/sweeps", content=document, headers=api.yaml_headers())
    assert response.status_code == 422
    [issue] = response.json()["errors"]  # the bounds first; the choices once they are valid
    assert issue["path"] == "search.space.updater.lr.base"
    assert issue["line"] == line_of(document, "updater.lr.base:") and issue["column"] == 5
    document = SWEEP.replace("[16, 32]", "[16, 0]")
    response = api.client.post("/api/v1/sweeps", content=document, headers=api.yaml_headers())
    [issue] = response.json()["errors"]
    assert issue["path"] == "search.space.neuralnet.layers.fc1.units"
    assert issue["message"].startswith("choice value 0 gives an invalid job")
    response = api.client.post("/api/v1/sweeps", content=BASE, headers=api.yaml_headers())
    assert response.status_code == 422 and "no search section" in response.json()["detail"]
    assert api.counts() == before
    with api.db.session() as session:
        assert session.scalar(select(func.count()).select_from(Sweep)) == 0


def test_jobs_routes_refuse_or_check_a_sweep(api: Any) -> None:
    response = api.client.post("/api/v1/jobs", content=SWEEP, headers=api.yaml_headers())
    assert response.status_code == 422
    [issue] = response.json()["errors"]
    assert issue["path"] == "search" and "POST /api/v1/sweeps" in issue["hint"]
    ok = api.client.post("/api/v1/jobs/validate", content=SWEEP, headers=api.yaml_headers())
    assert ok.status_code == 200 and ok.json()["name"] == "digits-mlp"
    bad = SWEEP.replace("[16, 32]", "[16, 0]")
    response = api.client.post("/api/v1/jobs/validate", content=bad, headers=api.yaml_headers())
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "search.space.neuralnet.layers.fc1.units"


def test_other_users_sweeps_answer_404(api: Any) -> None:
    sweep = submit(api)
    url = f"/api/v1/sweeps/{sweep['id']}"
    assert api.client.get(url, headers=api.auth("bob")).status_code == 404
    assert api.client.post(f"{url}/cancel", headers=api.auth("bob")).status_code == 404
    assert api.client.get("/api/v1/sweeps", headers=api.auth("bob")).json()["items"] == []
    assert api.client.get(url, headers=api.auth("admin")).status_code == 200
    assert api.client.get("/api/v1/sweeps/4294967296", headers=api.auth()).status_code == 422
    assert api.client.get("/api/v1/sweeps/7", headers=api.auth()).status_code == 404
    assert api.client.get("/api/v1/sweeps?limit=0", headers=api.auth()).status_code == 422


def test_cancel_a_sweep_cancels_its_trials(api: Any) -> None:
    sweep = submit(api)
    run_pass(api)
    url = f"/api/v1/sweeps/{sweep['id']}"
    detail = api.client.post(f"{url}/cancel", headers=api.auth()).json()
    assert detail["cancel_requested"] is True
    assert [t["state"] for t in detail["trials"]] == ["CANCELLED", "CANCELLED"]
    run_pass(api)
    detail = api.client.get(url, headers=api.auth()).json()
    assert detail["state"] == "CANCELLED" and detail["trials_created"] == 2
    response = api.client.post(f"{url}/cancel", headers=api.auth())
    assert response.status_code == 409 and "already CANCELLED" in response.json()["detail"]


def test_several_objectives_give_a_pareto_front(api: Any) -> None:
    document = BASE + SEARCH.replace(
        "  metric: test/accuracy\n  mode: max\n",
        "  objectives: [{metric: test/accuracy, mode: max}, {metric: train/loss, mode: min}]\n",
    ).replace("algorithm: random", "algorithm: nsga2").replace("max_parallel: 2", "max_parallel: 3")
    sweep = submit(api, document)
    run_pass(api)
    url = f"/api/v1/sweeps/{sweep['id']}"
    trials = api.client.get(url, headers=api.auth()).json()["trials"]
    results = [(0.9, 0.5), (0.8, 0.2), (0.7, 0.6)]  # the third is beaten by the first on both
    for trial, (accuracy, loss) in zip(trials, results, strict=True):
        end_trial(
            api,
            trial["job_id"],
            JobState.SUCCEEDED,
            **{"test/accuracy": accuracy, "train/loss": loss},
        )
    run_pass(api)
    detail = api.client.get(url, headers=api.auth()).json()
    assert detail["state"] == "SUCCEEDED" and detail["best"] is None
    assert [t["number"] for t in detail["pareto_front"]] == [0, 1]
    assert detail["pareto_front"][1]["values"] == [0.8, 0.2]


def test_parameter_importance_by_optunas_evaluators(api: Any) -> None:
    sweep = submit(api)
    url = f"/api/v1/sweeps/{sweep['id']}/importance"
    response = api.client.get(url, headers=api.auth())  # no pass yet: no trial at all
    assert response.status_code == 409 and "0 finished trials" in response.json()["detail"]
    run_pass(api)
    trials = api.client.get(f"/api/v1/sweeps/{sweep['id']}", headers=api.auth()).json()["trials"]
    end_trial(api, trials[0]["job_id"], JobState.SUCCEEDED, **{"test/accuracy": 0.9})
    run_pass(api)  # the study is told at the scheduler's pass
    response = api.client.get(url, headers=api.auth())
    assert response.status_code == 409
    assert response.json()["detail"].startswith(f"sweep {sweep['id']} has 1 finished trial;")
    end_trial(api, trials[1]["job_id"], JobState.SUCCEEDED, **{"test/accuracy": 0.4})
    run_pass(api)
    third = api.client.get(f"/api/v1/sweeps/{sweep['id']}", headers=api.auth()).json()["trials"]
    end_trial(api, third[2]["job_id"], JobState.SUCCEEDED, **{"test/accuracy": 0.6})
    run_pass(api)
    body = api.client.get(url, headers=api.auth()).json()
    assert (body["metric"], body["evaluator"], body["trials"]) == ("test/accuracy", "fanova", 3)
    assert set(body["importances"]) == {"updater.lr.base", "neuralnet.layers.fc1.units"}
    assert abs(sum(body["importances"].values()) - 1.0) < 1e-6
    assert api.client.get(url, headers=api.auth()).json() == body  # seeded: the same answer
    other = api.client.get(url, params={"evaluator": "mean_decrease_impurity"}, headers=api.auth())
    assert other.status_code == 200 and other.json()["evaluator"] == "mean_decrease_impurity"
    bad = api.client.get(url, params={"metric": "train/loss"}, headers=api.auth())
    assert bad.status_code == 422 and "not train/loss" in bad.json()["detail"]
    bad = api.client.get(url, params={"evaluator": "shap"}, headers=api.auth())
    assert bad.status_code == 422
    assert api.client.get(url, headers=api.auth("bob")).status_code == 404
