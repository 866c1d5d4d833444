"""The transformer's layers against reference computations: attention against a hand-written
softmax(QK^T / sqrt d) V, layernorm against torch.nn.LayerNorm, the activations and positions."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from dsl.compiler import compile_job
from dsl.errors import JobSpecError
from dsl.init import initialise
from dsl.layers.attention import Attention, sinusoids
from dsl.layers.base import LAYERS, BuildContext, Layer, LayerShapeError, Shape

torch.set_num_threads(1)

CTX = BuildContext(sample_shape=(6,), num_classes=5, label_shape=(6,))


def build(cfg: dict[str, Any], shape: Shape) -> tuple[Layer, Any]:
    config = LAYERS.get(cfg["type"])(name="layer", **cfg)
    module, out_shape = config.build([shape], CTX)
    generator = torch.Generator().manual_seed(1)
    for name, param in module.named_parameters():
        spec = module.default_param(module.param_role(name))
        initialise(param, spec, generator)
        if name.startswith("b"):  # non-zero biases, so that the reference must use them
            param.data.normal_(0.0, 0.1, generator=generator)
    return module, out_shape


def reference_attention(x: torch.Tensor, module: Attention, causal: bool) -> torch.Tensor:
    _, steps, dim = x.shape
    heads, width = module.heads, dim // module.heads
    q, k, v = (x @ module.w_qkv.T + module.b_qkv).split(dim, dim=-1)
    outs = []
    for h in range(heads):
        part = slice(h * width, (h + 1) * width)
        scores = q[..., part] @ k[..., part].transpose(1, 2) / math.sqrt(width)  # (B, T, T)
        if causal:
            later = torch.triu(torch.ones(steps, steps, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(later, float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v[..., part])
    return torch.cat(outs, dim=-1) @ module.w_out.T + module.b_out


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_softmax_of_scaled_scores_times_values(heads: int, causal: bool) -> None:
    module, out_shape = build({"type": "attention", "heads": heads, "causal": causal}, (5, 8))
    assert isinstance(module, Attention)
    x = torch.randn(3, 5, 8)
    got = module(x)
    assert out_shape == (5, 8) and got.shape == (3, 5, 8)
    torch.testing.assert_close(got, reference_attention(x, module, causal))


def test_causal_attention_does_not_see_later_steps() -> None:
    module, _ = build({"type": "attention", "heads": 2, "causal": True}, (5, 8))
    x = torch.randn(1, 5, 8)
    changed = x.clone()
    changed[:, 3:] += 1.0
    torch.testing.assert_close(module(x)[:, :3], module(changed)[:, :3])
    assert not torch.allclose(module(x)[:, 3:], module(changed)[:, 3:])


def test_attention_dropout_only_in_training() -> None:
    module, _ = build({"type": "attention", "heads": 2, "dropout": 0.5}, (5, 8))
    x = torch.randn(2, 5, 8)
    module.eval()
    torch.testing.assert_close(module(x), reference_attention(x, module, False))
    module.train()
    assert not torch.allclose(module(x), module(x))


def test_attention_flops_count_projections_and_scores() -> None:
    module, out_shape = build({"type": "attention", "heads": 2}, (5, 8))
    flops = module.forward_flops([(5, 8)], out_shape)
    assert flops == 2 * 5 * (3 * 64 + 64) + 4 * 25 * 8


def test_attention_heads_must_divide_the_width() -> None:
    with pytest.raises(LayerShapeError, match="3 heads do not divide the source's 8") as err:
        build({"type": "attention", "heads": 3}, (5, 8))
    assert err.value.field == "heads"
    with pytest.raises(LayerShapeError, match=r"rank 2"):
        build({"type": "attention"}, (8,))


def test_layernorm_equals_torch_layernorm() -> None:
    module, out_shape = build({"type": "layernorm", "eps": 1e-4}, (5, 8))
    reference = torch.nn.LayerNorm(8, eps=1e-4)
    with torch.no_grad():
        module.w.normal_()  # type: ignore[operator]
        reference.weight.copy_(module.w)  # type: ignore[arg-type]
        reference.bias.copy_(module.b)  # type: ignore[arg-type]
    x = torch.randn(3, 5, 8) * 3 + 1
    assert out_shape == (5, 8)
    torch.testing.assert_close(module(x), reference(x))
    module.eval()
    torch.testing.assert_close(module(x), reference(x))


def test_layernorm_starts_as_the_identity_on_normalised_rows() -> None:
    module, _ = build({"type": "layernorm"}, (8,))
    assert torch.equal(module.w, torch.ones(8))  # type: ignore[arg-type]
    with pytest.raises(LayerShapeError, match="scalar"):
        build({"type": "layernorm"}, ())


def test_gelu_and_silu() -> None:
    x = torch.randn(4, 6)
    gelu, _ = build({"type": "gelu"}, (6,))
    torch.testing.assert_close(gelu(x), x * 0.5 * (1 + torch.erf(x / math.sqrt(2))))
    tanh, _ = build({"type": "gelu", "approximate": "tanh"}, (6,))
    torch.testing.assert_close(tanh(x), F.gelu(x, approximate="tanh"))
    silu, shape = build({"type": "silu"}, (6,))
    torch.testing.assert_close(silu(x), x * torch.sigmoid(x))
    assert shape == (6,)


def test_learned_positions_add_one_row_per_step() -> None:
    module, out_shape = build({"type": "positional_embedding", "max_len": 7}, (5, 4))
    assert out_shape == (5, 4) and module.w.shape == (7, 4)  # type: ignore[union-attr]
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(module(x), x + module.w[:5])  # type: ignore[index]


def test_sinusoidal_positions_are_the_fixed_code() -> None:
    module, _ = build({"type": "positional_embedding", "kind": "sinusoidal"}, (5, 4))
    assert not list(module.parameters())
    x = torch.zeros(1, 5, 4)
    out = module(x)[0]
    assert out[3, 0] == pytest.approx(math.sin(3.0))
    assert out[3, 1] == pytest.approx(math.cos(3.0))
    assert out[3, 2] == pytest.approx(math.sin(3.0 / 100.0))
    torch.testing.assert_close(sinusoids(5, 4), out)


def test_positions_past_max_len_are_refused() -> None:
    with pytest.raises(LayerShapeError, match="6 time steps, more than max_len 4") as err:
        build({"type": "positional_embedding", "max_len": 4}, (6, 8))
    assert err.value.field == "max_len"


TEXT_JOB = """
name: tiny-gpt
data: {source: text, seq_len: 6, batch_size: 4}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: tok, type: embedding, srclayers: [data], dim: 8}
    - {name: pos, type: positional_embedding, srclayers: [tok]}
    - {name: att, type: attention, srclayers: [pos], heads: HEADS, causal: true}
    - {name: ln, type: layernorm, srclayers: [att]}
    - {name: head, type: dense, axis: 2, srclayers: [ln]}
    - {name: loss, type: softmax_loss, srclayers: [head]}
updater: {type: adam, lr: {base: 0.01}}
train_steps: 2
"""


def test_a_bad_head_count_is_located_at_its_key() -> None:
    with pytest.raises(JobSpecError) as err:
        compile_job(TEXT_JOB.replace("HEADS", "3"), CTX)
    [issue] = err.value.issues
    assert issue.path == "neuralnet.layers[3].heads"
    assert issue.line == 9
    assert "3 heads do not divide" in issue.message


def test_the_layers_compile_into_a_net() -> None:
    job = compile_job(TEXT_JOB.replace("HEADS", "2"), CTX)
    names = job.net.named_params()
    assert set(names) >= {"att/w_qkv", "att/b_out", "ln/w", "pos/w", "tok/w"}
    out = job.net(torch.randint(0, 5, (4, 6)), torch.randint(0, 5, (4, 6)))
    assert out.loss is not None and torch.isfinite(out.loss)
