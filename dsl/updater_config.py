"""The job's `updater:` section: which optimiser, its learning-rate schedule and clipping.

Pydantic only; `workers/updaters.py` and `workers/schedules.py` turn these into torch.optim
optimisers and per-step learning rates. Each updater type is its own model carrying only the keys
meaningful for it, so `momentum` on `adam` is an unknown-key error rather than silently ignored.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from dsl.config import StrictModel

ScheduleName = Literal[
    "fixed", "step", "linear", "exponential", "inverse", "inverse_t", "fixed_step", "cosine"
]

# Which optional knobs each schedule reads, and which of those it cannot do without. A knob set
# for a schedule that ignores it is an error: it almost always means the user expects an effect.
_USES: dict[str, frozenset[str]] = {
    "fixed": frozenset(),
    "step": frozenset({"gamma", "freq"}),
    "linear": frozenset({"final", "freq", "total_steps"}),
    "exponential": frozenset({"freq"}),
    "inverse": frozenset({"gamma", "power"}),
    "inverse_t": frozenset({"final"}),
    "fixed_step": frozenset({"steps", "values"}),
    "cosine": frozenset({"final", "total_steps"}),
}
_NEEDS: dict[str, frozenset[str]] = {
    "step": frozenset({"gamma", "freq"}),
    "exponential": frozenset({"freq"}),
    "inverse": frozenset({"gamma", "power"}),
    "inverse_t": frozenset({"final"}),
    "fixed_step": frozenset({"steps", "values"}),
}
_KNOBS = frozenset().union(*_USES.values())


class LRConfig(StrictModel):
    """The learning rate as a function of the step (SINGA's ChangeMethod), with optional warm-up.

    `lr(step)` is the schedule's formula (see each field); during the first `warmup_steps` steps
    it is multiplied by `(step + 1) / warmup_steps`.
    """

    base: float = Field(gt=0, description="base learning rate: every schedule's value at step 0")
    schedule: ScheduleName = Field(
        default="fixed",
        description=(
            "fixed: base | step: base * gamma ** floor(step / freq) | "
            "linear: (1 - r) * base + r * final, r = min(step / freq, 1) | "
            "exponential: base / 2 ** (step / freq) | "
            "inverse: base * (1 + gamma * step) ** (-power) | "
            "inverse_t: base / (1 + step / final) | "
            "fixed_step: values[i] for the last steps[i] <= step, base before steps[0] | "
            "cosine: final + 0.5 * (base - final) * (1 + cos(pi * min(step, T) / T)), "
            "T = total_steps"
        ),
    )
    gamma: float | None = Field(
        default=None,
        gt=0,
        description=(
            "step: multiplier applied every `freq` steps (base * gamma ** floor(step / freq)); "
            "inverse: rate in base * (1 + gamma * step) ** (-power)"
        ),
    )
    freq: int | None = Field(
        default=None,
        gt=0,
        description=(
            "step: steps between decays; exponential: half-life in steps "
            "(base / 2 ** (step / freq)); linear: steps to go from base to final "
            "(defaults to the horizon total_steps)"
        ),
    )
    power: float | None = Field(
        default=None, gt=0, description="inverse: exponent in base * (1 + gamma * step) ** (-power)"
    )
    final: float = Field(
        default=0.0,
        ge=0,
        description=(
            "linear/cosine: learning rate reached at the end of the decay; "
            "inverse_t: steps until lr halves (base / (1 + step / final)), must be > 0"
        ),
    )
    steps: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="fixed_step: strictly increasing steps at which lr switches to values[i]",
    )
    values: list[Annotated[float, Field(gt=0)]] | None = Field(
        default=None,
        description="fixed_step: learning rate from steps[i] on (same length as steps)",
    )
    warmup_steps: int = Field(
        default=0,
        ge=0,
        description=(
            "linear warm-up: for step < warmup_steps, lr = schedule(step) * (step + 1) / "
            "warmup_steps, reaching the schedule's value at step warmup_steps - 1"
        ),
    )
    total_steps: int | None = Field(
        default=None,
        gt=0,
        description=(
            "horizon T of cosine (and of linear without freq); "
            "unset means the job's train_steps, supplied at run time"
        ),
    )

    @model_validator(mode="after")
    def _check_schedule_knobs(self) -> LRConfig:
        # An explicit `null` counts as not given, so `gamma: null` neither trips nor satisfies.
        given = {k for k in self.model_fields_set & _KNOBS if getattr(self, k) is not None}
        uses = _USES[self.schedule]
        unused = sorted(given - uses)
        if unused:
            reads = ", ".join(sorted(uses)) or "no other keys"
            raise ValueError(
                f"schedule '{self.schedule}' does not use {', '.join(unused)} "
                f"(it reads {reads}); remove {'them' if len(unused) > 1 else 'it'}"
            )
        missing = sorted(_NEEDS.get(self.schedule, frozenset()) - given)
        if missing:
            raise ValueError(f"schedule '{self.schedule}' needs {', '.join(missing)}")
        if self.schedule == "inverse_t" and self.final <= 0:
            raise ValueError("schedule 'inverse_t' needs final > 0 (the steps until lr halves)")
        if self.schedule == "fixed_step":
            self._check_fixed_steps()
        return self

    def _check_fixed_steps(self) -> None:
        steps, values = self.steps or [], self.values or []
        if not steps:
            raise ValueError("schedule 'fixed_step' needs at least one entry in steps and values")
        if len(steps) != len(values):
            raise ValueError(
                f"schedule 'fixed_step' needs steps and values of equal length "
                f"(got {len(steps)} steps and {len(values)} values)"
            )
        if any(later <= earlier for earlier, later in pairwise(steps)):
            raise ValueError(f"fixed_step steps must be strictly increasing, got {steps}")


class ClipConfig(StrictModel):
    """Gradient clipping before each update: by global norm, or each element into [low, high]."""

    grad_norm: float | None = Field(
        default=None,
        gt=0,
        description="rescale all gradients together so their global L2 norm is at most this",
    )
    low: float | None = Field(default=None, description="clamp each gradient element to >= low")
    high: float | None = Field(default=None, description="clamp each gradient element to <= high")

    @model_validator(mode="after")
    def _check_one_form(self) -> ClipConfig:
        has_value_form = self.low is not None or self.high is not None
        if self.grad_norm is not None and has_value_form:
            raise ValueError("clip takes either grad_norm or low/high, not both")
        if self.grad_norm is None and not has_value_form:
            raise ValueError("clip needs grad_norm, or both low and high")
        if has_value_form:
            if self.low is None or self.high is None:
                raise ValueError("value clipping needs both low and high")
            if self.low >= self.high:
                raise ValueError(f"clip needs low < high (got low={self.low}, high={self.high})")
        return self


class UpdaterBase(StrictModel):
    """Keys every updater takes. Subclasses narrow `type` to a Literal."""

    type: str
    weight_decay: float = Field(
        default=0.0,
        ge=0,
        description="L2 penalty: weight_decay * wd_scale * param is added to each gradient",
    )
    clip: ClipConfig | None = Field(
        default=None, description="gradient clipping before each update; none when unset"
    )
    lr: LRConfig = Field(description="learning rate and its schedule over the steps")


class SGDConfig(UpdaterBase):
    """Stochastic gradient descent with optional (heavy-ball) momentum: torch.optim.SGD."""

    type: Literal["sgd"]
    momentum: float = Field(
        default=0.0, ge=0, lt=1, description="buf = momentum * buf + (1 - dampening) * grad"
    )
    dampening: float = Field(
        default=0.0, ge=0, le=1, description="share of the new gradient withheld from buf"
    )


class NesterovConfig(UpdaterBase):
    """SGD with Nesterov momentum: the step uses grad + momentum * buf."""

    type: Literal["nesterov"]
    momentum: float = Field(
        default=0.9, gt=0, lt=1, description="buf = momentum * buf + grad; must be > 0"
    )


class AdagradConfig(UpdaterBase):
    """Adagrad: lr / sqrt(sum of squared gradients)."""

    type: Literal["adagrad"]
    eps: float = Field(default=1e-10, gt=0, description="added to the root of the sum of squares")
    lr_decay: float = Field(
        default=0.0, ge=0, description="lr is divided by 1 + (t - 1) * lr_decay at update t"
    )


class RMSPropConfig(UpdaterBase):
    """RMSProp: lr / sqrt(running mean of squared gradients)."""

    type: Literal["rmsprop"]
    rho: float = Field(
        default=0.99,
        ge=0,
        lt=1,
        description="decay of the running mean of squared gradients (torch's alpha)",
    )
    eps: float = Field(default=1e-8, gt=0, description="added to the root of the running mean")
    momentum: float = Field(default=0.0, ge=0, lt=1, description="momentum on the scaled step")


class AdaDeltaConfig(UpdaterBase):
    """AdaDelta: step size from the ratio of running RMS of updates and gradients."""

    type: Literal["adadelta"]
    rho: float = Field(
        default=0.9, ge=0, le=1, description="decay of both running means of squares"
    )
    eps: float = Field(default=1e-6, gt=0, description="added inside both square roots")


class AdamConfig(UpdaterBase):
    """Adam with bias correction (L2 weight decay added to the gradient, as in SINGA)."""

    type: Literal["adam"]
    beta1: float = Field(default=0.9, ge=0, lt=1, description="decay of the mean of gradients")
    beta2: float = Field(
        default=0.999, ge=0, lt=1, description="decay of the mean of squared gradients"
    )
    eps: float = Field(default=1e-8, gt=0, description="added to the root of the second moment")
    amsgrad: bool = Field(
        default=False, description="divide by the running maximum of the second moment"
    )


class AdamaxConfig(UpdaterBase):
    """Adamax: Adam with the infinity norm in place of the second moment."""

    type: Literal["adamax"]
    beta1: float = Field(default=0.9, ge=0, lt=1, description="decay of the mean of gradients")
    beta2: float = Field(
        default=0.999, ge=0, lt=1, description="decay of the running max of |gradient|"
    )
    eps: float = Field(default=1e-8, gt=0, description="added to the running max of |gradient|")


# Updater type -> its model: the built-in ones, and those plugins add (dsl/plugins.py).
UPDATER_CONFIGS: dict[str, type[UpdaterBase]] = {
    "sgd": SGDConfig,
    "nesterov": NesterovConfig,
    "adagrad": AdagradConfig,
    "rmsprop": RMSPropConfig,
    "adadelta": AdaDeltaConfig,
    "adam": AdamConfig,
    "adamax": AdamaxConfig,
}


def updater_union() -> Any:
    """Every updater type's model as one pydantic union, told apart by `type`."""
    return Annotated[Union[tuple(UPDATER_CONFIGS.values())], Field(discriminator="type")]  # noqa: UP007


if TYPE_CHECKING:
    UpdaterConfig = UpdaterBase
else:
    UpdaterConfig = updater_union()
