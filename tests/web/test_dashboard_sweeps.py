"""The sweep pages in a real browser against a real `trainyard up`: examples/mnist1d_sweep.yaml
runs to its end (8 trials, ASHA pruning some, judged on the validation split), and the list and
the sweep's page show it, its best trial's test figure beside; a sweep submitted from the editor
runs live until its Cancel button cancels its trials; a multi-objective sweep shows its Pareto
front; a sweep that selects on the test split carries its warning."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import pytest
import yaml
from playwright.sync_api import Page, Route

from tests.web.conftest import EXAMPLES, Stack, shoot

pytestmark = pytest.mark.e2e

EXAMPLE = yaml.safe_load((EXAMPLES / "mnist1d_sweep.yaml").read_text())
SPACE = EXAMPLE["search"]["space"]
SCALES = {"updater.lr.base": "log", "updater.weight_decay": "linear"}
SCALES["neuralnet.layers.fc1.units"] = "categorical"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def sweep_yaml(name: str, steps: int, **search: Any) -> str:
    document = {**EXAMPLE, "name": name, "train_steps": steps}
    document["search"] = {**EXAMPLE["search"], **search}
    if "objectives" in search:  # instead of metric and mode
        del document["search"]["metric"], document["search"]["mode"]
    return yaml.safe_dump(document, sort_keys=False)


def submit_sweep(stack: Stack, text: str) -> int:
    response = stack.api.post("/sweeps", content=text, headers={"Content-Type": "application/yaml"})
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def wait_for_sweep(stack: Stack, sweep_id: int, timeout: float = 420) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sweep: dict[str, Any] = stack.api.get(f"/sweeps/{sweep_id}").json()
        if sweep["state"] in TERMINAL:
            return sweep
        time.sleep(0.5)
    raise AssertionError(f"sweep {sweep_id} did not end in {timeout:.0f}s: {sweep['state']}")


@pytest.fixture(scope="module")
def finished(stack: Stack) -> dict[str, Any]:
    """The example sweep as documented, run to its end."""
    sweep = wait_for_sweep(stack, submit_sweep(stack, sweep_yaml("e2e-sweep", 1000)))
    assert sweep["state"] == "SUCCEEDED", sweep
    return sweep


def count(page: Page, selector: str) -> int:
    return int(page.locator(selector).count())


def test_the_sweeps_list_shows_a_sweep(
    signed_in: Page, stack: Stack, finished: dict[str, Any]
) -> None:
    page = signed_in
    page.goto(stack.url + "/#/jobs")
    page.get_by_role("link", name="Sweeps").click()
    row = page.locator(f"tr[data-sweep='{finished['id']}']")
    row.wait_for()
    assert "succeeded" in row.locator(".badge").inner_text()
    assert row.locator(".trials-done").inner_text() == "8 / 8"
    assert f"trial {finished['best_trial']}" in row.locator(".best-value").inner_text()
    shoot(page, "sweeps")
    row.get_by_role("link", name="e2e-sweep").click()
    page.wait_for_url(re.compile(rf"#/sweeps/{finished['id']}$"))
    page.locator("#sweep-state", has_text="succeeded").wait_for()


def test_a_finished_sweeps_page(signed_in: Page, stack: Stack, finished: dict[str, Any]) -> None:
    page = signed_in
    trials = finished["trials"]
    page.goto(f"{stack.url}/#/sweeps/{finished['id']}")
    page.locator("#sweep-state", has_text="succeeded").wait_for()

    # The trials table: a row per trial, its job linked, a column per parameter and the metric.
    rows = page.locator("#trials tbody tr[data-trial]")
    rows.nth(len(trials) - 1).wait_for()
    assert rows.count() == len(trials) == 8
    headers = page.locator("#trials th").all_inner_texts()
    assert headers[:5] == ["Trial", "Job", "State", "Step", "Rung"]
    assert headers[-1] == "val/accuracy" and len(headers) == 5 + len(SPACE) + 1
    for trial in trials:
        row = page.locator(f"#trials tr[data-trial='{trial['number']}']")
        assert row.get_by_role("link", name=f"#{trial['job_id']}").count() == 1
        assert trial["state"].lower() in row.inner_text()
        rung = row.locator(".rung").inner_text()
        assert rung == (str(trial["pruned_step"]) if trial["state"] == "PRUNED" else "—")

    # The best trial: its number, value, parameters and job.
    best = finished["best"]
    assert page.locator("#best-number").inner_text() == str(best["number"])
    page.locator("#best-job").click()
    page.wait_for_url(re.compile(rf"#/jobs/{best['job_id']}$"))
    page.locator("#job-sweep", has_text=f"#{finished['id']} trial {best['number']}").click()
    page.wait_for_url(re.compile(rf"#/sweeps/{finished['id']}$"))
    # Chosen on the validation split; the test split's figure beside it, and no warning.
    assert finished["best_test"]["metric"] == "test/accuracy"
    honest = page.locator("#best-test")
    assert honest.inner_text() == f"{finished['best_test']['value']:.4g}"
    assert "test/accuracy (honest estimate)" in page.locator("#best-trial").inner_text().lower()
    assert page.locator("#sweep-warnings .warning-box").count() == 0
    params = page.locator("#best-trial tr[data-param]")
    params.first.wait_for()
    assert sorted(params.evaluate_all("rows => rows.map(r => r.dataset.param)")) == sorted(SPACE)

    # Parallel coordinates: an axis per parameter, scaled as its space says, and the metric.
    axes = page.locator("#parcoords g.pc-axis")
    axes.first.wait_for()
    shown = axes.evaluate_all("gs => gs.map(g => [g.dataset.axis, g.dataset.scale])")
    assert shown == [*([path, SCALES[path]] for path in SPACE), ["val/accuracy", "linear"]]
    valued = [t for t in trials if t["value"] is not None]
    assert count(page, "#parcoords path.pc-line") == len(valued)
    assert count(page, "#parcoords path.pc-line.best") == 1

    # Metric against step: a line per trial, each pruned one dashed with an ✕ at its rung.
    pruned = {t["number"] for t in trials if t["state"] == "PRUNED"}
    assert pruned, "ASHA pruned no trial of the example sweep"
    lines = "#trial-curves path.trial-line"
    page.wait_for_function(f"() => document.querySelectorAll({lines!r}).length === {len(trials)}")
    dashed = page.locator(f"{lines}.pruned").evaluate_all(
        "ps => ps.map(p => Number(p.dataset.trial)).filter((n, i) => ps[i].getAttribute("
        "'stroke-dasharray'))"
    )
    assert set(dashed) == pruned
    marks = page.locator("#trial-curves .prune-mark").evaluate_all(
        "ms => ms.map(m => Number(m.dataset.trial))"
    )
    assert set(marks) == pruned and len(marks) == len(pruned)
    assert not page.locator("#pareto").is_visible()
    assert not page.locator("#schedules").is_visible()
    # Importance shows when the server computes it (a 4xx hides the panel).
    importance = stack.api.get(f"/sweeps/{finished['id']}/importance")
    if importance.status_code == 200:
        bars = page.locator("#importance g.importance-bar")
        bars.first.wait_for()
        assert bars.count() == len(importance.json()["importances"])
    else:
        assert 400 <= importance.status_code < 500
        assert not page.locator("#importance").is_visible()
    shoot(page, "sweep", doc=True, full_page=True)

    # The top-k% filter keeps the best trials' lines only.
    page.locator("#topk").fill("50")
    page.locator("#topk-label", has_text="50%").wait_for()
    assert count(page, "#parcoords path.pc-line") == math.ceil(len(valued) / 2)
    page.locator("#topk").fill("5")
    assert count(page, "#parcoords path.pc-line") == 1
    assert count(page, "#parcoords path.pc-line.best") == 1
    page.locator("#topk").fill("100")
    assert count(page, "#parcoords path.pc-line") == len(valued)


def test_a_multi_objective_sweep_shows_its_pareto_front(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    objectives = [
        {"metric": "val/accuracy", "mode": "max"},
        {"metric": "val/loss", "mode": "min"},
    ]
    text = sweep_yaml(
        "e2e-pareto",
        300,
        objectives=objectives,
        algorithm="random",
        pruner={"type": "none"},
        max_trials=5,
        max_parallel=3,
    )
    sweep = wait_for_sweep(stack, submit_sweep(stack, text))
    assert sweep["state"] == "SUCCEEDED", sweep
    front = {t["number"] for t in sweep["pareto_front"]}
    assert front

    page.goto(f"{stack.url}/#/sweeps/{sweep['id']}")
    page.locator("#sweep-state", has_text="succeeded").wait_for()
    page.locator("#pareto svg").wait_for()
    points = page.locator("#pareto circle.pareto-point")
    assert points.count() == len([t for t in sweep["trials"] if t["values"]])
    on_front = page.locator("#pareto circle.on-front").evaluate_all(
        "cs => cs.map(c => Number(c.dataset.trial))"
    )
    assert set(on_front) == front
    assert page.locator("#best-trial h2").text_content() == "Pareto front"
    metric_axes = page.locator("#parcoords g.pc-axis.metric").evaluate_all(
        "gs => gs.map(g => g.dataset.axis)"
    )
    assert metric_axes == ["val/accuracy", "val/loss"]
    assert page.locator("#trials th").all_inner_texts()[-2:] == ["val/accuracy", "val/loss"]
    shoot(page, "sweep-pareto")


def test_a_sweep_that_selects_on_the_test_split_is_warned(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    text = sweep_yaml(
        "e2e-on-test", 300, metric="test/accuracy", pruner={"type": "none"}, max_trials=2
    )
    sweep_id = submit_sweep(stack, text)
    page.goto(f"{stack.url}/#/sweeps/{sweep_id}")
    warning = page.locator("#sweep-warnings .warning-box")
    warning.wait_for()
    assert warning.inner_text() == (
        "the sweep selects on test/accuracy: selecting on the test split biases the best "
        "trial's score; add data.validation_fraction and use val/..."
    )
    sweep = wait_for_sweep(stack, sweep_id, timeout=120)
    assert sweep["state"] == "SUCCEEDED" and sweep["best_test"] is None
    page.locator("#sweep-state", has_text="succeeded").wait_for()
    page.locator("#best-number").wait_for()
    assert page.locator("#best-test").count() == 0 and warning.is_visible()
    shoot(page, "sweep-warning")


def test_submit_a_sweep_from_the_editor_and_cancel_it(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    # Trials that run until cancelled, reporting every 50 steps.
    text = sweep_yaml("e2e-live-sweep", 100_000, pruner={"type": "none"}, max_trials=4)
    page.goto(stack.url + "/#/new")
    page.locator(".cm-content").wait_for()
    page.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(text)
    page.locator("#verdict", has_text="valid sweep").wait_for()
    assert page.locator("#submit").inner_text() == "Submit sweep"
    page.locator("#submit").click()
    page.wait_for_url(re.compile(r"#/sweeps/\d+$"))
    sweep_id = int(page.url.rsplit("/", 1)[-1])
    try:
        page.locator("#sweep-state", has_text="running").wait_for()
        # Live: the running trials' curves appear and grow without a reload.
        lines = "#trial-curves path.trial-line"
        page.locator(lines).first.wait_for(timeout=90_000)
        drawn = f"[...document.querySelectorAll({lines!r})].map(p => p.getAttribute('d')).join('')"
        first = page.evaluate(f"() => {drawn}.length")
        page.wait_for_function(f"() => {drawn}.length > {first}", timeout=30_000)
        assert page.locator("#trials tbody tr[data-trial]").count() >= 1
        shoot(page, "sweep-running")
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("#cancel-sweep").click()
        page.locator("#sweep-state", has_text="cancelled").wait_for(timeout=60_000)
        assert page.locator("#cancel-sweep").count() == 0
    finally:
        stack.api.post(f"/sweeps/{sweep_id}/cancel")
    sweep = wait_for_sweep(stack, sweep_id, timeout=60)
    assert sweep["state"] == "CANCELLED"
    assert sweep["trials"] and {t["state"] for t in sweep["trials"]} == {"CANCELLED"}
    states = page.locator("#trials tbody tr[data-trial] .badge").all_inner_texts()
    assert set(states) == {"cancelled"}


def test_importance_and_pbt_schedules_panels(
    signed_in: Page, stack: Stack, finished: dict[str, Any]
) -> None:
    """The panels for parameter importance and population-based training, on the shapes the API
    gives them (GET /sweeps/{id}/importance; a PBT trial's `schedule`), answered here for the
    finished sweep: each trial's learning rate halves at step 500, continuing from trial 3."""
    page = signed_in
    sweep_id = finished["id"]
    importances = {"updater.lr.base": 0.6, "neuralnet.layers.fc1.units": 0.3}
    importances["updater.weight_decay"] = 0.1

    def with_schedules(route: Route) -> None:
        sweep = route.fetch().json()
        for trial in sweep["trials"]:
            later = {**trial["params"], "updater.lr.base": trial["params"]["updater.lr.base"] / 2}
            trial["schedule"] = [
                {"step": 0, "params": trial["params"], "from_trial": None},
                {"step": 500, "params": later, "from_trial": 3},
            ]
        route.fulfill(json=sweep)

    page.route(f"**/api/v1/sweeps/{sweep_id}", with_schedules)
    page.route(
        f"**/api/v1/sweeps/{sweep_id}/importance",
        lambda route: route.fulfill(
            json={"metric": "val/accuracy", "importances": importances, "evaluator": "fanova",
                  "trials": 8}
        ),
    )  # fmt: skip
    page.goto(f"{stack.url}/#/sweeps/{sweep_id}")
    bars = page.locator("#importance g.importance-bar")
    bars.first.wait_for()
    assert bars.evaluate_all("gs => gs.map(g => g.dataset.param)") == list(importances)
    assert "fanova over 8 trials" in page.locator("#importance").inner_text()
    charts = page.locator("#schedules figure.schedule-chart")
    charts.first.wait_for()
    assert charts.evaluate_all("fs => fs.map(f => f.dataset.param)") == list(SPACE)
    lr = page.locator("#schedules figure[data-param='updater.lr.base']")
    assert lr.locator("g.schedule-line").count() == len(finished["trials"])
    # A trial's schedule is drawn up to its step: those stopped before 500 show no exploit.
    past = [t for t in finished["trials"] if t["step"] >= 500]
    assert lr.locator("circle.exploit").count() == len(past)
    shoot(page, "sweep-pbt-importance", full_page=True)


def test_without_importance_or_schedules_their_panels_hide(
    signed_in: Page, stack: Stack, finished: dict[str, Any]
) -> None:
    page = signed_in
    page.route(
        f"**/api/v1/sweeps/{finished['id']}/importance",
        lambda route: route.fulfill(status=409, json={"detail": "fewer than two trials"}),
    )
    with page.expect_response(lambda response: response.url.endswith("/importance")):
        page.goto(f"{stack.url}/#/sweeps/{finished['id']}")
    page.locator("#parcoords g.pc-axis").first.wait_for()
    assert not page.locator("#importance").is_visible()
    assert not page.locator("#schedules").is_visible()
