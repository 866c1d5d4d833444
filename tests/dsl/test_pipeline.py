"""The rules of the pipeline section: each error, its message and its place in the file."""

from __future__ import annotations

import pytest
import torch

from dsl.compiler import compile_job
from dsl.errors import JobSpecError, SpecIssue
from dsl.layers.base import LAYERS, BuildContext

CTX = BuildContext(sample_shape=(1, 8, 8), num_classes=10)

# The tests point at lines and columns of this text: the stage lists are lines 15 and 16.
JOB = """\
name: p
data: {source: digits, batch_size: 8}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: dense, srclayers: [data], units: 16}
    - {name: relu1, type: relu, srclayers: [fc1]}
    - {name: fc2, type: dense, srclayers: [relu1], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc2]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 10
pipeline:
  microbatches: 4
  stages:
    - [data, fc1]
    - [relu1, fc2, loss]
"""
STAGES = "    - [data, fc1]\n    - [relu1, fc2, loss]\n"


def with_stages(*lines: str) -> str:
    return JOB.replace(STAGES, "".join(f"    - {line}\n" for line in lines))


def issue(text: str, path: str) -> SpecIssue:
    """The one issue compiling `text` reports at `path`."""
    with pytest.raises(JobSpecError) as info:
        compile_job(text, CTX)
    found = [i for i in info.value.issues if i.path == path]
    assert len(found) == 1, info.value
    return found[0]


def test_the_written_stages_compile() -> None:
    job = compile_job(JOB, CTX)
    assert job.spec.pipeline is not None and job.spec.pipeline.count == 2


def test_an_unknown_layer_in_a_stage_list() -> None:
    found = issue(with_stages("[data, fc1]", "[rleu1, fc2, loss]"), "pipeline.stages[1][0]")
    assert found.message == "stage 1 names layer 'rleu1', which is not a layer of the net"
    assert found.hint == "did you mean 'relu1'?"
    assert (found.line, found.column) == (16, 8)


def test_a_layer_in_two_stages() -> None:
    found = issue(with_stages("[data, fc1]", "[fc1, relu1, fc2, loss]"), "pipeline.stages[1][0]")
    assert found.message == "layer 'fc1' is in stage 0 and again in stage 1"
    assert found.hint == "a layer runs on exactly one stage: remove all but one"
    assert (found.line, found.column) == (16, 8)


def test_a_layer_in_no_stage() -> None:
    found = issue(with_stages("[data, fc1]", "[fc2, loss]"), "pipeline.stages")
    assert found.message == "layer(s) relu1 are in no stage"
    assert found.hint == (
        "every layer runs on exactly one stage: add 'relu1' to stage 0 or a later one"
    )
    assert (found.line, found.column) == (14, 3)


def test_a_stage_that_is_not_contiguous_names_the_layer_it_reads() -> None:
    found = issue(with_stages("[data, fc1, fc2]", "[relu1, loss]"), "pipeline.stages[0][2]")
    assert found.message == (
        "stage 0 is not contiguous: its layer 'fc2' reads 'relu1', which runs on the later stage 1"
    )
    assert found.hint == (
        "a stage reads only layers of its own and earlier stages: move 'fc2' to stage 1 or "
        "later, or 'relu1' to stage 0 or earlier"
    )
    assert (found.line, found.column) == (15, 19)


def test_more_stages_than_the_net_has_layers_to_cut() -> None:
    # fc1, relu1 and fc2 can each start a stage, and the loss can end the net on its own.
    text = JOB.replace(STAGES, "").replace("  stages:\n", "  stages: 5\n")
    found = issue(text, "pipeline.stages")
    assert found.message.startswith("5 stages for a net that can be cut into at most 4: ")
    assert found.hint == "use at most 4 stages"
    assert (found.line, found.column) == (14, 3)
    compile_job(text.replace("stages: 5", "stages: 4"), CTX)


