"""Partitioning by feature and hybrid partitioning: the same outputs, gradients and training as
the unpartitioned net, with real processes (torch.multiprocessing spawn) talking over gloo."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from tests.conftest import compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.distributed.allreduce import GradientSync
from workers.distributed.comm import piece_bounds, split_sizes, take_piece
from workers.distributed.partition import (
    PartitionedNet,
    PartitionError,
    layer_mode,
    partition_net,
    sharded_params,
)
from workers.distributed.rendezvous import GroupMember, file_store, join_group, leave_group
from workers.parallel import checkpoint_due, group_trainer
from workers.trainer import Trainer, TrainOptions

torch.set_num_threads(1)

TOL = {"atol": 2e-5, "rtol": 1e-4}


def _layers(conv_dim: int, dense_dim: int, loss_dim: int) -> list[dict[str, Any]]:
    """A small cifar10-like net; 5 classes cut 3/2 over 2 workers and 2/2/1 over 3."""
    return [
        {"name": "data", "type": "input"},
        {"name": "conv1", "type": "conv2d", "srclayers": ["data"], "filters": 6, "kernel": 3,
         "padding": 1, "partition_dim": conv_dim},
        {"name": "relu1", "type": "relu", "srclayers": ["conv1"], "partition_dim": conv_dim},
        {"name": "pool1", "type": "pool2d", "srclayers": ["relu1"], "method": "max", "kernel": 2,
         "partition_dim": conv_dim},
        {"name": "conv2", "type": "conv2d", "srclayers": ["pool1"], "filters": 4, "kernel": 3,
         "padding": 1, "partition_dim": 1},
        {"name": "relu2", "type": "relu", "srclayers": ["conv2"], "partition_dim": 1},
        {"name": "fc1", "type": "dense", "srclayers": ["relu2"], "units": 9,
         "partition_dim": dense_dim},
        {"name": "relu3", "type": "tanh", "srclayers": ["fc1"], "partition_dim": dense_dim},
        {"name": "fc2", "type": "dense", "srclayers": ["relu3"], "partition_dim": dense_dim},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"], "partition_dim": loss_dim},
    ]  # fmt: skip


def job(kind: str, batch: int, steps: int = 6) -> dict[str, Any]:
    # feature: everything that has features is split by them, the rest runs whole;
    # hybrid: convolutions by batch, dense layers by feature, the loss by batch (SINGA cifar10).
    dims = {"feature": (1, 1, 1), "hybrid": (0, 1, 0)}[kind]
    return {
        "name": f"partition-{kind}",
        "seed": 3,
        "data": {"source": "synthetic", "task": "images", "num_samples": 240, "channels": 2,
                 "image_size": 8, "num_classes": 5, "batch_size": batch, "test_fraction": 0.25},
        "neuralnet": {"partition_dim": 1 if kind == "feature" else 0, "layers": _layers(*dims)},
        "updater": {"type": "sgd", "momentum": 0.9, "weight_decay": 0.001,
                    "clip": {"grad_norm": 0.5}, "lr": {"base": 0.1}},
        "train_steps": steps,
        "disp_freq": 2,
        "checkpoint": {"freq": 4, "keep": 5},
    }  # fmt: skip


def _join(rank: int, world: int, store: Path) -> None:
    torch.set_num_threads(1)
    member = GroupMember(rank, world)
    join_group(file_store(store, member), member)


def _check_gradients(rank: int, world: int, tmp: Path) -> None:
    """Outputs, loss and gradients of one batch match the whole net on every worker."""
    for kind in ("feature", "hybrid"):
        compiled, data = compile_with_data(job(kind, batch=6 * world), cache_dir=tmp)
        reference = copy.deepcopy(compiled.net)
        x, y = data.x_train[: 6 * world], data.y_train[: 6 * world]
        expected = reference(x, y, "train")
        assert expected.loss is not None
        expected.loss.backward()

        net = partition_net(compiled.net, net_dim=compiled.spec.neuralnet.partition_dim,
                            rank=rank, world=world)  # fmt: skip
        assert isinstance(net, PartitionedNet)
        sync = GradientSync(list(net.named_params().items()), sharded=sharded_params(net))
        out = net(take_piece(x, 0, world, rank), take_piece(y, 0, world, rank), "train")
        assert out.loss is not None
        out.loss.backward()
        sync.finish()

        loss = out.loss.detach().clone()
        dist.all_reduce(loss)
        torch.testing.assert_close(loss / world, expected.loss.detach(), **TOL)
        for layer in ("pool1", "fc1", "fc2"):  # whole on every worker after the connections
            got, want = out.outputs[layer], expected.outputs[layer]
            assert isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
            rows = want if got.shape == want.shape else take_piece(want, 0, world, rank)
            torch.testing.assert_close(got, rows.detach(), **TOL)
        grads = net.gather_full({n: p.grad for n, p in net.named_params().items()})
        for name, param in reference.named_params().items():
            assert param.grad is not None
            torch.testing.assert_close(grads[name], param.grad, **TOL, msg=f"{kind} {name}")

        with torch.no_grad():  # evaluation: the whole test batch on every worker
            xt, yt = data.x_test[:10], data.y_test[:10]
            test, want_test = net(xt, yt, "test", with_metrics=True), reference(xt, yt, "test")
        assert test.loss is not None and want_test.loss is not None
        torch.testing.assert_close(test.loss, want_test.loss, **TOL)


def _spawn(fn: Any, world: int, tmp: Path) -> None:
    mp.start_processes(fn, args=(world, tmp), nprocs=world, start_method="spawn")


def _grad_worker(rank: int, world: int, tmp: Path) -> None:
    _join(rank, world, tmp / "store")
    _check_gradients(rank, world, tmp)
    leave_group()


@pytest.mark.slow
def test_feature_and_hybrid_match_the_whole_net_on_three_workers(tmp_path: Path) -> None:
    _spawn(_grad_worker, 3, tmp_path)


def _train_worker(rank: int, world: int, tmp: Path) -> None:
    """Gradients, then 6 steps of hybrid training, then 2 more resumed from the checkpoint."""
    _join(rank, world, tmp / "store")
    _check_gradients(rank, world, tmp)
    for steps, resume in ((6, False), (8, True)):
        compiled, data = compile_with_data(job("hybrid", batch=8, steps=steps), cache_dir=tmp)
        options = TrainOptions(tmp / "group", rank=rank, world=world, resume=resume)
        trainer, _ = group_trainer(compiled, data, options)
        summary = trainer.run()
        assert summary.status == "succeeded" and summary.steps == steps
        assert isinstance(trainer.net, PartitionedNet)
        mine = {n: p.detach().contiguous() for n, p in trainer.net.named_params().items()}
        save_file(mine, str(tmp / f"rank{rank}-{steps}.safetensors"))
        (tmp / f"rank{rank}-{steps}.json").write_text(json.dumps(summary.metrics))
    leave_group()


def _metric_worker(rank: int, world: int, tmp: Path) -> None:
    """Two metric layers that report the same name: the split net keeps both, as the whole
    net does (the second under `<layer>/accuracy`)."""
    _join(rank, world, tmp / "store")
    document = job("feature", batch=8)
    document["neuralnet"]["layers"].append(
        {"name": "top2", "type": "accuracy", "srclayers": ["fc2"], "topk": 2}
    )
    compiled, data = compile_with_data(document, cache_dir=tmp)
    whole = copy.deepcopy(compiled.net)
    net = partition_net(compiled.net, net_dim=1, rank=rank, world=world)
    assert isinstance(net, PartitionedNet)
    x, y = data.x_test[:10], data.y_test[:10]
    with torch.no_grad():
        got = net(x, y, "test", with_metrics=True).metrics
        want = whole(x, y, "test", with_metrics=True).metrics
    assert sorted(got) == sorted(want) == ["accuracy", "top2/accuracy"]
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, **TOL, msg=key)
    leave_group()


@pytest.mark.slow
def test_a_split_net_reports_every_metric_layer_as_the_whole_net_does(tmp_path: Path) -> None:
    _spawn(_metric_worker, 2, tmp_path)


def _local(tmp: Path, steps: int, resume: bool) -> tuple[Trainer, dict[str, float]]:
    compiled, data = compile_with_data(job("hybrid", batch=8, steps=steps), cache_dir=tmp)
    trainer = Trainer(compiled, data, TrainOptions(tmp / "local", resume=resume))
    return trainer, trainer.run().metrics


@pytest.mark.slow
def test_hybrid_training_and_checkpoints_equal_the_local_trainer(tmp_path: Path) -> None:
    _spawn(_train_worker, 2, tmp_path)
    local, metrics = _local(tmp_path, 6, resume=False)
    # The group's checkpoints hold whole tensors: the same names and values as a local run's.
    for step in (4, 6):
        group = load_checkpoint(tmp_path / "group" / "checkpoints" / f"step-{step:08d}.safetensors")
        alone = load_checkpoint(tmp_path / "local" / "checkpoints" / f"step-{step:08d}.safetensors")
        assert group.params.keys() == alone.params.keys()
        assert group.updater.keys() == alone.updater.keys()
        for name, tensor in alone.params.items():
            torch.testing.assert_close(group.params[name], tensor, **TOL, msg=name)
        for name, tensor in alone.updater.items():
            torch.testing.assert_close(group.updater[name], tensor, **TOL, msg=name)
    group_metrics = json.loads((tmp_path / "rank0-6.json").read_text())
    for key in ("test/loss", "test/accuracy"):
        assert group_metrics[key] == pytest.approx(metrics[key], abs=1e-4)
    # Each worker keeps its slice: rank r holds rows piece r of every feature-split parameter.
    final = dict(local.net.named_params())
    for rank in range(2):
        mine = load_file(str(tmp_path / f"rank{rank}-6.safetensors"))
        for name, tensor in mine.items():
            whole = final[name].detach()
            if name.split("/")[0] in ("conv2", "fc1", "fc2"):
                start, stop = piece_bounds(whole.shape[0], 2, rank)
                whole = whole[start:stop]
            torch.testing.assert_close(tensor, whole, **TOL, msg=f"rank {rank} {name}")
    # Resuming from the whole checkpoint gives every worker its slices back.
    _local(tmp_path, 8, resume=True)
    group = load_checkpoint(resolve_checkpoint(tmp_path / "group"))
    alone = load_checkpoint(resolve_checkpoint(tmp_path / "local"))
    assert group.step == alone.step == 8
    for name, tensor in alone.params.items():
        torch.testing.assert_close(group.params[name], tensor, **TOL, msg=name)


def test_layer_modes_follow_the_layer_then_the_net(tmp_path: Path) -> None:
    compiled, _ = compile_with_data(job("hybrid", batch=8), cache_dir=tmp_path)
    modes = {c.config.name: layer_mode(c.config, 0) for c in compiled.net.compiled}
    assert modes["conv1"] == modes["loss"] == "batch"
    assert modes["conv2"] == modes["fc1"] == modes["fc2"] == "feature"
    assert modes["relu2"] == "replicated"  # no features of its own to split: runs whole
    # One worker, or a net split only by batch, stays the net it was.
    assert partition_net(compiled.net, net_dim=0, rank=0, world=1) is compiled.net
    layers = [
        *_layers(0, 0, 0)[:2],
        {"name": "fc", "type": "dense", "srclayers": ["conv1"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc"]},
    ]
    data_parallel, _ = compile_with_data(
        {**job("hybrid", batch=8), "neuralnet": {"layers": layers}}, cache_dir=tmp_path
    )
    assert partition_net(data_parallel.net, net_dim=0, rank=1, world=2) is data_parallel.net


def test_too_few_features_and_grouped_convolutions_are_refused(tmp_path: Path) -> None:
    compiled, _ = compile_with_data(job("hybrid", batch=8), cache_dir=tmp_path)
    with pytest.raises(PartitionError, match=r"'conv2' \(conv2d\) has 4 output features"):
        partition_net(compiled.net, net_dim=0, rank=0, world=6, group=None)
    grouped = job("hybrid", batch=8)
    grouped["neuralnet"]["layers"][4]["groups"] = 2
    compiled, _ = compile_with_data(grouped, cache_dir=tmp_path)
    with pytest.raises(PartitionError, match="groups=2"):
        partition_net(compiled.net, net_dim=0, rank=0, world=2, group=None)


def test_pieces_are_near_equal_and_cover_the_axis() -> None:
    assert split_sizes(5, 3) == [2, 2, 1]
    assert [piece_bounds(5, 3, i) for i in range(3)] == [(0, 2), (2, 4), (4, 5)]
    x = torch.arange(10).reshape(5, 2)
    assert torch.equal(torch.cat([take_piece(x, 0, 3, i) for i in range(3)]), x)
    with pytest.raises(ValueError, match="cannot cut 2 into 3"):
        split_sizes(2, 3)


def test_checkpoints_follow_the_trainer_schedule(tmp_path: Path) -> None:
    compiled, _ = compile_with_data(job("hybrid", batch=8, steps=10), cache_dir=tmp_path)
    due = [step for step in range(1, 11) if checkpoint_due(compiled.spec, step)]
    assert due == [4, 8, 10]
