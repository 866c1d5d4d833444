"""The dashboard in a real browser (Debian's Chromium, headless) against a real `trainyard up`
(tests/web/conftest.py starts both): sign-in, the editor, a job's pages, the cluster and the job
list.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import Page

from tests.web.conftest import EXAMPLES, SLOTS, Stack, job_yaml, shoot, submit, wait_for_state

pytestmark = pytest.mark.e2e

MLP = (EXAMPLES / "mnist1d_mlp.yaml").read_text()
MLP_LAYERS = yaml.safe_load(MLP)["neuralnet"]["layers"]
# A quick job (300 steps at several hundred per second) submitted through the editor.
QUICK_JOB = job_yaml(
    "mnist1d_mlp", name="e2e-quick-mlp", train_steps=300, disp_freq=10, test={"freq": 100}
)
# A long one (the CNN runs about 100 steps/s on one core): reports every 25 steps until cancelled.
LONG_JOB = job_yaml(
    "mnist1d_cnn",
    name="e2e-long-cnn",
    train_steps=100_000,
    disp_freq=25,
    test={"freq": 100},
    checkpoint={"freq": 200, "keep": 3},
)
# One line names a layer that does not exist, which also leaves relu1 (the line above) unused.
BROKEN_JOB = MLP.replace("srclayers: [relu1]", "srclayers: [relu9]")
BROKEN_LINE = next(i for i, line in enumerate(BROKEN_JOB.splitlines(), 1) if "relu9" in line)


@pytest.fixture(scope="module", autouse=True)
def long_job(stack: Stack) -> Iterator[int]:
    """Submitted before the first test, so it is running (and reporting) by the time tests
    watch a running job; cancelled after the last, whichever of them ran (the next browser
    module shares the stack)."""
    job_id = submit(stack, LONG_JOB)
    yield job_id
    stack.api.post(f"/jobs/{job_id}/cancel")


def replace_editor_text(page: Page, text: str) -> None:
    page.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(text)


def test_sign_in_with_a_token(page: Page, stack: Stack) -> None:
    page.goto(stack.url + "/")
    page.wait_for_url(re.compile(r"#/signin$"))
    token = page.locator("#token")
    shoot(page, "signin", doc=True)
    token.fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("alert").filter(has_text="not accepted").wait_for()

    token.fill(stack.token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"#/jobs$"))
    page.get_by_role("heading", name="Jobs").wait_for()
    assert page.evaluate("localStorage.getItem('trainyard.token')") == stack.token
    shoot(page, "signed-in")


def test_broken_yaml_is_marked_on_its_line(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    page.goto(stack.url + "/#/new")
    page.locator(".cm-content").wait_for()
    replace_editor_text(page, BROKEN_JOB)

    page.locator("#verdict", has_text="2 problems").wait_for()
    lines = page.locator(".cm-content .cm-line")
    broken = lines.nth(BROKEN_LINE - 1)
    assert "cm-error-line" in (broken.get_attribute("class") or "")
    assert "names source 'relu9'" in broken.locator(".cm-line-message").inner_text()
    unused = lines.nth(BROKEN_LINE - 2).locator(".cm-line-message").inner_text()
    assert "'relu1' is not used" in unused
    assert page.locator(".cm-error-line").count() == 2
    assert page.locator(".cm-lint-marker-error").count() == 2
    assert page.locator(".cm-lintRange-error").count() == 2
    problems = page.locator("#problems li")
    assert problems.count() == 2
    assert "did you mean 'relu2'" in page.locator("#problems").inner_text()
    shoot(page, "new-job-errors", doc=True)

    # Fixing the line clears its marks.
    replace_editor_text(page, MLP)
    page.locator("#verdict", has_text="valid").wait_for()
    assert page.locator(".cm-error-line").count() == 0


def test_submit_a_job_from_the_editor(signed_in: Page, stack: Stack) -> None:
    page = signed_in
    page.goto(stack.url + "/#/new")
    page.locator("#example option[value='mnist1d_mlp']").wait_for(state="attached")
    page.select_option("#example", "mnist1d_mlp")
    page.locator(".cm-content", has_text="name: mnist1d-mlp").wait_for()
    replace_editor_text(page, QUICK_JOB)

    page.locator("#verdict", has_text="valid").wait_for()
    assert page.locator("tr.layer-row").count() == len(MLP_LAYERS)
    assert page.locator("#placement-verdict").inner_text().startswith("✓ fits now")
    shoot(page, "new-job", doc=True)

    page.locator("#submit").click()
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[-1])
    page.get_by_role("heading", name=f"#{job_id} e2e-quick-mlp").wait_for()
    job = stack.api.get(f"/jobs/{job_id}").json()
    assert (job["name"], job["train_steps"], job["spec_yaml"]) == ("e2e-quick-mlp", 300, QUICK_JOB)

    page.get_by_role("tab", name="graph").click()
    page.locator("#graph g.layer").first.wait_for()
    assert page.locator("#graph g.layer").count() == len(MLP_LAYERS)
    edges = sum(len(layer.get("srclayers", [])) for layer in MLP_LAYERS)
    assert page.locator("#graph path.edge").count() == edges
    assert "(100)" in (page.locator("#graph g[data-layer='fc1']").text_content() or "")
    shoot(page, "job-graph", doc=True)

    page.get_by_role("tab", name="events").click()
    page.locator("#events li", has_text="submitted").wait_for()

    page.get_by_role("tab", name="yaml").click()
    assert "e2e-quick-mlp" in page.locator(".pane-yaml .cm-content").inner_text()


def test_a_running_jobs_chart_gains_points(signed_in: Page, stack: Stack, long_job: int) -> None:
    page = signed_in
    page.goto(f"{stack.url}/#/jobs/{long_job}")
    page.locator("#job-state", has_text="running").wait_for()
    count = "Number(document.querySelector(\"figure[data-metric='loss']\")?.dataset.points ?? 0)"
    page.wait_for_function(f"() => {count} > 0", timeout=30_000)
    before = page.evaluate(count)
    # Live points arrive over the event stream: no reload, the curve grows.
    page.wait_for_function(f"() => {count} >= {before + 4}", timeout=30_000)
    assert page.evaluate(count) >= before + 4
    # The first evaluation (step 100) adds the test curves next to the training ones.
    page.locator("figure[data-metric='accuracy']", has_text="test/accuracy").wait_for(
        timeout=30_000
    )
    shoot(page, "job-running")

    page.get_by_role("tab", name="checkpoints").click()
    page.locator("#checkpoints tbody tr:not(.empty)").first.wait_for(timeout=30_000)
    with page.expect_download() as download:
        page.locator("#checkpoints button", has_text="Download").first.click()
    saved = download.value.path()
    assert saved is not None and Path(saved).stat().st_size > 1000
    assert download.value.suggested_filename.startswith("e2e-long-cnn-step")
    shoot(page, "job-checkpoints", doc=True)


def test_a_jobs_metrics_log_and_tensorboard_files_download_from_its_page(
    signed_in: Page, stack: Stack, long_job: int
) -> None:
    page = signed_in
    page.goto(f"{stack.url}/#/jobs/{long_job}")
    page.locator("#job-state", has_text="running").wait_for()
    count = "Number(document.querySelector(\"figure[data-metric='loss']\")?.dataset.points ?? 0)"
    page.wait_for_function(f"() => {count} > 0", timeout=30_000)
    saved: dict[str, tuple[str, Path]] = {}
    for file in ("metrics.csv", "logs.txt", "tensorboard"):
        with page.expect_download() as download:
            page.locator(f"#job-downloads button[data-file='{file}']").click()
        path = download.value.path()
        assert path is not None
        saved[file] = (download.value.suggested_filename, Path(path))
    name, csv_file = saved["metrics.csv"]
    assert name == f"e2e-long-cnn-job{long_job}.csv"
    header, first, *_ = csv_file.read_text().splitlines()
    assert header == "step,time,name,group,rank,value" and first.split(",")[3:5] == ["0", "0"]
    name, log_file = saved["logs.txt"]
    assert name == f"e2e-long-cnn-job{long_job}.log" and log_file.read_text().strip()
    name, tar_file = saved["tensorboard"]
    assert name == f"e2e-long-cnn-job{long_job}-tensorboard.tar"
    with tarfile.open(tar_file) as tar:
        events = [n for n in tar.getnames() if "/tensorboard/events.out.tfevents." in n]
    assert events and all(n.startswith(f"job-{long_job}/") for n in events)


def test_cluster_page_shows_nodes_running_and_queue(
    signed_in: Page, stack: Stack, long_job: int
) -> None:
    page = signed_in
    # A worker of all the node's slots cannot start while the long job holds one of them.
    blocked = submit(
        stack,
        job_yaml(
            "mnist1d_mlp", name="e2e-waiting", cluster={"resources": {"slots_per_worker": SLOTS}}
        ),
    )
    try:
        page.goto(stack.url + "/#/cluster")
        node = page.locator("[data-node='node-1']")
        node.wait_for()
        page.locator("#nodes", has_text=f"1 / {SLOTS}").wait_for()
        assert "alive" in node.inner_text()
        running = page.locator("section", has_text="Running").locator("tbody")
        running.locator("tr", has_text=f"#{long_job} e2e-long-cnn").wait_for()
        assert "worker g0 r0" in running.inner_text()
        queued = page.locator("section", has_text="Queue").locator("tbody tr")
        queued.filter(has_text=f"#{blocked} e2e-waiting").wait_for()
        assert queued.first.locator("td").first.inner_text() == "1"
        shoot(page, "cluster", doc=True)
    finally:
        stack.api.post(f"/jobs/{blocked}/cancel")


def test_jobs_table_filters_and_pages(signed_in: Page, stack: Stack, long_job: int) -> None:
    page = signed_in
    page.goto(stack.url + "/#/jobs")
    page.locator(f"tr[data-job='{long_job}']").wait_for()
    shoot(page, "jobs", doc=True)

    # 55 jobs that need all the node's slots wait in the queue while the long job holds one
    # (a job no node could ever hold is refused at submission).
    parked = {"resources": {"slots_per_worker": SLOTS}}
    waiting = [
        submit(stack, job_yaml("mnist1d_mlp", name=f"e2e-parked-{i:02d}", cluster=parked))
        for i in range(55)
    ]
    try:
        page.reload()
        rows = page.locator("tbody tr[data-job]")
        page.locator("tbody", has_text="e2e-parked-54").wait_for()
        assert rows.count() == 50

        page.get_by_role("button", name="Older →").click()
        page.locator(".pager", has_text="page 2").wait_for()
        page.locator("tbody", has_text="e2e-parked-00").wait_for()
        assert page.locator("tbody", has_text="e2e-parked-54").count() == 0

        page.locator("button[data-state='QUEUED']").click()
        page.locator(".pager", has_text="page 1").wait_for()
        page.locator("tbody", has_text="e2e-parked-54").wait_for()
        states = page.locator("tbody tr[data-job] .badge").all_inner_texts()
        assert len(states) == 50 and set(states) == {"queued"}

        page.locator("button[data-state='all']").click()
        page.locator("#job-filter-name").fill("parked-0")
        page.wait_for_function(
            "() => document.querySelectorAll('tbody tr[data-job]').length === 10"
        )
        names = page.locator("tbody .job-name").all_inner_texts()
        assert sorted(names) == [f"e2e-parked-{i:02d}" for i in range(10)]
        shoot(page, "jobs-filtered")
    finally:
        for job_id in waiting:
            stack.api.post(f"/jobs/{job_id}/cancel")


# mnist1d_mlp.yaml (a validation split, early_stop, keep_best) whose rate drops to 1e-9 at step
# 200: its validation accuracy stands still from there, and it stops early.
HELD_OUT_JOB = yaml.safe_dump(
    {
        **yaml.safe_load(MLP),
        "name": "e2e-held-out",
        "train_steps": 3000,
        "disp_freq": 50,
        "validate": {"freq": 50},
        "early_stop": {"patience": 3},
        "updater": {
            "type": "adam",
            "lr": {"base": 0.002, "schedule": "fixed_step", "steps": [200], "values": [1e-9]},
        },
    },
    sort_keys=False,
)


def test_a_job_selected_on_validation_shows_its_objective_best_and_early_stop(
    signed_in: Page, stack: Stack
) -> None:
    page = signed_in
    job_id = submit(stack, HELD_OUT_JOB)
    assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}, timeout=180) == "SUCCEEDED"
    job = stack.api.get(f"/jobs/{job_id}").json()
    assert job["objective"] == "val/accuracy" and job["step"] < 3000
    best = f"{job['best_metric'] * 100:.2f}%"

    page.goto(stack.url + "/#/jobs")
    cell = page.locator(f"tr[data-job='{job_id}'] .best")
    cell.wait_for()
    assert " ".join(cell.inner_text().split()) == f"{best} val/accuracy @{job['best_step']:,}"

    page.goto(f"{stack.url}/#/jobs/{job_id}")
    page.locator("#job-state", has_text="succeeded").wait_for()
    fact = page.locator(".fact", has_text="best val/accuracy")
    fact.wait_for()
    assert best in fact.inner_text()
    # The validation curve joins the accuracy panel.
    page.locator("figure[data-metric='accuracy']", has_text="val/accuracy").wait_for()
    page.get_by_role("tab", name="events").click()
    page.locator("#events li", has_text=f"stopped early at step {job['step']}").wait_for()
    page.get_by_role("tab", name="checkpoints").click()
    marked = page.locator("#checkpoints tr[data-best]")
    marked.wait_for()
    assert marked.get_attribute("data-step") == str(job["best_step"])
    assert marked.locator(".best-badge").inner_text() == "best"
    shoot(page, "job-best-checkpoint")


def test_cancel_a_job(signed_in: Page, stack: Stack, long_job: int) -> None:
    page = signed_in
    page.goto(f"{stack.url}/#/jobs/{long_job}")
    page.locator("#job-state", has_text="running").wait_for()
    # By now the job has a history worth a picture: several evaluations, many training points.
    page.locator("figure[data-metric='accuracy']", has_text="test/accuracy").wait_for()
    shoot(page, "job-charts", doc=True)
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#cancel-job").click()
    page.locator("#job-state", has_text="cancelled").wait_for(timeout=30_000)
    assert stack.api.get(f"/jobs/{long_job}").json()["state"] == "CANCELLED"
    assert page.locator("#cancel-job").count() == 0
    page.get_by_role("tab", name="events").click()
    page.locator("#events li", has_text="cancelled").wait_for()
    shoot(page, "job-cancelled")

    # The job has ended: the logs tab shows exactly what the server stored.
    page.get_by_role("tab", name="logs").click()
    stored = stack.api.get(f"/jobs/{long_job}/logs").json()["lines"]
    page.locator("#logs-note", has_text=f"{len(stored)} lines" if stored else "no log").wait_for()
    shown = page.locator("#logs").inner_text()
    assert all(line["line"] in shown for line in stored)


def test_a_distributed_jobs_charts_have_a_line_per_worker_group(
    signed_in: Page, stack: Stack, long_job: int
) -> None:
    page = signed_in
    # The long job's slot is needed (test_cancel_a_job cancels it when the module runs whole).
    stack.api.post(f"/jobs/{long_job}/cancel")
    wait_for_state(stack, long_job, {"CANCELLED"})
    # Downpour on the node's 3 slots: two worker groups and their server shard.
    downpour = job_yaml("mnist1d_downpour", name="e2e-downpour", train_steps=300, disp_freq=10)
    job_id = submit(stack, downpour)
    page.goto(f"{stack.url}/#/jobs/{job_id}")
    loss = page.locator("figure[data-metric='loss']")
    loss.filter(has_text="group 1").wait_for(timeout=90_000)
    assert "group 0" in loss.inner_text()
    assert wait_for_state(stack, job_id, {"SUCCEEDED", "FAILED"}, timeout=180) == "SUCCEEDED"
    # Each group's one worker is rank 0 of its group, in the training and the PS metrics alike.
    names = {"name": ["train/loss", "ps/version"]}
    series = stack.api.get(f"/jobs/{job_id}/metrics", params=names).json()["series"]
    assert sorted((s["name"], s["group"], s["rank"]) for s in series) == [
        ("ps/version", 0, 0), ("ps/version", 1, 0), ("train/loss", 0, 0), ("train/loss", 1, 0),
    ]  # fmt: skip
    shoot(page, "job-groups")
