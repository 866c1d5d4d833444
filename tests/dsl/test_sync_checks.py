"""The rules of how replicas exchange gradients (dsl/sync_checks.py): compression powersgd
only where DDP carries the gradients, framework localsgd only where post-local SGD can run;
each refusal located at the key that asks for it."""

from __future__ import annotations

from typing import Any

import pytest

from dsl.compiler import compile_job
from dsl.errors import JobSpecError
from dsl.layers.base import BuildContext

MLP: dict[str, Any] = {
    "name": "sync-rules",
    "data": {"source": "synthetic", "task": "classification", "num_samples": 400,
             "num_features": 24, "num_classes": 4, "batch_size": 16},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 64},
        {"name": "fc2", "type": "dense", "srclayers": ["fc1"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
    ]},
    "updater": {"type": "sgd", "lr": {"base": 0.1}},
    "train_steps": 10,
}  # fmt: skip


def _compiles(cluster: dict[str, Any], **changes: Any) -> None:
    compile_job(
        {**MLP, **changes, "cluster": cluster}, BuildContext(sample_shape=(24,), num_classes=4)
    )


def _issues(cluster: dict[str, Any], **changes: Any) -> list[tuple[str, str]]:
    document = {**MLP, **changes, "cluster": cluster}
    with pytest.raises(JobSpecError) as caught:
        compile_job(document, BuildContext(sample_shape=(24,), num_classes=4))
    return [(issue.path, issue.message) for issue in caught.value.issues]


def test_what_post_local_sgd_cannot_run_is_refused_where_it_is_written() -> None:
    [(path, message)] = _issues({"framework": "localsgd", "compression": "bf16"})
    assert path == "cluster.compression" and "averages parameters, not gradients" in message
    [(path, message)] = _issues({"framework": "localsgd", "nworker_groups": 2})
    assert path == "cluster.nworker_groups" and "one worker group" in message
    net = {**MLP["neuralnet"], "partition_dim": 1}
    [(path, message)] = _issues({"framework": "localsgd"}, neuralnet=net)
    assert path == "neuralnet.partition_dim" and "exchanges activations" in message
    [(path, message)] = _issues(
        {"framework": "localsgd"}, pipeline={"stages": 2, "microbatches": 2}
    )
    assert path == "pipeline" and "post-local SGD hook" in message
    [(path, message)] = _issues({"framework": "localsgd", "sync_freq": 4, "localsgd_delay": 4})
    assert path == "cluster.localsgd_delay" and "not below sync_freq 4" in message


def test_powersgd_is_refused_where_ddp_does_not_carry_the_gradients() -> None:
    for cluster, where in [
        ({"framework": "sandblaster"}, "to server shards"),
        ({"framework": "allreduce", "nworker_groups": 2, "nserver_groups": 1,
          "nservers_per_group": 1, "server_worker_separate": True}, "hybrid"),
    ]:  # fmt: skip
        [(path, message)] = _issues({**cluster, "compression": "powersgd"})
        assert path == "cluster.compression" and where in message
    [(path, message)] = _issues(
        {"framework": "allreduce", "compression": "powersgd"},
        pipeline={"stages": 2, "microbatches": 2},
    )
    assert path == "cluster.compression" and "pipeline stages" in message


def test_what_ddp_carries_compiles() -> None:
    for compression in ("none", "fp16", "bf16", "powersgd"):
        _compiles({"framework": "allreduce", "compression": compression, "powersgd_rank": 4})
    _compiles({"framework": "local", "compression": "powersgd"})  # nothing is exchanged
    _compiles({"framework": "localsgd", "sync_freq": 4, "localsgd_warmup": 20})
    _compiles({"framework": "localsgd", "sync_freq": 4, "localsgd_delay": 3})
    # Whole gradients after the algorithm or the schedule, in a wire type: as before DDP.
    rnn = {"source": "synthetic", "task": "sequence", "num_samples": 64, "seq_len": 8,
           "batch_size": 8}  # fmt: skip
    gru = {"layers": [
        {"name": "data", "type": "input"},
        {"name": "gru", "type": "gru", "srclayers": ["data"], "hidden": 4, "output": "last"},
        {"name": "fc", "type": "dense", "srclayers": ["gru"], "units": 1},
        {"name": "loss", "type": "euclidean_loss", "srclayers": ["fc"]},
    ]}  # fmt: skip
    compile_job(
        {**MLP, "data": rnn, "neuralnet": gru, "train_one_batch": {"alg": "bptt"},
         "cluster": {"framework": "allreduce", "compression": "bf16"}},
        BuildContext(sample_shape=(8, 1)),
    )  # fmt: skip
    with pytest.raises(JobSpecError, match="train_one_batch 'bptt' does not back-propagate"):
        compile_job(
            {**MLP, "data": rnn, "neuralnet": gru, "train_one_batch": {"alg": "bptt"},
             "cluster": {"framework": "allreduce", "compression": "powersgd"}},
            BuildContext(sample_shape=(8, 1)),
        )  # fmt: skip


def test_the_powersgd_rank_is_bounded() -> None:
    with pytest.raises(JobSpecError, match=r"cluster\.powersgd_rank"):
        _compiles({"framework": "allreduce", "compression": "powersgd", "powersgd_rank": 33})
