"""Load: `--users` users submit `--jobs-per-user` jobs each, all at once, to a real `trainyard
up` over HTTP, and every job runs to its end.

The bench starts `trainyard up` (its own Redis, SQLite file, API, scheduler and one node agent
of `--slots` slots) in a temporary directory, creates the users with `trainyard admin
create-user`, and submits examples/digits_mlp.yaml with `train_steps` 10 as JSON
`{spec, overrides}` from one thread per user and job (the users' requests interleaved, all
released together). It waits until the API lists every job in a final state, then prints the
submission latency percentiles, the time from the first submission until all jobs were final,
the jobs per minute, and the checks: no job lost (the API lists exactly the jobs submitted),
none placed twice (one allocation and one SCHEDULED event each), every one trained all its
steps (each train/loss step reported once), and the first jobs placed were several users'.

    .venv/bin/python bench/load.py [--users 10] [--jobs-per-user 20] [--slots 4] [--json out.json]

tests/scheduler/test_load.py runs the same load, cancelling most queued jobs; the users, the
submission and the store's records of the jobs are harness/load.py's, which both use.
docs/reliability.md and docs/performance.md record a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench import smoke
from harness.load import (
    DISP_FREQ,
    TRAIN_STEPS,
    JobRecord,
    LoadUser,
    Submitted,
    final_jobs,
    job_records,
    store_of,
    submit_all,
)
from scheduler.cli.redis_server import free_port
from scheduler.cli.stack import read_stack_file
from scheduler.store.states import JobState

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 120.0


def stack_env(**extra: str) -> dict[str, str]:
    """Our environment without any Trainyard, Redis or SQL configuration, plus `extra`."""
    drop = ("TRAINYARD_", "REDIS_", "DATABASE_URL")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def start_stack(
    data_dir: Path, slots: int, log: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    """`trainyard up` on a free port with one node agent of `slots` slots (and the `settings`,
    TRAINYARD_... variables): (process, URL, admin token) once its stack file says it is up."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "up", "--port", str(port), "--data-dir", data_dir],
            cwd=ROOT,
            env=stack_env(
                TRAINYARD_NODE_SLOTS=str(slots), TRAINYARD_HEARTBEAT_SECONDS="1", **settings
            ),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = read_stack_file(data_dir / "stack.json")
        if found is not None and found.pid == process.pid:
            return process, found.url, found.token
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"trainyard up did not come up:\n{log.read_text()}")


def create_users(url: str, data_dir: Path, count: int) -> list[LoadUser]:
    """`trainyard admin create-user load-N` for each, at once; each prints its token."""

    def create(name: str) -> LoadUser:
        done = subprocess.run(
            [sys.executable, "-m", "scheduler", "admin", "create-user", name],
            cwd=ROOT,
            env=stack_env(TRAINYARD_DATA_DIR=str(data_dir)),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"create-user {name} exited {done.returncode}: {done.stderr}")
        return LoadUser(name, done.stdout.strip().splitlines()[-1], url)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(create, [f"load-{n}" for n in range(count)]))


def percentiles(values: Sequence[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49] * 1000, 1),
        "p90_ms": round(cuts[89] * 1000, 1),
        "p99_ms": round(cuts[98] * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def checks(
    submitted: Sequence[Submitted], listed: Sequence[dict[str, Any]], records: dict[int, JobRecord]
) -> dict[str, Any]:
    """The load's invariants, each a count that must be 0 (or true)."""
    accepted = {s.job_id for s in submitted if s.job_id is not None}
    ids = [job["id"] for job in listed]
    steps = list(range(DISP_FREQ, TRAIN_STEPS + 1, DISP_FREQ))
    placed = sorted((r for r in records.values() if r.allocations), key=lambda r: r.allocations[0])
    return {
        "refused": sum(1 for s in submitted if s.status != 201),
        "lost": len(accepted - set(ids)),
        "listed_not_submitted": len(set(ids) - accepted),
        "listed_twice": len(ids) - len(set(ids)),
        "not_succeeded": sum(1 for r in records.values() if r.state != JobState.SUCCEEDED),
        "placed_twice": sum(1 for r in records.values() if len(r.allocations) > 1),
        "scheduled_twice": sum(1 for r in records.values() if r.scheduled_events > 1),
        "steps_wrong": sum(1 for r in records.values() if r.loss_steps != steps),
        "users_in_first_10_placed": len({r.owner for r in placed[:10]}),
    }


def run(users: int, per_user: int, slots: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trainyard-load-") as tmp:
        data_dir = Path(tmp) / "data"
        process, url, token = start_stack(data_dir, slots, Path(tmp) / "up.log")
        db = store_of(data_dir)
        try:
            people = create_users(url, data_dir, users)
            began = time.monotonic()
            submitted = submit_all(people, per_user)
            submit_seconds = time.monotonic() - began
            admin = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
            listed = final_jobs(admin, timeout)
            all_final = time.monotonic() - began
            records = job_records(db, [job["id"] for job in listed])
        finally:
            db.dispose()
            process.terminate()
            process.wait(timeout=60)
    jobs = len(submitted)
    return {
        "users": users,
        "jobs": jobs,
        "slots": slots,
        "train_steps": TRAIN_STEPS,
        "statuses": dict(Counter(s.status for s in submitted)),
        "submission_latency": percentiles([s.seconds for s in submitted]),
        "all_submitted_s": round(submit_seconds, 1),
        "all_final_s": round(all_final, 1),
        "jobs_per_minute": round(jobs / all_final * 60, 1),
        "final_states": dict(Counter(job["state"] for job in listed)),
        "checks": checks(submitted, listed, records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--jobs-per-user", type=int, default=20)
    parser.add_argument("--slots", type=int, default=4, help="the node agent's slots")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for all")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = smoke.parse(parser, users=2, jobs_per_user=2, timeout=300.0)
    result = run(args.users, args.jobs_per_user, args.slots, args.timeout)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    bad = {k: v for k, v in result["checks"].items() if k != "users_in_first_10_placed" and v}
    if bad:
        sys.exit(f"checks failed: {bad}")


if __name__ == "__main__":
    main()
