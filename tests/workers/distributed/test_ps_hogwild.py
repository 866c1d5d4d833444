"""Hogwild: two server groups train their own copies and average them every sync_freq updates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from harness.local_cluster import launch_local
from tests.conftest import EXAMPLES

torch.set_num_threads(1)

STEPS = 600  # 85% is reached at ~300 steps; asynchrony makes single runs vary, so keep a margin


@pytest.mark.slow
def test_hogwild_reaches_85_percent_and_syncs_the_server_groups(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    run = launch_local(
        EXAMPLES / "mnist1d_hogwild.yaml",
        None,
        redis_url,
        tmp_path,
        cache_dir=cache_dir,
        overrides={"train_steps": STEPS, "test.freq": 0, "cluster.sync_freq": 10},
        timeout=300,
    )
    for summary in run.workers.values():
        assert summary["metrics"]["test/accuracy"] >= 0.85
    for server_group in (0, 1):
        log = (tmp_path / "logs" / f"server-g{server_group}r0.log").read_text()
        found = re.search(r"updates=(\d+), peer_syncs=(\d+)", log)
        assert found is not None, log
        assert int(found.group(1)) == STEPS  # one worker group per server group
        assert int(found.group(2)) == STEPS // 10