def test_more_stage_lists_than_layers() -> None:
    lists = [f"[{name}]" for name in ("data", "fc1", "relu1", "fc2", "loss")] + ["[]"]
    found = issue(with_stages(*lists), "pipeline.stages")
    assert found.message == "6 stages for a net of 5 layers"
    assert found.hint == "use at most 4 stages"


def test_an_empty_stage() -> None:
    found = issue(with_stages("[data, fc1]", "[]", "[relu1, fc2, loss]"), "pipeline.stages[1]")
    assert found.message == "stage 1 is empty"
    assert (found.line, found.column) == (16, 7)


def test_a_stage_of_inputs_only_computes_nothing() -> None:
    found = issue(with_stages("[data]", "[fc1, relu1, fc2, loss]"), "pipeline.stages[0]")
    assert found.message == "stage 0 runs only input layers (data): it computes nothing"
    assert found.hint == (
        "give every stage at least one layer besides the inputs, or use fewer stages"
    )
    assert (found.line, found.column) == (15, 7)


def test_an_input_layer_after_the_first_stage() -> None:
    found = issue(with_stages("[fc1, relu1]", "[data, fc2, loss]"), "pipeline.stages[1][0]")
    assert found.message == (
        "input layer 'data' is in stage 1: the samples enter the pipeline at its first stage"
    )
    assert found.hint == "move it to stage 0"
    assert (found.line, found.column) == (16, 8)


def test_a_loss_before_the_last_stage() -> None:
    text = with_stages("[data, fc1, relu1, fc2, loss]", "[acc]").replace(
        "srclayers: [fc2]}\n",
        "srclayers: [fc2]}\n    - {name: acc, type: accuracy, srclayers: [fc2]}\n",
    )
    found = issue(text, "pipeline.stages[0][4]")
    assert found.message == (
        "layer 'loss' is in stage 0, and it must run on the last stage (stage 1): "
        "it reads the labels"
    )
    assert found.hint == "move it to stage 1"
    assert (found.line, found.column) == (16, 31)  # one line down: the added layer


def test_a_test_only_layer_before_the_last_stage() -> None:
    text = with_stages("[data, fc1, top3]", "[relu1, fc2, loss]").replace(
        "srclayers: [fc2]}\n",
        "srclayers: [fc2]}\n"
        "    - {name: top3, type: dense, srclayers: [fc1], units: 3, include: [test]}\n",
    )
    with pytest.raises(JobSpecError) as info:
        compile_job(text, CTX)
    # A dense layer of the test phase whose output nothing reads is also reported.
    (found,) = [i for i in info.value.issues if i.path == "pipeline.stages[0][2]"]
    assert found.message == (
        "layer 'top3' is in stage 0, and it must run on the last stage (stage 1): "
        "it runs only in the test phase"
    )
    assert (found.line, found.column) == (16, 19)  # one line down: the added layer


def test_batch_size_must_split_into_the_micro_batches() -> None:
    found = issue(JOB.replace("microbatches: 4", "microbatches: 3"), "pipeline.microbatches")
    assert found.message == "data.batch_size 8 does not split into 3 equal micro-batches"
    assert found.hint == (
        "use a number of micro-batches that divides 8 (1, 2, 4, 8), or change data.batch_size"
    )
    assert (found.line, found.column) == (13, 3)


def test_each_replicas_part_of_the_batch_must_split_into_the_micro_batches() -> None:
    text = JOB + "cluster: {framework: allreduce, nworker_groups: 4}\n"
    found = issue(text, "pipeline.microbatches")
    assert found.message == (
        "data.batch_size 8 (4 replicas of 2 rows) does not split into 4 equal micro-batches"
    )
    assert found.hint == (
        "use a number of micro-batches that divides 2 (1, 2), or change data.batch_size"
    )


