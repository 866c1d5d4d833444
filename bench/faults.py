"""A fault campaign: real service processes killed at random points of running jobs, counted.

For each kind of fault, `--rounds` times: submit examples/digits_mlp.yaml (`--steps` steps,
2000 by default, metrics every 50), wait until it has trained a random fraction of its steps
(10% to 80%), inject the fault, and wait for the job to end. Each row of the table says how
often the fault was injected, at which steps, how the jobs ended, how many steps were trained
again (the restart point's distance to where the job was) and how many steps were reported
missing or twice (both must be 0).

    .venv/bin/python bench/faults.py --rounds 3 [--seed 0] [--restart-interval 300 1]
        [--json out.json]

`--restart-interval` sets the service's restart_point_seconds, the one setting that decides how
far a restarted job goes back: by default the service's own default (300 s), under which a job
of this length saves no restart point and a fault retrains it from step 0; several values run
the campaign once each. (docs/reliability.md's first campaign ran at 1 s without saying so.)

docs/reliability.md records the runs. Every kind is also one test of tests/scheduler/test_faults.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import select

from bench import smoke
from contract.settings import Settings
from harness.service_cluster import Cluster, start_cluster, stop_cluster, stop_process
from scheduler.cli.redis_server import RedisServer
from scheduler.store.models import Metric
from scheduler.store.states import JobState

EVERY = 50
AGAIN = re.compile(r"\((\d+) steps to train again\)")


@dataclass
class Row:
    fault: str
    injected: int = 0
    at_steps: list[int] = field(default_factory=list)
    succeeded: int = 0
    restarts: int = 0
    steps_again: int = 0
    missing: int = 0
    duplicated: int = 0


def worker_sigkill(cluster: Cluster, job_id: int, server: RedisServer) -> None:
    alloc = [a for a, _ in cluster.allocations(job_id) if a.role == "worker"][-1]
    os.kill(cluster.pid(alloc.id), signal.SIGKILL)


def agent_sigkill(cluster: Cluster, job_id: int, server: RedisServer) -> None:
    _, node = cluster.allocations(job_id)[-1]
    os.kill(cluster.agents[node].pid, signal.SIGKILL)
    cluster.agents[node].wait()
    cluster.start_agent(node, slots=2)


def agent_sigterm(cluster: Cluster, job_id: int, server: RedisServer) -> None:
    _, node = cluster.allocations(job_id)[-1]
    stop_process(cluster.agents[node])
    cluster.start_agent(node, slots=2)


def scheduler_sigkill(cluster: Cluster, job_id: int, server: RedisServer) -> None:
    os.killpg(cluster.agents["scheduler"].pid, signal.SIGKILL)
    cluster.agents["scheduler"].wait()
    cluster.start_scheduler()


def redis_restart(cluster: Cluster, job_id: int, server: RedisServer) -> None:
    server.stop()
    time.sleep(3.0)
    server.start()


Fault = Callable[[Cluster, int, RedisServer], None]
FAULTS: dict[str, tuple[Fault, dict[str, object]]] = {
    "worker process SIGKILL (local job)": (worker_sigkill, {}),
    "worker process SIGKILL (allreduce, 2 workers)": (
        worker_sigkill,
        {"cluster.framework": "allreduce", "cluster.nworkers_per_group": 2},
    ),
    "worker process SIGKILL (downpour: restarts alone)": (
        worker_sigkill,
        {"cluster.framework": "downpour"},
    ),
    "node agent SIGKILL, started again": (agent_sigkill, {}),
    "node agent SIGTERM (drain), started again": (agent_sigterm, {}),
    "scheduler SIGKILL, started again": (scheduler_sigkill, {}),
    "Redis restarted empty (3 s down)": (redis_restart, {}),
}


def one_round(
    cluster: Cluster,
    server: RedisServer,
    row: Row,
    fault: Fault,
    overrides: dict[str, object],
    steps: int,
) -> None:
    at = random.randint(steps // 10, steps * 8 // 10) // EVERY * EVERY
    job_id = cluster.submit(train_steps=steps, disp_freq=EVERY, **overrides)
    cluster.wait_for(f"job {job_id} at step {at}", lambda: cluster.job(job_id).step >= at)
    row.injected += 1
    row.at_steps.append(cluster.job(job_id).step)
    fault(cluster, job_id, server)
    cluster.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=300)
    job = cluster.job(job_id)
    row.succeeded += job.state == JobState.SUCCEEDED
    row.restarts += job.restarts
    for state, reason in cluster.events(job_id):
        found = AGAIN.search(reason) if state == "QUEUED" else None
        row.steps_again += int(found.group(1)) if found else 0
    expected = set(range(EVERY, steps + 1, EVERY))
    for steps in worker_steps(cluster, job_id).values():  # every worker reports every 50 steps
        row.missing += len(expected - set(steps))
        row.duplicated += len(steps) - len(set(steps))


def worker_steps(cluster: Cluster, job_id: int) -> dict[tuple[int, int], list[int]]:
    """The steps each worker (group, rank) reported train/loss at."""
    with cluster.db.session() as session:
        rows = session.execute(
            select(Metric.group, Metric.rank, Metric.step).where(
                Metric.job_id == job_id, Metric.name == "train/loss"
            )
        ).all()
    found: dict[tuple[int, int], list[int]] = {}
    for group, rank, step in rows:
        found.setdefault((group, rank), []).append(step)
    return found


def campaign(
    rounds: int, workdir: Path, restart_interval: float, steps: int, kinds: list[str]
) -> list[Row]:
    server = RedisServer(workdir / "redis", persist=False, password="campaign")
    cluster = start_cluster(
        workdir / "data", server.start(), nodes=2, restart_point_seconds=restart_interval
    )
    rows = []
    try:
        for name, (fault, overrides) in FAULTS.items():
            if kinds and not any(kind in name for kind in kinds):
                continue
            row = Row(name)
            for _ in range(rounds):
                one_round(cluster, server, row, fault, overrides, steps)
                print(f"{name}: {row}", flush=True)
            rows.append(row)
    finally:
        stop_cluster(cluster)
        server.stop()
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| fault | injected | at steps | jobs SUCCEEDED | restarts | steps trained again "
        "| steps missing | steps counted twice |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        at = ", ".join(str(s) for s in r.at_steps)
        lines.append(
            f"| {r.fault} | {r.injected} | {at} | {r.succeeded} of {r.injected} | {r.restarts} "
            f"| {r.steps_again} | {r.missing} | {r.duplicated} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2000, help="train_steps of each job")
    parser.add_argument(
        "--kinds", nargs="*", default=[], help="only the faults whose names contain one of these"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--restart-interval",
        type=float,
        nargs="+",
        default=[Settings.model_fields["restart_point_seconds"].default],
        help="restart_point_seconds of the service: one campaign for each (default: its default)",
    )
    # Shorter jobs would end before their fault lands: one round of one fault instead.
    args = smoke.parse(parser, rounds=1, kinds=["downpour"])
    bad: list[Row] = []
    everything: dict[str, list[dict[str, object]]] = {}
    for interval in args.restart_interval:
        random.seed(args.seed)
        with tempfile.TemporaryDirectory(prefix="trainyard-faults-") as tmp:
            rows = campaign(args.rounds, Path(tmp), interval, args.steps, args.kinds)
        print(f"\nrestart points every {interval:g} s (restart_point_seconds), seed {args.seed}\n")
        print(table(rows))
        everything[f"{interval:g}"] = [asdict(r) for r in rows]
        bad += [r for r in rows if r.succeeded < r.injected or r.missing or r.duplicated]
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
