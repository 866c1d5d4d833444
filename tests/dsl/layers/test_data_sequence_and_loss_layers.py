"""Layers at the ends of a net and over sequences: input, embedding, onehot, rnn/lstm/gru, rbm
and the loss layers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch.autograd import gradcheck
from torch.func import functional_call

from dsl.init import initialise
from dsl.layers.base import LAYERS, BuildContext, Layer, LayerShapeError, Shape, StatefulLayer
from dsl.layers.embedding import Embedding
from dsl.layers.loss import topk_accuracy
from dsl.layers.rbm import RBM
from dsl.layers.recurrent import Recurrent

torch.set_num_threads(1)
torch.manual_seed(0)

CTX = BuildContext(sample_shape=(5,), num_classes=4, label_shape=(), label_is_index=True)


def build(
    cfg: dict[str, Any], in_shapes: list[Shape], ctx: BuildContext = CTX
) -> tuple[Layer, Any]:
    """Build from a config dict through the registry and initialise as the compiler would."""
    module, shape = LAYERS.get(cfg["type"])(name="layer", **cfg).build(in_shapes, ctx)
    generator = torch.Generator().manual_seed(1)
    for local_name, param in module.named_parameters():
        initialise(param, module.default_param(module.param_role(local_name)), generator)
    return module, shape


def check_params(module: Layer, inputs: tuple[torch.Tensor, ...], reset: bool = False) -> None:
    """gradcheck of the module's output with respect to every parameter (double precision)."""
    names = [n for n, _ in module.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in module.named_parameters())

    def run(*values: torch.Tensor) -> torch.Tensor:
        if reset:
            assert isinstance(module, StatefulLayer)
            module.reset_state()
        return functional_call(module, dict(zip(names, values, strict=True)), inputs)

    assert gradcheck(run, params)


# input


def test_input_passes_the_data_on() -> None:
    module, shape = build({"type": "input"}, [], BuildContext(sample_shape=(2, 3)))
    x = torch.randn(3, 2, 3)
    assert shape == (2, 3)
    assert torch.equal(module(x), x)
    assert LAYERS.get("input").arity == (0, 0)


def test_input_shape_must_match_the_data() -> None:
    _, shape = build({"type": "input", "shape": [2, 3]}, [], BuildContext(sample_shape=(2, 3)))
    assert shape == (2, 3)
    with pytest.raises(LayerShapeError) as err:
        build({"type": "input", "shape": [6]}, [], BuildContext(sample_shape=(2, 3)))
    assert err.value.field == "shape"
    assert "[2, 3]" in err.value.message
    with pytest.raises(ValidationError):
        build({"type": "input", "shape": [0]}, [])


# embedding and onehot


def test_embedding_shape_and_lookup() -> None:
    module, shape = build({"type": "embedding", "vocab_size": 7, "dim": 3}, [(5,)])
    assert isinstance(module, Embedding)
    x = torch.randint(0, 7, (3, 5))
    out = module(x)
    assert shape == (5, 3) == tuple(out.shape[1:])
    assert torch.equal(out[1, 2], module.w[x[1, 2]])
    _, scalar_shape = build({"type": "embedding", "vocab_size": 7, "dim": 3}, [()])
    assert scalar_shape == (3,)


def test_embedding_vocab_defaults_to_num_classes() -> None:
    module, _ = build({"type": "embedding", "dim": 2}, [(5,)])
    assert module.w.shape == (CTX.num_classes, 2)
    with pytest.raises(LayerShapeError) as err:
        build({"type": "embedding", "dim": 2}, [(5,)], BuildContext(sample_shape=(5,)))
    assert err.value.field == "vocab_size"


def test_embedding_default_init_is_unit_gaussian() -> None:
    module, _ = build({"type": "embedding", "vocab_size": 500, "dim": 40}, [(5,)])
    assert isinstance(module, Embedding)
    assert abs(module.w.std().item() - 1.0) < 0.05


def test_embedding_errors() -> None:
    with pytest.raises(LayerShapeError):
        build({"type": "embedding", "vocab_size": 7, "dim": 3}, [(5, 2)])
    with pytest.raises(ValidationError):
        build({"type": "embedding", "vocab_size": 7}, [(5,)])
    module, _ = build({"type": "embedding", "vocab_size": 7, "dim": 3}, [(5,)])
    with pytest.raises(IndexError, match="vocab_size"):
        module(torch.tensor([[1, 7, 0, 0, 0]]))


