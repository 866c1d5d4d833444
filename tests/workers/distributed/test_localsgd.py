"""Framework localsgd with two real worker processes: with sync_freq 1 and sgd it ends where
the local trainer on the combined batch ends (as allreduce does); with a warm-up and sync_freq 4
the replicas are equal through the warm-up, apart between syncs, equal right after each sync
and after the last step; the job's cluster.localsgd_delay reaches the workers through
workers/parallel.py. What it cannot run is refused by tests/dsl/test_sync_checks.py's rules."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from dsl.topology import resolve_topology
from tests.conftest import compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.context import RunContext
from workers.distributed.localsgd import LocalSGD
from workers.distributed.rendezvous import GroupMember, file_store, join_group, leave_group
from workers.parallel import agreed_stops, sync_apart, train
from workers.trainer import StepHooks, Trainer, TrainOptions

WORLD = 2
TOL = {"atol": 2e-5, "rtol": 1e-4}
STEPS = 11
WARMUP, PERIOD = 2, 4

MLP: dict[str, Any] = {
    "name": "localsgd-mlp",
    "seed": 5,
    "data": {"source": "synthetic", "task": "classification", "num_samples": 400,
             "num_features": 24, "num_classes": 4, "batch_size": 16, "test_fraction": 0.25},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 64},
        {"name": "act1", "type": "relu", "srclayers": ["fc1"]},
        {"name": "fc2", "type": "dense", "srclayers": ["act1"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
    ]},
    # Linear in the gradient: averaging the replicas' steps is the step of the mean gradient.
    "updater": {"type": "sgd", "momentum": 0.9, "weight_decay": 0.001, "lr": {"base": 0.1}},
    "train_steps": STEPS,
    "disp_freq": 4,
    "checkpoint": {"freq": 0, "keep": 1},
}  # fmt: skip


def _job(sync_freq: int, warmup: int, delay: int = 0) -> dict[str, Any]:
    cluster = {
        "framework": "localsgd",
        "sync_freq": sync_freq,
        "localsgd_warmup": warmup,
        "localsgd_delay": delay,
    }
    return {**MLP, "cluster": cluster}


def _train(rank: int, tmp: Path, name: str, job: dict[str, Any]) -> dict[str, float]:
    """localsgd's pieces as workers/parallel.py applies them; the parameters after each step."""
    compiled, data = compile_with_data(job, cache_dir=tmp)
    cluster = compiled.spec.cluster
    local = LocalSGD(
        compiled.net,
        period=cluster.sync_freq,
        warmup=cluster.localsgd_warmup,
        delay=cluster.localsgd_delay,
    )
    hooks = agreed_stops(sync_apart(StepHooks(), local=local), device="cpu")
    trainer = Trainer(compiled, data, TrainOptions(tmp / name, rank=rank, world=WORLD), hooks=hooks)

    def snapshot(step: int) -> None:
        params = {n: p.detach().clone() for n, p in trainer.net.named_params().items()}
        save_file(params, str(tmp / f"{name}-step{step}-rank{rank}.safetensors"))

    return trainer.run(on_step=snapshot).metrics


def _delayed_mean(rank: int, tmp: Path) -> list[float]:
    """LocalSGD with a delay of 2 on parameters set by hand: replica r holds r + 1 when the
    sync after step 4 starts the averaging, then learns 10 (r + 1) more; its parameters after
    steps 5 and 6 (the mean is taken in after step 6)."""
    compiled, data = compile_with_data(_job(PERIOD, 0, delay=2), cache_dir=tmp)
    trainer = Trainer(compiled, data, TrainOptions(tmp / f"by-hand-{rank}", rank=rank, world=WORLD))
    local = LocalSGD(compiled.net, period=PERIOD, warmup=0, delay=2)
    local.at_start(trainer)
    seen = []
    with torch.no_grad():
        for p in local.params:
            p.fill_(rank + 1.0)
        local.after_update(trainer, 3)  # 4 steps done: a sync step
        for p in local.params:
            p.add_(10.0 * (rank + 1))
        for step in (4, 5):
            local.after_update(trainer, step)
            seen.append(sorted({float(v) for p in local.params for v in p.reshape(-1)}))
    return seen


def _through_parallel(rank: int, tmp: Path, redis_url: str, scope: str) -> str:
    """The delayed job as a worker of the service runs it: workers/parallel.py's train, which
    joins its group through Redis and applies the job's cluster settings itself."""
    compiled, data = compile_with_data(_job(PERIOD, WARMUP, delay=2), cache_dir=tmp)
    context = RunContext(
        topology=resolve_topology(compiled.spec.cluster),
        rank=rank,
        redis_url=redis_url,
        scope=scope,
        job=compiled,
        dataset=data,
        run_dir=tmp / "parallel-delayed",
    )
    return train(context).status


