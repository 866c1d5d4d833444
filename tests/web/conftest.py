"""The browser tests' stack and browser: Debian's Chromium (headless) against a real
`trainyard up` (Redis, API, scheduler and a node agent with 3 slots, as subprocesses), one stack
for all the browser modules of a run: started by the first, stopped after the last browser test
(each module leaves nothing running behind it). Each test drives the pages a user would and
saves a screenshot under tests/web/screenshots/; with TRAINYARD_DOC_SCREENSHOTS=1 the
documentation's pictures in docs/img/ are refreshed from the same runs (CI leaves the committed
ones alone). Chromium comes from scripts/ensure-apt.sh (`make test` runs it); never from
`playwright install`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, Page, ViewportSize, sync_playwright

from tests.conftest import missing_component

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples"
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
DOC_IMAGES = ROOT / "docs" / "img"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT: ViewportSize = {"width": 1366, "height": 768}
SLOTS = 3  # a distributed job (2 worker groups and a server shard) fits when the node is idle


def job_yaml(example: str, **keys: object) -> str:
    """An example job, its comments and layout kept, with top-level keys set (added if absent)."""
    text = (EXAMPLES / f"{example}.yaml").read_text()
    for key, value in keys.items():
        flow = yaml.safe_dump(value, default_flow_style=True, width=200).removesuffix("\n...\n")
        line = f"{key}: {flow.strip()}"
        text, found = re.subn(rf"^{key}:.*$", line, text, count=1, flags=re.MULTILINE)
        if not found:
            text = f"{text.rstrip()}\n{line}\n"
    job = yaml.safe_load(text)
    assert {key: job[key] for key in keys} == keys, f"could not set {keys} in {example}"
    return text


@dataclass
class Stack:
    url: str
    token: str
    api: httpx.Client
    redis_url: str = ""  # for node agents a test starts beside the stack's own
    data_dir: Path = Path()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stack_env(data_dir: Path) -> dict[str, str]:
    # The stack is our own: no Redis, SQL or other settings leak in from the caller's shell.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRAINYARD_") and k not in ("REDIS_URL", "DATABASE_URL")
    }
    env.update(TRAINYARD_NODE_NAME="node-1", TRAINYARD_NODE_SLOTS=str(SLOTS))
    env["TRAINYARD_DATA_DIR"] = str(data_dir)
    return env


@dataclass
class SharedStack:
    """The one `trainyard up` of the browser tests; `running` starts it when none runs."""

    process: subprocess.Popen[bytes] | None = None
    stack: Stack | None = None

    def running(self, tmp_path_factory: pytest.TempPathFactory) -> Stack:
        if self.stack is None or self.process is None or self.process.poll() is not None:
            self.stop()
            self.start(tmp_path_factory.mktemp("stack"))
        assert self.stack is not None
        return self.stack

    def start(self, data_dir: Path) -> None:
        port = _free_port()
        log_path = data_dir / "up.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "scheduler", "up"),
                    *("--data-dir", str(data_dir), "--port", str(port)),
                ],
                env=stack_env(data_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        stack_file = data_dir / "stack.json"
        deadline = time.monotonic() + 180
        while not stack_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"`trainyard up` did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        info = json.loads(stack_file.read_text())
        api = httpx.Client(
            base_url=f"{info['url']}/api/v1",
            headers={"Authorization": f"Bearer {info['token']}"},
            timeout=30,
        )
        self.process = process
        self.stack = Stack(info["url"], info["token"], api, info["redis_url"], data_dir)

    def stop(self) -> None:
        process, stack = self.process, self.stack
        self.process = self.stack = None
        if stack is not None:
            stack.api.close()
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


SHARED = SharedStack()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Stack:
    if not CHROMIUM.exists():
        missing_component(f"{CHROMIUM} is missing: run scripts/ensure-apt.sh (make test does)")
    if not (ROOT / "web" / "dist" / "index.html").exists():
        pytest.fail("web/dist is missing: build the dashboard with `make web`")
    return SHARED.running(tmp_path_factory)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last browser test (its fixtures torn down), the stack goes: the suite's other
    tests do not share the machine with it."""
    result = yield
    if nextitem is None or not nextitem.path.resolve().is_relative_to(HERE):
        SHARED.stop()
    return result


def pytest_sessionfinish() -> None:
    SHARED.stop()


@pytest.fixture(scope="module")
def browser(stack: Stack) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, stack: Stack) -> Iterator[Page]:
    """A fresh browser context at laptop size; fails the test on any uncaught script error."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"script errors in the page: {errors}"


@pytest.fixture
def signed_in(page: Page, stack: Stack) -> Page:
    page.add_init_script(f"localStorage.setItem('trainyard.token', {json.dumps(stack.token)})")
    return page


def shoot(page: Page, name: str, *, doc: bool = False, full_page: bool = False) -> None:
    """Every test leaves a screenshot; the documentation's pictures come from the same runs.
    `full_page` takes the whole page, not only the 1366x768 viewport."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)
    if doc and os.environ.get("TRAINYARD_DOC_SCREENSHOTS") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOC_IMAGES / f"{name}.png"), full_page=full_page)


def submit(stack: Stack, yaml_text: str) -> int:
    response = stack.api.post(
        "/jobs", content=yaml_text, headers={"Content-Type": "application/yaml"}
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def wait_for_state(stack: Stack, job_id: int, states: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = str(stack.api.get(f"/jobs/{job_id}").json()["state"])
        if state in states:
            return state
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} did not reach {states} in {timeout:.0f}s (now {state})")