def test_embedding_gradcheck_on_weight() -> None:
    module, _ = build({"type": "embedding", "vocab_size": 4, "dim": 2}, [(3,)])
    # repeated indices: their gradients must accumulate into the same row
    check_params(module.double(), (torch.tensor([[0, 1, 1], [3, 0, 1]]),))


def test_onehot_shapes_and_values() -> None:
    module, shape = build({"type": "onehot", "depth": 6}, [(4,)])
    x = torch.randint(0, 6, (3, 4))
    out = module(x)
    assert shape == (4, 6) == tuple(out.shape[1:])
    assert out.dtype == torch.float32
    assert torch.equal(out.argmax(-1), x)
    assert torch.equal(out.sum(-1), torch.ones(3, 4))
    module, shape = build({"type": "onehot"}, [()])
    out = module(torch.tensor([0, 3, 2]))
    assert shape == (4,) == tuple(out.shape[1:])


def test_onehot_follows_the_net_dtype_and_checks_range() -> None:
    module, _ = build({"type": "onehot", "depth": 3}, [(2,)])
    assert module.double()(torch.tensor([[0, 2]])).dtype == torch.float64
    with pytest.raises(IndexError, match="depth"):
        module(torch.tensor([[0, 3]]))
    with pytest.raises(LayerShapeError) as err:
        build({"type": "onehot"}, [(2,)], BuildContext())
    assert err.value.field == "depth"


# recurrent

RECURRENT = [
    {"type": "rnn"},
    {"type": "rnn", "nonlinearity": "relu"},
    {"type": "lstm"},
    {"type": "gru"},
]


