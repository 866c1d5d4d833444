"""The allreduce framework with two real worker processes that meet through a real Redis:
it ends where the local trainer on the combined batch ends, the replicas stay equal, and
gradients compressed by DDP's hooks (bf16, fp16, PowerSGD) train as the whole ones do."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file, save_file

from dsl.schema import ClusterConfig
from dsl.topology import resolve_topology
from harness.local_cluster import launch_local
from tests.conftest import compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.context import RunContext, worker_dir
from workers.distributed import allreduce
from workers.distributed.allreduce import (
    DDPSync,
    GradientSync,
    bucket_cap_mb,
    compression_hook,
    gradient_sync,
)
from workers.distributed.rendezvous import (
    GroupMember,
    RendezvousError,
    address_key,
    join_group,
    leave_group,
    reachable_address,
    redis_store,
)
from workers.metrics import read_metrics
from workers.parallel import (
    TopologyError,
    check_topology,
    group_pushers,
    group_trainer,
    sync_in_group,
    train,
)
from workers.trainer import StepHooks, Trainer, TrainOptions

torch.set_num_threads(1)

WORLD = 2
TOL = {"atol": 2e-5, "rtol": 1e-4}

MLP: dict[str, Any] = {
    "name": "allreduce-mlp",
    "seed": 5,
    "data": {"source": "synthetic", "task": "classification", "num_samples": 400,
             "num_features": 24, "num_classes": 4, "batch_size": 16, "test_fraction": 0.25},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 64,
         "param": {"b": {"init": "constant", "value": 0.1, "lr_scale": 2, "wd_scale": 0}}},
        {"name": "act1", "type": "relu", "srclayers": ["fc1"]},
        {"name": "fc2", "type": "dense", "srclayers": ["act1"], "units": 48},
        {"name": "act2", "type": "tanh", "srclayers": ["fc2"]},
        {"name": "fc3", "type": "dense", "srclayers": ["act2"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc3"]},
    ]},
    "updater": {"type": "sgd", "momentum": 0.9, "weight_decay": 0.001,
                "clip": {"grad_norm": 1.0}, "lr": {"base": 0.05, "warmup_steps": 3}},
    "train_steps": 12,
    "disp_freq": 4,
    "checkpoint": {"freq": 0, "keep": 1},
}  # fmt: skip

# A dense layer whose output only a metric reads: no loss depends on it, so it gets no
# gradient, which DDP must be told (it waits for a gradient of every parameter it reduces).
PROBED: dict[str, Any] = {
    **MLP,
    "neuralnet": {"layers": [
        *MLP["neuralnet"]["layers"],
        {"name": "probe", "type": "dense", "srclayers": ["act2"], "units": 4},
        {"name": "probe_accuracy", "type": "accuracy", "srclayers": ["probe"]},
    ]},
}  # fmt: skip

# Truncated BPTT runs backward once per chunk, so the all-reduce waits for the last one.
GRU: dict[str, Any] = {
    "name": "allreduce-gru",
    "seed": 2,
    "data": {"source": "synthetic", "task": "sequence", "num_samples": 200, "seq_len": 8,
             "batch_size": 8, "test_fraction": 0.2},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "gru", "type": "gru", "srclayers": ["data"], "hidden": 12, "output": "last"},
        {"name": "fc", "type": "dense", "srclayers": ["gru"], "units": 1},
        {"name": "loss", "type": "euclidean_loss", "srclayers": ["fc"]},
    ]},
    "train_one_batch": {"alg": "bptt", "unroll_len": 4},
    "updater": {"type": "adam", "lr": {"base": 0.01}},
    "train_steps": 6,
    "disp_freq": 3,
}  # fmt: skip


COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")
LONGER = 60  # steps of the compression runs: three epochs, so accuracy means something


def _worker(rank: int, redis_url: str, scope: str, tmp: Path) -> None:
    torch.set_num_threads(1)
    client = redis.Redis.from_url(redis_url)
    member = GroupMember(rank, WORLD)
    store = redis_store(client, scope, member, advertise=reachable_address(redis_url), timeout=120)
    join_group(store, member)
    results: dict[str, Any] = {}

    compiled, data = compile_with_data(PROBED, cache_dir=tmp)
    sync = gradient_sync(compiled, compression="none")
    assert isinstance(sync, DDPSync)
    options = TrainOptions(tmp / "mlp", rank=rank, world=WORLD)
    trainer = Trainer(compiled, data, options, hooks=sync_in_group(StepHooks(), sync=sync))
    trainer.run()
    params = {n: p.detach().contiguous() for n, p in trainer.net.named_params().items()}
    save_file(params, str(tmp / f"mlp-rank{rank}.safetensors"))

    for compression in COMPRESSIONS:
        job = {**MLP, "train_steps": LONGER, "cluster": {"compression": compression}}
        compiled, data = compile_with_data(job, cache_dir=tmp)
        options = TrainOptions(tmp / compression, rank=rank, world=WORLD)
        trainer, sync = group_trainer(compiled, data, options)
        assert isinstance(sync, DDPSync)
        results[compression] = {
            **trainer.run().metrics,
            "hook": sync.ddp._get_ddp_logging_data().get("comm_hook", ""),
        }
        params = {n: p.detach().contiguous() for n, p in trainer.net.named_params().items()}
        save_file(params, str(tmp / f"{compression}-rank{rank}.safetensors"))

    compiled, data = compile_with_data(GRU, cache_dir=tmp)
    trainer, sync = group_trainer(compiled, data, TrainOptions(tmp / "gru", rank=rank, world=WORLD))
    results["gru_sync"] = type(sync).__name__
    trainer.run()
    results["before_2_13"] = _ddp_as_before_torch_2_13(rank)

    (tmp / f"results-rank{rank}.json").write_text(json.dumps(results))
    # The trainers' DDP wrappers hold the process group: let go of before leave_group frees
    # them (and joins their gloo threads), as workers.parallel.train does; a spawned process
    # that left them alive died at exit with SIGABRT under load.
    del trainer, sync
    dist.barrier()
    leave_group(client, scope, 0)


def _ddp_as_before_torch_2_13(rank: int) -> dict[str, list[float]]:
    """DDP made the way torch before 2.13 allows (the GPU image has 2.11): rank 0's buffers at
    the start, and gradients averaged."""
    allreduce.DDP_SYNCS_BUFFERS_AT_INIT = False
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    assert net[1].running_mean is not None
    net[1].running_mean.fill_(float(rank + 1))
    ddp = allreduce._ddp_syncing_buffers_once(net, None, None)  # type: ignore[arg-type]
    buffers = net[1].running_mean.tolist()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    (ddp(x) * torch.arange(8.0).reshape(4, 2)).sum().backward()
    return {"buffers": buffers, "grad": net[0].weight.grad.flatten().tolist()}


@pytest.fixture(scope="module")
def group_run(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two workers train three jobs, one after the other, in one process group."""
    tmp = tmp_path_factory.mktemp("allreduce")
    scope = f"test-{uuid.uuid4().hex[:8]}:job:1"
    mp.start_processes(_worker, args=(redis_url, scope, tmp), nprocs=WORLD, start_method="spawn")
    # Rank 0 withdrew its address when the group was done.
    assert redis.Redis.from_url(redis_url).get(address_key(scope, 0)) is None
    return tmp


