"""Repeated blocks: the expansion's names and sources, errors located at the block's lines,
checkpoint names, overrides into a block, pipeline cuts between copies, and the bound."""

from __future__ import annotations

import pytest
import torch

from dsl.blocks import MAX_EXPANDED_LAYERS, expand_layers, expanded_count
from dsl.compiler import compile_job
from dsl.errors import JobSpecError
from dsl.layers.base import BuildContext
from dsl.planner import plan_pipeline
from dsl.schema import JobSpec
from dsl.source import parse_document

torch.set_num_threads(1)

CTX = BuildContext(sample_shape=(8,), num_classes=11, label_shape=(8,))

GPT = """\
name: blocks
data: {source: text, seq_len: 8, batch_size: 4}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: tok, type: embedding, srclayers: [data], dim: 8}
    - name: block
      type: repeat
      times: 3
      srclayers: [tok]
      layers:
        - {name: ln, type: layernorm, srclayers: [block]}
        - {name: att, type: attention, srclayers: [ln], heads: HEADS, causal: true}
        - {name: res, type: add, srclayers: [block, att]}
    - {name: head, type: dense, axis: 2, srclayers: [block]}
    - {name: loss, type: softmax_loss, srclayers: [head]}
updater: {type: adam, lr: {base: 0.01}}
train_steps: 2
"""


def spec_of(text: str) -> JobSpec:
    return JobSpec.model_validate(parse_document(text)[0])


def test_copies_are_named_and_chained() -> None:
    net = spec_of(GPT.replace("HEADS", "2")).neuralnet
    assert expanded_count(net.layers) == 13
    expanded = expand_layers(net.layers)
    names = [layer.name for layer in expanded.layers]
    assert names[2:5] == ["block.0.ln", "block.0.att", "block.0.res"]
    assert len(names) == 13 and names[-2:] == ["head", "loss"]
    sources = {layer.name: layer.srclayers for layer in expanded.layers}
    assert sources["block.0.ln"] == ["tok"]
    assert sources["block.0.res"] == ["tok", "block.0.att"]
    assert sources["block.2.ln"] == ["block.1.res"]
    assert sources["block.2.res"] == ["block.1.res", "block.2.att"]
    assert sources["head"] == ["block.2.res"]
    assert expanded.blocks["block"][1] == ["block.1.ln", "block.1.att", "block.1.res"]
    assert expanded.origins[3] == (2, "layers", 1)
    # the written net is left as it was: a stored spec round-trips with its block
    assert net.layers[2].type == "repeat"


def test_a_copy_trains_and_its_parameters_carry_its_name() -> None:
    job = compile_job(GPT.replace("HEADS", "2"), CTX)
    params = job.net.named_params()
    assert {"block.0.att/w_qkv", "block.2.ln/w", "block.1.att/b_out"} <= set(params)
    assert not params["block.0.att/w_qkv"].equal(params["block.1.att/w_qkv"])
    assert [row.name for row in job.table][3] == "block.0.att"
    out = job.net(torch.randint(0, 11, (4, 8)), torch.randint(0, 11, (4, 8)))
    assert out.loss is not None
    out.loss.backward()
    assert params["block.0.ln/w"].grad is not None
    dumped = job.spec.model_dump(mode="json", exclude_unset=True)
    assert dumped["neuralnet"]["layers"][2]["times"] == 3
    again = compile_job(JobSpec.model_validate(dumped), CTX)
    assert set(again.net.named_params()) == set(params)


def test_an_error_in_a_copy_is_located_in_the_block() -> None:
    with pytest.raises(JobSpecError) as err:
        compile_job(GPT.replace("HEADS", "3"), CTX)
    issues = err.value.issues
    assert {issue.path for issue in issues} == {"neuralnet.layers[2].layers[1].heads"}
    assert {issue.line for issue in issues} == {13}
    assert "layer 'block.0.att' (attention): 3 heads do not divide" in issues[0].message


def test_a_bad_source_in_a_block_is_located_in_the_block() -> None:
    text = GPT.replace("HEADS", "2").replace("srclayers: [block, att]", "srclayers: [block, at]")
    with pytest.raises(JobSpecError) as err:
        compile_job(text, CTX)
    first = err.value.issues[0]
    assert first.path == "neuralnet.layers[2].layers[2].srclayers[1]"
    assert first.line == 14
    assert "names source 'at'" in first.message


def test_an_unknown_key_in_a_block_gets_a_suggestion() -> None:
    text = GPT.replace("HEADS", "2").replace("type: layernorm,", "type: layernorm, epsilon: 1,")
    with pytest.raises(JobSpecError) as err:
        compile_job(text, CTX)
    [issue] = err.value.issues
    assert issue.path == "neuralnet.layers[2].layers[0].epsilon"
    assert issue.line == 12
    assert issue.hint == "did you mean 'eps'?"


def test_a_block_checks_its_own_keys() -> None:
    text = GPT.replace("HEADS", "2").replace("times: 3", "times: 3\n      output: nope")
    with pytest.raises(JobSpecError, match="output 'nope' is not a layer of the block"):
        compile_job(text, CTX)
    with pytest.raises(JobSpecError, match=r"neuralnet.layers\[2\].times"):
        compile_job(GPT.replace("HEADS", "2").replace("times: 3", "times: 0"), CTX)


def test_the_expansion_is_bounded_before_it_is_made() -> None:
    text = GPT.replace("HEADS", "2").replace("times: 3", "times: 1000")
    body = "".join(
        f"        - {{name: x{i}, type: relu, srclayers: [x{i - 1}]}}\n" for i in range(1, 12)
    )
    text = text.replace(
        "        - {name: ln,",
        "        - {name: x0, type: relu, srclayers: [block]}\n" + body + "        - {name: ln,",
    )
    with pytest.raises(JobSpecError) as err:
        compile_job(text, CTX)
    assert f"more than the limit of {MAX_EXPANDED_LAYERS:,}" in str(err.value)


def test_overrides_reach_into_a_block() -> None:
    job = compile_job(
        GPT.replace("HEADS", "2"), CTX, overrides={"neuralnet.layers.block.layers.att.heads": 4}
    )
    assert job.spec.layer("block.1.att").heads == 4  # type: ignore[attr-defined]


def test_the_planner_cuts_between_copies() -> None:
    text = GPT.replace("HEADS", "2") + "pipeline: {stages: 2, microbatches: 2}\n"
    plan = plan_pipeline(compile_job(text, CTX))
    first, second = (list(stage.layers) for stage in plan.stages)
    assert first[:2] == ["data", "tok"] and second[-1] == "loss"
    assert all(name.startswith("block.") for name in first[2:] + second[:1])


def test_written_stages_may_name_blocks_and_copies() -> None:
    stages = "[[data, tok, block.0, block.1], [block.2, head, loss]]"
    text = GPT.replace("HEADS", "2") + f"pipeline: {{stages: {stages}, microbatches: 2}}\n"
    plan = plan_pipeline(compile_job(text, CTX))
    assert list(plan.stages[1].layers) == [
        "block.2.ln",
        "block.2.att",
        "block.2.res",
        "head",
        "loss",
    ]
    bad = (
        GPT.replace("HEADS", "2")
        + "pipeline: {stages: [[data, tok, block.1], [block.0, head, loss]], microbatches: 2}\n"
    )
    with pytest.raises(JobSpecError) as err:
        compile_job(bad, CTX)
    paths = {issue.path for issue in err.value.issues}
    assert "pipeline.stages[0][2]" in paths