@pytest.mark.parametrize("kind", RECURRENT, ids=lambda c: "-".join(c.values()))
@pytest.mark.parametrize("output", ["sequence", "last"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_recurrent_shapes(kind: dict[str, Any], output: str, bidirectional: bool) -> None:
    cfg = {**kind, "hidden": 4, "num_layers": 2, "output": output, "bidirectional": bidirectional}
    module, shape = build(cfg, [(6, 3)])
    out = module(torch.randn(3, 6, 3))
    width = 8 if bidirectional else 4
    assert shape == ((6, width) if output == "sequence" else (width,))
    assert tuple(out.shape[1:]) == shape


@pytest.mark.parametrize("kind", RECURRENT, ids=lambda c: "-".join(c.values()))
def test_recurrent_gradcheck(kind: dict[str, Any]) -> None:
    cfg = {**kind, "hidden": 2, "bidirectional": True, "output": "last"}
    module, _ = build(cfg, [(3, 2)])
    module.double()
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    if kind.get("nonlinearity") == "relu":
        # keep pre-activations away from relu's kink, where finite differences disagree
        x = (x.detach() + 2.0).requires_grad_(True)
    assert gradcheck(lambda v: module(v), (x,))
    check_params(module, (x.detach(),), reset=True)


def test_recurrent_param_roles_and_default_init() -> None:
    module, _ = build({"type": "lstm", "hidden": 3, "bidirectional": True}, [(4, 2)])
    roles = {name: module.param_role(name) for name, _ in module.named_parameters()}
    assert set(roles.values()) == {"w", "b"}
    assert roles["rnn.weight_hh_l0_reverse"] == "w"
    assert roles["rnn.bias_ih_l0"] == "b"
    params = dict(module.named_parameters())
    assert torch.count_nonzero(params["rnn.bias_ih_l0"]) == 0
    assert torch.count_nonzero(params["rnn.weight_ih_l0"]) == params["rnn.weight_ih_l0"].numel()


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_recurrent_carries_state_across_chunks(kind: str) -> None:
    module, _ = build({"type": kind, "hidden": 3, "num_layers": 2}, [(6, 2)])
    assert isinstance(module, StatefulLayer)
    x = torch.randn(3, 6, 2)
    whole = module(x)
    module.reset_state()
    first = module(x[:, :4])
    module.detach_state()
    second = module(x[:, 4:])
    torch.testing.assert_close(torch.cat([first, second], 1), whole)
    states = module.state if isinstance(module.state, tuple) else (module.state,)
    assert any(s.requires_grad for s in states)  # the last call's state is still in its graph
    module.detach_state()
    states = module.state if isinstance(module.state, tuple) else (module.state,)
    assert all(not s.requires_grad for s in states)


def test_recurrent_state_of_another_batch_size_is_dropped() -> None:
    module, _ = build({"type": "gru", "hidden": 3}, [(4, 2)])
    assert isinstance(module, StatefulLayer)
    x = torch.randn(3, 4, 2)
    module(torch.randn(5, 4, 2))
    after_other_batch = module(x)
    module.reset_state()
    torch.testing.assert_close(after_other_batch, module(x))


def test_bidirectional_starts_each_call_from_zeros() -> None:
    module, _ = build({"type": "lstm", "hidden": 3, "bidirectional": True}, [(4, 2)])
    x = torch.randn(3, 4, 2)
    first = module(x)
    assert module.state is None
    torch.testing.assert_close(module(x), first)
    last, _ = build(
        {"type": "lstm", "hidden": 3, "bidirectional": True, "output": "last"}, [(4, 2)]
    )
    last.load_state_dict(module.state_dict())
    # forward direction ends at the last step, backward direction at the first
    expected = torch.cat([first[:, -1, :3], first[:, 0, 3:]], 1)
    torch.testing.assert_close(last(x), expected)


def test_recurrent_config_and_shape_errors() -> None:
    with pytest.raises(ValidationError, match="num_layers"):
        build({"type": "gru", "hidden": 3, "dropout": 0.5}, [(4, 2)])
    module, _ = build({"type": "gru", "hidden": 3, "num_layers": 2, "dropout": 0.5}, [(4, 2)])
    assert isinstance(module, Recurrent)
    assert module.rnn.dropout == 0.5
    with pytest.raises(ValidationError):
        build({"type": "lstm", "hidden": 3, "nonlinearity": "relu"}, [(4, 2)])
    with pytest.raises(ValidationError):
        build({"type": "rnn", "hidden": 0}, [(4, 2)])
    with pytest.raises(LayerShapeError, match="rank 2"):
        build({"type": "rnn", "hidden": 3}, [(4,)])


# rbm


def test_rbm_forward_is_the_hidden_probabilities() -> None:
    module, shape = build({"type": "rbm", "hidden": 4}, [(2, 3)])
    assert isinstance(module, RBM)
    v = torch.rand(3, 2, 3)
    out = module(v)
    assert shape == (4,) == tuple(out.shape[1:])
    torch.testing.assert_close(out, torch.sigmoid(v.flatten(1) @ module.w.t() + module.hb))
    assert module.w.shape == (4, 6) and module.vb.shape == (6,)
    assert abs(module.w.std().item() - 0.01) < 0.005
    assert torch.count_nonzero(module.hb) == torch.count_nonzero(module.vb) == 0
    with pytest.raises(ValidationError):
        build({"type": "rbm", "hidden": 4, "visible": "poisson"}, [(6,)])


def test_rbm_gradcheck() -> None:
    module, _ = build({"type": "rbm", "hidden": 3, "visible": "gaussian"}, [(4,)])
    assert isinstance(module, RBM)
    module.double()
    with torch.no_grad():
        module.w.normal_(0, 0.5)
    v = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x: module(x), (v,))
    check_params(module, (v.detach(),))


def gibbs_chain(rbm: RBM, v0: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """The chain end cd_loss draws with the same seed, written out independently."""
    generator = torch.Generator().manual_seed(seed)
    v = v0
    with torch.no_grad():
        for step in range(k):
            h = torch.bernoulli(torch.sigmoid(v @ rbm.w.t() + rbm.hb), generator=generator)
            pre = h @ rbm.w + rbm.vb
            mean = torch.sigmoid(pre) if rbm.visible == "binary" else pre
            if step == k - 1:
                v = mean
            elif rbm.visible == "binary":
                v = torch.bernoulli(mean, generator=generator)
            else:
                v = mean + torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
    return v


@pytest.mark.parametrize("visible", ["binary", "gaussian"])
@pytest.mark.parametrize("k", [1, 3])
def test_cd_gradient_is_the_difference_of_statistics(visible: str, k: int) -> None:
    module, _ = build({"type": "rbm", "hidden": 3, "visible": visible}, [(5,)])
    rbm = module.double()
    assert isinstance(rbm, RBM)
    with torch.no_grad():
        rbm.w.normal_(0, 0.5)
        rbm.hb.normal_(0, 0.5)
        rbm.vb.normal_(0, 0.5)
    v0 = torch.bernoulli(torch.full((8, 5), 0.5, dtype=torch.float64))
    loss, recon = rbm.cd_loss(v0, k, torch.Generator().manual_seed(7))
    loss.backward()

    vk = gibbs_chain(rbm, v0, k, seed=7)
    with torch.no_grad():
        h0 = torch.sigmoid(v0 @ rbm.w.t() + rbm.hb)
        hk = torch.sigmoid(vk @ rbm.w.t() + rbm.hb)
        # dF/dvb is -v for binary units and -(v - vb) for gaussian ones; the vb term cancels
        expected = {
            "w": -(h0.t() @ v0 - hk.t() @ vk) / len(v0),
            "hb": -(h0.mean(0) - hk.mean(0)),
            "vb": -(v0.mean(0) - vk.mean(0)),
        }
    for name, grad in expected.items():
        torch.testing.assert_close(getattr(rbm, name).grad, grad)
    assert recon.ndim == 0 and not recon.requires_grad


def test_cd_needs_a_step() -> None:
    module, _ = build({"type": "rbm", "hidden": 2}, [(3,)])
    assert isinstance(module, RBM)
    with pytest.raises(ValueError, match="k >= 1"):
        module.cd_loss(torch.rand(2, 3), 0, None)


def test_cd1_training_lowers_reconstruction_error() -> None:
    module, _ = build({"type": "rbm", "hidden": 6}, [(8,)])
    assert isinstance(module, RBM)
    patterns = torch.tensor(
        [[1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0, 1, 0]],
        dtype=torch.float32,
    )
    data = patterns.repeat(4, 1)  # (12, 8)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.2, momentum=0.5)
    generator = torch.Generator().manual_seed(3)
    errors = []
    for _ in range(300):
        optimizer.zero_grad()
        loss, recon = module.cd_loss(data, 1, generator)
        loss.backward()
        optimizer.step()
        errors.append(recon.item())
    start, end = sum(errors[:10]) / 10, sum(errors[-10:]) / 10
    assert end < 0.5 * start
    assert end < 0.1


# loss and metric layers


def test_softmax_loss_matches_cross_entropy_and_top_k() -> None:
    module, shape = build({"type": "softmax_loss", "topk": 2}, [(4,)])
    assert module.is_loss and shape == ()
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 0.0]])
    labels = torch.tensor([1, 0, 2])
    loss = module(logits, labels)
    assert loss.ndim == 0
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels))
    metrics = module.metrics(logits, labels)
    assert set(metrics) == {"accuracy"}
    torch.testing.assert_close(metrics["accuracy"], torch.tensor(2 / 3))  # label 0 not in top 2
    top1, _ = build({"type": "accuracy"}, [(4,)])
    assert top1.is_metric and not top1.is_loss
    torch.testing.assert_close(top1(logits, labels), torch.tensor(0.0))
    torch.testing.assert_close(top1.metrics(logits, labels), {"accuracy": torch.tensor(0.0)})