def test_1f1b_needs_as_many_micro_batches_as_stages() -> None:
    found = issue(JOB.replace("  microbatches: 4\n", ""), "pipeline.microbatches")
    assert found.message == (
        "schedule 1f1b (the default) needs at least as many micro-batches as stages: "
        "1 micro-batch(es) for 2 stages"
    )
    assert found.hint == "use microbatches: 2 (more keep the bubble smaller), or schedule: gpipe"
    assert (found.line, found.column) == (12, 1)  # no microbatches key: the pipeline's
    compile_job(JOB.replace("  microbatches: 4\n", "  schedule: gpipe\n"), CTX)


@pytest.mark.parametrize("alg", ["cd", "bptt"])
def test_algorithms_a_pipeline_does_not_run(alg: str) -> None:
    text = JOB.replace("train_steps: 10\n", f"train_steps: 10\ntrain_one_batch: {{alg: {alg}}}\n")
    with pytest.raises(JobSpecError) as info:
        compile_job(text, CTX)
    (found,) = [i for i in info.value.issues if i.message.startswith("not supported")]
    assert found.path == "train_one_batch.alg"
    assert found.message.startswith(f"not supported: a pipeline with train_one_batch '{alg}': ")
    assert found.hint == "use alg: bp, or drop the pipeline section"
    assert (found.line, found.column) == (12, 19)


def test_a_layer_split_by_feature_cannot_be_in_a_pipeline() -> None:
    text = JOB.replace(
        "srclayers: [data], units: 16}", "srclayers: [data], units: 16, partition_dim: 1}"
    )
    found = issue(text, "neuralnet.layers[1].partition_dim")
    assert found.message == (
        "a pipelined job's workers are its stages, so layer 'fc1' cannot also be split by "
        "feature over them (partition_dim: 1)"
    )
    assert found.hint is not None and "partition_dim 0 or -1" in found.hint
    assert (found.line, found.column) == (6, 62)


def test_a_net_split_by_feature_cannot_be_a_pipeline() -> None:
    text = JOB.replace("  layers:\n", "  partition_dim: 1\n  layers:\n").replace(
        "srclayers: [fc1]}", "srclayers: [fc1], partition_dim: 0}"
    )
    found = issue(text, "neuralnet.partition_dim")
    assert found.message == (
        "a pipelined job's workers are its stages, so the layers data, fc1, fc2, loss cannot "
        "also be split by feature over them (partition_dim: 1 of the net)"
    )
    assert (found.line, found.column) == (4, 3)


def test_label_readers_are_known_before_their_modules_are_built() -> None:
    """`reads_labels` of a config (the pipeline's rules) and `is_loss`/`is_metric` of its
    module (the net's forward pass) must agree for every layer type that has either."""
    text = """\
name: labels
data: {source: digits, batch_size: 8}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: flat, type: flatten, srclayers: [data]}
    - {name: fc, type: dense, srclayers: [flat], units: 10}
    - {name: back, type: dense, srclayers: [fc], units: 64}
    - {name: loss, type: softmax_loss, srclayers: [fc]}
    - {name: acc, type: accuracy, srclayers: [fc]}
    - {name: recon, type: euclidean_loss, srclayers: [back, flat]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 1
"""
    job = compile_job(text, CTX)
    for layer in job.net.compiled:
        module = layer.module
        assert type(layer.config).reads_labels == (module.is_loss or module.is_metric)
    readers = {name for name, cls in LAYERS.items() if cls.reads_labels}
    assert readers == {c.config.type for c in job.net.compiled if type(c.config).reads_labels}
    assert torch.isfinite(job.net(torch.randn(2, 1, 8, 8), torch.tensor([1, 2])).loss)


def with_pipeline(*lines: str) -> str:
    """JOB with the pipeline section's lines after `microbatches` (line 13) replaced."""
    head = JOB[: JOB.index("  stages:\n")]
    return head + "".join(f"  {line}\n" for line in lines)


