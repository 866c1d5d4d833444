"""Test hosts on one machine: network namespaces joined by veth pairs to a private bridge.

A head host runs the broker Redis, the API server and the scheduler; node hosts run
`trainyard node`; an optional parameter-server host runs a second Redis. Each process is
started with the commands and environment variables of docs/operations.md ("Across
machines"), which tests/hosts/test_operations_steps.py keeps in step. The machine itself
(the bridge's address) plays the user's laptop: it reaches the API over the bridge.

    python scripts/testhosts.py up [--nodes 2] [--slots 2] [--bandwidth 100mbit]
    python scripts/testhosts.py clean    # what a killed harness left behind

`up` prints the API's address and a token, then serves until Ctrl-C, and tears everything
down: processes, namespaces, links. Needs root and iproute2 (`ip`, `tc`).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "tyh"  # every namespace, bridge and link made here: tyh<pid>...
STALE = re.compile(rf"^{PREFIX}(\d+)")
_NETWORKS = itertools.count()


class HostsError(RuntimeError):
    """A host could not be made, or a command run on it failed."""


def unavailable() -> str | None:
    """Why test hosts cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"test hosts need iproute2's `{tool}`"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise HostsError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_netns(netns: str) -> None:
    for raw in subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True
    ).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(raw), signal.SIGKILL)