def test_softmax_loss_over_sequences() -> None:
    ctx = BuildContext(sample_shape=(6,), num_classes=5, label_shape=(6,))
    module, _ = build({"type": "softmax_loss"}, [(6, 5)], ctx)
    logits, labels = torch.randn(3, 6, 5), torch.randint(0, 5, (3, 6))
    expected = F.cross_entropy(logits.reshape(18, 5), labels.reshape(18))
    torch.testing.assert_close(module(logits, labels), expected)
    hits = (logits.argmax(-1) == labels).float().mean()
    torch.testing.assert_close(module.metrics(logits, labels)["accuracy"], hits)
    accuracy, _ = build({"type": "accuracy"}, [(6, 5)], ctx)
    torch.testing.assert_close(accuracy(logits, labels), hits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("k", [1, 2])
def test_accuracy_is_the_mean_of_the_hits_in_the_scores_dtype_to_the_bit(
    dtype: torch.dtype, k: int
) -> None:
    """The trainer sums every step's accuracy: it is the value `.to(dtype).mean()` gave, to
    the bit, for batch sizes whose fractions do not round evenly."""
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 3, 7, 24, 100, 999):
        logits = torch.randn(batch, 5, generator=gen).to(dtype)
        labels = torch.randint(0, 5, (batch,), generator=gen)
        if k == 1:  # argmax, which picks its own among equal scores
            hits = logits.argmax(1) == labels
        else:
            hits = (logits.topk(k, dim=1).indices == labels.unsqueeze(1)).any(1)
        expected = hits.to(dtype).mean()
        got = topk_accuracy(logits, labels, k)
        assert got.dtype == dtype and torch.equal(got, expected)


