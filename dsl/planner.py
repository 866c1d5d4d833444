"""The pipeline stage planner: which layers each stage of a pipelined job runs.

A plan lists the layers of every stage in the net's topological order. Input layers go to the
first stage; losses, metrics and layers that run only in the test phase go to the last, where
the labels are. A `stages: K` section is cut by cost; a list of lists is taken as written
(dsl/pipeline.py has checked it).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsl.compiler import CompiledJob
from dsl.net import CompiledLayer


@dataclass(frozen=True)
class StagePlan:
    layers: tuple[str, ...]
    params: int


@dataclass(frozen=True)
class PipelinePlan:
    stages: tuple[StagePlan, ...]
    microbatches: int

    def stage_of(self) -> dict[str, int]:
        """Layer name -> the stage that runs it."""
        return {name: i for i, stage in enumerate(self.stages) for name in stage.layers}

    def layer_lists(self) -> list[list[str]]:
        return [list(stage.layers) for stage in self.stages]


def pinned_last(layer: CompiledLayer) -> bool:
    """Layers that must run on the last stage: they read the labels or only run in tests."""
    module = layer.module
    return bool(module.is_loss or module.is_metric or layer.config.include == ["test"])


def plan_pipeline(job: CompiledJob) -> PipelinePlan:
    """The stages of `job`'s pipeline (its spec must have a pipeline section)."""
    config = job.spec.pipeline
    if config is None:
        raise ValueError(f"job '{job.spec.name}' has no pipeline section")
    params = {row.name: row.params for row in job.table}
    if isinstance(config.stages, list):
        lists = [list(names) for names in config.stages]
    else:
        lists = _even_cut(job, config.stages)
    stages = tuple(StagePlan(tuple(names), sum(params[name] for name in names)) for names in lists)
    return PipelinePlan(stages, config.microbatches)


def _even_cut(job: CompiledJob, count: int) -> list[list[str]]:
    layers = job.net.compiled
    body = [c.config.name for c in layers if c.config.type != "input" and not pinned_last(c)]
    first = [c.config.name for c in layers if c.config.type == "input"]
    last = [c.config.name for c in layers if pinned_last(c)]
    size, extra = divmod(len(body), count)
    lists, start = [], 0
    for i in range(count):
        stop = start + size + (1 if i < extra else 0)
        lists.append(body[start:stop])
        start = stop
    lists[0] = first + lists[0]
    lists[-1] = lists[-1] + last
    return lists