def _results(tmp: Path, rank: int) -> dict[str, Any]:
    return dict(json.loads((tmp / f"results-rank{rank}.json").read_text()))


def _local(tmp: Path, job: dict[str, Any], name: str) -> Path:
    compiled, data = compile_with_data(job, cache_dir=tmp)
    Trainer(compiled, data, TrainOptions(tmp / name)).run()
    return resolve_checkpoint(tmp / name)


def _assert_same_checkpoint(group: Path, local: Path) -> None:
    ours, theirs = load_checkpoint(group), load_checkpoint(local)
    assert ours.step == theirs.step
    assert ours.params.keys() == theirs.params.keys()
    assert ours.updater.keys() == theirs.updater.keys()
    for name, tensor in theirs.params.items():
        torch.testing.assert_close(ours.params[name], tensor, **TOL, msg=name)
    for name, tensor in theirs.updater.items():
        torch.testing.assert_close(ours.updater[name], tensor, **TOL, msg=name)


@pytest.mark.slow
def test_two_workers_end_where_the_local_trainer_on_the_combined_batch_ends(
    group_run: Path,
) -> None:
    _assert_same_checkpoint(
        resolve_checkpoint(group_run / "mlp"), _local(group_run, PROBED, "mlp-local")
    )


@pytest.mark.slow
def test_ddp_as_made_before_torch_2_13_starts_from_rank_zeros_buffers(group_run: Path) -> None:
    first, second = (_results(group_run, rank)["before_2_13"] for rank in range(WORLD))
    assert first["buffers"] == second["buffers"] == [1.0, 1.0]  # rank 0 filled them with 1
    assert first["grad"] == second["grad"] and any(first["grad"])


