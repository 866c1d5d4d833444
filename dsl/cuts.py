"""What a pipeline stage costs, and the search for the cut of a net into stages.

The layers are taken in topological order: inputs first, then the body, the layers a cut may
fall between, then the layers that run on the last stage (losses, metrics, test-only layers).
Stage i of a cut runs body[start:stop], with the inputs if it is the first and the last
stage's layers if it is the last. The search asks for the cost of every run of the body, so
`StageCosts` tables what it needs once: prefix sums of time and output bytes, and the bytes each
run receives from earlier stages.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping, Sequence

from dsl.layers.base import LayerConfig
from dsl.pipeline import last_stage_layers, sources_of
from dsl.schema import PipelineConfig

Costs = Mapping[str, tuple[float, int]]  # layer -> (time_ms, activation_bytes): a LayerCost
PartCost = tuple[float, float]  # (what the largest part minimises, what the parts add up)


class StageCosts:
    """A net's layers in topological order, their costs, and what any stage of them costs."""

    def __init__(self, layers: Sequence[LayerConfig], costs: Costs, config: PipelineConfig) -> None:
        # `count` parts: the pieces (stages, without virtual stages).
        self.config, self.count = config, config.pieces
        self.position = {layer.name: i for i, layer in enumerate(layers)}
        self.sources = {layer.name: sources_of(layer) for layer in layers}
        pinned = last_stage_layers(layers)
        self.first = [layer.name for layer in layers if layer.type == "input"]
        self.last = [layer.name for layer in layers if layer.name in pinned]
        self.last_set = set(self.last)
        self.body = [
            layer.name for layer in layers if layer.type != "input" and layer.name not in pinned
        ]
        self.body_index = {name: i for i, name in enumerate(self.body)}
        self.times = {name: float(cost[0]) for name, cost in costs.items()}
        self.bytes = {name: float(cost[1]) for name, cost in costs.items()}
        self.time_sums, self.byte_sums = [0.0], [0.0]
        for name in self.body:
            self.time_sums.append(self.time_sums[-1] + self.times[name])
            self.byte_sums.append(self.byte_sums[-1] + self.bytes[name])
        self._received: dict[int, array[float]] = {}

    # -- a stage given by its layers (the plan's report and written stages)

    def in_order(self, names: Sequence[str]) -> list[str]:
        return sorted(names, key=self.position.__getitem__)

    def time(self, names: Sequence[str]) -> float:
        return sum(self.times[name] for name in names)

    def received(self, names: Sequence[str]) -> list[str]:
        """The layers of other stages whose outputs a stage of `names` reads."""
        inside = set(names)
        outside = {src for name in names for src in self.sources[name] if src not in inside}
        return self.in_order(list(outside))

    def memory(self, index: int, names: Sequence[str]) -> float:
        """Bytes stage `index` of `names` keeps at once for its backward passes."""
        received = sum(self.bytes[name] for name in self.received(names))
        return self.kept(index, sum(self.bytes[name] for name in names), received)

    def kept(self, index: int, own: float, received: float) -> float:
        """Bytes stage (piece) `index` keeps at once, from the bytes per batch of its layers'
        outputs and of what it receives: for each micro-batch in flight (GPipe: all of them;
        1F1B and the others: at most one per piece from this one on, an estimate for the
        interleaved and zero-bubble schedules) both, or with `rematerialize` what it receives
        and one micro-batch's outputs, recomputed."""
        micro = self.config.microbatches
        in_flight = micro if self.config.schedule == "gpipe" else min(micro, self.count - index)
        if self.config.rematerialize:
            return (received * in_flight + own) / micro
        return (received + own) * in_flight / micro

    # -- a stage given by its run of the body (the search)

    def stage(self, index: int, start: int, stop: int) -> list[str]:
        names = self.body[start:stop]
        if index == 0:
            names = self.first + names
        if index == self.count - 1:
            names = names + self.last
        return names

    def stage_time(self, index: int, start: int, stop: int) -> float:
        time = self.time_sums[stop] - self.time_sums[start]
        if index == 0:
            time += self.time(self.first)
        if index == self.count - 1:
            time += self.time(self.last)
        return time

    def stage_memory(self, index: int, start: int, stop: int) -> float:
        own = self.byte_sums[stop] - self.byte_sums[start]
        if index == 0:
            own += sum(self.bytes[name] for name in self.first)
        if index == self.count - 1:
            own += sum(self.bytes[name] for name in self.last)
        return self.kept(index, own, self.stage_received(index, start, stop))

    def stage_received(self, index: int, start: int, stop: int) -> float:
        """Bytes per batch the stage receives from earlier ones."""
        table = self._received.get(start)
        if table is None:
            table = self._received[start] = self._received_from(start)
        return table[-1] if index == self.count - 1 else table[stop - start]

    def _received_from(self, start: int) -> array[float]:
        """What body[start:stop] receives, for stop = start .. len(body), then what the last
        stage from `start` receives; built as the run grows, each source counted once."""

        def earlier(src: str) -> bool:
            if src in self.body_index:
                return self.body_index[src] < start
            return start > 0 and src not in self.last_set  # an input, outside the first stage

        outside: set[str] = set()
        total, table = 0.0, array("d", [0.0])  # 8 bytes a run: the search tables n^2 / 2
        for name in [*self.body[start:], *self.last]:
            for src in self.sources[name]:
                if src not in outside and earlier(src):
                    outside.add(src)
                    total += self.bytes[src]
            if name in self.body_index:
                table.append(total)
        table.append(total)
        return table


def search_cut(
    size: int,
    count: int,
    last_may_be_empty: bool,
    cost: Callable[[int, int, int], PartCost | None],
) -> list[tuple[int, int]] | None:
    """The (start, stop) of each of `count` contiguous parts of range(size), every part but an
    allowed empty last one non-empty, minimising the largest first item of `cost(part, start,
    stop)`, and among those (greedily: a tie-break, not an optimum) the sum of the second. A
    part whose cost is None is not allowed. None when no cut is allowed.

    Dynamic programming over the parts and their ends: `count` x `size`^2 / 2 costs asked.
    """
    never = (math.inf, math.inf)
    # best[k][j]: the least (largest, summed) cost of cutting range(j) into k parts; back[k][j]:
    # the start of the k-th part in that cut.
    best = [[never] * (size + 1) for _ in range(count + 1)]
    back = [[0] * (size + 1) for _ in range(count + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, count + 1):
        last = k == count
        stops = [size] if last else range(k, size + 1)
        for stop in stops:
            top = stop if last and last_may_be_empty else stop - 1
            for start in range(k - 1, top + 1):
                before = best[k - 1][start]
                part = None if before == never else cost(k - 1, start, stop)
                if part is None:
                    continue
                value = (max(before[0], part[0]), before[1] + part[1])
                if value < best[k][stop]:
                    best[k][stop], back[k][stop] = value, start
    if best[count][size] == never:
        return None
    cuts, stop = [], size
    for k in range(count, 0, -1):
        start = back[k][stop]
        cuts.append((start, stop))
        stop = start
    return cuts[::-1]
