"""A server shard killed mid-run (SIGKILL) is started again and continues where it stopped:
the job finishes with the parameters of an uninterrupted run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
import torch

from harness.local_cluster import LocalCluster, prepare_launch
from tests.conftest import EXAMPLES, compile_with_data
from tests.workers.distributed.test_ps_overlap import (
    ONE_WORKER,
    UNCLIPPED,
    armed_backward,
    one_overlapped_worker,
)
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.distributed.ps.plan import PSKeys
from workers.distributed.ps.wire import FrameBuffer, decode_frames
from workers.trainer import Trainer, TrainOptions

torch.set_num_threads(1)

JOB = EXAMPLES / "mnist1d_cnn.yaml"
STEPS = 40
COMMON = {"train_steps": STEPS, "disp_freq": 10, "test.freq": 0, "checkpoint.freq": 0}


def _shard_version(client: redis.Redis, keys: PSKeys) -> int:
    raw = client.hget(keys.state(0, 0), "version")
    return int(raw) if raw is not None else 0  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_killed_shard_is_replaced_and_the_job_finishes_exactly(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    config = prepare_launch(
        JOB,
        None,
        redis_url,
        tmp_path / "ps",
        cache_dir=cache_dir,
        overrides={**COMMON, "cluster.framework": "sandblaster"},
    )
    keys = PSKeys(config.scope)
    client = redis.Redis.from_url(redis_url)
    cluster = LocalCluster(config)
    cluster.start()
    try:
        deadline = time.monotonic() + 180
        while _shard_version(client, keys) < 10:
            assert time.monotonic() < deadline, "the shard never reached version 10"
            time.sleep(0.02)
        cluster.kill(("server", 0, 0))
        killed_at = _shard_version(client, keys)
        run = cluster.wait(timeout=240)
    finally:
        cluster.stop()
    assert killed_at < STEPS
    assert run.restarts == 1
    assert run.summary["status"] == "succeeded" and run.summary["steps"] == STEPS
    # One update per step across both shard processes: nothing lost, nothing applied twice.
    assert _shard_version(client, keys) == STEPS
    log = (tmp_path / "ps" / "logs" / "server-g0r0.log").read_text()
    assert "resumed at version" in log

    # The replacement loaded the parameters and the momentum of its predecessor: the result is
    # the uninterrupted run's.
    job, data = compile_with_data(JOB.read_text(), cache_dir=cache_dir, overrides=COMMON)
    Trainer(job, data, TrainOptions(run_dir=tmp_path / "local")).run()
    local = load_checkpoint(resolve_checkpoint(tmp_path / "local")).params
    distributed = load_checkpoint(resolve_checkpoint(tmp_path / "ps")).params
    for name, tensor in local.items():
        torch.testing.assert_close(distributed[name], tensor, rtol=1e-4, atol=2e-5, msg=name)


def _staged_differs(client: redis.Redis, keys: PSKeys, ranges: list[tuple[int, int]]) -> bool:
    """Whether the staged blob holds other bytes than the parameters in `ranges` (the
    shard wrote an early-updated slice there and has not committed it)."""
    pipe = client.pipeline(transaction=False)
    for start, stop in ranges:
        pipe.getrange(keys.staged(0, 0), start, stop - 1)
        pipe.getrange(keys.params(0, 0), start, stop - 1)
    replies = pipe.execute()
    pairs = zip(replies[::2], replies[1::2], strict=True)
    return any(len(a) == len(b) and a != b for a, b in pairs)


def _train_through_a_shard_process(
    redis_url: str, tmp: Path, *, kill_at: int | None
) -> dict[str, torch.Tensor]:
    """One overlapped sandblaster worker, driven here, against a shard process; with
    `kill_at`, the shard is killed once it has staged some slices of that step's update, and
    started again before the step's last part is sent. The worker's parameters at the end."""
    doc = {**UNCLIPPED, "train_steps": 8}
    name = "killed" if kill_at is not None else "whole"
    config = prepare_launch(
        json.dumps(doc), ONE_WORKER, redis_url, tmp / name, cache_dir=tmp / "cache"
    )
    keys = PSKeys(config.scope)
    job, data = compile_with_data(doc, cache_dir=tmp / "cache")
    client = one_overlapped_worker(job.net, redis_url, keys, wait_timeout=60)
    main = redis.Redis.from_url(redis_url)
    cluster = LocalCluster(config)
    role = ("server", 0, 0)
    cluster.start([role])
    try:
        client.connect()
        # The parts a hook sends (all but the round trip's): their slices' byte ranges.
        blob = client.connections.client(client.urls[0]).get(keys.params(0, 0))
        frames = FrameBuffer(((f.slice_id, f.tensor) for f in decode_frames(blob)), 0)
        sent = [s.id for part in client._parts[:-1] for s in part.slices]
        early = [(at, at + len(data)) for at, data in frames.ranges(sent)]
        for step in range(doc["train_steps"]):
            armed_backward(client, job.net, data, step)
            if step == kill_at:
                deadline = time.monotonic() + 60
                while not _staged_differs(main, keys, early):
                    assert time.monotonic() < deadline, "the shard staged nothing early"
                    time.sleep(0.005)
                cluster.kill(role)
                cluster.processes[role].wait()
                assert _shard_version(main, keys) == step  # killed before the commit
                cluster.start([role])
            client.step(step)
        client.finish()
        cluster.join_servers()
    finally:
        cluster.stop()
        client.close()
    if kill_at is not None:
        log = (tmp / name / "logs" / "server-g0r0.log").read_text()
        assert f"resumed at version {kill_at} " in log
    assert _shard_version(main, keys) == doc["train_steps"]
    return {name: p.detach().clone() for name, p in job.net.named_params().items()}


@pytest.mark.slow
def test_a_shard_killed_between_updating_slices_early_and_committing_them(
    redis_url: str, tmp_path: Path
) -> None:
    """The killed shard had updated some slices of a step and written them to the staged
    blob; its replacement reads the step's parts again, updates them again over that blob and
    commits: the parameters are bit for bit those of a run without the kill."""
    whole = _train_through_a_shard_process(redis_url, tmp_path, kill_at=None)
    killed = _train_through_a_shard_process(redis_url, tmp_path, kill_at=5)
    assert whole.keys() == killed.keys()
    for name, tensor in whole.items():
        assert torch.equal(tensor, killed[name]), name
