"""A placed training process (workers/entry.py) builds its job from the stored execution spec:
the service checked the document at admission, and the worker does not check it again."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from contract.allocation import AllocationInfo, ExitCode
from contract.keys import Keys
from dsl import compiler
from dsl.topology import resolve_topology
from tests.conftest import EXAMPLES
from workers import entry
from workers.data import TrainingData

OVERRIDES = {"train_steps": 3, "test.freq": 0, "checkpoint.freq": 0, "disp_freq": 1}


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The language's checks run, by name: reading a document and its cross-field rules."""
    ran: list[str] = []
    for name in ("_validate", "cross_field_issues"):
        original = getattr(compiler, name)

        def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            ran.append(_name)
            return _original(*args)

        monkeypatch.setattr(compiler, name, counted)
    return ran


def test_a_worker_trains_from_the_stored_spec_without_checking_the_language(
    checks: list[str], redis_url: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    # What admission stores: the checked document's execution spec and its topology.
    compiled = compiler.compile_job(
        (EXAMPLES / "digits_mlp.yaml").read_text(),
        TrainingData(cache_dir=cache),
        overrides=OVERRIDES,
    )
    assert checks == ["_validate", "cross_field_issues"]  # the counting itself works
    checks.clear()
    spec = compiled.spec
    info = AllocationInfo(
        allocation_id=1,
        job_id=1,
        role="worker",
        group=0,
        rank=0,
        world=1,
        slots=1,
        gpus=0,
        node="n",
        framework=spec.cluster.framework,
        topology=resolve_topology(spec.cluster, spec.pipeline).to_dict(),
        spec=spec.model_dump(mode="json", exclude_unset=True),
        run_dir=tmp_path / "run",
    )
    client = redis.Redis.from_url(redis_url)
    keys = Keys(prefix=f"test-{uuid.uuid4().hex[:8]}")
    handler = signal.getsignal(signal.SIGTERM)
    try:
        code = entry.train(info, client, keys, cache, redis_url=redis_url, ps_urls=[])
    finally:
        signal.signal(signal.SIGTERM, handler)
        client.close()
    assert code == ExitCode.OK
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"step": 3') >= 1
    assert checks == []
