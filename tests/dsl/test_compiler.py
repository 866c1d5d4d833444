"""The compile pipeline: DAG ordering, phases, shapes, and each class of error with its place."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dsl.compiler import compile_job
from dsl.errors import DataSourceError, JobSpecError
from dsl.layers.base import BuildContext

CTX = BuildContext(sample_shape=(1, 8, 8), num_classes=10)

BASE = """\
name: t
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
"""


def errors_of(text: str, data: object = CTX, **kwargs: object) -> JobSpecError:
    with pytest.raises(JobSpecError) as info:
        compile_job(textwrap.dedent(text), data, **kwargs)  # type: ignore[arg-type]
    return info.value


def test_compiles_with_shapes_and_param_names() -> None:
    job = compile_job(BASE, CTX)
    rows = {row.name: row for row in job.table}
    assert rows["fc1"].out_shape == [16]
    assert rows["fc1"].params == 64 * 16 + 16
    assert job.total_params == 64 * 16 + 16 + 16 * 10 + 10
    assert sorted(job.net.named_params()) == ["fc1/b", "fc1/w", "fc2/b", "fc2/w"]
    out = job.net(torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3]), with_metrics=True)
    assert out.loss is not None and out.loss.shape == ()
    assert 0.0 <= float(out.metrics["accuracy"]) <= 1.0


def test_layers_are_ordered_topologically_whatever_the_file_order() -> None:
    text = BASE.replace("    - {name: data, type: input}\n", "").replace(
        "  layers:\n",
        "  layers:\n    - {name: loss2, type: softmax_loss, srclayers: [fc2]}\n"
        "    - {name: data, type: input}\n",
    )
    job = compile_job(text, CTX)
    names = [row.name for row in job.table]
    assert names.index("data") < names.index("fc1") < names.index("fc2") < names.index("loss2")


def test_same_seed_same_init_other_seed_other_init() -> None:
    a = compile_job(BASE, CTX).net.named_params()["fc1/w"]
    b = compile_job(BASE, CTX).net.named_params()["fc1/w"]
    c = compile_job(BASE.replace("name: t\n", "name: t\nseed: 5\n"), CTX).net.named_params()[
        "fc1/w"
    ]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_param_init_follows_the_spec() -> None:
    text = BASE.replace(
        "units: 16}", "units: 16, param: {b: {init: constant, value: 0.5}, w: {init: constant}}}"
    )
    params = compile_job(text, CTX).net.named_params()
    assert torch.all(params["fc1/b"] == 0.5)
    assert torch.all(params["fc1/w"] == 0.0)


def test_unknown_key_is_located_with_did_you_mean() -> None:
    err = errors_of(BASE.replace("units: 16}", "unit: 16}"))
    issue = next(i for i in err.issues if "unknown key" in i.message)
    assert issue.path == "neuralnet.layers[1].unit"
    assert (issue.line, issue.column) == (6, 51)
    assert issue.hint == "did you mean 'units'?"


def test_unknown_layer_type_lists_known_types() -> None:
    err = errors_of(BASE.replace("type: relu", "type: relux"))
    (issue,) = err.issues
    assert issue.path == "neuralnet.layers[2].type"
    assert issue.line == 7
    assert "relu" in issue.message and "conv2d" in issue.message
    assert issue.hint == "did you mean 'relu'?"


def test_wrong_type_and_missing_key_are_reported_together() -> None:
    err = errors_of(BASE.replace("units: 16", "units: many").replace("train_steps: 10\n", ""))
    messages = " | ".join(i.message for i in err.issues)
    assert "valid integer" in messages and "'many'" in messages
    assert "missing required key 'train_steps'" in messages
    assert len(err.issues) == 2


def test_missing_source_cycle_and_unused_output() -> None:
    missing = errors_of(BASE.replace("srclayers: [relu1]", "srclayers: [relu9]"))
    assert any("'relu9'" in i.message and i.line == 8 for i in missing.issues)
    assert any("not used" in i.message for i in missing.issues)  # relu1 now dangles

    cycle = errors_of(BASE.replace("srclayers: [data], units: 16", "srclayers: [relu1], units: 16"))
    assert any("cycle" in i.message for i in cycle.issues)


def test_duplicate_layer_name() -> None:
    err = errors_of(BASE.replace("name: relu1, type: relu", "name: fc1, type: relu"))
    assert any("used twice" in i.message for i in err.issues)


def test_shape_errors_name_the_layer_and_input_shapes() -> None:
    text = BASE.replace(
        "{name: fc1, type: dense, srclayers: [data], units: 16}",
        "{name: fc1, type: conv1d, srclayers: [data], filters: 4, kernel: 3}",
    )
    err = errors_of(text)
    (issue,) = err.issues
    assert issue.path.startswith("neuralnet.layers[1]")
    assert "fc1" in issue.message and "[1, 8, 8]" in issue.message


def test_phases_restrict_layers() -> None:
    text = BASE.replace(
        "    - {name: loss, type: softmax_loss, srclayers: [fc2]}\n",
        "    - {name: loss, type: softmax_loss, srclayers: [fc2]}\n"
        "    - {name: acc, type: accuracy, srclayers: [fc2], include: [test]}\n",
    )
    job = compile_job(text, CTX)
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([1, 2])
    assert "acc" not in job.net(x, y, "train").outputs
    assert "acc" in job.net(x, y, "test").outputs

    bad = text.replace("{name: fc2, type: dense", "{name: fc2, type: dense, include: [test]")
    err = errors_of(bad)
    assert any("phase train" in i.message for i in err.issues)


def test_overrides_address_layers_by_name() -> None:
    job = compile_job(BASE, CTX, overrides={"neuralnet.layers.fc1.units": 32, "train_steps": 5})
    assert job.spec.layer("fc1").units == 32  # type: ignore[attr-defined]
    assert job.spec.train_steps == 5
    with pytest.raises(JobSpecError, match="no item named"):
        compile_job(BASE, CTX, overrides={"neuralnet.layers.fc9.units": 3})


def test_malformed_yaml_is_located() -> None:
    err = errors_of("name: t\ndata: {source: digits\nneuralnet: x\n")
    (issue,) = err.issues
    assert issue.line == 3 and "malformed YAML" in issue.message


def test_yaml_tags_are_refused() -> None:
    err = errors_of(BASE.replace("name: t", "name: !!python/object/apply:os.system [ls]"))
    assert "not allowed" in err.issues[0].message


def test_algorithm_needs_matching_layers() -> None:
    err = errors_of(BASE.replace("train_steps: 10", "train_steps: 10\ntrain_one_batch: {alg: cd}"))
    assert any("rbm" in i.message for i in err.issues)
    no_loss = BASE.replace(
        "    - {name: loss, type: softmax_loss, srclayers: [fc2]}\n",
        "    - {name: acc, type: accuracy, srclayers: [fc2]}\n",
    )
    assert any("loss layer" in i.message for i in errors_of(no_loss).issues)


def test_unknown_param_key_lists_the_layers_params() -> None:
    err = errors_of(BASE.replace("units: 16}", "units: 16, param: {weight: {init: gaussian}}}"))
    (issue,) = err.issues
    assert issue.path == "neuralnet.layers[1].param.weight"
    assert "b, w" in (issue.hint or "")


def test_a_validated_spec_compiles_again_to_the_same_net() -> None:
    spec = compile_job(BASE, CTX).spec
    net_a = compile_job(spec, CTX).net
    net_b = compile_job(spec, CTX).net
    assert torch.equal(net_a.named_params()["fc2/w"], net_b.named_params()["fc2/w"])


def test_a_validated_spec_is_trusted_and_takes_no_overrides() -> None:
    no_loss = BASE.replace("train_steps: 10", "train_steps: 10\ntrain_one_batch: {alg: cd}")
    with pytest.raises(JobSpecError):
        compile_job(no_loss, CTX)
    spec = compile_job(BASE, CTX).spec.model_copy(update={"name": "stored"})
    assert compile_job(spec, CTX).spec.name == "stored"
    with pytest.raises(ValueError, match="overrides"):
        compile_job(spec, CTX, overrides={"train_steps": 5})


def test_data_errors_and_the_callers_rules_are_located() -> None:
    def missing(_: object) -> BuildContext:
        raise DataSourceError("no such file", hint="upload it", field="path")

    (issue,) = errors_of(BASE, data=missing).issues
    assert issue.path == "data.path" and issue.hint == "upload it"
    small = BuildContext(sample_shape=(1, 8, 8), num_classes=10, train_samples=4)
    (issue,) = errors_of(BASE, data=small).issues
    assert issue.path == "data.batch_size" and "use at most 4" in (issue.hint or "")

    def no_long_runs(spec: object, source: object) -> list[object]:
        return [source.issue(("train_steps",), "too long")]  # type: ignore[attr-defined]

    (issue,) = errors_of(BASE, rules=no_long_runs).issues
    assert issue.path == "train_steps" and issue.line == 11


def test_fp16_is_refused_where_the_job_gets_no_gpu_or_its_shards_update() -> None:
    (issue,) = errors_of(BASE + "precision: fp16\n").issues
    assert (issue.path, issue.line, issue.column) == ("precision", 12, 1)
    assert "fp16 is for GPUs" in issue.message and "precision: bf16" in (issue.hint or "")
    gpu = BASE + "precision: fp16\ncluster: {resources: {gpus_per_worker: 1}}\n"
    assert compile_job(gpu, CTX).spec.precision == "fp16"
    shards = gpu.replace("cluster: {", "cluster: {framework: downpour, ")
    (issue,) = errors_of(shards).issues
    assert issue.path == "precision" and "do not unscale" in issue.message
    cpu = BASE + "precision: bf16\ncompile: true\n"
    assert compile_job(cpu, CTX).spec.compile


def test_a_batch_that_does_not_split_evenly_between_the_workers_is_refused() -> None:
    three = BASE + "cluster: {framework: allreduce, nworkers_per_group: 3}\n"
    (issue,) = errors_of(three).issues
    assert (issue.path, issue.line) == ("data.batch_size", 2)
    assert "3 workers" in issue.message and "e.g. 6 or 9" in (issue.hint or "")
    assert (
        compile_job(three.replace("batch_size: 8", "batch_size: 9"), CTX).spec.data.batch_size == 9
    )
    groups = BASE + "cluster: {framework: downpour, nworker_groups: 3}\n"
    assert errors_of(groups).issues[0].path == "data.batch_size"
