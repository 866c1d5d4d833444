"""The harness leaves nothing behind: its namespaces, bridge, links and every process on its
hosts are gone after it ends, also when the body raised, and `clean` removes what a harness
killed outright left."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from scripts.testhosts import PREFIX, Network, clean_stale

pytestmark = [pytest.mark.hosts, pytest.mark.usefixtures("needs_namespaces")]


def leftovers(tag: str) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in (netns + links).splitlines() if tag in line]


def dead_pid() -> int:
    """A process id no process can have: above the kernel's pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def test_a_network_that_raised_leaves_no_namespace_link_or_process(tmp_path: Path) -> None:
    network = Network(["a", "b"])
    with pytest.raises(RuntimeError, match="the body failed"):
        network.create()
        try:
            b = network.hosts["b"]
            sleeper = network.spawn(b, ["sleep", "600"], {}, tmp_path / "b.log")
            deadline = time.monotonic() + 10
            while not network.pids(b) and time.monotonic() < deadline:
                time.sleep(0.05)  # `ip netns exec` enters the namespace, then execs sleep
            assert network.pids(b) == [sleeper.pid]
            raise RuntimeError("the body failed")
        finally:
            network.destroy()
    assert sleeper.wait(timeout=10) == -9
    assert leftovers(network.tag) == []


def test_clean_removes_what_a_killed_harness_left() -> None:
    orphan = Network(["a"], tag=f"{PREFIX}{dead_pid()}")
    orphan.create()
    assert leftovers(orphan.tag)
    removed = clean_stale()
    assert f"{orphan.tag}-a" in removed and f"{orphan.tag}b" in removed
    assert leftovers(orphan.tag) == []
