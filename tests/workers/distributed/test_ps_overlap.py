"""Gradients sent during the backward pass change when the bytes leave, not what the shards
apply: the same parameters as sending the whole gradient after the backward pass, the same
staleness bound. Shards serve from threads against a real Redis; the workers are real trainers
(threads of this process) whose backward passes fire the hooks."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from dsl.net import NeuralNet
from dsl.topology import Topology
from tests.conftest import compile_with_data
from tests.workers.distributed.test_ps_client import Shards
from workers.data import Dataset
from workers.distributed.ps.client import PSClient, PSError
from workers.distributed.ps.journal import SNAPSHOT_EVERY
from workers.distributed.ps.overlap import PART_BYTES, ReadyParts, plan_parts
from workers.distributed.ps.plan import Connections, PSKeys, PSPlan
from workers.distributed.ps.shard import ShardServer
from workers.distributed.ps.slicing import ParamInfo, plan_slices
from workers.distributed.ps.wire import MAX_PARTS, GradHeader, decode_frames, encode_grad_message
from workers.parallel import sync_through_servers
from workers.trainer import StepHooks, Trainer, TrainOptions

torch.set_num_threads(1)

JOB = {
    "name": "ps-overlap",
    "seed": 3,
    "data": {
        "source": "synthetic",
        "task": "classification",
        "num_samples": 256,
        "num_features": 24,
        "num_classes": 4,
        "batch_size": 16,
    },
    "neuralnet": {
        "layers": [
            {"name": "data", "type": "input"},
            {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 300},
            {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
            {"name": "fc2", "type": "dense", "srclayers": ["relu1"], "units": 400},
            {"name": "relu2", "type": "relu", "srclayers": ["fc2"]},
            {"name": "fc3", "type": "dense", "srclayers": ["relu2"], "units": 4},
            {"name": "loss", "type": "softmax_loss", "srclayers": ["fc3"]},
        ]
    },
    # Clipping by the global norm: the norm travels in a last part of its own.
    "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.05}, "clip": {"grad_norm": 1}},
    "train_steps": 12,
    "disp_freq": 4,
    "test": {"freq": 0},
    "checkpoint": {"freq": 0},
}
SMALL_PARTS = 16 * 1024  # the net's 0.5 MB would be one part per shard at PART_BYTES
# Without clipping, a sandblaster shard updates each slice as soon as every worker sent it.
UNCLIPPED = {**JOB, "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.05}}}


ONE_WORKER = Topology("sandblaster", 1, 1, 1, 1, True, 1, 0)


def one_overlapped_worker(net: NeuralNet, redis_url: str, keys: PSKeys, **options: Any) -> PSClient:
    """The worker of ONE_WORKER, whose gradient leaves in SMALL_PARTS during the backward pass."""
    return PSClient(
        net,
        plan=PSPlan.from_topology(ONE_WORKER),
        connections=Connections(redis_url),
        keys=keys,
        group=0,
        rank=0,
        overlap=True,
        part_bytes=SMALL_PARTS,
        **options,
    )


def armed_backward(client: PSClient, net: NeuralNet, data: Dataset, step: int) -> None:
    """Step `step`'s forward and backward pass on its 16 rows, armed: the parts of its
    gradient leave as the backward pass completes them (`client.step` sends the rest)."""
    client.begin_step(step)
    for p in client.params.values():
        p.grad = None
    rows = slice(16 * step % 240, 16 * step % 240 + 16)
    out = net(data.x_train[rows], data.y_train[rows], "train")
    assert out.loss is not None
    out.loss.backward()


def _train(
    redis_url: str, tmp: Path, topology: Topology, doc: dict[str, Any], *, overlap: bool
) -> list[dict[str, torch.Tensor]]:
    """Every worker of `topology` trains `doc` through the shards; each one's parameters."""
    scope = f"test:{uuid.uuid4().hex[:8]}"
    plan = PSPlan.from_topology(topology)
    shards = Shards(topology, redis_url, [], scope, job_doc=doc)
    trainers, clients = [], []
    for group in range(topology.nworker_groups):
        for rank in range(topology.nworkers_per_group):
            job, data = compile_with_data(doc, cache_dir=tmp / "cache")
            client = PSClient(
                job.net,
                plan=plan,
                connections=Connections(redis_url),
                keys=PSKeys(scope),
                group=group,
                rank=rank,
                clip_norm=1.0 if "clip" in doc["updater"] else None,
                overlap=overlap,
                part_bytes=SMALL_PARTS,
            )
            hooks = sync_through_servers(StepHooks(), client=client, job=job, device="cpu")
            worker = plan.worker_id(group, rank)
            options = TrainOptions(
                run_dir=tmp / f"{overlap}-{worker}", rank=worker, world=plan.nworkers
            )
            trainers.append(Trainer(job, data, options, hooks=hooks))
            clients.append(client)
    errors: list[BaseException] = []

    def run(trainer: Trainer, client: PSClient) -> None:
        try:
            trainer.run()
            client.finish()
        except BaseException as exc:  # surfaced in the test's thread
            errors.append(exc)
            raise

    threads = [
        threading.Thread(target=run, args=pair, daemon=True)
        for pair in zip(trainers, clients, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and not any(thread.is_alive() for thread in threads), errors
    shards.join()
    for client in clients:
        client.close()
    assert [r.updates for r in shards.reports] == [JOB["train_steps"]] * len(shards.reports)
    return [
        {name: p.detach().clone() for name, p in t.net.named_params().items()} for t in trainers
    ]


@pytest.mark.parametrize("clipped", [True, False], ids=["clipped", "updated-early"])
@pytest.mark.parametrize("nworkers,nshards", [(2, 2), (1, 3)])
def test_sandblaster_ends_with_the_same_parameters_with_and_without_overlap(
    redis_url: str, tmp_path: Path, nworkers: int, nshards: int, clipped: bool
) -> None:
    topology = Topology("sandblaster", 1, nworkers, 1, nshards, True, 1, 0)
    doc = JOB if clipped else UNCLIPPED
    apart = _train(redis_url, tmp_path, topology, doc, overlap=False)
    overlapped = _train(redis_url, tmp_path, topology, doc, overlap=True)
    initial, _ = compile_with_data(doc, cache_dir=tmp_path / "cache")
    for before, after in zip(apart, overlapped, strict=True):
        assert before.keys() == after.keys()
        for name, tensor in before.items():
            assert torch.equal(tensor, after[name]), name  # bit for bit
            assert not torch.equal(tensor, initial.net.named_params()[name]), name


def test_the_gradient_travels_in_parts_during_the_backward_pass(
    redis_url: str, tmp_path: Path
) -> None:
    """The parts leave as the backward pass produces them: the last layers' parts are in the
    shard's stream when the backward pass reaches the first layer."""
    job, data = compile_with_data(JOB, cache_dir=tmp_path / "cache")
    main = redis.Redis.from_url(redis_url)
    keys = PSKeys(f"test:{uuid.uuid4().hex[:8]}")
    sending: list[PSClient] = []
    in_stream: list[int] = []

    def at_first_layer(param: torch.Tensor) -> None:
        for send in list(sending[0]._sending):
            send.result(timeout=10)
        in_stream.append(int(main.xlen(keys.grads(0, 0))))

    # Registered before the client's hooks: runs before fc1/w's gradient is handed over.
    job.net.named_params()["fc1/w"].register_post_accumulate_grad_hook(at_first_layer)
    client = one_overlapped_worker(job.net, redis_url, keys)
    sending.append(client)
    client.begin_step(0)
    out = job.net(data.x_train[:16], data.y_train[:16], "train")
    assert out.loss is not None
    out.loss.backward()
    parts = len(client._parts)
    assert parts >= 2
    assert 1 <= in_stream[0] < parts
    client.push(0)
    assert main.xlen(keys.grads(0, 0)) == parts
    client.close()


def test_ssp_bounds_the_lead_alike_with_overlap(redis_url: str, tmp_path: Path) -> None:
    """test_ps_client's SSP check, with gradients sent during real backward passes."""
    topology = Topology("downpour", 2, 1, 1, 1, True, 1, 0)
    scope = f"test:{uuid.uuid4().hex[:8]}"
    shards = Shards(topology, redis_url, [], scope, job_doc=JOB)

    def client(group: int) -> PSClient:
        job, _ = compile_with_data(JOB, cache_dir=tmp_path / "cache")
        return PSClient(
            job.net,
            plan=PSPlan.from_topology(topology),
            connections=Connections(redis_url),
            keys=PSKeys(scope),
            group=group,
            rank=0,
            staleness=1,
            clip_norm=1.0,
            overlap=True,
            part_bytes=SMALL_PARTS,
        )

    def backward(worker: PSClient, step: int) -> None:
        worker.begin_step(step)
        for p in worker.params.values():
            p.grad = None
        loss = sum((p * 0.01).sum() for p in worker.params.values())
        assert isinstance(loss, torch.Tensor)
        loss.backward()

    fast, slow = client(0), client(1)
    fast.connect()
    slow.connect()
    backward(fast, 0)
    fast.step(0)  # one step ahead: allowed
    assert fast.stats.staleness == 1
    backward(fast, 1)
    second = threading.Thread(target=fast.step, args=(1,))
    second.start()
    second.join(timeout=1.0)
    assert second.is_alive(), "two steps ahead of the slowest with staleness 1 must wait"
    backward(slow, 0)
    slow.step(0)
    second.join(timeout=10)
    assert not second.is_alive()
    assert fast.stats.staleness == 1
    assert fast.stats.version == 3
    fast.finish()
    slow.finish()
    shards.join()
    assert [r.updates for r in shards.reports] == [3]
    fast.close()
    slow.close()


def test_a_step_sent_again_replaces_the_parts_of_its_earlier_try(
    redis_url: str, tmp_path: Path
) -> None:
    """A worker restarted alone sends its step again: the shard drops the parts it had of the
    earlier try and applies the step once, from the new parts."""
    shards, worker = _downpour_worker(redis_url, tmp_path)
    main = redis.Redis.from_url(redis_url)
    slices = worker.slice_map.slices
    header = GradHeader(worker=0, group=0, step=0, version=0, norm=0.0, part=0, parts=2)
    garbage = encode_grad_message(header, [(s.id, torch.full(s.shape, 9.0)) for s in slices])
    main.xadd(worker.keys.grads(0, 0), {"m": garbage})  # the killed try's first part
    for p in worker.params.values():
        p.grad = torch.full_like(p, 0.01)
    expected = _one_clean_update(redis_url, tmp_path)
    worker.step(0)
    assert worker.versions == {0: 1}
    for name, p in worker.params.items():
        assert torch.equal(p, expected[name]), name
    worker.finish()
    shards.join()
    assert [r.updates for r in shards.reports] == [1]
    worker.close()


def _downpour_worker(redis_url: str, tmp_path: Path) -> tuple[Shards, PSClient]:
    """A downpour job's one shard (in a scope of its own) and its one worker, connected."""
    topology = Topology("downpour", 1, 1, 1, 1, True, 1, 0)
    scope = f"test:{uuid.uuid4().hex[:8]}"
    shards = Shards(topology, redis_url, [], scope, job_doc=JOB)
    job, _ = compile_with_data(JOB, cache_dir=tmp_path / "cache")
    worker = PSClient(
        job.net,
        plan=PSPlan.from_topology(topology),
        connections=Connections(redis_url),
        keys=PSKeys(scope),
        group=0,
        rank=0,
        clip_norm=1.0,
    )
    worker.connect()
    return shards, worker


def _one_clean_update(redis_url: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    shards, clean = _downpour_worker(redis_url, tmp_path)
    for p in clean.params.values():
        p.grad = torch.full_like(p, 0.01)
    clean.step(0)
    clean.finish()
    shards.join()
    clean.close()
    return {name: p.detach().clone() for name, p in clean.params.items()}


def test_two_backward_passes_in_one_armed_step_are_refused(redis_url: str, tmp_path: Path) -> None:
    topology = Topology("sandblaster", 1, 1, 1, 1, True, 1, 0)
    job, data = compile_with_data(JOB, cache_dir=tmp_path / "cache")
    client = PSClient(
        job.net,
        plan=PSPlan.from_topology(topology),
        connections=Connections(redis_url),
        keys=PSKeys(f"test:{uuid.uuid4().hex[:8]}"),
        group=0,
        rank=0,
        overlap=True,
    )
    client.begin_step(0)
    x, y = data.x_train[:8], data.y_train[:8]
    loss = job.net(x, y, "train").loss
    assert loss is not None
    loss.backward()
    again = job.net(x, y, "train").loss
    assert again is not None
    with pytest.raises(PSError, match="accumulated twice in one step"):
        again.backward()
    client.close()


def test_parts_follow_the_backward_order_and_stay_under_the_header_limit() -> None:
    params = [ParamInfo(f"p{i}", (1000, 300)) for i in range(6)]
    slice_map = plan_slices(params, 2)
    order = [p.name for p in reversed(params)]
    for shard in range(2):
        slices = slice_map.shard_slices(shard)
        parts = plan_parts(slices, order)
        assert sorted(s.id for part in parts for s in part) == sorted(s.id for s in slices)
        ranks = [order.index(s.param) for part in parts for s in part]
        assert ranks == sorted(ranks)
        assert all(4 * sum(s.numel for s in part) >= PART_BYTES for part in parts[:-1])
        assert all(4 * sum(s.numel for s in part[:-1]) < PART_BYTES for part in parts)
    many = plan_parts(slice_map.shard_slices(0), order, part_bytes=64)
    assert len(many) <= MAX_PARTS - 1
    ready = ReadyParts(plan_parts(slice_map.slices, order, part_bytes=4 * 300_000))
    ready.begin()
    assert ready.accumulated("p5") == [0]
    assert ready.unsent() == [1, 2, 3, 4, 5]


def test_slices_updated_early_replay_to_the_same_bits(redis_url: str, tmp_path: Path) -> None:
    """A replacement shard applies each logged update whole; the shard before it updated the
    slices part by part as they came: the same parameters (ShardServer.load checks them bit
    for bit) and the same momentum."""
    plan = PSPlan.from_topology(ONE_WORKER)
    keys = PSKeys(f"test:{uuid.uuid4().hex[:8]}")
    job, data = compile_with_data(UNCLIPPED, cache_dir=tmp_path / "cache")
    client = one_overlapped_worker(job.net, redis_url, keys)
    client.connect()
    first = ShardServer(
        Connections(redis_url), keys, plan, 0, 0, client.slice_map, job.spec, gang=True
    )
    assert first.early
    first.load(timeout=10)
    stop = threading.Event()
    serving = threading.Thread(target=first.serve, args=(stop.is_set,), daemon=True)
    serving.start()
    steps = SNAPSHOT_EVERY + 3
    for step in range(steps):
        armed_backward(client, job.net, data, step)
        client.step(step)
    stop.set()
    serving.join(timeout=10)
    client.close()
    second = ShardServer(
        Connections(redis_url), keys, plan, 0, 0, client.slice_map, job.spec, gang=True
    )
    second.load(timeout=10)
    assert second.version == steps
    expected = first.updater.state_tensors()
    assert expected
    for name, tensor in second.updater.state_tensors().items():
        assert torch.equal(tensor, expected[name]), name


def test_a_half_applied_update_is_published_only_whole(redis_url: str, tmp_path: Path) -> None:
    """Slices updated early go to the staged blob, not to the parameters: a commit in between
    (here of a message deleted while pending) leaves the parameters at their version, and the
    commit of the update publishes all of it."""
    plan = PSPlan.from_topology(ONE_WORKER)
    keys = PSKeys(f"test:{uuid.uuid4().hex[:8]}")
    job, _ = compile_with_data(UNCLIPPED, cache_dir=tmp_path / "cache")
    client = one_overlapped_worker(job.net, redis_url, keys)
    connections = client.connections
    client.connect()
    shard = ShardServer(connections, keys, plan, 0, 0, client.slice_map, job.spec, gang=True)
    shard.load(timeout=10)
    for p in client.params.values():
        p.grad = torch.full_like(p, 0.5)
    messages = [
        (f"{i + 1}-0".encode(), {b"m": client._message(0, part, 0.0)})
        for i, part in enumerate(client._parts)
    ]
    before = connections.main.get(keys.params(0, 0))
    shard.handle(messages[:-1])
    staged = connections.main.get(keys.staged(0, 0))
    assert staged is not None and staged != before
    shard.handle([(b"9-0", None)])  # acknowledged and deleted: a commit of no update
    assert connections.main.get(keys.params(0, 0)) == before
    assert connections.main.hget(keys.state(0, 0), "version") == b"0"
    shard.handle(messages[-1:])
    after = decode_frames(connections.main.get(keys.params(0, 0)))
    assert [f.version for f in after] == [1] * len(after)
    for frame in after:
        assert torch.equal(frame.tensor, shard.tensors[frame.slice_id])
    client.close()
    connections.close()
