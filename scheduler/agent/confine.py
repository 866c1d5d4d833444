"""A memory cgroup per worker process, made by its node agent where the machine lets it.

Each allocation gets a cgroup of its own below the agent's, `trainyard-<node>-<agent pid>/
alloc-<id>` (the agent's pid: two stacks on one machine may number their allocations alike), its
limit the allocation's `memory_mb`: v1's `memory.limit_in_bytes` where the memory controller
is mounted on its own (/sys/fs/cgroup/memory), else v2's `memory.max` where the agent's cgroup
may give its children the memory controller. The worker process joins it before it does
anything else (workers/confine.py; the agent moves it there too once it knows its pid), so
only that process is killed when it passes its limit: its neighbours on the node, the fork
server and the agent are not. The kernel counts such kills (`oom_kill`), which is how the agent
tells an out-of-memory death from another SIGKILL.

Where no cgroup can be made (no controller, no right to write it), `find` answers None and the
worker limits itself with RLIMIT_DATA instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("trainyard.agent")

CGROUP_ROOT = Path("/sys/fs/cgroup")
MB = 2**20


@dataclass(frozen=True)
class MemoryCgroups:
    """Where this agent makes its processes' memory cgroups."""

    base: Path  # the agent's folder of cgroups: trainyard-<node> below its own cgroup
    version: int  # 1 or 2

    @classmethod
    def find(cls, node: str, *, root: Path = CGROUP_ROOT) -> MemoryCgroups | None:
        """The agent's folder of cgroups, made now; None where the machine does not let it."""
        own = _own_cgroups()
        name = f"trainyard-{re.sub(r'[^A-Za-z0-9_.-]', '_', node)}-{os.getpid()}"
        if "memory" in own and (root / "memory").is_dir():
            found = cls(root / "memory" / own["memory"].lstrip("/") / name, 1)
        elif "" in own and (root / "cgroup.controllers").is_file():
            found = cls(root / own[""].lstrip("/") / name, 2)
        else:
            return None
        try:
            _remove_stale(found.base.parent)
            found.base.mkdir(exist_ok=True)
            if found.version == 2:
                _enable_memory(found.base)
            probe = found.make("probe", 64)
            found.remove(probe)
        except OSError as exc:
            log.info("no memory cgroups here (%s): workers limit themselves (RLIMIT_DATA)", exc)
            return None
        return found

    def make(self, name: str, limit_mb: int) -> Path:
        """A cgroup limited to `limit_mb` (no swap beyond it); OSError if it cannot be."""
        path = self.base / name
        path.mkdir(exist_ok=True)
        limit = str(limit_mb * MB)
        if self.version == 1:
            (path / "memory.limit_in_bytes").write_text(limit)
            swap = path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory and swap together: no more than the limit either
                with contextlib.suppress(OSError):
                    swap.write_text(limit)
        else:
            (path / "memory.max").write_text(limit)
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0")
        return path

    def add(self, path: Path, pid: int) -> None:
        """Move process `pid` into the cgroup (a process already there stays)."""
        (path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self, path: Path) -> int:
        """How many processes the kernel killed in the cgroup for passing its limit."""
        events = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (path / events).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def close(self) -> None:
        """Remove the agent's folder, once its processes' cgroups are gone."""
        self.remove(self.base)

    def remove(self, path: Path) -> None:
        """Remove the cgroup once its processes are gone (a cgroup is a folder to rmdir)."""
        with contextlib.suppress(OSError):
            path.rmdir()


def _remove_stale(parent: Path) -> None:
    """The folders of agents that died without removing theirs (killed): empty by now."""
    for folder in parent.glob("trainyard-*-*"):
        pid = folder.name.rsplit("-", 1)[1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for child in folder.glob("alloc-*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller ("" for v2's unified hierarchy)."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            found[controller] = path
    return found


def _enable_memory(base: Path) -> None:
    """v2: the memory controller for `base`'s children (its parent must have delegated it)."""
    if "memory" not in (base.parent / "cgroup.subtree_control").read_text().split():
        (base.parent / "cgroup.subtree_control").write_text("+memory")
    if "memory" not in (base / "cgroup.subtree_control").read_text().split():
        (base / "cgroup.subtree_control").write_text("+memory")
