"""A job's YAML tab in a real browser against a real `trainyard up`: a job submitted with
overrides (`--set`) shows the document it ran, each override marked on its line, the overrides
themselves and the document as submitted; "Edit a copy" carries the overrides into the editor."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from tests.web.conftest import Stack, job_yaml, shoot

pytestmark = pytest.mark.e2e

SUBMITTED = job_yaml("mnist1d_mlp", name="e2e-overridden", train_steps=1500, disp_freq=50)
OVERRIDES = {"train_steps": 400, "neuralnet.layers.fc1.units": 24}


def test_the_yaml_tab_shows_the_overrides_applied_and_edit_a_copy_keeps_them(
    signed_in: Page, stack: Stack
) -> None:
    response = stack.api.post("/jobs", json={"spec": SUBMITTED, "overrides": OVERRIDES})
    assert response.status_code == 201, response.text
    job_id = int(response.json()["id"])
    try:
        page = signed_in
        page.goto(f"{stack.url}/#/jobs/{job_id}/yaml")
        effective = page.locator(".pane-yaml #yaml-effective")
        marked = effective.locator(".cm-marked-line")
        marked.first.wait_for()
        # fc1's units near the top; CodeMirror draws only the lines in view, train_steps is
        # at the end
        assert [line.strip() for line in marked.all_inner_texts()] == [
            "units: 24--set neuralnet.layers.fc1.units=24"
        ]
        assert "name: e2e-overridden" in effective.locator(".cm-content").inner_text()
        effective.locator(".cm-scroller").evaluate("el => { el.scrollTop = el.scrollHeight; }")
        marked.filter(has_text="train_steps").wait_for()
        assert [line.strip() for line in marked.all_inner_texts()][-1] == (
            "train_steps: 400--set train_steps=400"
        )
        assert "train_steps: 1500" not in effective.locator(".cm-content").inner_text()
        notice = page.locator("#yaml-overrides").inner_text()
        assert "--set train_steps=400" in notice and "--set neuralnet.layers.fc1.units=24" in notice
        page.locator("#yaml-submitted summary").click()
        assert "train_steps: 1500" in page.locator("#yaml-submitted pre").inner_text()
        shoot(page, "job-yaml-overrides")

        page.get_by_role("button", name="Edit a copy").click()
        page.wait_for_url("**/#/new")
        editor = page.locator(".editor .cm-content")
        editor.filter(has_text="train_steps: 400").wait_for()
        assert "train_steps: 1500" not in editor.inner_text()
        page.locator("#verdict", has_text="valid").wait_for()
    finally:
        stack.api.post(f"/jobs/{job_id}/cancel")
