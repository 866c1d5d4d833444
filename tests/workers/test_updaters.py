"""Updaters against hand-computed closed forms; scales, clipping, grouping and state round trips."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, get_args

import pytest
import safetensors.torch
import torch
from pydantic import TypeAdapter, ValidationError

from dsl.updater_config import UpdaterConfig
from workers.updaters import UPDATERS, ParamEntry, Updater

torch.set_num_threads(1)

CONFIG = TypeAdapter(UpdaterConfig)


def config(**fields: Any) -> UpdaterConfig:
    fields.setdefault("lr", {"base": 0.1})
    return CONFIG.validate_python(fields)


def param(*values: float) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.tensor(values, dtype=torch.float64))


def step_with(
    updater: Updater, grads: dict[str, list[float]], params: dict[str, torch.Tensor], step: int
) -> None:
    for name, grad in grads.items():
        params[name].grad = torch.tensor(grad, dtype=torch.float64)
    updater.step(step)


def values(tensor: torch.Tensor) -> list[float]:
    return tensor.detach().tolist()


def test_registry_covers_every_updater_type() -> None:
    members = get_args(get_args(UpdaterConfig)[0])
    declared = sorted(get_args(m.model_fields["type"].annotation)[0] for m in members)
    assert declared == UPDATERS.names()


def test_sgd_momentum_weight_decay_two_steps() -> None:
    p = param(1.0, -2.0)
    lr, m, wd, g = 0.1, 0.9, 0.01, [0.5, 0.25]
    upd = Updater([ParamEntry("l/w", p)], config(type="sgd", momentum=m, weight_decay=wd), 10)
    p0 = [1.0, -2.0]
    g1 = [gi + wd * pi for gi, pi in zip(g, p0, strict=True)]
    p1 = [pi - lr * bi for pi, bi in zip(p0, g1, strict=True)]
    g2 = [gi + wd * pi for gi, pi in zip(g, p1, strict=True)]
    buf2 = [m * b1 + b2 for b1, b2 in zip(g1, g2, strict=True)]
    p2 = [pi - lr * bi for pi, bi in zip(p1, buf2, strict=True)]
    step_with(upd, {"l/w": g}, {"l/w": p}, 0)
    assert values(p) == pytest.approx(p1, rel=1e-12)
    step_with(upd, {"l/w": g}, {"l/w": p}, 1)
    assert values(p) == pytest.approx(p2, rel=1e-12)


def test_nesterov_first_step_looks_ahead() -> None:
    p = param(1.0, -1.0)
    upd = Updater([ParamEntry("l/w", p)], config(type="nesterov", momentum=0.9), 10)
    step_with(upd, {"l/w": [1.0, 2.0]}, {"l/w": p}, 0)
    # buf = g; update = g + momentum * buf = 1.9 g
    assert values(p) == pytest.approx([1.0 - 0.1 * 1.9, -1.0 - 0.1 * 3.8], rel=1e-12)


def test_adagrad_two_steps_with_lr_decay() -> None:
    p = param(0.0, 0.0)
    eps, g = 1e-10, [2.0, -0.5]
    upd = Updater([ParamEntry("l/w", p)], config(type="adagrad", lr_decay=0.5, eps=eps), 10)
    step_with(upd, {"l/w": g}, {"l/w": p}, 0)
    step_with(upd, {"l/w": g}, {"l/w": p}, 1)
    # sum of squares after t steps is t * g^2; update t uses lr / (1 + (t - 1) * lr_decay)
    expected = [
        -0.1 * gi / (abs(gi) + eps) - 0.1 / 1.5 * gi / (math.sqrt(2) * abs(gi) + eps) for gi in g
    ]
    assert values(p) == pytest.approx(expected, rel=1e-9)


def test_rmsprop_first_step() -> None:
    p = param(0.0, 0.0)
    rho, eps, g = 0.9, 1e-8, [3.0, -0.2]
    upd = Updater([ParamEntry("l/w", p)], config(type="rmsprop", rho=rho, eps=eps), 10)
    step_with(upd, {"l/w": g}, {"l/w": p}, 0)
    expected = [-0.1 * gi / (math.sqrt(1 - rho) * abs(gi) + eps) for gi in g]
    assert values(p) == pytest.approx(expected, rel=1e-9)


def test_adadelta_first_step() -> None:
    p = param(0.0, 0.0)
    rho, eps, g = 0.9, 1e-6, [1.0, -4.0]
    cfg = config(type="adadelta", rho=rho, eps=eps, lr={"base": 1.0})
    upd = Updater([ParamEntry("l/w", p)], cfg, 10)
    step_with(upd, {"l/w": g}, {"l/w": p}, 0)
    expected = [-math.sqrt(eps) / math.sqrt((1 - rho) * gi**2 + eps) * gi for gi in g]
    assert values(p) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_bias_corrected_steps_are_lr_times_sign(amsgrad: bool) -> None:
    p = param(1.0, 1.0)
    eps, g = 1e-8, [0.003, -7.0]
    upd = Updater([ParamEntry("l/w", p)], config(type="adam", amsgrad=amsgrad), 10)
    # with a constant gradient the bias-corrected moments are exactly g and g^2
    step_with(upd, {"l/w": g}, {"l/w": p}, 0)
    assert values(p) == pytest.approx([1.0 - 0.1 * gi / (abs(gi) + eps) for gi in g], rel=1e-9)
    step_with(upd, {"l/w": g}, {"l/w": p}, 1)
    assert values(p) == pytest.approx([1.0 - 0.2 * gi / (abs(gi) + eps) for gi in g], rel=1e-9)


def test_adamax_first_step() -> None:
    p = param(0.0, 0.0)
    eps, g = 1e-8, [0.5, -2.0]
    upd = Updater([ParamEntry("l/w", p)], config(type="adamax"), 10)
    step_with(upd, {"l/w": g}, {"l/w": p}, 0)
    assert values(p) == pytest.approx([-0.1 * gi / (abs(gi) + eps) for gi in g], rel=1e-9)


def test_lr_and_wd_scales_apply_per_parameter() -> None:
    a, b, c = param(1.0), param(1.0), param(1.0)
    entries = [
        ParamEntry("l1/w", a),
        ParamEntry("l1/b", b, lr_scale=2.0, wd_scale=0.0),
        ParamEntry("l2/w", c),
    ]
    upd = Updater(entries, config(type="sgd", weight_decay=0.5), 10)
    assert len(upd.optimizer.param_groups) == 2
    step_with(
        upd, {"l1/w": [1.0], "l1/b": [1.0], "l2/w": [1.0]}, {"l1/w": a, "l1/b": b, "l2/w": c}, 0
    )
    assert values(a) == pytest.approx([1.0 - 0.1 * (1.0 + 0.5)])
    assert values(b) == pytest.approx([1.0 - 0.2 * 1.0])
    assert values(c) == values(a)


def test_uniform_scales_make_one_group() -> None:
    entries = [ParamEntry(f"l{i}/w", param(0.0), lr_scale=0.5, wd_scale=2.0) for i in range(5)]
    upd = Updater(entries, config(type="adam", weight_decay=0.01), 10)
    (group,) = upd.optimizer.param_groups
    assert len(group["params"]) == 5
    assert group["weight_decay"] == pytest.approx(0.02)
    assert group["lr"] == pytest.approx(0.05)


def test_each_step_sets_the_scheduled_lr() -> None:
    p, q = param(0.0), param(0.0)
    cfg = config(type="sgd", lr={"base": 1.0, "schedule": "step", "gamma": 0.1, "freq": 2})
    upd = Updater([ParamEntry("a/w", p), ParamEntry("b/w", q, lr_scale=0.5)], cfg, 10)
    step_with(upd, {"a/w": [1.0], "b/w": [1.0]}, {"a/w": p, "b/w": q}, 2)
    assert upd.lr_at(2) == pytest.approx(0.1)
    assert [g["lr"] for g in upd.optimizer.param_groups] == pytest.approx([0.1, 0.05])
    assert values(p) == pytest.approx([-0.1])
    assert values(q) == pytest.approx([-0.05])


def test_missing_horizon_fails_at_construction() -> None:
    cfg = config(type="sgd", lr={"base": 1.0, "schedule": "cosine"})
    with pytest.raises(ValueError, match="needs a horizon"):
        Updater([ParamEntry("a/w", param(0.0))], cfg, 0)


def test_clip_by_global_norm() -> None:
    a, b = param(0.0, 0.0), param(0.0)
    cfg = config(type="sgd", lr={"base": 1.0}, clip={"grad_norm": 1.0})
    upd = Updater([ParamEntry("a/w", a), ParamEntry("b/w", b)], cfg, 10)
    step_with(upd, {"a/w": [3.0, 0.0], "b/w": [4.0]}, {"a/w": a, "b/w": b}, 0)
    # global norm 5 -> every gradient scaled by 1/5
    assert values(a) == pytest.approx([-0.6, 0.0], rel=1e-5)
    assert values(b) == pytest.approx([-0.8], rel=1e-5)
    step_with(upd, {"a/w": [0.3, 0.0], "b/w": [0.4]}, {"a/w": a, "b/w": b}, 1)
    assert values(b) == pytest.approx([-1.2], rel=1e-5)


def test_the_loss_scale_is_undone_before_clipping_and_an_overflow_skips_the_step() -> None:
    """fp16's scaler (its arithmetic is the same on a CPU): the scaled gradients of the loss
    update as the plain ones would, clipped by their true norm; an inf skips the step."""
    a, b = param(0.0, 0.0), param(0.0)
    cfg = config(type="sgd", momentum=0.9, lr={"base": 1.0}, clip={"grad_norm": 1.0})
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    upd = Updater([ParamEntry("a/w", a), ParamEntry("b/w", b)], cfg, 10, scaler=scaler)
    weights = (
        torch.tensor([3.0, 0.0], dtype=torch.float64),
        torch.tensor([4.0], dtype=torch.float64),
    )
    scaler.scale((a * weights[0]).sum() + (b * weights[1]).sum()).backward()
    upd.step(0)
    assert values(a) == pytest.approx([-0.6, 0.0], rel=1e-6)  # as test_clip_by_global_norm
    assert values(b) == pytest.approx([-0.8], rel=1e-6)
    assert scaler.get_scale() == 512.0  # a finite step grows it (every step here)
    upd.zero_grad()
    scaler.scale((a * float("inf")).sum() + b.sum()).backward()
    upd.step(1)
    assert values(a) == pytest.approx([-0.6, 0.0], rel=1e-6)
    assert values(b) == pytest.approx([-0.8], rel=1e-6)
    assert scaler.get_scale() == 256.0
    assert set(upd.state_tensors()) == {"a/w/momentum_buffer", "b/w/momentum_buffer"}


def test_clip_by_value_on_plain_tensors_with_a_missing_grad() -> None:
    a = torch.zeros(3, requires_grad=True)
    frozen = torch.ones(2, requires_grad=True)
    cfg = config(type="sgd", lr={"base": 1.0}, clip={"low": -1.0, "high": 0.5})
    upd = Updater([ParamEntry("a/w", a), ParamEntry("a/b", frozen)], cfg, 10)
    a.grad = torch.tensor([-3.0, 0.25, 2.0])
    upd.step(0)
    assert a.grad.tolist() == [-1.0, 0.25, 0.5]
    assert a.tolist() == [1.0, -0.25, -0.5]
    assert frozen.tolist() == [1.0, 1.0]
    upd.zero_grad()
    assert a.grad is None


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="repeated: l/w"):
        Updater(
            [ParamEntry("l/w", param(0.0)), ParamEntry("l/w", param(0.0))], config(type="sgd"), 1
        )


ROUND_TRIP_CONFIGS = [
    {"type": "sgd", "momentum": 0.9, "weight_decay": 0.01},
    {"type": "nesterov"},
    {"type": "adagrad", "lr_decay": 0.1},
    {"type": "rmsprop", "momentum": 0.5},
    {"type": "adadelta"},
    {"type": "adam", "amsgrad": True, "weight_decay": 0.001},
    {"type": "adamax"},
]
SHAPES = {"conv1/w": (4, 3), "conv1/b": (4,), "fc/w": (2, 4)}


def make_entries(
    seed: int, order: list[str]
) -> tuple[list[ParamEntry], dict[str, torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(SHAPES[name], generator=gen) for name in SHAPES}
    params = {name: torch.nn.Parameter(tensors[name]) for name in order}
    scales = {"conv1/b": 2.0}
    entries = [ParamEntry(n, params[n], lr_scale=scales.get(n, 1.0)) for n in order]
    return entries, params


def train(upd: Updater, params: Mapping[str, torch.Tensor], steps: range) -> None:
    for step in steps:
        gen = torch.Generator().manual_seed(1000 + step)
        for name in SHAPES:  # gradients drawn in a fixed name order, whatever the param order
            params[name].grad = torch.randn(SHAPES[name], generator=gen)
        upd.step(step)
        upd.zero_grad()


@pytest.mark.parametrize("fields", ROUND_TRIP_CONFIGS, ids=lambda f: f["type"])
def test_state_round_trip_restores_by_name(fields: dict[str, Any]) -> None:
    cfg = config(**fields)
    entries, params = make_entries(0, list(SHAPES))
    original = Updater(entries, cfg, 5)
    train(original, params, range(3))
    saved = safetensors.torch.load(safetensors.torch.save(original.state_tensors()))

    reordered = list(reversed(SHAPES))
    fresh_entries, fresh_params = make_entries(0, reordered)
    with torch.no_grad():
        for name in SHAPES:
            fresh_params[name].copy_(params[name])
    restored = Updater(fresh_entries, cfg, 5)
    restored.load_state_tensors(saved)

    train(original, params, range(3, 5))
    train(restored, fresh_params, range(3, 5))
    for name in SHAPES:
        assert torch.equal(params[name], fresh_params[name]), name


def test_without_the_state_training_diverges() -> None:
    cfg = config(type="adam")
    entries, params = make_entries(0, list(SHAPES))
    original = Updater(entries, cfg, 5)
    train(original, params, range(3))
    fresh_entries, fresh_params = make_entries(0, list(SHAPES))
    with torch.no_grad():
        for name in SHAPES:
            fresh_params[name].copy_(params[name])
    unrestored = Updater(fresh_entries, cfg, 5)
    train(original, params, range(3, 5))
    train(unrestored, fresh_params, range(3, 5))
    assert not torch.equal(params["fc/w"], fresh_params["fc/w"])


def test_state_tensors_are_a_name_keyed_snapshot() -> None:
    entries, params = make_entries(0, list(SHAPES))
    upd = Updater(entries, config(type="adam"), 5)
    train(upd, params, range(2))
    state = upd.state_tensors()
    assert set(state) == {f"{n}/{k}" for n in SHAPES for k in ("step", "exp_avg", "exp_avg_sq")}
    assert state["fc/w/step"].shape == () and state["fc/w/step"].item() == 2
    before = state["fc/w/exp_avg"].clone()
    train(upd, params, range(2, 3))
    assert torch.equal(state["fc/w/exp_avg"], before)


def test_load_rejects_foreign_or_malformed_keys() -> None:
    entries, params = make_entries(0, list(SHAPES))
    upd = Updater(entries, config(type="sgd", momentum=0.9), 5)
    train(upd, params, range(1))
    state = upd.state_tensors()
    foreign = {**state, "other/w/momentum_buffer": torch.zeros(1)}
    with pytest.raises(ValueError, match="does not hold: other/w/momentum_buffer"):
        upd.load_state_tensors(foreign)
    upd.load_state_tensors(foreign, strict=False)
    assert torch.equal(upd.state_tensors()["fc/w/momentum_buffer"], state["fc/w/momentum_buffer"])
    with pytest.raises(ValueError, match="not '<param name>/<state key>'"):
        upd.load_state_tensors({"momentum_buffer": torch.zeros(1)})


def test_unknown_key_for_the_updater_type_is_extra_forbidden() -> None:
    with pytest.raises(ValidationError) as info:
        config(type="adam", momentum=0.9)
    (error,) = info.value.errors()
    assert error["type"] == "extra_forbidden"
    assert error["loc"] == ("adam", "momentum")


@pytest.mark.parametrize(
    ("clip", "message"),
    [
        ({"grad_norm": 1.0, "low": -1.0, "high": 1.0}, "not both"),
        ({"low": -1.0}, "both low and high"),
        ({"low": 1.0, "high": 1.0}, "low < high"),
        ({}, "needs grad_norm"),
        ({"grad_norm": 0.0}, "greater than 0"),
    ],
)
def test_clip_config_errors(clip: dict[str, float], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(type="sgd", clip=clip)


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "nesterov", "momentum": 0.0},
        {"type": "sgd", "weight_decay": -0.1},
        {"type": "adam", "beta1": 1.0},
        {"type": "adamw"},
        {"type": "sgd", "lr": {"base": 0.1, "schedule": "step", "freq": 10}},
    ],
)
def test_invalid_updater_configs(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        config(**fields)


@pytest.mark.parametrize("fields", ROUND_TRIP_CONFIGS, ids=lambda f: f["type"])
def test_foreach_kernels_give_the_per_tensor_loops_results_to_the_bit(
    fields: dict[str, Any],
) -> None:
    """The updater runs torch's foreach kernels on CPU; the same steps through torch's
    per-tensor loop (foreach=False) end with the same parameters and state, bit for bit."""
    entries, params = make_entries(0, list(SHAPES))
    upd = Updater(entries, config(**fields), total_steps=20)
    assert all(group["foreach"] for group in upd.optimizer.param_groups)
    loop_entries, loop_params = make_entries(0, list(SHAPES))
    loop = Updater(loop_entries, config(**fields), total_steps=20)
    for group in loop.optimizer.param_groups:
        group["foreach"] = False  # torch reads it at each step
    train(upd, params, range(12))
    train(loop, loop_params, range(12))
    for name in SHAPES:
        assert torch.equal(params[name].detach(), loop_params[name].detach()), name
    ours, theirs = upd.state_tensors(), loop.state_tensors()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_fused_kernels_only_on_cuda() -> None:
    from workers.updaters import kernel_options

    cpu = [torch.zeros(3)]
    assert kernel_options("adam", cpu) == {"foreach": True}
    assert kernel_options("rmsprop", cpu) == {"foreach": True}
