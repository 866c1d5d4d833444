"""What a worker process does first, before any import or allocation of the job's: confine
itself to what its allocation grants.

- Memory: it joins the memory cgroup its node agent made for it (scheduler/agent/confine.py),
  whose limit the kernel enforces by killing this process alone; where the agent could make
  none, it limits its own data segment (RLIMIT_DATA: the heap and every private mapping, which
  is where tensors live) to what it has now plus its `memory_mb`, so that an allocation past
  the limit fails in this process instead of the kernel's OOM killer choosing a neighbour.
- GPUs: CUDA_VISIBLE_DEVICES names the node's GPUs placement gave it alone (none for a job
  without GPUs), set before CUDA starts in this process: inside, its first GPU is cuda:0. The
  fork server never starts CUDA (a CUDA context does not survive a fork), so every forked
  process starts it afresh with its own variable.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from contract.allocation import AllocationInfo

MB = 2**20
# What an allocation past the limit raises, besides MemoryError: torch's CPU allocator.
ALLOCATION_FAILURES = ("can't allocate memory", "DefaultCPUAllocator")


def confine(info: AllocationInfo, cgroup: str) -> str:
    """Apply the allocation's memory limit and GPUs to this process; how, in words."""
    how = []
    if info.devices or not info.gpus:  # (a record from before devices were assigned: as is)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible_devices(info.devices))
        how.append(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}")
    if info.memory_mb <= 0:
        return "; ".join([*how, "no memory limit (its node does not say its memory)"])
    if cgroup:
        (Path(cgroup) / "cgroup.procs").write_text("0")  # "0": the writing process
        how.append(f"memory limit {info.memory_mb} MB (its memory cgroup)")
    else:
        limit = data_segment() + info.memory_mb * MB
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)  # an operator's lower limit stays
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        how.append(f"memory limit {info.memory_mb} MB (RLIMIT_DATA)")
    return "; ".join(how)


def visible_devices(indices: tuple[int, ...]) -> list[str]:
    """The node's GPUs `indices` as CUDA names them for this process: indices among the GPUs
    its agent saw, which an operator may have narrowed with CUDA_VISIBLE_DEVICES itself (the
    agent's second GPU of "2,3" is "3")."""
    seen = [name for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name]
    if seen and all(i < len(seen) for i in indices):
        return [seen[i] for i in indices]
    return [str(i) for i in indices]


def data_segment() -> int:
    """The bytes of this process's data segment now (VmData): a forked process's includes its
    fork server's imports, which the limit comes on top of."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # not Linux: no fork server's pages to add either
        return 0
    for line in status.splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation refused for want of memory."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(word in str(exc) for word in ALLOCATION_FAILURES)
