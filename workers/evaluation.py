"""A run's evaluations: the validation split every validate.freq steps and the test split every
test.freq steps (and both after the last step), their figures reported, and the model selection
they feed (the objective's best step, whose checkpoint keep_best keeps, and early stopping:
workers/selection.py). The trainer calls `Evaluation.after_step` after each of its steps and
`Evaluation.finish` after the last (workers/trainer.py). A split's figures come from the
trainer's `evaluate` hook: for a whole net `evaluate_whole`, the default (a pipeline's stages
pass the split through all of them instead: workers/distributed/pipeline.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dsl.objective import resolve_objective
from dsl.schema import JobSpec
from workers.algorithms import rbm_input
from workers.data import eval_batches
from workers.selection import Selection

if TYPE_CHECKING:
    from workers.trainer import Trainer


def validation_due(spec: JobSpec, done: int) -> bool:
    """Whether the trainer evaluates the validation split once `done` steps are done (it
    always does at the end)."""
    if not spec.data.has_validation():
        return False
    return done == spec.train_steps or bool(spec.validate.freq and done % spec.validate.freq == 0)


def selection_due(spec: JobSpec, done: int) -> bool:
    """Whether the objective is measured once `done` steps are done: a step where keep_best
    may save the best checkpoint, or early stopping end the run."""
    if resolve_objective(spec).metric.startswith("val/"):
        return validation_due(spec, done)
    return done == spec.train_steps or bool(spec.test.freq and done % spec.test.freq == 0)


class Evaluation:
    """One worker's evaluations, and where the job's objective stands after them."""

    def __init__(self, spec: JobSpec) -> None:
        self.objective = resolve_objective(spec)
        self.selection = Selection()  # restored with the run's checkpoint
        self.last_val: dict[str, float] = {}
        self.last_test: dict[str, float] = {}
        self.validated = -1  # the step of the latest validation
        self.stopped_early: str | None = None

    def stopped_already(self, trainer: Trainer) -> bool:
        """Whether the run was restored from the validation that stopped it early: it has no
        step left to take."""
        early_stop = trainer.spec.early_stop
        if not self.selection.exhausted(early_stop):
            return False
        assert early_stop is not None
        self.stopped_early = self.selection.stop_message(self.objective, trainer.step, early_stop)
        return True

    def after_step(self, trainer: Trainer) -> bool:
        """The evaluations due after a step before the last (the last step's are `finish`'s):
        the validation split every validate.freq steps, the test split every test.freq steps;
        whether the run stops early here (every worker gets the same answer)."""
        spec, step = trainer.spec, trainer.step
        if step == spec.train_steps:
            return False
        stop = validation_due(spec, step) and self.validate(trainer)
        if spec.test.freq and step % spec.test.freq == 0:
            self.evaluate_test(trainer)
        return stop

    def finish(self, trainer: Trainer) -> None:
        """After the last step (or the validation that stopped the run early): the validation
        figures unless this step has them, and the test figures."""
        if trainer.x_val is not None and self.validated != trainer.step:
            self.validate(trainer, final=True)
        self.evaluate_test(trainer)

    def validate(self, trainer: Trainer, *, final: bool = False) -> bool:
        """Evaluate the validation split and report it; whether the run stops early here
        (every worker gets the same answer; never at the `final` step)."""
        self.last_val = trainer.evaluate("val")
        self.validated = trainer.step
        trainer.reporting.emit(trainer.step, self.last_val)
        self.select(trainer, self.last_val)
        early_stop = trainer.spec.early_stop
        if final or early_stop is None:
            return False
        if not trainer.hooks.agree(self.selection.exhausted(early_stop)):
            return False
        self.stopped_early = self.selection.stop_message(self.objective, trainer.step, early_stop)
        trainer.reporting.log(self.stopped_early)
        trainer.reporting.event(trainer.step, self.stopped_early)
        return True

    def evaluate_test(self, trainer: Trainer) -> None:
        self.last_test = trainer.evaluate()
        trainer.reporting.emit(trainer.step, self.last_test)
        self.select(trainer, self.last_test)

    def select(self, trainer: Trainer, figures: dict[str, float]) -> None:
        """The objective's value among an evaluation's `figures`: a new best is kept
        (checkpoint.keep_best), the validations without an improvement are counted."""
        if self.objective.metric not in figures:
            return
        spec = trainer.spec
        min_delta = spec.early_stop.min_delta if spec.early_stop is not None else 0.0
        value = figures[self.objective.metric]
        improved = self.selection.observe(self.objective, trainer.step, value, min_delta)
        if improved and spec.checkpoint.keep_best and trainer.options.is_writer:
            trainer.checkpointing.save(trainer, best=True)


@torch.no_grad()
def evaluate_whole(trainer: Trainer, split: str) -> dict[str, float]:
    """Loss and metrics over the split ("val" or "test", or its first validate.steps or
    test.steps batches), as `<split>/<name>`."""
    return trainer.compiled_net.run(lambda: _evaluate(trainer, split))


def _evaluate(trainer: Trainer, split: str) -> dict[str, float]:
    net, spec = trainer.net, trainer.spec
    x_split, y_split, limit = trainer.eval_split(split)
    net.eval()
    sums: dict[str, float] = {}
    seen = 0
    cd = spec.train_one_batch.alg == "cd"
    for x, y in eval_batches(x_split, y_split, spec.data.batch_size, limit):
        if cd:
            values = _cd_eval(trainer, x)
        else:
            net.reset_state()
            with trainer.precision.autocast():
                out = net(x, y, "test", with_metrics=True)
            values = {k: float(v) for k, v in out.metrics.items()}
            if out.loss is not None:
                values["loss"] = float(out.loss)
        for key, value in values.items():
            sums[key] = sums.get(key, 0.0) + value * len(x)
        seen += len(x)
    net.train()
    return {f"{split}/{k}": v / max(seen, 1) for k, v in sums.items()}


def _cd_eval(trainer: Trainer, x: torch.Tensor) -> dict[str, float]:
    # Its own stream: evaluating must not shift the training samples' noise, and the same
    # parameters should always give the same figure.
    generator = torch.Generator(device=trainer.device).manual_seed(trainer.spec.seed + 11)
    with trainer.precision.autocast():
        rbm, v0 = rbm_input(trainer.net, x, "test")
        _, recon = rbm.cd_loss(v0, 1, generator)  # type: ignore[operator]
    return {"recon_error": float(recon)}
