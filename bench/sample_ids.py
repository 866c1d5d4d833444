"""A plugin (docs/plugins.md) for bench/data_stream_stack.py: the layer `sample_ids`, which
passes its input through and, in training, writes down which samples each step trained on.

Inside a stack the worker processes are the node agent's, out of the benchmark's reach, so the
record is kept by the net itself: for every training batch a line `step id id ...` is appended
to `<trace>/<pid>.txt`, the ids read back from the first feature (`id * scale`, as
bench/data_stream.py writes the shards). The step is a parameter, so a restart point saves it
with the weights and a restarted worker counts on from the step it resumed at: the lines of a
step written last are what the final model trained on. It takes part in the graph with a zero
gradient (`x + 0 * step`): every framework's gradient exchange expects a gradient of each
parameter (DDP refuses one left out, the bucketed allreduce one that needs none), and an
updater without weight decay moves nothing by a zero gradient.

    TRAINYARD_PLUGINS=/path/to/bench/sample_ids.py trainyard up ...
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

from trainyard.plugins import layer


@layer("sample_ids")
class SampleIds(nn.Module):
    """Passes its input through; in training, appends the step and the ids of its batch's
    samples (x[:, 0] / scale) to <trace>/<pid>.txt, then sleeps `sleep` seconds (a small run
    made long enough to be killed mid-way)."""

    def __init__(
        self, in_shape: tuple[int, ...], *, trace: str, scale: float = 1e-6, sleep: float = 0.0
    ) -> None:
        super().__init__()
        self.trace, self.scale, self.sleep = Path(trace), scale, sleep
        self.step = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not x.is_meta:  # shapes are inferred on the meta device
            with torch.no_grad():
                self.step += 1
            ids = torch.round(x[:, 0].double() / self.scale).long().tolist()
            with (self.trace / f"{os.getpid()}.txt").open("a") as out:
                out.write(f"{int(self.step.item())} {' '.join(map(str, ids))}\n")
            time.sleep(self.sleep)
        return x + 0 * self.step
