"""Compare in a real browser against a real `trainyard up`: three finished jobs ticked in the
jobs list open side by side, with a curve per job on each metric's chart (by step, then by wall
time), the settings they differ in, their final metrics and their environments; the page's
address, opened afresh, shows the same; a job's environment tab shows its worker's."""

from __future__ import annotations

import platform

import pytest
import torch
from playwright.sync_api import Page

from tests.web.conftest import Stack, job_yaml, shoot, submit, wait_for_state

pytestmark = pytest.mark.e2e


def test_compare_three_jobs(signed_in: Page, stack: Stack) -> None:
    ids = [
        submit(
            stack,
            job_yaml(
                "digits_mlp",
                name=f"e2e-compare-{i}",
                seed=i,
                train_steps=steps,
                disp_freq=10,
                test={"freq": steps},
                checkpoint={"freq": 0},
            ),
        )
        for i, steps in enumerate((30, 40, 50))
    ]
    for job_id in ids:
        assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    page = signed_in
    page.goto(stack.url + "/#/jobs")
    compare = page.locator("#compare-picked")
    for job_id in ids:
        page.locator(f"input[data-pick='{job_id}']").check()
    assert compare.inner_text() == "Compare (3)" and compare.is_enabled()
    compare.click()
    page.wait_for_url(f"**/#/compare/{','.join(map(str, ids))}")

    def check_page() -> None:
        loss = page.locator("#compare-charts figure[data-metric='train/loss']")
        loss.wait_for()
        assert loss.get_attribute("data-curves") == "3"
        assert loss.locator("canvas").count() >= 1
        for job_id in ids:
            page.locator(f".compare-head[data-job='{job_id}']", has_text="succeeded").wait_for()
        steps = page.locator("#compare-settings tr[data-key='train_steps']")
        assert steps.inner_text().split("\t")[1:] == ["30", "40", "50"]
        assert page.locator("#compare-settings tr[data-key='seed']").inner_text().split("\t")[
            1:
        ] == ["0", "1", "2"]
        assert page.locator("#compare-settings tr[data-key='name']").count() == 1
        assert page.locator("#compare-settings tr[data-key='updater.momentum']").count() == 0
        accuracy = page.locator("#compare-metrics tr[data-metric='test/accuracy']")
        assert accuracy.inner_text().count("%") == 9  # final, lowest and highest of each
        python = page.locator("#compare-environment tr[data-key='python']")
        assert python.inner_text().count(platform.python_version()) == 3
        assert python.get_attribute("class") != "differs"  # one machine: nothing differs
        assert page.locator("#compare-environment tr.differs").count() == 0

    check_page()
    shoot(page, "compare", doc=True, full_page=True)
    x_label = page.locator("#compare-charts figure[data-metric='train/loss'] .u-legend th").first
    assert x_label.inner_text().startswith("step")
    page.click("button[data-axis='time']")
    assert x_label.inner_text().startswith("time")
    assert page.locator("#compare-charts figure[data-metric='train/loss'] canvas").count() >= 1

    # The address is the page: opened in a fresh tab it shows the same jobs.
    fresh = page.context.new_page()
    fresh.goto(f"{stack.url}/#/compare/{','.join(map(str, ids))}")
    page = fresh
    check_page()
    page.goto(f"{stack.url}/#/compare/{ids[0]},999999")
    page.locator(".error-box", has_text="no job 999999").wait_for()

    page.goto(f"{stack.url}/#/jobs/{ids[0]}/environment")
    facts = page.locator("#environment")
    facts.locator("tr[data-fact='torch']", has_text=torch.__version__).wait_for()
    assert platform.python_version() in facts.locator("tr[data-fact='python']").inner_text()
    assert facts.locator("tr[data-process='0/0']").count() == 1
    shoot(page, "job-environment")
    fresh.close()
