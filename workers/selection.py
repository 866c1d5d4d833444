"""Model selection during a run: the objective's best value and step (which checkpoint
`keep_best` keeps), and early stopping (validations in a row without an improvement).

`Selection` is plain numbers, saved in every checkpoint and restart point (`to_meta`), so a run
that continues from one goes on counting where it stood. Its decisions are pure functions of
those numbers and the new value; the trainer's evaluations carry them out (workers/evaluation.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from dsl.objective import Mode, Objective
from dsl.schema import EarlyStopConfig

META_KEY = "selection"  # the checkpoint metadata entry that holds a Selection


def better(mode: Mode, value: float, than: float | None, by: float = 0.0) -> bool:
    """Whether `value` beats `than` by more than `by` in the objective's direction (any finite
    value beats none; a value that is not a finite number beats nothing)."""
    if not math.isfinite(value):
        return False
    if than is None:
        return True
    return value > than + by if mode == "max" else value < than - by


@dataclass
class Selection:
    """Where the objective stands after the validations so far."""

    best: float | None = None  # the best value, and the step it was measured at
    best_step: int | None = None
    # The value the last improvement by more than min_delta reached, and the validations since.
    reference: float | None = None
    stale: int = 0

    def observe(self, objective: Objective, step: int, value: float, min_delta: float) -> bool:
        """Take the objective's value at `step`; whether it is a new best."""
        improved = better(objective.mode, value, self.best)
        if improved:
            self.best, self.best_step = value, step
        if better(objective.mode, value, self.reference, min_delta):
            self.reference, self.stale = value, 0
        else:
            self.stale += 1
        return improved

    def exhausted(self, early_stop: EarlyStopConfig | None) -> bool:
        """Whether early stopping ends the run now."""
        return early_stop is not None and self.stale >= early_stop.patience

    def stop_message(self, objective: Objective, step: int, early_stop: EarlyStopConfig) -> str:
        best = "none" if self.best is None else f"{self.best:.4g} at step {self.best_step}"
        return (
            f"stopped early at step {step}: {objective.metric} has not improved by "
            f"{early_stop.min_delta} for {self.stale} validations (best {best})"
        )

    def to_meta(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_meta(cls, text: str | None) -> Selection:
        """The selection a checkpoint saved; a fresh one for a checkpoint without (older, or
        from another job)."""
        if not text:
            return cls()
        return cls(**json.loads(text))
