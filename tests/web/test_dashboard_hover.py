"""Chart hover in a real browser against a real `trainyard up`: where series report at
different steps (a job's train loss every 10 steps and its test loss every 50; two jobs side by
side on Compare, one reporting every 10 steps, the other every 25), the legend shows each
series' value at the hovered step, or its own step beside a value from another step."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Locator, Page

from tests.web.conftest import Stack, job_yaml, shoot, submit, wait_for_state

pytestmark = pytest.mark.e2e

STEPS = 200


def quick_job(name: str, every: int) -> str:
    return job_yaml(
        "digits_mlp",
        name=name,
        train_steps=STEPS,
        disp_freq=every,
        test={"freq": 50},
        checkpoint={"freq": 0},
    )


def legend(figure: Locator) -> dict[str, str]:
    """The hover legend of one chart: each series' label -> the value it shows."""
    rows = figure.locator(".u-legend tr.u-series")
    return {
        (row.locator("th").inner_text()).strip(): row.locator("td.u-value").inner_text().strip()
        for row in rows.all()
    }


def hover_at(page: Page, figure: Locator, wanted: set[int]) -> dict[str, str]:
    """Moves the cursor across the chart until it hovers one of the `wanted` steps; the legend
    there (its first entry, the x series, is the hovered step)."""
    figure.scroll_into_view_if_needed()
    box = figure.locator(".u-over").bounding_box()
    assert box is not None
    for tenth in range(5, 1000, 7):
        page.mouse.move(box["x"] + box["width"] * tenth / 1000, box["y"] + box["height"] / 2)
        shown = legend(figure)
        step = next(iter(shown.values()))
        if step.isdigit() and int(step) in wanted:
            return shown
    raise AssertionError(f"the cursor found none of the steps {sorted(wanted)}: {shown}")


def own_step(value: str) -> int | None:
    """The step written beside a value taken from another step, else None."""
    match = re.search(r"\(step (\d+)\)$", value)
    return int(match.group(1)) if match else None


def test_hover_shows_each_series_value_at_the_hovered_step(signed_in: Page, stack: Stack) -> None:
    often, seldom = (
        submit(stack, quick_job("e2e-hover-every-10", 10)),
        submit(stack, quick_job("e2e-hover-every-25", 25)),
    )
    for job_id in (often, seldom):
        assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}) == "SUCCEEDED"
    page = signed_in

    # The job page: train/loss at every 10th step, test/loss at every 50th.
    page.goto(f"{stack.url}/#/jobs/{often}")
    loss = page.locator("#charts figure[data-metric='loss']")
    loss.locator(".u-over").wait_for()
    between = {s for s in range(10, STEPS, 10) if s % 50 != 0}
    shown = hover_at(page, loss, between)
    step = int(next(iter(shown.values())))
    assert own_step(shown["train/loss"]) is None, shown
    beside = own_step(shown["test/loss"])
    assert beside is not None and beside % 50 == 0 and abs(beside - step) < 50, shown
    shoot(page, "job-chart-hover")
    shown = hover_at(page, loss, {50, 100, 150})
    assert own_step(shown["train/loss"]) is None and own_step(shown["test/loss"]) is None, shown

    # Compare: one job reports every 10 steps, the other every 25.
    page.goto(f"{stack.url}/#/compare/{often},{seldom}")
    train = page.locator("#compare-charts figure[data-metric='train/loss']")
    train.locator(".u-over").wait_for()
    shown = hover_at(page, train, {s for s in range(10, STEPS, 10) if s % 25 != 0})
    step = int(next(iter(shown.values())))
    assert own_step(shown[f"#{often} e2e-hover-every-10"]) is None, shown
    beside = own_step(shown[f"#{seldom} e2e-hover-every-25"])
    assert beside is not None and beside % 25 == 0 and abs(beside - step) < 25, shown
    shoot(page, "compare-chart-hover")
    shown = hover_at(page, train, {50, 100, 150})
    assert all(own_step(value) is None for value in list(shown.values())[1:]), shown
