"""A plugin job through the whole service: `trainyard up` with TRAINYARD_PLUGINS naming the
example plugin (docs/plugins.md) loads it in its API, scheduler and node agent; a second node
agent started without it reports no plugins, and the job, which would go to that node by
name otherwise, runs only on the node that has the plugin."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scheduler.cli.stack import read_stack_file
from tests.conftest import ROOT, clean_env
from tests.trainyard.test_cli_client import run, submitted_id
from trainyard import Client

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

PLUGIN = ROOT / "tests" / "fixtures" / "plugin_dist" / "trainyard_rmsnorm.py"
PLAIN = "aaa-plain"  # first by name: placement's tie-break would pick it
WITH_PLUGIN = "zzz-plugin"

JOB = """\
name: rmsnorm-allreduce
data: {source: synthetic, task: classification, num_samples: 128, num_features: 8, batch_size: 16}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc, type: dense, srclayers: [data], units: 16}
    - {name: norm, type: rmsnorm, srclayers: [fc], eps: 0.0001}
    - {name: out, type: dense, srclayers: [norm]}
    - {name: loss, type: softmax_loss, srclayers: [out]}
updater: {type: signsgd, momentum: 0.5, lr: {base: 0.01}}
train_steps: 6
disp_freq: 3
cluster: {framework: allreduce, nworkers_per_group: 2}
"""


@pytest.fixture(scope="module")
def plugin_stack(stack_factory: Callable[..., RunningStack]) -> Iterator[RunningStack]:
    stack = stack_factory(
        env={"TRAINYARD_PLUGINS": str(PLUGIN), "TRAINYARD_NODE_NAME": WITH_PLUGIN}
    )
    found = read_stack_file(stack.data_dir / "stack.json")
    assert found is not None
    env = clean_env(TRAINYARD_DATA_DIR=str(stack.data_dir), REDIS_URL=found.redis_url)
    log = (stack.data_dir.parent / "plain-agent.log").open("wb")
    agent = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "worker", "--name", PLAIN, "--slots", "2"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield stack
    finally:
        os.kill(agent.pid, signal.SIGTERM)
        agent.wait(timeout=30)
        log.close()


def _nodes(stack: RunningStack) -> dict[str, dict[str, str]]:
    with Client(stack.url, stack.token) as client:
        return {node.name: node.plugins for node in client.cluster().nodes}


def test_a_plugin_job_runs_only_where_the_plugin_is(
    plugin_stack: RunningStack, tmp_path: Path
) -> None:
    deadline = time.monotonic() + 60
    while len(nodes := _nodes(plugin_stack)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert nodes == {
        PLAIN: {},
        WITH_PLUGIN: {"trainyard_rmsnorm": ""},
    }  # a file: no distribution's version

    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    result = run(plugin_stack, "submit", str(job), "--follow")
    assert result.exit_code == 0, result.output
    job_id = submitted_id(result)
    with Client(plugin_stack.url, plugin_stack.token) as client:
        detail = client.get_json(f"/jobs/{job_id}")
        events = client.get_json(f"/jobs/{job_id}/events")
    assert detail["state"] == "SUCCEEDED"
    # both workers placed on the node that has the plugin: "placed on <node> (2)"
    placed = [e["reason"] for e in events if e["state"] == "SCHEDULED"]
    assert placed == [f"placed on {WITH_PLUGIN} (2)"], events
