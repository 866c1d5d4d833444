"""Layers from tensors to tensors: conv, pool, norm, activation, shape and connection layers."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch.func import functional_call

from dsl.init import ParamSpec, initialise
from dsl.layers.base import LAYERS, BuildContext, Layer, LayerShapeError, Shape
from dsl.layers.connection import SliceConfig
from dsl.layers.conv import Conv
from dsl.layers.norm import BatchNorm

torch.set_num_threads(1)
torch.manual_seed(0)

CTX = BuildContext(sample_shape=(2, 8), num_classes=3)
BATCH = 3


def build(cfg: dict[str, Any], *in_shapes: Shape) -> tuple[Layer, Any]:
    config = LAYERS.get(cfg["type"])(name="layer", **cfg)
    module, out_shape = config.build(list(in_shapes), CTX)
    generator = torch.Generator().manual_seed(1)
    for name, param in module.named_parameters():
        initialise(param, module.default_param(module.param_role(name)), generator)
    return module, out_shape


L = TypeVar("L", bound=Layer)


def build_as(kind: type[L], cfg: dict[str, Any], *in_shapes: Shape) -> L:
    module, _ = build(cfg, *in_shapes)
    assert isinstance(module, kind)
    return module


def inputs(in_shapes: tuple[Shape, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(BATCH, *shape, dtype=dtype) for shape in in_shapes]


def shapes_of(out: torch.Tensor | tuple[torch.Tensor, ...]) -> Shape | list[Shape]:
    if isinstance(out, tuple):
        return [tuple(t.shape[1:]) for t in out]
    return tuple(out.shape[1:])


# (config, source shapes, expected output shape); every case also runs through gradcheck
CASES: list[tuple[dict[str, Any], tuple[Shape, ...], Shape | list[Shape]]] = [
    ({"type": "conv1d", "filters": 4, "kernel": 3}, ((2, 9),), (4, 7)),
    (
        {"type": "conv1d", "filters": 6, "kernel": 3, "stride": 2, "padding": 1, "dilation": 2}
        | {"groups": 2},
        ((4, 10),),
        (6, 4),
    ),
    (
        {"type": "conv2d", "filters": 3, "kernel": [3, 2], "stride": [2, 1], "padding": 1},
        ((2, 6, 5),),
        (3, 3, 6),
    ),
    ({"type": "convolution", "filters": 2, "kernel": 2, "bias": False}, ((1, 4, 4),), (2, 3, 3)),
    ({"type": "pool1d", "kernel": 2}, ((3, 8),), (3, 4)),
    (
        {"type": "pool1d", "method": "avg", "kernel": 3, "stride": 2, "padding": 1},
        ((3, 7),),
        (3, 4),
    ),
    ({"type": "pool2d", "kernel": [2, 3]}, ((2, 6, 6),), (2, 3, 2)),
    ({"type": "pooling", "method": "avg", "kernel": 2, "stride": 1}, ((2, 6, 6),), (2, 5, 5)),
    ({"type": "lrn", "size": 3, "alpha": 0.5}, ((5, 3, 3),), (5, 3, 3)),
    ({"type": "lrn", "size": 3, "alpha": 0.5}, ((6,),), (6,)),
    ({"type": "batchnorm"}, ((3, 2, 2),), (3, 2, 2)),
    ({"type": "batchnorm"}, ((5,),), (5,)),
    ({"type": "relu"}, ((4, 5),), (4, 5)),
    ({"type": "relu", "negative_slope": 0.1}, ((4, 5),), (4, 5)),
    ({"type": "sigmoid"}, ((4, 5),), (4, 5)),
    ({"type": "tanh"}, ((4, 5),), (4, 5)),
    ({"type": "stanh"}, ((4, 5),), (4, 5)),
    ({"type": "softmax"}, ((4, 5),), (4, 5)),
    ({"type": "flatten"}, ((2, 3, 4),), (24,)),
    ({"type": "flatten", "axis": 2}, ((2, 3, 4),), (2, 12)),
    ({"type": "flatten", "axis": 3}, ((2, 3, 4),), (2, 3, 4)),
    ({"type": "reshape", "shape": [-1, 4]}, ((2, 6),), (3, 4)),
    ({"type": "reshape", "shape": [3, 2, 2]}, ((12,),), (3, 2, 2)),
    ({"type": "concat"}, ((2, 3), (4, 3)), (6, 3)),
    ({"type": "concate", "concat_dim": 2}, ((2, 3), (2, 5), (2, 1)), (2, 9)),
    ({"type": "concat", "concat_dim": 0}, ((2, 3), (2, 3)), (2, 3)),
    ({"type": "slice", "num_slices": 2}, ((4, 3),), [(2, 3), (2, 3)]),
    (
        {"type": "slice", "slice_dim": 2, "slice_points": [1, 3]},
        ((2, 5),),
        [(2, 1), (2, 2), (2, 2)],
    ),
    ({"type": "slice", "slice_dim": 0, "num_slices": 3}, ((2, 3),), [(2, 3)] * 3),
    ({"type": "split", "num_splits": 2}, ((2, 3),), (2, 3)),
    ({"type": "add"}, ((2, 3), (2, 3), (2, 3)), (2, 3)),
]
IDS = [f"{cfg['type']}-{i}" for i, (cfg, _, _) in enumerate(CASES)]


@pytest.mark.parametrize(("cfg", "in_shapes", "expected"), CASES, ids=IDS)
def test_declared_shape_matches_forward(
    cfg: dict[str, Any], in_shapes: tuple[Shape, ...], expected: Shape | list[Shape]
) -> None:
    module, out_shape = build(cfg, *in_shapes)
    assert out_shape == expected
    out = module(*inputs(in_shapes))
    # the slice of the batch gives each part one sample, but the per-sample shape is unchanged
    assert shapes_of(out) == out_shape


@pytest.mark.parametrize(("cfg", "in_shapes", "expected"), CASES, ids=IDS)
def test_gradients_match_finite_differences(
    cfg: dict[str, Any], in_shapes: tuple[Shape, ...], expected: Shape | list[Shape]
) -> None:
    module, _ = build(cfg, *in_shapes)
    module = module.double()
    names = [name for name, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    xs = [x.requires_grad_() for x in inputs(in_shapes, torch.float64)]

    def call(*args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        weights = dict(zip(names, args[: len(names)], strict=True))
        return functional_call(module, weights, tuple(args[len(names) :]))

    assert torch.autograd.gradcheck(call, (*params, *xs))


def test_every_tensor_layer_type_is_registered() -> None:
    expected = {"conv1d", "conv2d", "convolution", "pool1d", "pool2d", "pooling", "lrn"}
    expected |= {"batchnorm", "dropout", "relu", "sigmoid", "tanh", "stanh", "softmax"}
    expected |= {"flatten", "reshape", "concat", "concate", "slice", "split", "add"}
    assert expected <= set(LAYERS.names())
    assert LAYERS.get("concat").arity == (2, None)
    assert LAYERS.get("add").arity == (2, None)
    assert LAYERS.get("conv2d").arity == (1, 1)


# ---- values ----


def test_conv_matches_torch_modules() -> None:
    module = build_as(
        Conv,
        {"type": "conv2d", "filters": 4, "kernel": 3, "stride": 2, "padding": 1, "groups": 2},
        (2, 7, 7),
    )
    reference = torch.nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2)
    assert module.b is not None and reference.bias is not None
    with torch.no_grad():
        reference.weight.copy_(module.w)
        reference.bias.copy_(module.b)
    x = torch.randn(BATCH, 2, 7, 7)
    torch.testing.assert_close(module(x), reference(x))
    assert dict(module.named_parameters()).keys() == {"w", "b"}
    assert module.w.shape == (4, 1, 3, 3)

    module1d = build_as(Conv, {"type": "conv1d", "filters": 2, "kernel": 2, "bias": False}, (3, 5))
    assert module1d.b is None
    x1 = torch.randn(BATCH, 3, 5)
    torch.testing.assert_close(module1d(x1), F.conv1d(x1, module1d.w))


def test_pool_values() -> None:
    x = torch.arange(8.0).reshape(1, 1, 8)
    avg, _ = build({"type": "pool1d", "method": "avg", "kernel": 2}, (1, 8))
    mx, _ = build({"type": "pool1d", "method": "max", "kernel": 4, "stride": 2}, (1, 8))
    assert avg(x).flatten().tolist() == [0.5, 2.5, 4.5, 6.5]
    assert mx(x).flatten().tolist() == [3.0, 5.0, 7.0]
    img = torch.arange(16.0).reshape(1, 1, 4, 4)
    mx2, _ = build({"type": "pool2d", "kernel": 2}, (1, 4, 4))
    assert mx2(img).flatten().tolist() == [5.0, 7.0, 13.0, 15.0]


def test_lrn_follows_singa_formula() -> None:
    size, alpha, beta, k = 3, 0.2, 0.75, 2.0
    module, _ = build({"type": "lrn", "size": size, "alpha": alpha, "beta": beta, "k": k}, (4,))
    x = torch.randn(BATCH, 4)
    squares = F.pad(x**2, (1, 1))  # zero channels beyond the edges
    window = squares[:, :-2] + squares[:, 1:-1] + squares[:, 2:]
    expected = x / (k + alpha / size * window) ** beta
    torch.testing.assert_close(module(x), expected)


def test_batchnorm_normalises_per_channel_and_tracks_running_stats() -> None:
    module = build_as(BatchNorm, {"type": "batchnorm", "momentum": 0.5}, (3, 4))
    assert module.w.tolist() == [1.0, 1.0, 1.0]
    assert module.b.tolist() == [0.0, 0.0, 0.0]
    assert {name for name, _ in module.named_buffers()} >= {"running_mean", "running_var"}
    x = torch.randn(16, 3, 4) * 3.0 + 5.0
    module.train()
    y = module(x)
    torch.testing.assert_close(y.mean(dim=(0, 2)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(dim=(0, 2), unbiased=False), torch.ones(3), atol=1e-3, rtol=0)
    torch.testing.assert_close(module.running_mean, 0.5 * x.mean(dim=(0, 2)))
    module.eval()
    expected = (x - module.running_mean[:, None]) / torch.sqrt(module.running_var[:, None] + 1e-5)
    torch.testing.assert_close(module(x), expected)


def test_activation_values() -> None:
    x = torch.tensor([[-2.0, -0.5, 0.0, 1.5]])
    relu, _ = build({"type": "relu"}, (4,))
    leaky, _ = build({"type": "relu", "negative_slope": 0.1}, (4,))
    stanh, _ = build({"type": "stanh"}, (4,))
    softmax, _ = build({"type": "softmax"}, (2, 4))
    assert relu(x).tolist() == [[0.0, 0.0, 0.0, 1.5]]
    torch.testing.assert_close(leaky(x), torch.tensor([[-0.2, -0.05, 0.0, 1.5]]))
    torch.testing.assert_close(stanh(x), 1.7159 * torch.tanh(2.0 / 3.0 * x))
    torch.testing.assert_close(stanh(torch.ones(1, 4)), torch.full((1, 4), 1.0), atol=1e-4, rtol=0)
    probs = softmax(torch.randn(BATCH, 2, 4))
    torch.testing.assert_close(probs.sum(-1), torch.ones(BATCH, 2))


def test_dropout_scales_in_training_and_is_identity_in_eval() -> None:
    module, shape = build({"type": "dropout", "ratio": 0.25}, (100, 40))
    assert shape == (100, 40)
    x = torch.rand(BATCH, 100, 40) + 1.0
    module.eval()
    assert torch.equal(module(x), x)
    module.train()
    y = module(x)
    dropped = y == 0
    assert abs(dropped.float().mean().item() - 0.25) < 0.02
    torch.testing.assert_close(y[~dropped], x[~dropped] / 0.75)
    none, _ = build({"type": "dropout", "ratio": 0.0}, (5,))
    z = torch.randn(BATCH, 5)
    assert torch.equal(none.train()(z), z)


def test_flatten_and_reshape_keep_sample_order() -> None:
    x = torch.randn(BATCH, 2, 3, 4)
    flat, _ = build({"type": "flatten", "axis": 2}, (2, 3, 4))
    assert torch.equal(flat(x), x.reshape(BATCH, 2, 12))
    reshape, _ = build({"type": "reshape", "shape": [4, -1]}, (2, 3, 4))
    assert torch.equal(reshape(x), x.reshape(BATCH, 4, 6))


def test_concat_slice_roundtrip() -> None:
    slicer, shapes = build({"type": "slice", "slice_dim": 2, "slice_points": [2, 3]}, (3, 6))
    assert SliceConfig(name="s", type="slice", slice_points=[2, 3]).num_outputs() == 3
    assert SliceConfig(name="s", type="slice", num_slices=4).num_outputs() == 4
    x = torch.randn(BATCH, 3, 6)
    parts = slicer(x)
    assert isinstance(parts, tuple) and len(parts) == 3
    assert [tuple(p.shape[1:]) for p in parts] == shapes == [(3, 2), (3, 1), (3, 3)]
    joiner, _ = build({"type": "concat", "concat_dim": 2}, *shapes)
    assert torch.equal(joiner(*parts), x)


def test_batch_slice_is_near_equal_and_needs_enough_samples() -> None:
    slicer, _ = build({"type": "slice", "slice_dim": 0, "num_slices": 2}, (4,))
    parts = slicer(torch.randn(5, 4))
    assert [p.shape[0] for p in parts] == [3, 2]
    with pytest.raises(ValueError, match="batch of 1 into 2"):
        slicer(torch.randn(1, 4))


def test_split_passes_input_and_sums_consumer_gradients() -> None:
    split, _ = build({"type": "split"}, (3,))
    add, _ = build({"type": "add"}, (3,), (3,))
    x = torch.randn(BATCH, 3, requires_grad=True)
    shared = split(x)
    assert torch.equal(shared, x)
    add(shared, 2.0 * shared).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, torch.full((BATCH, 3), 3.0))


# ---- shape errors: LayerShapeError naming the key at fault ----

SHAPE_ERRORS: list[tuple[dict[str, Any], tuple[Shape, ...], str | None, str]] = [
    ({"type": "conv1d", "filters": 2, "kernel": 5}, ((1, 4),), "kernel", "spans 5"),
    ({"type": "conv1d", "filters": 2, "kernel": 3, "dilation": 2}, ((1, 4),), "kernel", "spans 5"),
    ({"type": "conv2d", "filters": 2, "kernel": [2, 6]}, ((1, 8, 5),), "kernel", "width is 5"),
    ({"type": "conv2d", "filters": 2, "kernel": 3}, ((1, 8),), None, "rank 3"),
    ({"type": "conv1d", "filters": 2, "kernel": 2, "groups": 2}, ((3, 8),), "groups", "3 input"),
    ({"type": "pool1d", "kernel": 9}, ((1, 8),), "kernel", "spans 9"),
    ({"type": "pool2d", "kernel": 2, "padding": 2}, ((1, 8, 8),), "padding", "half the kernel"),
    ({"type": "pool2d", "kernel": 2}, ((8, 8),), None, "rank 3"),
    ({"type": "lrn"}, ((),), None, "scalar"),
    ({"type": "batchnorm"}, ((),), None, "scalar"),
    ({"type": "softmax"}, ((),), None, "scalar"),
    ({"type": "flatten", "axis": 3}, ((2, 3),), "axis", "axis 3"),
    ({"type": "reshape", "shape": [5, 2]}, ((2, 6),), "shape", "12 elements"),
    ({"type": "reshape", "shape": [5, -1]}, ((2, 6),), "shape", "not divisible by 5"),
    ({"type": "concat"}, ((2, 3), (2, 4)), None, "source 1"),
    ({"type": "concat"}, ((2, 3), (2, 3, 1)), None, "source 1"),
    ({"type": "concat", "concat_dim": 3}, ((2, 3), (2, 3)), "concat_dim", "concat_dim=3"),
    ({"type": "concat", "concat_dim": 0}, ((2, 3), (4, 3)), None, "source 1"),
    ({"type": "slice", "num_slices": 3}, ((4, 2),), "num_slices", "size 4"),
    ({"type": "slice", "slice_points": [1, 4]}, ((4, 2),), "slice_points", "size 4"),
    ({"type": "slice", "slice_dim": 3, "num_slices": 2}, ((4, 2),), "slice_dim", "slice_dim=3"),
    ({"type": "add"}, ((2, 3), (3, 2)), None, "identical"),
]


@pytest.mark.parametrize(("cfg", "in_shapes", "field", "message"), SHAPE_ERRORS)
def test_shape_errors(
    cfg: dict[str, Any], in_shapes: tuple[Shape, ...], field: str | None, message: str
) -> None:
    with pytest.raises(LayerShapeError, match=message) as caught:
        build(cfg, *in_shapes)
    assert caught.value.field == field
    assert caught.value.hint


# ---- config errors: pydantic rejects the keys before any shape is known ----

CONFIG_ERRORS: list[dict[str, Any]] = [
    {"type": "conv1d", "filters": 2, "kernel": [2, 2]},
    {"type": "conv1d", "filters": 0, "kernel": 2},
    {"type": "conv2d", "filters": 3, "kernel": 2, "groups": 2},
    {"type": "conv2d", "filters": 2, "kernel": [2, 0]},
    {"type": "conv2d", "filters": 2, "kernel": 2, "padding": -1},
    {"type": "conv2d", "filters": 2, "kernel": 2, "kernal": 3},
    {"type": "pool2d", "kernel": 2, "method": "min"},
    {"type": "pool1d"},
    {"type": "lrn", "size": 4},
    {"type": "batchnorm", "momentum": 0.0},
    {"type": "dropout", "ratio": 1.0},
    {"type": "dropout", "ratio": -0.1},
    {"type": "relu", "negative_slope": -1.0},
    {"type": "flatten", "axis": 0},
    {"type": "reshape", "shape": [-1, -1]},
    {"type": "reshape", "shape": [0, 3]},
    {"type": "reshape", "shape": []},
    {"type": "concat", "concat_dim": -1},
    {"type": "slice"},
    {"type": "slice", "num_slices": 2, "slice_points": [1]},
    {"type": "slice", "slice_points": [3, 2]},
    {"type": "slice", "slice_points": [0, 2]},
    {"type": "slice", "slice_dim": 0, "slice_points": [1]},
    {"type": "split", "num_splits": 0},
]


@pytest.mark.parametrize("cfg", CONFIG_ERRORS, ids=[str(c) for c in CONFIG_ERRORS])
def test_config_errors(cfg: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        LAYERS.get(cfg["type"])(name="layer", **cfg)


def test_batchnorm_and_conv_param_defaults() -> None:
    bn = build_as(BatchNorm, {"type": "batchnorm"}, (2,))
    assert bn.default_param("w") == ParamSpec(init="constant", value=1.0)
    assert bn.default_param("b") == ParamSpec(init="constant", value=0.0)
    conv = build_as(Conv, {"type": "conv1d", "filters": 2, "kernel": 3}, (4, 6))
    assert conv.default_param("w").init == "xavier"
    bound = math.sqrt(3.0 / ((4 * 3 + 2 * 3) / 2))
    assert conv.w.abs().max().item() <= bound
