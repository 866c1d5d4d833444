"""How the workers of one group find each other and form a torch.distributed process group.

Worker rank 0 of the group starts a TCPStore on a free port and publishes its address in Redis
under the job's scope; the other ranks read it there and connect. Tests on one machine may use a
FileStore instead. Each worker group is its own torch.distributed world: groups never exchange
tensors directly (between groups the parameter server carries the updates).
"""

from __future__ import annotations

import gc
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import psutil
import redis
import torch.distributed as dist

from contract.keys import RENDEZVOUS_TTL_SECONDS


class RendezvousError(RuntimeError):
    """The workers of a group did not meet in time."""


@dataclass(frozen=True)
class GroupMember:
    """This process's place in its worker group."""

    rank: int
    world: int
    group: int = 0

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is not in a group of {self.world} workers")


def address_key(scope: str, group: int) -> str:
    """Redis key of a worker group's store address, under the job's scope (Keys.job_scope)."""
    return f"{scope}:rendezvous:group:{group}"


def reachable_address(redis_url: str) -> str:
    """This machine's address on the route to Redis, which the other workers also reach."""
    parsed = urlparse(redis_url)
    host = parsed.hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        # A UDP connect sends nothing; it only asks the kernel which interface would be used.
        probe.connect((host, parsed.port or 6379))
        return str(probe.getsockname()[0])


def redis_store(
    client: redis.Redis,
    scope: str,
    member: GroupMember,
    *,
    advertise: str,
    timeout: float = 300.0,
) -> dist.Store:
    """A TCPStore shared by the group: rank 0 serves it and publishes `host:port` in Redis.

    The other ranks poll for the address and retry the connection, since an address left by an
    earlier placement of the same job may still be there until rank 0 overwrites it.
    """
    key = address_key(scope, member.group)
    limit = timedelta(seconds=timeout)
    if member.rank == 0:
        store = dist.TCPStore(
            "0.0.0.0", 0, member.world, is_master=True, timeout=limit, wait_for_workers=False
        )
        client.set(key, f"{advertise}:{store.port}", ex=RENDEZVOUS_TTL_SECONDS)
        return store
    deadline = time.monotonic() + timeout
    last_error = "no address published yet"
    while time.monotonic() < deadline:
        raw = client.get(key)
        if raw is not None:
            host, _, port = (raw.decode() if isinstance(raw, bytes) else str(raw)).rpartition(":")
            try:
                return dist.TCPStore(
                    host,
                    int(port),
                    member.world,
                    is_master=False,
                    timeout=timedelta(seconds=min(10.0, max(deadline - time.monotonic(), 1.0))),
                )
            except (RuntimeError, ValueError) as exc:  # DistNetworkError derives from RuntimeError
                last_error = f"{host}:{port}: {exc}"
        time.sleep(0.2)
    raise RendezvousError(
        f"worker {member.rank} of group {member.group} found no store from rank 0 within "
        f"{timeout:g} s (key {key}; last: {last_error})"
    )


def file_store(path: Path, member: GroupMember) -> dist.Store:
    """A store in a shared file, for workers on one machine (tests, benchmarks)."""
    return dist.FileStore(str(path), member.world)


def backend_for(device: str) -> str:
    """NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device.startswith("cuda") else "gloo"


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds `address`, if one does."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return None


def use_interface(device: str, address: str) -> None:
    """Make the collectives' transport use the interface of `address` (the one on the route to
    Redis, which the group's other machines reach). Left to itself, gloo binds the address
    the machine's host name resolves to, often 127.0.x.1: fine on one machine, unreachable
    from any other. An operator's own GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME is kept."""
    name = interface_of(address)
    if name is not None:
        variable = "NCCL_SOCKET_IFNAME" if backend_for(device) == "nccl" else "GLOO_SOCKET_IFNAME"
        # Read by gloo and NCCL themselves when the process group is made; not a setting of ours.
        os.environ.setdefault(variable, name)


def join_group(
    store: dist.Store,
    member: GroupMember,
    *,
    device: str = "cpu",
    timeout: float | None = None,
    address: str | None = None,
) -> None:
    """Make this process a member of its group's default process group.

    `timeout` bounds every collective (default torch's: 30 min for gloo, 10 for NCCL), so it
    must outlast the longest a worker can wait for its peers, e.g. rank 0 saving a checkpoint.
    `address` is this machine's address the other members reach (`reachable_address`).
    """
    if address is not None:
        use_interface(device, address)
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=member.rank,
        world_size=member.world,
        timeout=None if timeout is None else timedelta(seconds=timeout),
    )


def leave_group(client: redis.Redis | None = None, scope: str = "", group: int = 0) -> None:
    """Tear the process group down; rank 0 also withdraws the published address. What the
    caller let go of that holds the group (a DDP wrapper, in reference cycles) is freed first,
    so that its gloo threads end with the group, not at the process's exit (SIGABRT)."""
    if dist.is_initialized():
        if client is not None and dist.get_rank() == 0:
            client.delete(address_key(scope, group))
        gc.collect()
        dist.destroy_process_group()
