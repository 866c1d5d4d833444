"""`compile: true`: the net's forward through torch.compile, and eager where it cannot be.

Only the forward function is replaced (`net.forward`, an attribute of the one net object), so the
parameters, their names, the updater and the checkpoints are the uncompiled net's. torch compiles
lazily, at the first call of each new kind (the train and the test phase, a new batch shape), and
a failure then (no C++ compiler for inductor on a CPU, an operation it cannot trace) raises from
that call. `run` catches it once, puts the eager forward back, says so in the run's log and makes
the call again eagerly: a net that cannot be compiled trains as with `compile: false`, and an
error of the net itself is raised again by the eager call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")


class CompiledNet:
    """The forward of `net`, compiled when `enabled`; `run` makes calls that use it."""

    def __init__(self, net: nn.Module, *, enabled: bool, log: Callable[[str], None]) -> None:
        self.net, self.log = net, log
        self.active = False
        if not enabled:
            return
        try:
            net.forward = torch.compile(net.forward)
        except Exception as exc:  # torch refuses up front (an unsupported Python or platform)
            self._warn(exc)
        else:
            self.active = True

    def run(self, call: Callable[[], T]) -> T:
        """`call()`; if compiling fails in it, `call()` again on the eager forward.

        `call` must start from scratch each time (zero the gradients it accumulates): the failed
        attempt may have run part of the net.
        """
        if not self.active:
            return call()
        try:
            return call()
        except Exception as exc:
            del self.net.forward  # the class's own forward again
            self.active = False
            self._warn(exc)
            return call()

    def _warn(self, exc: Exception) -> None:
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        self.log(f"warning: compile: the net cannot be compiled ({reason}); it runs uncompiled")
