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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pytest

from scheduler.cli.stack import read_stack_file
from tests.conftest import ROOT, clean_env
from tests.trainyard.test_cli_client import run, submitted_id
from trainyard import Client
from trainyard.models import NodeOut

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

PLUGIN = ROOT / "tests" / "fixtures" / "plugin_dist" / "trainyard_rmsnorm.py"
BROKEN = "aaa-broken"  # first by name: placement's tie-break would pick it
PLAIN = "aaa-plain"  # before the plugin node by name
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


@dataclass
class PluginStack:
    stack: RunningStack
    broken: subprocess.Popen[bytes]  # the agent whose plugin fails
    broken_log: Path


@pytest.fixture(scope="module")
def plugin_stack(stack_factory: Callable[..., RunningStack]) -> Iterator[PluginStack]:
    stack = stack_factory(
        env={"TRAINYARD_PLUGINS": str(PLUGIN), "TRAINYARD_NODE_NAME": WITH_PLUGIN}
    )
    found = read_stack_file(stack.data_dir / "stack.json")
    assert found is not None
    broken_plugin = stack.data_dir.parent / "broken_layers.py"
    broken_plugin.write_text('raise RuntimeError("this plugin is broken on purpose")\n')
    env = clean_env(TRAINYARD_DATA_DIR=str(stack.data_dir), REDIS_URL=found.redis_url)
    agents: list[tuple[subprocess.Popen[bytes], BinaryIO]] = []
    for name, plugins in ((PLAIN, ""), (BROKEN, str(broken_plugin))):
        log = (stack.data_dir.parent / f"{name}.log").open("wb")
        agent = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "node", "--name", name, "--slots", "2"],
            cwd=ROOT,
            env={**env, "TRAINYARD_PLUGINS": plugins},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        agents.append((agent, log))
    try:
        yield PluginStack(stack, agents[1][0], stack.data_dir.parent / f"{BROKEN}.log")
    finally:
        for agent, _ in agents:
            if agent.poll() is None:
                os.kill(agent.pid, signal.SIGTERM)
        for agent, log in agents:
            agent.wait(timeout=30)
            log.close()


def _nodes(stack: RunningStack) -> dict[str, NodeOut]:
    with Client(stack.url, stack.token) as client:
        return {node.name: node for node in client.cluster().nodes}


def _all_nodes(stack: RunningStack) -> dict[str, NodeOut]:
    deadline = time.monotonic() + 60
    while len(nodes := _nodes(stack)) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    return nodes


def test_a_plugin_job_runs_only_where_the_plugin_is(
    plugin_stack: PluginStack, tmp_path: Path
) -> None:
    nodes = _all_nodes(plugin_stack.stack)
    assert {name: node.plugins for name, node in nodes.items()} == {
        BROKEN: {},
        PLAIN: {},
        WITH_PLUGIN: {"trainyard_rmsnorm": ""},
    }  # a file: no distribution's version
    stack = plugin_stack.stack

    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    result = run(stack, "submit", str(job), "--follow")
    assert result.exit_code == 0, result.output
    job_id = submitted_id(result)
    with Client(stack.url, stack.token) as client:
        detail = client.get_json(f"/jobs/{job_id}")
        events = client.get_json(f"/jobs/{job_id}/events")
    assert detail["state"] == "SUCCEEDED"
    # both workers placed on the node that has the plugin: "placed on <node> (2)"
    placed = [e["reason"] for e in events if e["state"] == "SCHEDULED"]
    assert placed == [f"placed on {WITH_PLUGIN} (2)"], events


PLAIN_JOB = """\
name: plain
data: {source: synthetic, task: classification, num_samples: 64, num_features: 8, batch_size: 16}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: out, type: dense, srclayers: [data]}
    - {name: loss, type: softmax_loss, srclayers: [out]}
updater: {type: sgd, lr: {base: 0.01}}
train_steps: 4
"""


def test_an_agent_whose_plugin_fails_registers_the_error_and_takes_no_job(
    plugin_stack: PluginStack, tmp_path: Path
) -> None:
    stack = plugin_stack.stack
    nodes = _all_nodes(stack)
    error = nodes[BROKEN].plugin_error
    assert error is not None and error.startswith("plugin broken_layers ("), error
    assert error.endswith("failed to load: RuntimeError: this plugin is broken on purpose")
    assert nodes[BROKEN].state == "ALIVE"  # heartbeating: its card stays, with the error
    assert nodes[PLAIN].plugin_error is None and nodes[WITH_PLUGIN].plugin_error is None
    assert plugin_stack.broken.poll() is None  # the agent did not stop

    job = tmp_path / "plain.yaml"
    job.write_text(PLAIN_JOB)
    result = run(stack, "submit", str(job), "--follow")
    assert result.exit_code == 0, result.output
    with Client(stack.url, stack.token) as client:
        events = client.get_json(f"/jobs/{submitted_id(result)}/events")
    # aaa-broken, first by name and as free as aaa-plain, would take it were it not skipped
    placed = [e["reason"] for e in events if e["state"] == "SCHEDULED"]
    assert placed == [f"placed on {PLAIN} (1)"], events

    # stopped, it leaves the cluster as any agent does
    plugin_stack.broken.send_signal(signal.SIGTERM)
    assert plugin_stack.broken.wait(timeout=30) == 0
    assert "this plugin is broken on purpose" in plugin_stack.broken_log.read_text()
    deadline = time.monotonic() + 30
    while BROKEN in (nodes := _nodes(stack)) and nodes[BROKEN].state == "ALIVE":
        assert time.monotonic() < deadline, nodes[BROKEN]
        time.sleep(0.5)