def test_softmax_loss_gradcheck() -> None:
    module, _ = build({"type": "softmax_loss"}, [(4,)])
    logits = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 3, 1])
    assert gradcheck(lambda x: module(x, labels), (logits,))


@pytest.mark.parametrize("kind", ["softmax_loss", "accuracy"])
def test_class_score_shape_errors(kind: str) -> None:
    with pytest.raises(LayerShapeError, match="labels of shape"):
        build({"type": kind}, [(3, 4)])  # sequence scores, but one label per sample
    with pytest.raises(LayerShapeError, match="4 classes"):
        build({"type": kind}, [(3,)])
    with pytest.raises(LayerShapeError, match="rank 1 or 2"):
        build({"type": kind}, [(2, 3, 4)])
    with pytest.raises(LayerShapeError, match="class-index labels") as err:
        build({"type": kind}, [(4,)], BuildContext(num_classes=4, label_is_index=False))
    assert "euclidean_loss" in str(err.value.hint)
    with pytest.raises(LayerShapeError) as err:
        build({"type": kind, "topk": 5}, [(4,)])
    assert err.value.field == "topk"
    with pytest.raises(ValidationError):
        build({"type": kind, "topk": 0}, [(4,)])


def test_euclidean_loss_against_labels_and_second_source() -> None:
    assert LAYERS.get("euclidean_loss").arity == (1, 2)
    ctx = BuildContext(sample_shape=(3,), label_shape=(2,), label_is_index=False)
    module, shape = build({"type": "euclidean_loss"}, [(2,)], ctx)
    assert module.is_loss and shape == ()
    prediction, target = torch.randn(4, 2), torch.randn(4, 2)
    expected = 0.5 * ((prediction - target) ** 2).sum() / 4
    torch.testing.assert_close(module(prediction, target), expected)
    assert module.metrics(prediction, target) == {}

    pair, _ = build({"type": "euclidean_loss"}, [(2, 3), (2, 3)], ctx)
    a, b, labels = torch.randn(4, 2, 3), torch.randn(4, 2, 3), torch.randn(4, 2)
    torch.testing.assert_close(pair(a, b, labels), 0.5 * ((a - b) ** 2).sum() / 4)


def test_euclidean_loss_fits_a_scalar_label_and_gradchecks() -> None:
    ctx = BuildContext(sample_shape=(3,), label_shape=(), label_is_index=False)
    module, _ = build({"type": "euclidean_loss"}, [(1,)], ctx)
    prediction = torch.randn(5, 1, dtype=torch.float64, requires_grad=True)
    labels = torch.randn(5, dtype=torch.float32)
    expected = 0.5 * ((prediction.detach().squeeze(1) - labels.double()) ** 2).mean()
    torch.testing.assert_close(module(prediction, labels), expected)
    assert gradcheck(lambda x: module(x, labels), (prediction,))


def test_euclidean_loss_shape_errors_name_both_shapes() -> None:
    ctx = BuildContext(label_shape=(3,), label_is_index=False)
    with pytest.raises(LayerShapeError, match=r"\[2\].*\[3\].*labels"):
        build({"type": "euclidean_loss"}, [(2,)], ctx)
    with pytest.raises(LayerShapeError, match=r"\[2, 3\].*\[3, 2\].*second source"):
        build({"type": "euclidean_loss"}, [(2, 3), (3, 2)], ctx)
