"""A job's page lists its batch prediction runs in a real browser against a real `trainyard
up`: a 2-worker run's state and progress, and its scores downloaded from the page."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Page

from tests.web.conftest import Stack, job_yaml, shoot, submit, wait_for_state

pytestmark = pytest.mark.e2e


def test_a_jobs_prediction_runs_on_its_page(signed_in: Page, stack: Stack, tmp_path: Path) -> None:
    text = job_yaml("digits_mlp", name="e2e-predict", train_steps=20, checkpoint={"freq": 20})
    job_id = submit(stack, text)
    assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    x = np.random.default_rng(1).uniform(0, 16, size=(3000, 64)).astype(np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, x=x)
    uploaded = stack.api.post(
        "/datasets",
        files={"file": ("e2e-rows.npz", buffer.getvalue())},
        data={"name": "e2e-rows"},
    )
    assert uploaded.status_code == 201, uploaded.text
    body = {"dataset": "e2e-rows", "workers": 2}
    started = stack.api.post(f"/jobs/{job_id}/predictions", json=body)
    assert started.status_code == 201, started.text
    run = started.json()["id"]

    page = signed_in
    page.goto(f"{stack.url}/#/jobs/{job_id}/predictions")
    row = page.locator(f"tr[data-prediction='{run}'][data-state='SUCCEEDED']")
    row.wait_for(timeout=90_000)  # the tab reads the runs again while one is going
    assert "e2e-rows" in row.inner_text() and "100%" in row.inner_text()
    shoot(page, "job-predictions")
    with page.expect_download() as download:
        row.locator("button", has_text="Download").click()
    saved = tmp_path / "scores.npy"
    download.value.save_as(saved)
    scores = np.load(saved)
    assert scores.shape == (len(x), 10)


def test_a_models_prediction_run_on_the_models_and_the_jobs_pages_and_its_own(
    signed_in: Page, stack: Stack
) -> None:
    """A run started from a registered model is listed on the model's runs and its source
    job's; its own page shows rows scored of rows and no training tabs."""
    text = job_yaml("digits_mlp", name="e2e-model-source", train_steps=20, checkpoint={"freq": 20})
    job_id = submit(stack, text)
    assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    registered = stack.api.post("/models", json={"name": "e2e-scorer", "job_id": job_id})
    assert registered.status_code == 201, registered.text
    ref = registered.json()["ref"]
    x = np.random.default_rng(2).uniform(0, 16, size=(1200, 64)).astype(np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, x=x)
    uploaded = stack.api.post(
        "/datasets", files={"file": ("e2e-few.npz", buffer.getvalue())}, data={"name": "e2e-few"}
    )
    assert uploaded.status_code == 201, uploaded.text
    version = ref.split("@")[1]
    started = stack.api.post(
        f"/models/e2e-scorer/{version}/predictions", json={"dataset": "e2e-few", "workers": 1}
    )
    assert started.status_code == 201, started.text
    run = started.json()
    assert (run["model"], run["job_id"]) == (ref, job_id)
    listed_runs = stack.api.get(f"/models/e2e-scorer/{version}/predictions").json()
    assert [r["id"] for r in listed_runs] == [run["id"]]
    assert stack.api.get(f"/jobs/{run['run_job_id']}/prediction").json()["id"] == run["id"]
    not_a_run = stack.api.get(f"/jobs/{job_id}/prediction")
    assert not_a_run.status_code == 404 and "not a prediction run" in not_a_run.text

    page = signed_in
    page.goto(f"{stack.url}/#/jobs/{job_id}/predictions")
    row = page.locator(f"#predictions tr[data-prediction='{run['id']}'][data-state='SUCCEEDED']")
    row.wait_for(timeout=90_000)
    assert ref in row.inner_text() and "e2e-few" in row.inner_text()

    page.goto(f"{stack.url}/#/models")
    page.locator(f"tr[data-model='{ref}'] button.runs-button").click()
    listed = page.locator(f"#model-predictions tr[data-prediction='{run['id']}']")
    listed.wait_for()
    assert "SUCCEEDED" in listed.inner_text().upper() and "e2e-few" in listed.inner_text()
    shoot(page, "model-predictions")

    listed.locator("a.run-link").click()
    page.wait_for_url(f"**/#/jobs/{run['run_job_id']}")
    scored = page.locator("#rows-scored")
    scored.wait_for()
    assert "1,200 / 1,200 rows" in scored.inner_text()
    tabs = page.get_by_role("tab")
    page.locator("button[data-tab='logs']:visible").wait_for()
    visible = [tab.inner_text().lower() for tab in tabs.all() if tab.is_visible()]
    assert visible == ["events", "logs", "environment"], visible
    assert page.locator("#run-source").inner_text() == f"#{job_id}"
    shoot(page, "prediction-run")
