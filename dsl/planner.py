"""The pipeline stage planner: which layers each stage of a pipelined job runs.

A plan lists the layers of every stage in the net's topological order. With `virtual_stages: V`
(interleaved and zero-bubble schedules) the net is cut into K·V pieces, each stage running V of
them: pieces i, i + K, ... (round-robin), or i and 2K - 1 - i for ZB-V's V shape; a plan's
`stages` are then the pieces in pipeline order, each naming the stage that runs it.

Input layers go to the first piece; losses, metrics and layers that run only in the test
phase go to the last, where the labels are (dsl/pipeline.py says which). A list of lists of
layer names is taken as written (dsl/pipeline.py has checked it). `stages: K` is cut where the
stages balance: PipeDream's objective, the slowest stage's forward and backward time, is
minimised by dynamic programming (dsl/cuts.py) over the contiguous cuts of the topological
order whose every stage keeps at most `max_stage_memory_mb` of activations. With pieces, the
slowest piece is minimised (so the stages, V pieces each, balance too) and each piece may keep
`max_stage_memory_mb / V`.

A stage's activation memory is what it keeps for its backward passes: the outputs of its layers
and the tensors it receives, for each micro-batch in flight (GPipe: all M; 1F1B: at most K - i
on stage i). With `rematerialize` it keeps only what it receives, and recomputes one
micro-batch's outputs at a time. Costs are estimated from the net (dsl/costs.py) unless
measured ones are given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dsl.compiler import CompiledJob
from dsl.costs import estimate_costs
from dsl.cuts import Costs, StageCosts, search_cut
from dsl.errors import JobSpecError
from dsl.net import CompiledLayer
from dsl.pipeline import SCHEDULE_SPECS, last_stage_only

MB = 2**20


@dataclass(frozen=True)
class StagePlan:
    layers: tuple[str, ...]
    params: int
    time_ms: float  # forward and backward of all of one batch's micro-batches
    activation_mb: float  # the most it keeps at once for its backward passes
    inputs: tuple[str, ...]  # the layers of earlier stages whose outputs it reads
    rank: int  # the stage (worker of the pipeline) that runs it: itself without virtual stages

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "rank": self.rank,
            "params": self.params,
            "time_ms": self.time_ms,
            "activation_mb": self.activation_mb,
            "inputs": list(self.inputs),
        }


@dataclass(frozen=True)
class PipelinePlan:
    stages: tuple[StagePlan, ...]
    microbatches: int
    schedule: str
    rematerialize: bool
    max_stage_memory_mb: float | None
    measured: bool  # the costs were measured (profile_costs), not estimated
    virtual_stages: int = 1  # pieces each stage runs: `stages` holds count x virtual_stages

    @property
    def count(self) -> int:
        """The number of stages: worker processes of one pipeline."""
        return len(self.stages) // self.virtual_stages

    def stage_of(self) -> dict[str, int]:
        """Layer name -> the piece that runs it (the stage, without virtual stages)."""
        return {name: i for i, stage in enumerate(self.stages) for name in stage.layers}

    def pieces_of(self, rank: int) -> list[int]:
        """The pieces stage `rank` runs, in pipeline order."""
        return [i for i, stage in enumerate(self.stages) if stage.rank == rank]

    def rank_times(self) -> list[float]:
        """Each stage's time: the sum of its pieces'."""
        times = [0.0] * self.count
        for stage in self.stages:
            times[stage.rank] += stage.time_ms
        return times

    @property
    def _idle(self) -> float:
        """A stage's idle time per step, in micro-batch passes (ScheduleSpec.bubble_units)."""
        spec = SCHEDULE_SPECS[self.schedule]
        return spec.bubble_units(self.count, self.virtual_stages)

    def layer_lists(self) -> list[list[str]]:
        """The layers of each piece (each stage, without virtual stages), in pipeline order."""
        return [list(stage.layers) for stage in self.stages]

    def worker_layers(self) -> list[list[str]]:
        """The layers each stage's worker holds: those of all its pieces."""
        return [
            [name for piece in self.pieces_of(rank) for name in self.stages[piece].layers]
            for rank in range(self.count)
        ]

    @property
    def bubble(self) -> float:
        """The fraction of a batch's time each stage waits while the pipeline fills and
        drains: (K - 1) / (M + K - 1) for GPipe and 1F1B, less for the others."""
        return self._idle / (self.microbatches + self._idle)

    @property
    def ideal_speedup(self) -> float:
        """K·M / (M + idle): the speed-up over one worker of K stages of equal time
        (K·M / (M + K - 1) for GPipe and 1F1B)."""
        return self.count * self.microbatches / (self.microbatches + self._idle)

    @property
    def balance(self) -> float:
        """The stages' mean time over the slowest's: 1 when they are equal."""
        times = self.rank_times()
        slowest = max(times)
        if slowest <= 0:
            return 1.0
        return sum(times) / (len(times) * slowest)

    @property
    def expected_speedup(self) -> float:
        """The ideal speed-up scaled by the balance: the slowest stage sets the pace."""
        return self.ideal_speedup * self.balance

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": [stage.to_dict() for stage in self.stages],
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
            "rematerialize": self.rematerialize,
            "max_stage_memory_mb": self.max_stage_memory_mb,
            "costs": "measured" if self.measured else "estimated",
            "bubble": self.bubble,
            "ideal_speedup": self.ideal_speedup,
            "balance": self.balance,
            "expected_speedup": self.expected_speedup,
        }


def pinned_last(layer: CompiledLayer) -> bool:
    """Layers that must run on the last stage: they read the labels or only run in tests."""
    return last_stage_only(layer.config)