@pytest.mark.slow
def test_bptt_reduces_after_the_last_chunk_and_matches_the_local_trainer(
    group_run: Path,
) -> None:
    assert _results(group_run, 0)["gru_sync"] == "GradientSync"  # not DDP: see allreduce.py
    _assert_same_checkpoint(
        resolve_checkpoint(group_run / "gru"), _local(group_run, GRU, "gru-local")
    )


@pytest.mark.slow
@pytest.mark.parametrize("job", ["mlp", *COMPRESSIONS])
def test_replicas_stay_identical(group_run: Path, job: str) -> None:
    zero = load_file(str(group_run / f"{job}-rank0.safetensors"))
    one = load_file(str(group_run / f"{job}-rank1.safetensors"))
    assert zero.keys() == one.keys()
    for name, tensor in zero.items():
        assert torch.equal(tensor, one[name]), name


HOOKS = {"bf16": "bf16_hook", "fp16": "fp16_compress_hook", "powersgd": "powerSGD_hook"}


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["bf16", "fp16", "powersgd"])
def test_compressed_gradients_train_as_the_full_ones_do(group_run: Path, compression: str) -> None:
    """Each compression is DDP's hook, and the job learns as much as with whole gradients."""
    full, ours = _results(group_run, 0)["none"], _results(group_run, 0)[compression]
    assert ours["hook"] == HOOKS[compression]
    assert full["test/accuracy"] > 0.8  # 4 classes: chance is 0.25
    assert ours["test/accuracy"] >= full["test/accuracy"] - 0.05
    assert ours["test/loss"] == pytest.approx(full["test/loss"], abs=0.1)
    if compression != "powersgd":  # half precision stays close to the whole gradients
        whole = load_checkpoint(resolve_checkpoint(group_run / "none"))
        half = load_checkpoint(resolve_checkpoint(group_run / compression))
        for name, tensor in whole.params.items():
            assert (half.params[name] - tensor).abs().max() < 0.05, name