def test_interleaved_1f1b_needs_virtual_stages() -> None:
    found = issue(with_pipeline("stages: 2", "schedule: interleaved_1f1b"), "pipeline.schedule")
    assert found.message == (
        "schedule interleaved_1f1b needs virtual_stages: the pieces of the net each stage runs"
    )
    assert found.hint == "add virtual_stages: 2 (or more: a smaller bubble, more messages)"
    assert (found.line, found.column) == (15, 3)


@pytest.mark.parametrize(
    ("schedule", "pieces", "message", "hint"),
    [
        ("1f1b", 2, "schedule 1f1b (one forward, one backward) runs one piece of the net per "
         "stage: virtual_stages 2", "drop virtual_stages, or use schedule: interleaved_1f1b, "
         "zero_bubble or zbv to run several pieces per stage"),
        ("interleaved_1f1b", 1, "schedule interleaved_1f1b (1f1b over pieces in turn) runs at "
         "least 2 pieces of the net per stage: virtual_stages 1", "use virtual_stages: 2 or more"),
        ("zbv", 3, "schedule zbv (two pieces per stage in a V) runs exactly 2 pieces of the net "
         "per stage: virtual_stages 3", "use virtual_stages: 2, or drop it"),
    ],
)  # fmt: skip
def test_virtual_stages_that_do_not_fit_the_schedule(
    schedule: str, pieces: int, message: str, hint: str
) -> None:
    text = with_pipeline("stages: 2", f"schedule: {schedule}", f"virtual_stages: {pieces}")
    found = issue(text, "pipeline.virtual_stages")
    assert (found.message, found.hint) == (message, hint)
    assert (found.line, found.column) == (16, 3)


def test_virtual_stages_cut_the_net_into_more_pieces_than_it_has() -> None:
    text = with_pipeline("stages: 2", "schedule: zbv", "virtual_stages: 2")
    text = text.replace("srclayers: [relu1], units: 10}", "srclayers: [fc1], units: 10}")
    text = text.replace("    - {name: relu1, type: relu, srclayers: [fc1]}\n", "")
    found = issue(text, "pipeline.stages")
    assert found.message.startswith(
        "2 stages of 2 pieces each cut the net into 4 pieces, and it can be cut into at most 3"
    )
    assert found.hint == "use at most 1 stages, or fewer virtual_stages"


def test_written_pieces_must_be_a_multiple_of_virtual_stages() -> None:
    text = with_pipeline(
        "schedule: zero_bubble",
        "virtual_stages: 2",
        "stages: [[data, fc1], [relu1], [fc2, loss]]",
    )
    found = issue(text, "pipeline.stages")
    assert found.message.startswith("3 stage lists with virtual_stages 2: the lists are the pieces")
    assert found.hint == "write 4 lists, or change virtual_stages"


def test_zero_bubble_micro_batches_run_in_rounds_that_divide_them() -> None:
    text = (
        with_pipeline("stages: 2", "schedule: zero_bubble")
        .replace("microbatches: 4", "microbatches: 5")
        .replace("batch_size: 8", "batch_size: 10")
    )
    found = issue(text, "pipeline.microbatches")
    assert found.message == (
        "schedule zero_bubble runs the micro-batches in rounds of max(1, microbatches // "
        "stages) = 2, which must divide microbatches: 5 micro-batches for 2 stages"
    )
    assert found.hint.startswith("use microbatches such as 2, 3, 4, 6, 8")


def test_the_new_schedules_compile_with_their_pieces() -> None:
    for lines in (
        ("stages: 2", "schedule: zbv"),
        ("stages: 2", "schedule: zero_bubble"),
        ("stages: [[data, fc1], [relu1], [fc2], [loss]]", "schedule: interleaved_1f1b",
         "virtual_stages: 2"),
    ):  # fmt: skip
        job = compile_job(with_pipeline(*lines), CTX)
        assert job.spec.pipeline is not None and job.spec.pipeline.count == 2
