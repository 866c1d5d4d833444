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
