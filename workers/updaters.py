"""The job's updater on top of torch.optim: grouping by per-parameter scales, the learning-rate
schedule, gradient clipping and name-keyed optimiser state for checkpoints.

`Updater` works on any list of named leaf tensors, not only a module's parameters, because the
same code runs inside parameter-server shards that own slices of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch

from dsl.plugins import PLUGIN_UPDATERS
from dsl.registry import Registry
from dsl.updater_config import (
    AdaDeltaConfig,
    AdagradConfig,
    AdamaxConfig,
    AdamConfig,
    NesterovConfig,
    RMSPropConfig,
    SGDConfig,
    UpdaterBase,
    UpdaterConfig,
)
from workers.schedules import lr_at

ParamGroup = dict[str, Any]
# Builds the torch optimiser from param groups that already carry their `lr` and
# `weight_decay`, and the kernel options (`kernel_options`) as keyword arguments.
OptimizerFactory = Callable[..., torch.optim.Optimizer]

UPDATERS: Registry[OptimizerFactory] = Registry("updater")
register_updater = UPDATERS.register

# The updaters whose torch optimiser has a fused kernel (one kernel for the whole update).
FUSED = frozenset({"sgd", "nesterov", "adagrad", "adam"})


def kernel_options(updater_type: str, tensors: list[torch.Tensor]) -> dict[str, bool]:
    """torch's multi-tensor kernels for a built-in updater of `tensors`.

    foreach everywhere: one call per operation over all tensors instead of a Python loop over
    them, with the loop's results to the bit (tests/workers/test_updaters.py). fused (the whole
    update in one kernel) on CUDA where torch has it, the same results to float rounding. Not
    fused on CPU, although its kernels are 2-3.5x faster there: they are vectorised, and a
    tensor split into slices (a parameter-server shard's) rounds differently in the last bit
    from the whole tensor, which the exact equality of sharded and one-process training would
    see."""
    if tensors and updater_type in FUSED and all(t.is_cuda for t in tensors):
        return {"fused": True}
    return {"foreach": True}


@register_updater("sgd")
def _sgd(groups: list[ParamGroup], cfg: SGDConfig, **kernel: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, momentum=cfg.momentum, dampening=cfg.dampening, **kernel)


@register_updater("nesterov")
def _nesterov(
    groups: list[ParamGroup], cfg: NesterovConfig, **kernel: bool
) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, momentum=cfg.momentum, nesterov=True, **kernel)


@register_updater("adagrad")
def _adagrad(groups: list[ParamGroup], cfg: AdagradConfig, **kernel: bool) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(groups, eps=cfg.eps, lr_decay=cfg.lr_decay, **kernel)


@register_updater("rmsprop")
def _rmsprop(groups: list[ParamGroup], cfg: RMSPropConfig, **kernel: bool) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(groups, alpha=cfg.rho, eps=cfg.eps, momentum=cfg.momentum, **kernel)


@register_updater("adadelta")
def _adadelta(
    groups: list[ParamGroup], cfg: AdaDeltaConfig, **kernel: bool
) -> torch.optim.Optimizer:
    return torch.optim.Adadelta(groups, rho=cfg.rho, eps=cfg.eps, **kernel)


@register_updater("adam")
def _adam(groups: list[ParamGroup], cfg: AdamConfig, **kernel: bool) -> torch.optim.Optimizer:
    betas = (cfg.beta1, cfg.beta2)
    return torch.optim.Adam(groups, betas=betas, eps=cfg.eps, amsgrad=cfg.amsgrad, **kernel)


@register_updater("adamax")
def _adamax(groups: list[ParamGroup], cfg: AdamaxConfig, **kernel: bool) -> torch.optim.Optimizer:
    return torch.optim.Adamax(groups, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kernel)


def _build_optimizer(
    groups: list[ParamGroup], config: UpdaterConfig, tensors: list[torch.Tensor]
) -> torch.optim.Optimizer:
    """The built-in updater's optimiser, or a plugin's (its function gets its own keys)."""
    plugin = PLUGIN_UPDATERS.get(config.type)
    if plugin is None:
        kernel = kernel_options(config.type, tensors)
        return UPDATERS.get(config.type)(groups, config, **kernel)
    own = set(type(config).model_fields) - set(UpdaterBase.model_fields)
    return plugin(groups, **{key: getattr(config, key) for key in own})


@dataclass(frozen=True)
class ParamEntry:
    """One named parameter and its per-parameter scales (from the layer's `param:` section)."""

    name: str  # "<layer>/<param>", e.g. "conv1/w"
    tensor: torch.Tensor  # any leaf tensor; nn.Parameter in a model, a slice in a shard
    lr_scale: float = 1.0
    wd_scale: float = 1.0


class Updater:
    """Applies one job's updater to a set of named parameters."""

    def __init__(
        self,
        params: list[ParamEntry],
        config: UpdaterConfig,
        total_steps: int,
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        """`scaler`: the loss scale of fp16 training (workers/precision.py), undone here."""
        names = [entry.name for entry in params]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"parameter names must be unique; repeated: {', '.join(duplicates)}")
        self.config = config
        self.total_steps = total_steps
        self.scaler = scaler
        # Fails here, not at the first step, when the schedule lacks a horizon.
        first_lr = self.lr_at(0)

        # One torch param group per distinct (lr_scale, wd_scale): the usual all-ones case is a
        # single group, which keeps torch's multi-tensor (foreach) kernels on one launch.
        by_scales: dict[tuple[float, float], list[torch.Tensor]] = {}
        for entry in params:
            by_scales.setdefault((entry.lr_scale, entry.wd_scale), []).append(entry.tensor)
        groups = [
            {"params": tensors, "lr": first_lr * lr_s, "weight_decay": config.weight_decay * wd_s}
            for (lr_s, wd_s), tensors in by_scales.items()
        ]
        self._lr_scales = [lr_s for lr_s, _ in by_scales]
        self._lr = first_lr  # the rate the groups hold (times their scales)
        self.optimizer = _build_optimizer(groups, config, [entry.tensor for entry in params])

        self._params = [entry.tensor for entry in params]
        tensor_names = {id(entry.tensor): entry.name for entry in params}
        # Names in torch's state_dict index order (groups flattened), for name-keyed checkpoints.
        self._index_names = [tensor_names[id(p)] for p in chain.from_iterable(self._group_params())]
        self._names = set(names)

    def _group_params(self) -> list[list[torch.Tensor]]:
        return [group["params"] for group in self.optimizer.param_groups]

    def lr_at(self, step: int) -> float:
        """The base learning rate (before per-parameter lr_scale) for 0-based `step`."""
        return lr_at(step, self.config.lr, self.total_steps)

    def step(self, step: int) -> None:
        """Update the parameters from their gradients for 0-based iteration `step`."""
        lr = self.lr_at(step)
        if lr != self._lr:  # most schedules hold a rate for many steps (fixed, step)
            for group, lr_scale in zip(self.optimizer.param_groups, self._lr_scales, strict=True):
                group["lr"] = lr * lr_scale
            self._lr = lr
        if self.scaler is not None:
            # The true gradients, for clipping too; a step whose gradients overflowed is skipped.
            self.scaler.unscale_(self.optimizer)
        clip = self.config.clip
        if clip is not None:
            if clip.grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self._params, clip.grad_norm)
            elif clip.low is not None and clip.high is not None:
                grads = [p.grad for p in self._params if p.grad is not None]
                if grads:
                    torch._foreach_clamp_min_(grads, clip.low)
                    torch._foreach_clamp_max_(grads, clip.high)
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """A snapshot of the optimiser state as `"<param name>/<state key>" -> tensor`.

        Keyed by name so a checkpoint restores into parameters created in another order or split
        across shards differently. Python scalars become 0-d tensors; tensors are copies, so the
        snapshot does not change as training goes on (and is contiguous for safetensors).
        """
        out: dict[str, torch.Tensor] = {}
        for tensor, name in zip(
            chain.from_iterable(self._group_params()), self._index_names, strict=True
        ):
            for key, value in self.optimizer.state.get(tensor, {}).items():
                if value is None:
                    continue
                if isinstance(value, torch.Tensor):
                    out[f"{name}/{key}"] = value.detach().clone().contiguous()
                else:
                    out[f"{name}/{key}"] = torch.tensor(value)
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Replace the optimiser state with one saved by `state_tensors`.

        Parameters absent from `tensors` start with empty state. With `strict`, an entry for a
        parameter this updater does not hold is an error; without it such entries are skipped
        (a shard loading a whole-model checkpoint).
        """
        per_param: dict[str, dict[str, torch.Tensor]] = {}
        unknown: list[str] = []
        for full_key, value in tensors.items():
            name, sep, key = full_key.rpartition("/")
            if not sep or not name:
                raise ValueError(
                    f"updater state key '{full_key}' is not '<param name>/<state key>'"
                )
            if name not in self._names:
                unknown.append(full_key)
                continue
            per_param.setdefault(name, {})[key] = value.detach().clone()
        if unknown and strict:
            shown = ", ".join(sorted(unknown)[:5])
            raise ValueError(f"updater state for parameters this updater does not hold: {shown}")
        index = {name: i for i, name in enumerate(self._index_names)}
        # torch's own loader applies its dtype/device policy (e.g. `step` stays float32).
        self.optimizer.load_state_dict(
            {
                "state": {index[name]: state for name, state in per_param.items()},
                "param_groups": self.optimizer.state_dict()["param_groups"],
            }
        )
