"""A pipelined job's page in a real browser against a real `trainyard up`: two stage workers train
the job, and the page colours the net by stage and draws each stage's timeline as it arrives."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page

from tests.web.conftest import Stack, job_yaml, shoot, submit, wait_for_state

pytestmark = pytest.mark.e2e

STAGES = [["data", "fc1", "relu1"], ["fc2", "relu2", "fc3", "loss"]]
# Runs until cancelled (about 100 steps/s on one core per stage); each stage times a step every
# 10 steps.
PIPELINED = job_yaml(
    "mnist1d_mlp",
    name="e2e-pipeline",
    train_steps=100_000,
    disp_freq=10,
    test={"freq": 1000},
    pipeline={"stages": STAGES, "microbatches": 2},
)
BARS = "#pipeline-timeline g.stage-row[data-stage='{stage}'] g.bar"
STEP = "#pipeline-timeline g.stage-row[data-stage='0'] .stage-step"


def test_a_pipelined_jobs_stages_and_timeline(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    job_id = submit(stack, PIPELINED)
    try:
        page.goto(f"{stack.url}/#/jobs/{job_id}/graph")
        page.locator("#graph g.layer").first.wait_for()
        legend = page.locator("#graph-legend .staged")
        legend.nth(1).wait_for()
        assert legend.all_inner_texts() == ["stage 0", "stage 1"]
        for stage, layers in enumerate(STAGES):
            for name in layers:
                layer = page.locator(f"#graph g[data-layer='{name}']")
                assert layer.get_attribute("data-stage") == str(stage)
        stroke = "el => getComputedStyle(el.querySelector('rect')).stroke"
        colours = [page.locator(f"#graph g[data-layer='{s[0]}']").evaluate(stroke) for s in STAGES]
        assert colours[0] != colours[1]
        shoot(page, "job-pipeline-graph")

        page.get_by_role("tab", name="pipeline").click()
        rows = page.locator("#pipeline-plan tbody tr")
        rows.nth(1).wait_for()
        assert [row.locator("td").nth(1).inner_text() for row in rows.all()] == [
            ", ".join(layers) for layers in STAGES
        ]
        facts = page.locator("#pipeline-plan .facts").inner_text().lower()
        assert re.search(r"micro-batches\s+2", facts) and re.search(r"replicas\s+1", facts)
        # Each stage's row: a forward and a backward of each of the 2 micro-batches, numbered.
        for stage in (0, 1):
            page.locator(BARS.format(stage=stage)).nth(3).wait_for(timeout=90_000)
            bars = page.locator(BARS.format(stage=stage))
            # Read at once: live timelines redraw the rows.
            shown = bars.evaluate_all(
                "bars => bars.map(b => `${b.dataset.kind}${b.dataset.microbatch}: "
                "${b.querySelector('text').textContent}`)"
            )
            assert sorted(shown) == ["B0: 0", "B1: 1", "F0: 0", "F1: 1"]
            # One piece per stage under 1F1B: every bar is the stage's own.
            pieces = bars.evaluate_all("bars => bars.map(b => b.dataset.piece)")
            assert set(pieces) == {str(stage)}
        busy = page.locator("#pipeline-timeline .stage-busy")
        page.wait_for_function(
            "() => [...document.querySelectorAll('#pipeline-timeline .stage-busy')]"
            ".every(t => /busy \\d+%/.test(t.textContent))"
        )
        assert busy.count() == 2
        # Live: newer steps replace the rows while the job runs, without a reload.
        first = page.locator(STEP).text_content()
        page.wait_for_function(
            f"() => document.querySelector({STEP!r})?.textContent !== {first!r}", timeout=30_000
        )
        assert page.locator("#job-state").text_content() == "running"
        shoot(page, "job-pipeline", doc=True)
    finally:
        stack.api.post(f"/jobs/{job_id}/cancel")
    assert wait_for_state(stack, job_id, {"CANCELLED"}) == "CANCELLED"
    stored = stack.api.get(f"/jobs/{job_id}/pipeline").json()
    assert stored["stages"] == STAGES and len(stored["timelines"]) == 2


def test_a_job_without_a_pipeline_has_no_pipeline_tab(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    job_id = submit(stack, job_yaml("mnist1d_mlp", name="e2e-plain", train_steps=50))
    page.goto(f"{stack.url}/#/jobs/{job_id}/pipeline")
    page.locator(".pane-charts").wait_for()  # the address's tab falls back to the charts
    assert page.get_by_role("tab", name="graph").is_visible()
    assert not page.get_by_role("tab", name="pipeline").is_visible()
