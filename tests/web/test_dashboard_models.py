"""The Models page in a real browser against a real `trainyard up`: a finished job's best
checkpoint registered from the page, tagged production, the tag moved by tagging a second
version, a version deleted; a job then fine-tuned from the tagged model."""

from __future__ import annotations

import pytest
import yaml
from playwright.sync_api import Page

from tests.web.conftest import Stack, job_yaml, shoot, submit, wait_for_state

pytestmark = pytest.mark.e2e


def test_register_tag_and_delete_models(signed_in: Page, stack: Stack) -> None:
    text = job_yaml(
        "digits_mlp",
        name="e2e-model",
        train_steps=40,
        test={"freq": 20},
        checkpoint={"freq": 20, "keep": 3, "keep_best": True},
    )
    job_id = submit(stack, text)
    assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    page = signed_in
    page.goto(stack.url + "/#/models")
    page.locator("#models", has_text="No models yet").wait_for()
    for checkpoint in ("", "latest"):
        page.fill("#model-name", "e2e-digits")
        page.fill("#model-job", str(job_id))
        page.select_option("#model-checkpoint", checkpoint)
        page.click("form.register-model button[type=submit]")
        version = 1 if not checkpoint else 2
        page.locator("#model-message", has_text=f"registered e2e-digits@{version}").wait_for()
    best = stack.api.get(f"/jobs/{job_id}").json()["best_step"]
    first = page.locator("tr[data-model='e2e-digits@1']")
    first.wait_for()
    assert f"#{job_id} e2e-model" in first.inner_text() and str(best) in first.inner_text()

    for version in (1, 2):  # the tag moves to the version tagged last
        row = page.locator(f"tr[data-model='e2e-digits@{version}']")
        row.locator("input.tag-input").fill("production")
        row.locator("button.tag-button").click()
        page.locator("#model-message", has_text=f"e2e-digits@{version} tagged").wait_for()
        # The list is read again after the message: the next version's input is filled in the
        # new table, not in one about to be replaced (on a busy machine it was, and the click
        # sent an empty tag).
        page.locator(f"tr[data-model='e2e-digits@{version}']", has_text="production").wait_for()
    assert "production" not in page.locator("tr[data-model='e2e-digits@1']").inner_text()
    shoot(page, "models")

    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("tr[data-model='e2e-digits@1'] button.delete-button").click()
    page.locator("#model-message", has_text="deleted e2e-digits@1").wait_for()
    # The message comes before the list is read again: wait for the row to go (or time out).
    page.locator("tr[data-model='e2e-digits@1']").wait_for(state="detached")
    assert page.locator("tr[data-model='e2e-digits@1']").count() == 0

    document = yaml.safe_load(text)
    document.update(name="e2e-tuned", train_steps=2)
    document["checkpoint"] = {"init_from": {"model": "e2e-digits@production"}}
    tuned = submit(stack, yaml.safe_dump(document))
    assert wait_for_state(stack, tuned, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    page.fill("#model-name", "e2e-digits")
    page.fill("#model-job", "999999")
    page.click("form.register-model button[type=submit]")
    page.locator("#model-message", has_text="no job 999999").wait_for()


def test_register_a_sweeps_best_trial_from_its_page(signed_in: Page, stack: Stack) -> None:
    document = yaml.safe_load(
        job_yaml(
            "digits_mlp",
            name="e2e-sweep-model",
            train_steps=20,
            test={"freq": 10},
            checkpoint={"freq": 10, "keep_best": True},
        )
    )
    document["search"] = {
        "metric": "test/accuracy",
        "mode": "max",
        "algorithm": "random",
        "max_trials": 2,
        "max_parallel": 2,
        "space": {"updater.lr.base": {"loguniform": [0.01, 0.1]}},
    }
    answer = stack.api.post(
        "/sweeps", content=yaml.safe_dump(document), headers={"Content-Type": "application/yaml"}
    )
    assert answer.status_code == 201, answer.text
    sweep_id = answer.json()["id"]
    page = signed_in
    page.goto(stack.url + f"/#/sweeps/{sweep_id}")
    page.locator("#trials tbody tr", has_text="SUCCEEDED").nth(1).wait_for(timeout=120_000)
    page.fill("#register-best-name", "e2e-best")
    page.click("#register-best")
    message = page.locator("#register-best-message", has_text="registered e2e-best@1")
    message.wait_for()
    best = stack.api.get(f"/sweeps/{sweep_id}").json()["best"]
    version = stack.api.get("/models/e2e-best/1").json()
    assert version["job_id"] == best["job_id"]
    # the trial's best checkpoint, and the message says which step
    kept = stack.api.get(f"/jobs/{best['job_id']}/checkpoints").json()
    assert version["step"] == next(c["step"] for c in kept if c["best"])
    assert f"job #{best['job_id']} step {version['step']}, test/accuracy" in message.inner_text()
    shoot(page, "sweep-register-best")