def plan_pipeline(job: CompiledJob, costs: Costs | None = None) -> PipelinePlan:
    """The stages of `job`'s pipeline (its spec must have a pipeline section).

    `costs` (from dsl.costs.profile_costs) replace the estimates. A JobSpecError at
    `pipeline.max_stage_memory_mb` when no cut (or the written one) fits that cap.
    """
    config = job.spec.pipeline
    if config is None:
        raise ValueError(f"job '{job.spec.name}' has no pipeline section")
    if costs is not None:
        missing = [c.config.name for c in job.net.compiled if c.config.name not in costs]
        if missing:
            raise ValueError(f"costs lack the layers {', '.join(missing)}")
    layers = [c.config for c in job.net.compiled]  # topological order
    model = StageCosts(layers, costs if costs is not None else estimate_costs(job), config)
    written = job.spec.stage_lists()
    if written is not None:
        lists = [model.in_order(names) for names, _ in written]
        _check_cap(job, model, lists)
    else:
        lists = _best_cut(job, model)
    params = {row.name: row.params for row in job.table}
    spec = SCHEDULE_SPECS[config.schedule]
    stages = tuple(
        StagePlan(
            layers=tuple(names),
            params=sum(params[name] for name in names),
            time_ms=model.time(names),
            activation_mb=model.memory(i, names) / MB,
            inputs=tuple(model.received(names)),
            rank=spec.stage_of(i, config.count),
        )
        for i, names in enumerate(lists)
    )
    plan = PipelinePlan(
        stages,
        config.microbatches,
        config.schedule,
        config.rematerialize,
        config.max_stage_memory_mb,
        measured=costs is not None,
        virtual_stages=config.pieces_per_stage,
    )
    if written is None and plan.virtual_stages > 1:
        _check_cap(job, model, lists)  # the search bounded each piece; a stage holds several
    return plan


# The search asks for `stages` x `layers`^2 / 2 stage costs, about a second per million, and
# tables `layers`^2 / 2 numbers: a limit that keeps a request to the service short.
MAX_SEARCH = 3_000_000


def _best_cut(job: CompiledJob, model: StageCosts) -> list[list[str]]:
    """The fastest cut of `job`'s net into its `stages: K` that fits the memory cap."""
    count, size = model.count, len(model.body)
    candidates = count * size * size // 2
    if candidates > MAX_SEARCH:
        raise JobSpecError(
            job.source.issue(
                ("pipeline", "stages"),
                f"the planner does not cut a net of {size} layers into {count} stages: it would "
                f"weigh {candidates:,} candidate stages, more than its limit of {MAX_SEARCH:,}",
                "write the stages as lists of layer names, or use fewer stages",
            )
        )
    cap = model.config.max_stage_memory_mb
    if cap is not None:
        cap /= model.config.pieces_per_stage

    def slowest(index: int, start: int, stop: int) -> tuple[float, float] | None:
        if cap is not None and model.stage_memory(index, start, stop) > cap * MB:
            return None
        # Of the cuts as fast, the one that sends the fewest bytes between stages.
        return model.stage_time(index, start, stop), model.stage_received(index, start, stop)

    def fullest(index: int, start: int, stop: int) -> tuple[float, float]:
        return model.stage_memory(index, start, stop), 0.0

    may_end_empty = bool(model.last)
    cuts = search_cut(size, count, may_end_empty, slowest)
    if cuts is None:
        if cap is None:
            raise ValueError(f"the net cannot be cut into {count} stages")
        message = (
            f"no cut of the net into {count} stages keeps every stage's activations within "
            f"{cap:g} MB"
        )
        least = None
        fewest = search_cut(size, count, may_end_empty, fullest)
        if fewest is not None:
            least = max(model.stage_memory(i, a, b) for i, (a, b) in enumerate(fewest))
            message += f"; the best cut keeps {least / MB:.1f} MB on its fullest stage"
        raise _cap_error(job, message, least)
    return [model.stage(i, start, stop) for i, (start, stop) in enumerate(cuts)]


def _check_cap(job: CompiledJob, model: StageCosts, lists: list[list[str]]) -> None:
    config = model.config
    cap = config.max_stage_memory_mb
    if cap is None:
        return
    spec = SCHEDULE_SPECS[config.schedule]
    held = [0.0] * config.count
    for i, names in enumerate(lists):
        held[spec.stage_of(i, config.count)] += model.memory(i, names)
    for rank, kept in enumerate(held):
        if kept > cap * MB:
            pieces = "" if config.pieces_per_stage == 1 else "its pieces' "
            raise _cap_error(
                job,
                f"stage {rank} keeps {kept / MB:.1f} MB of activations, more than "
                f"max_stage_memory_mb {cap:g}",
                kept,
                f"move layers out of {pieces}stage {rank}, or ",
            )


def _cap_error(
    job: CompiledJob, message: str, needed: float | None, first: str = ""
) -> JobSpecError:
    """The error at max_stage_memory_mb, with the ways out: `needed` bytes would fit."""
    config = job.spec.pipeline
    assert config is not None
    ways = []
    if needed is not None:
        ways.append(f"raise max_stage_memory_mb to {math.ceil(needed / MB * 10) / 10:g}")
    if not config.rematerialize:
        ways.append("set rematerialize: true")
    if config.schedule == "gpipe":
        ways.append("use schedule: 1f1b (it keeps fewer micro-batches in flight)")
    else:
        ways.append("use more microbatches (1f1b keeps at most one per stage in flight)")
    hint = first + (", ".join(ways[:-1]) + " or " if len(ways) > 1 else "") + ways[-1]
    return JobSpecError(job.source.issue(("pipeline", "max_stage_memory_mb"), message, hint))
