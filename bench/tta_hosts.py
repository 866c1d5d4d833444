"""bench/time_to_accuracy.py's cases as jobs on test hosts (scripts/testhosts.py): one slot per
node host, so every process of a job runs on a host of its own and talks to the others over
links limited to a bandwidth (tc tbf, both ways); the broker Redis on the head host, the
parameter-server Redis on a host of its own. Every case runs at every bandwidth, in one run."""

from __future__ import annotations

from pathlib import Path

from time_to_accuracy import EXAMPLES, Case, Result, _curve, _time_to

from scripts.testhosts import running_cluster
from trainyard import Client, Job
from workers.metrics import read_metrics

NODES = 6  # the largest case (the hybrid: 2 groups x 2 workers + 2 shards) has six processes
TIMEOUT = 1800.0


def run_case(client: Client, data_dir: Path, case: Case, overrides: dict[str, object]) -> Result:
    job = client.submit(EXAMPLES / case.job, overrides={**case.overrides, **overrides})
    assert isinstance(job, Job)
    job.wait(timeout=TIMEOUT, poll=1.0)
    wall = (job.info.ended_at - job.info.created_at).total_seconds() if job.info.ended_at else 0.0
    if job.state != "SUCCEEDED":
        return Result(case, [], None, wall, error=f"{job.state}: {(job.error or '')[-200:]}")
    # Worker 0 of group 0 writes the job's run directory itself.
    curve = _curve(read_metrics(data_dir / "artifacts" / "jobs" / str(job.id)))
    return Result(case, curve, _time_to(curve), wall)


def run_on_hosts(
    cases: list[Case], overrides: dict[str, object], bandwidths: list[str], work: Path
) -> dict[str, list[Result]]:
    """Every case at every bandwidth ("none": links not limited), on one set of test hosts."""
    results: dict[str, list[Result]] = {}
    with (
        running_cluster(work, nodes=NODES, slots=1, ps_hosts=1) as cluster,
        Client(cluster.url, cluster.token) as client,
    ):
        cluster.wait_for(
            f"{NODES} nodes",
            lambda: sum(n.state == "ALIVE" for n in client.cluster().nodes) == NODES,
        )
        for bandwidth in bandwidths:
            cluster.network.limit(None if bandwidth == "none" else bandwidth)
            for case in cases:
                result = run_case(client, cluster.data_dir, case, overrides)
                results.setdefault(bandwidth, []).append(result)
                shown = "not reached" if result.seconds is None else f"{result.seconds:.1f} s"
                print(f"{bandwidth} {case.name}: {shown} {result.error}", flush=True)
    return results
