"""What compiling one document may cost: its layers (repeated blocks expanded), the elements of
its net (parameters and every layer's outputs for one sample), and time.

Compiling costs more than linearly in a document's size (resolving the layer graph above all),
so a service compiles every document under a budget and answers a clear located error past
it, instead of holding a thread for as long as a hostile document asks. A sweep's probes (the
base job compiled with each value its space can produce) share their sweep's budget.

The time is the compiling thread's CPU time, not the clock's: what the document costs the
service, whatever else the machine does meanwhile (on a loaded machine the clock would refuse
an honest document that a quiet one compiles in a second).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dsl.errors import JobSpecError, Path
from dsl.source import SourceMap

# Layers of one net, counted after any repeated blocks are expanded: the examples have up to
# a few dozen; 1,000 compile in about half a second on one core.
MAX_LAYERS = 1_000
# Parameters plus every layer's outputs for one sample: what shape inference and the meta
# device's modules have to count.
MAX_ELEMENTS = 2_000_000_000


@dataclass
class CompileBudget:
    """One document's budget (or a sweep's, with its probes), started when it is made."""

    seconds: float | None = None  # None: no limit on the time (a local run's own document)
    max_layers: int = MAX_LAYERS
    max_elements: int = MAX_ELEMENTS
    started: float = field(default_factory=time.thread_time)

    def check_layers(self, count: int, source: SourceMap) -> None:
        if count > self.max_layers:
            raise JobSpecError(
                source.issue(
                    ("neuralnet", "layers"),
                    f"the net has {count:,} layers (repeated blocks expanded), more than the "
                    f"{self.max_layers:,} a job may have",
                    "use fewer, wider layers",
                )
            )

    def check_elements(self, count: int, source: SourceMap, path: Path, name: str) -> None:
        if count > self.max_elements:
            raise JobSpecError(
                source.issue(
                    path,
                    f"with layer '{name}' the net holds {count:,} elements (parameters and "
                    f"each layer's outputs for one sample), more than the "
                    f"{self.max_elements:,} a job may have",
                    "use fewer units or filters, or a smaller input",
                )
            )

    def check_time(self, source: SourceMap, path: Path, doing: str) -> None:
        """Past the time budget: a located error naming what was being compiled."""
        if self.seconds is None:
            return
        spent = time.thread_time() - self.started
        if spent > self.seconds:
            raise JobSpecError(
                source.issue(
                    path,
                    f"compiling the document took more than its budget of {self.seconds:g} s "
                    f"of CPU time ({doing})",
                    "use fewer layers; a sweep: fewer values in its space",
                )
            )
