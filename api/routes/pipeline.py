"""/jobs/{id}/pipeline: a pipelined job's stages, micro-batches and replicas, and the latest
timeline of each stage (when it ran each micro-batch's forward and backward)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import SessionDep, VisibleJob
from api.schemas import PipelineOut, StageTimelineOut, errors
from dsl.pipeline import SCHEDULE_SPECS
from dsl.schema import PipelineConfig
from dsl.topology import Topology
from scheduler.store import errors as store_errors
from scheduler.store.models import Job, PipelineTimeline
from scheduler.store.reports import pipeline_timelines

router = APIRouter(prefix="/jobs", tags=["jobs"])


def pipeline_config(job: Job) -> PipelineConfig:
    """The job's pipeline section; NotFound (404) for a job without one."""
    section = job.spec.get("pipeline")
    if section is None:
        raise store_errors.NotFound(f"job {job.id} has no pipeline")
    return PipelineConfig.model_validate(section)


def stage_lists(job: Job, config: PipelineConfig) -> list[list[str]]:
    """The layers of each stage, as the service stored them: check_job writes a planned count
    out as lists, so every stage's worker runs the same cut and nothing is compiled here."""
    if isinstance(config.stages, int):
        raise store_errors.NotFound(f"job {job.id} was stored without its planned stages")
    return config.stages


def pipeline_view(
    job: Job, config: PipelineConfig, stages: list[list[str]], rows: list[PipelineTimeline]
) -> PipelineOut:
    return PipelineOut(
        stages=stages,
        microbatches=config.microbatches,
        schedule=config.schedule,
        virtual_stages=config.pieces_per_stage,
        piece_stages=[
            SCHEDULE_SPECS[config.schedule].stage_of(piece, config.count)
            for piece in range(len(stages))
        ],
        rematerialize=config.rematerialize,
        replicas=Topology.from_dict(job.topology).nworker_groups,
        timelines=[StageTimelineOut.of(r.group, r.rank, r.step, r.events) for r in rows],
    )


@router.get(
    "/{job_id}/pipeline",
    response_model=PipelineOut,
    summary="The pipeline of a pipelined job",
    description="The layers of each stage, the micro-batches, schedule and replicas, and each "
    "stage's latest timeline: when it ran the forward (F) and backward (B) of every "
    "micro-batch, and its weight-gradient pass (W) where the schedule splits the backward, "
    "in seconds from the start of the step. 404 for a job without a pipeline.",
    responses=errors(401, 404, 422),
)
def job_pipeline(job: VisibleJob, session: SessionDep) -> PipelineOut:
    config = pipeline_config(job)
    stages = stage_lists(job, config)
    return pipeline_view(job, config, stages, pipeline_timelines(session, job.id))