def test_a_worker_without_rank_zero_gives_up_with_the_key_it_watched(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    scope = f"test-{uuid.uuid4().hex[:8]}:job:7"
    with pytest.raises(
        RendezvousError, match=rf"worker 1 of group 3 .* within 0.5 s \(key {scope}:rendezvous"
    ):
        redis_store(client, scope, GroupMember(1, 2, group=3), advertise="127.0.0.1", timeout=0.5)


def test_the_advertised_address_is_the_route_to_redis() -> None:
    assert reachable_address("redis://127.0.0.1:6399/0") == "127.0.0.1"


def test_unknown_compression_and_bad_ranks_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown gradient compression 'int8'"):
        GradientSync([], compression="int8")
    with pytest.raises(ValueError, match="unknown gradient compression 'powersgd' for an all-"):
        GradientSync([], compression="powersgd")
    with pytest.raises(ValueError, match="unknown gradient compression 'int8'; known: none, f"):
        compression_hook("int8", group=None, powersgd_rank=1)
    with pytest.raises(ValueError, match="rank 2 is not in a group of 2"):
        GroupMember(2, 2)


def test_powersgd_gets_one_bucket_for_all_the_gradients() -> None:
    """PowerSGD launches all-reduces from callbacks, which with several buckets in flight may
    run in another order on each worker (see `bucket_cap_mb`)."""
    params = [torch.zeros(1 << 20), torch.zeros(1 << 19)]  # 6 MB
    assert bucket_cap_mb("powersgd", params) == pytest.approx(7.0)
    assert bucket_cap_mb("bf16", params) is None  # DDP's default


HYBRID = {
    "cluster.framework": "allreduce",
    "cluster.nworker_groups": 2,
    "cluster.nworkers_per_group": 2,
    "cluster.nserver_groups": 1,
    "cluster.nservers_per_group": 1,
    "cluster.server_worker_separate": True,
    "train_steps": 30,
    "disp_freq": 10,
    "data.batch_size": 32,
}


@pytest.mark.slow
def test_hybrid_groups_all_reduce_inside_and_share_shards_between(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """2 groups x 2 workers and one shard: one update per group and step reaches the shard,
    and the two workers of a group end with identical replicas."""
    run = launch_local(
        yaml.safe_dump(MLP), None, redis_url, tmp_path, cache_dir=cache_dir, overrides=HYBRID
    )
    assert run.summary["status"] == "succeeded" and run.summary["steps"] == 30
    assert set(run.workers) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for group in (0, 1):
        zero, one = run.workers[(group, 0)]["metrics"], run.workers[(group, 1)]["metrics"]
        assert zero["test/loss"] == one["test/loss"]
        assert zero["test/accuracy"] > 0.6
    # Only rank 0 of a group pushes, so the shard ends at version groups x steps.
    versions = [
        record["ps/version"]
        for g, r in run.workers
        for record in read_metrics(worker_dir(tmp_path, g, r))
        if "ps/version" in record
    ]
    assert max(versions) == 2 * 30


def test_allreduce_topologies_without_the_shards_they_need_are_refused() -> None:
    base = ClusterConfig(framework="allreduce")
    check_topology(resolve_topology(base))
    with pytest.raises(TopologyError, match="set nserver_groups >= 1"):
        check_topology(resolve_topology(base.model_copy(update={"nworker_groups": 2})))
    with pytest.raises(TopologyError, match="no use for server shards"):
        check_topology(
            resolve_topology(
                base.model_copy(
                    update={"nserver_groups": 1, "nservers_per_group": 1,
                            "server_worker_separate": True}
                )
            )
        )  # fmt: skip
    assert group_pushers(resolve_topology(base)) == 1
    assert group_pushers(resolve_topology(ClusterConfig(framework="downpour"))) is None


def _threads() -> int:
    """The process's OS threads (gloo's own included, which Python's threading does not see)."""
    return len(os.listdir("/proc/self/task"))


def _product_worker(rank: int, redis_url: str, scope: str, tmp: Path) -> None:
    """A worker of an allreduce job (DDP, PowerSGD) as the product runs one: workers.parallel's
    train with its context; then what it left behind."""
    torch.set_num_threads(1)
    job = {**MLP, "cluster": {"framework": "allreduce", "compression": "powersgd"}}
    compiled, data = compile_with_data(job, cache_dir=tmp)
    before = _threads()
    summary = train(
        RunContext(
            topology=resolve_topology(compiled.spec.cluster),
            rank=rank,
            redis_url=redis_url,
            scope=scope,
            job=compiled,
            dataset=data,
            run_dir=tmp / "run",
        )
    )
    left = {"status": summary.status, "joined": dist.is_initialized()}
    left |= {"threads_before": before, "threads_after": _threads()}
    (tmp / f"left-rank{rank}.json").write_text(json.dumps(left))


@pytest.mark.slow
def test_a_finished_ddp_worker_leaves_its_process_group_and_exits_0(
    redis_url: str, tmp_path: Path
) -> None:
    """After training, the worker's process group is destroyed and its gloo threads joined
    (the DDP wrapper that held the group freed first); a process that left threads of its
    group behind died at exit with SIGABRT ("terminate called without an active exception")."""
    scope = f"test-{uuid.uuid4().hex[:8]}:job:2"
    context = mp.start_processes(
        _product_worker,
        args=(redis_url, scope, tmp_path),
        nprocs=WORLD,
        start_method="spawn",
        join=False,
    )
    while not context.join(timeout=300):
        pass
    assert [process.exitcode for process in context.processes] == [0] * WORLD
    for rank in range(WORLD):
        left = json.loads((tmp_path / f"left-rank{rank}.json").read_text())
        assert left["status"] == "succeeded" and not left["joined"], left
        assert left["threads_after"] <= left["threads_before"], left