def clean_stale() -> list[str]:
    """Remove the namespaces and links of harnesses whose process is gone; their names."""
    removed: list[str] = []
    for line in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True
    ).stdout.split("\n"):
        name = line.split(" ")[0]
        found = STALE.match(name)
        if found and not _alive(int(found.group(1))):
            _kill_netns(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(name)
    for line in sh("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        found = STALE.match(name)
        if found and not _alive(int(found.group(1))):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
            removed.append(name)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.213.0.0/16 that no route or address of this machine uses."""
    used = sh("ip", "-4", "route", "show") + sh("ip", "-4", "-o", "addr", "show")
    taken = [
        ipaddress.ip_network(m, strict=False)
        for m in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", used)
    ]
    start = os.getpid() % 250
    for offset in range(250):
        subnet = ipaddress.ip_network(f"10.213.{(start + offset) % 250}.0/24")
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise HostsError("no free /24 under 10.213.0.0/16 for the test hosts")


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    link: str  # the bridge end of its veth pair (the host's end is eth0 in its namespace)
    address: str


@dataclass
class Network:
    """A bridge with an address of this machine, and one namespace per host on it."""

    names: Sequence[str]
    # Unique per network (the process id, then a count): links' names stay within 15 bytes.
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{next(_NETWORKS)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    gateway: str = ""

    def create(self) -> None:
        clean_stale()
        subnet = _free_subnet()
        addresses = list(subnet.hosts())
        self.bridge, self.gateway = f"{self.tag}b", str(addresses[0])
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for index, name in enumerate(self.names):
                host = Host(
                    name, f"{self.tag}-{name}", f"{self.tag}v{index}", str(addresses[index + 1])
                )
                sh("ip", "netns", "add", host.netns)
                self.hosts[name] = host
                sh(
                    "ip",
                    "link",
                    "add",
                    host.link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    host.netns,
                )
                sh("ip", "link", "set", host.link, "master", self.bridge, "up")
                self.exec(host, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
                self.exec(host, "ip", "link", "set", "eth0", "up")
                self.exec(host, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise

    def exec(self, host: Host, *argv: str) -> str:
        return sh("ip", "netns", "exec", host.netns, *argv)

    def spawn(
        self, host: Host, argv: Sequence[str], env: dict[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """A process on `host`, in a session of its own, its output appended to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:
            return subprocess.Popen(
                ["ip", "netns", "exec", host.netns, *argv],
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def pids(self, host: Host) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill(self, host: Host) -> None:
        """SIGKILL every process on the host: the machine loses power."""
        _kill_netns(host.netns)

    def set_link(self, host: Host, *, up: bool) -> None:
        """Cut the host off the network (its cable pulled), or plug it back in."""
        sh("ip", "link", "set", host.link, "up" if up else "down")

    def limit(self, rate: str | None) -> None:
        """Limit every host's link to `rate` (tc's units: 100mbit, 1gbit) both ways, or lift it."""
        for host in self.hosts.values():
            # The bridge end shapes what the host receives; eth0 in its namespace what it sends.
            for runner, device in ((sh, host.link), (self._on(host), "eth0")):
                if rate is None:
                    with contextlib.suppress(HostsError):
                        runner("tc", "qdisc", "del", "dev", device, "root")
                    continue
                # tbf's bucket must hold at least one timer tick of the rate; 64 kB at least.
                burst = max(_bits(rate) // 8 // 250, 64 * 1024)
                runner(
                    *("tc", "qdisc", "replace", "dev", device, "root", "tbf"),
                    *("rate", rate, "burst", str(burst), "latency", "100ms"),
                )

    def _on(self, host: Host) -> Callable[..., str]:
        return lambda *argv: self.exec(host, *argv)

    def block(self, host: Host, address: str) -> None:
        """From `host`, make `address` unreachable (a route that refuses it)."""
        self.exec(host, "ip", "route", "add", "unreachable", f"{address}/32")

    def unblock(self, host: Host, address: str) -> None:
        self.exec(host, "ip", "route", "del", "unreachable", f"{address}/32")

    def destroy(self) -> None:
        for host in self.hosts.values():
            _kill_netns(host.netns)
        for host in self.hosts.values():
            deadline = time.monotonic() + 10
            while self.pids(host) and time.monotonic() < deadline:
                time.sleep(0.05)
            # Deleting one end of a veth pair deletes both; left to the namespace's end, the
            # kernel does it only once the last process in it has gone.
            subprocess.run(["ip", "link", "del", host.link], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.hosts.clear()


def _bits(rate: str) -> int:
    found = re.fullmatch(r"(\d+)([kmg]?)bit", rate.lower())
    if not found:
        raise HostsError(f"bandwidth {rate!r}: expected tc units such as 100mbit or 1gbit")
    return int(found.group(1)) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[found.group(2)]


# -- the platform on the hosts, as docs/operations.md ("Across machines") sets it up ------------

PASSWORD = "hosts-secret"  # the Redis password on the harness's private bridge
REDIS_PORT = 6379
API_PORT = 8000
# Short beats and timeouts, so that a host cut off is noticed in seconds, not minutes.
TIMINGS = {
    "TRAINYARD_HEARTBEAT_SECONDS": "0.5",
    "TRAINYARD_NODE_TIMEOUT_SECONDS": "6",
    "TRAINYARD_SCHEDULE_SECONDS": "0.2",
    "TRAINYARD_RESTART_POINT_SECONDS": "1",
}
CONSOLE = str(Path(sys.executable).with_name("trainyard"))
# The variables docs/operations.md ("Across machines") has operators export on node hosts, and
# on the API host (tests/hosts/test_operations_steps.py holds the two in step).
NODE_VARIABLES = ("REDIS_URL", "REDIS_PS_URLS", "TRAINYARD_DATA_DIR")
HEAD_VARIABLES = ("DATABASE_URL", *NODE_VARIABLES)


def api_command() -> list[str]:
    return [CONSOLE, "api", "--host", "0.0.0.0", "--port", str(API_PORT), "--workers", "1"]


def scheduler_command() -> list[str]:
    return [CONSOLE, "scheduler"]


def worker_command(name: str, slots: int) -> list[str]:
    return [CONSOLE, "node", "--name", name, "--slots", str(slots), "--gpus", "0"]


@dataclass
class Cluster:
    """The platform running on test hosts; `url` and `token` are the user's."""

    network: Network
    work: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""
    token: str = ""

    @property
    def head(self) -> Host:
        return self.network.hosts["head"]

    @property
    def data_dir(self) -> Path:
        return self.work / "data"  # the shared data directory (every namespace sees the disk)

    def redis_url(self, host: str = "head") -> str:
        return f"redis://:{PASSWORD}@{self.network.hosts[host].address}:{REDIS_PORT}/0"

    def ps_urls(self) -> str:
        ps = [name for name in self.network.hosts if name.startswith("ps-")]
        return ",".join(self.redis_url(name) for name in ps) or self.redis_url()

    def variables(self) -> dict[str, str]:
        """What docs/operations.md has operators export on every host (node hosts: these;
        the API host: these and DATABASE_URL)."""
        values = (self.redis_url(), self.ps_urls(), str(self.data_dir))
        return dict(zip(NODE_VARIABLES, values, strict=True))

    def env(self, **extra: str) -> dict[str, str]:
        """A node host's environment: nothing of ours inherited, the documented variables."""
        drop = ("TRAINYARD_", "REDIS_", "DATABASE_URL")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        return {**env, **self.variables(), **TIMINGS, **extra}

    def head_env(self) -> dict[str, str]:
        return self.env(DATABASE_URL=f"sqlite:///{self.data_dir / 'trainyard.db'}")

    def spawn(self, host: str, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        log = self.work / "logs" / f"{name}.log"
        self.processes[name] = self.network.spawn(self.network.hosts[host], argv, env, log)

    def start_redis(self, host: str, *, persist: bool) -> None:
        """The stack's Redis server (the bundled Valkey: scheduler/cli/redis_server.py) on
        `host`'s address, with a password (and an append-only file)."""
        from scheduler.cli.redis_server import redis_binary

        directory = self.work / f"redis-{host}"
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "redis.conf"
        config.write_text(f"requirepass {PASSWORD}\n")
        config.chmod(0o600)
        address = self.network.hosts[host].address
        argv = [redis_binary(), str(config)]
        argv += ["--bind", address, "--port", str(REDIS_PORT), "--dir", str(directory)]
        argv += ["--appendonly", "yes" if persist else "no", "--save", ""]
        self.spawn(host, f"redis-{host}", argv, self.env())
        self.wait_for(f"Redis on {host}", lambda: _redis_answers(address))

    def start_head(self) -> None:
        self.start_redis("head", persist=True)
        self.spawn("head", "api", api_command(), self.head_env())
        self.url = f"http://{self.head.address}:{API_PORT}"
        self.wait_for("the API server", lambda: _http_ok(f"{self.url}/healthz"))
        self.spawn("head", "scheduler", scheduler_command(), self.head_env())
        created = subprocess.run(
            [CONSOLE, "admin", "create-user", "alice"],
            env=self.head_env(),
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if created.returncode != 0:
            raise HostsError(f"trainyard admin create-user failed: {created.stderr}")
        self.token = created.stdout.strip().splitlines()[-1]

    def start_node(self, name: str, slots: int) -> None:
        self.spawn(name, name, worker_command(name, slots), self.env())

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 120.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if check():
                return time.monotonic() - started
            time.sleep(0.2)
        raise HostsError(f"timed out after {timeout:g} s waiting for {what}\n{self.logs()}")

    def logs(self, tail: int = 2500) -> str:
        parts = []
        for log in sorted((self.work / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)


def _redis_answers(address: str) -> bool:
    import redis

    try:
        return bool(redis.Redis(host=address, port=REDIS_PORT, password=PASSWORD).ping())
    except redis.RedisError:
        return False


def _http_ok(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running_cluster(
    work: Path, *, nodes: int = 2, slots: int = 2, ps_hosts: int = 0
) -> Iterator[Cluster]:
    """Hosts `head`, `node-1`..`node-N` (and `ps-1`.. with a Redis each), the platform started
    on them; everything is torn down on exit, also when the body raises."""
    names = ["head", *(f"node-{n}" for n in range(1, nodes + 1))]
    names += [f"ps-{n}" for n in range(1, ps_hosts + 1)]
    network = Network(names)
    network.create()
    cluster = Cluster(network, work)
    try:
        for name in names:
            if name.startswith("ps-"):
                cluster.start_redis(name, persist=False)
        cluster.start_head()
        for n in range(1, nodes + 1):
            cluster.start_node(f"node-{n}", slots)
        yield cluster
    finally:
        network.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make the hosts, start the platform, serve until Ctrl-C")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--slots", type=int, default=2)
    up.add_argument("--ps-hosts", type=int, default=0)
    up.add_argument("--bandwidth", default=None, help="limit each link, e.g. 100mbit")
    up.add_argument("--work", type=Path, default=None, help="[default: a new temporary folder]")
    sub.add_parser("clean", help="remove what a killed harness left behind")
    args = parser.parse_args()
    if args.command == "clean":
        print("\n".join(clean_stale()) or "nothing to clean")
        return
    reason = unavailable()
    if reason:
        sys.exit(f"error: {reason}")
    work = args.work or Path(tempfile.mkdtemp(prefix="trainyard-hosts-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with running_cluster(work, nodes=args.nodes, slots=args.slots, ps_hosts=args.ps_hosts) as c:
        c.network.limit(args.bandwidth)
        for host in c.network.hosts.values():
            print(f"{host.name:8} {host.address:15} netns {host.netns}")
        print(f"\nAPI: {c.url}\ntoken: {c.token}\nlogs: {work / 'logs'}")
        print(f"try: trainyard login {c.url} --token {c.token}  (Ctrl-C tears it all down)")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
