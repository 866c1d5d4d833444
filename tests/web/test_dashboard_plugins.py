"""The cluster page's plugins in a real browser against a real `trainyard up`: a second node
agent beside the stack's, given a plugin of an installed distribution (version 1.2) and then a
plugin that raises at import, shows the first as name@version on its node card and the second's
error, and the stack's own node shows no plugins."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page

from tests.web.conftest import ROOT, Stack, shoot, stack_env

pytestmark = pytest.mark.e2e

NODE = "node-plugins"
BROKEN = "this plugin is broken on purpose"


def plugin_path(where: Path) -> Path:
    """A folder holding `good_layers` of the distribution good-layers 1.2, and a broken .py."""
    (where / "good_layers.py").write_text('"""A plugin that registers nothing."""\n')
    info = where / "good_layers-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: good-layers\nVersion: 1.2\n")
    (info / "top_level.txt").write_text("good_layers\n")
    (where / "broken_layers.py").write_text(f"raise RuntimeError({BROKEN!r})\n")
    return where


@pytest.fixture
def plugin_node(stack: Stack, tmp_path: Path) -> Iterator[None]:
    where = plugin_path(tmp_path)
    env = {
        **stack_env(stack.data_dir),
        "REDIS_URL": stack.redis_url,
        "PYTHONPATH": str(where),
        "TRAINYARD_PLUGINS": f"good_layers,{where / 'broken_layers.py'}",
    }
    with (tmp_path / "agent.log").open("wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "node", "--name", NODE, "--slots", "1"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0, (tmp_path / "agent.log").read_text()


def test_cluster_page_shows_each_nodes_plugins_and_a_plugin_error(
    signed_in: Page, stack: Stack, plugin_node: None
) -> None:
    page = signed_in
    page.goto(stack.url + "/#/cluster")
    card = page.locator(f"[data-node='{NODE}']")
    card.locator(".plugin-error").wait_for()
    assert card.locator(".plugins").inner_text() == "plugins: good_layers@1.2"
    error = card.locator(".plugin-error").inner_text()
    assert error.startswith("takes no jobs: plugin broken_layers ("), error
    assert error.endswith(f"failed to load: RuntimeError: {BROKEN}"), error
    own = page.locator("[data-node='node-1']")
    assert own.locator(".plugins").count() == 0 and own.locator(".plugin-error").count() == 0
    shoot(page, "cluster-plugins")