def _worker(rank: int, tmp: Path, redis_url: str, scope: str) -> None:
    torch.set_num_threads(1)
    member = GroupMember(rank, WORLD)
    join_group(file_store(tmp / "store", member), member)
    results: dict[str, Any] = {
        "every": _train(rank, tmp, "every", _job(1, 0)),
        "apart": _train(rank, tmp, "apart", _job(PERIOD, WARMUP)),
        "delayed": _train(rank, tmp, "delayed", _job(PERIOD, WARMUP, delay=2)),
        "by_hand": _delayed_mean(rank, tmp),
    }
    leave_group()
    results["parallel"] = _through_parallel(rank, tmp, redis_url, scope)
    (tmp / f"results-rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Path:
    tmp = tmp_path_factory.mktemp("localsgd")
    scope = f"test-{uuid.uuid4().hex[:8]}:job:1"
    mp.start_processes(_worker, args=(tmp, redis_url, scope), nprocs=WORLD, start_method="spawn")
    return tmp


def _params(tmp: Path, name: str, step: int, rank: int) -> dict[str, torch.Tensor]:
    return load_file(str(tmp / f"{name}-step{step}-rank{rank}.safetensors"))


@pytest.mark.slow
def test_sync_freq_1_with_sgd_ends_where_the_local_trainer_on_the_combined_batch_ends(
    group_run: Path,
) -> None:
    compiled, data = compile_with_data(MLP, cache_dir=group_run)
    Trainer(compiled, data, TrainOptions(group_run / "local")).run()
    local = load_checkpoint(resolve_checkpoint(group_run / "local"))
    ours = load_checkpoint(resolve_checkpoint(group_run / "every"))
    assert ours.step == local.step == STEPS
    for name, tensor in local.params.items():
        torch.testing.assert_close(ours.params[name], tensor, **TOL, msg=name)


@pytest.mark.slow
def test_replicas_are_equal_after_the_warm_up_and_each_sync_and_apart_between(
    group_run: Path,
) -> None:
    # All-reduced gradients for steps 1 and 2; averaged after steps 2 + 4k and the last.
    synced = {1, 2, 6, 10, STEPS}
    for step in range(1, STEPS + 1):
        zero, one = _params(group_run, "apart", step, 0), _params(group_run, "apart", step, 1)
        equal = all(torch.equal(zero[name], one[name]) for name in zero)
        assert equal == (step in synced), f"step {step}"
    metrics = json.loads((group_run / "results-rank0.json").read_text())["apart"]
    assert metrics["test/accuracy"] > 0.6  # 4 classes: chance is 0.25


@pytest.mark.slow
def test_a_delayed_averaging_is_taken_in_after_the_delay_keeping_what_each_replica_learnt(
    group_run: Path,
) -> None:
    """Replica r held r + 1 when the averaging started (mean 1.5) and learnt 10 (r + 1) while
    it ran: after the delay it holds 1.5 + 10 (r + 1), before it what it learnt on its own."""
    for rank in range(WORLD):
        seen = json.loads((group_run / f"results-rank{rank}.json").read_text())["by_hand"]
        assert seen == [[11.0 * (rank + 1)], [1.5 + 10.0 * (rank + 1)]]


@pytest.mark.slow
def test_with_a_delay_the_replicas_are_equal_through_the_warm_up_and_at_the_end(
    group_run: Path,
) -> None:
    """Averaged after steps 2 (equal replicas), 6 and 10, each taken in two steps later (the
    last at the last step, which averages whole): never equal between the warm-up and the
    end, each replica keeping its last two steps."""
    for step in range(1, STEPS + 1):
        zero, one = _params(group_run, "delayed", step, 0), _params(group_run, "delayed", step, 1)
        equal = all(torch.equal(zero[name], one[name]) for name in zero)
        assert equal == (step in {1, 2, STEPS}), f"step {step}"
    metrics = json.loads((group_run / "results-rank0.json").read_text())["delayed"]
    assert metrics["test/accuracy"] > 0.6


@pytest.mark.slow
def test_the_jobs_delay_reaches_the_workers_through_workers_parallel(group_run: Path) -> None:
    """The localsgd framework as workers/parallel.py applies the job (cluster.localsgd_delay:
    2) ends where the pieces wired by hand with the delay end, not where they end without it."""
    assert json.loads((group_run / "results-rank0.json").read_text())["parallel"] == "succeeded"
    ours = load_checkpoint(resolve_checkpoint(group_run / "parallel-delayed")).params
    delayed = _params(group_run, "delayed", STEPS, 0)
    undelayed = _params(group_run, "apart", STEPS, 0)
    assert ours.keys() == delayed.keys()
    for name, tensor in delayed.items():
        torch.testing.assert_close(ours[name], tensor, **TOL, msg=name)
    assert not all(torch.allclose(ours[name], undelayed[name], **TOL) for name in undelayed)
