"""The rules of how a job's replicas exchange gradients: `cluster.compression` and framework
localsgd against the rest of the job (the compiler's cross-field step).

Only the allreduce framework's single worker group, training with `bp`, reduces its
gradients through DistributedDataParallel (workers/distributed/allreduce.py), so only it takes
DDP's communication hooks that are not a wire type: PowerSGD's low-rank factors and
post-local SGD's local steps. The parameter-server wire, the hybrid's push of the group's mean,
the pipeline stages' all-reduce after the schedule and the algorithms that back-propagate more
or less than once per step send whole gradients, in fp32, fp16 or bf16.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsl.errors import SpecIssue
from dsl.frameworks import FRAMEWORK_SPECS
from dsl.source import SourceMap
from dsl.topology import Topology

if TYPE_CHECKING:
    from dsl.schema import JobSpec


def sync_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    issues = _powersgd_issues(spec, topology, source)
    if FRAMEWORK_SPECS.get(topology.framework).averages_locally:
        issues += _localsgd_issues(spec, topology, source)
    return issues


def _ddp_obstacle(spec: JobSpec, topology: Topology) -> str | None:
    """Why this job's gradients do not go through DDP's hooks; None where they do."""
    if topology.stages > 1:
        return "pipeline stages all-reduce their gradients after the schedule, whole"
    if spec.train_one_batch.alg != "bp":
        return (
            f"train_one_batch '{spec.train_one_batch.alg}' does not back-propagate exactly once "
            "per step, so its gradients are all-reduced whole after it"
        )
    return None


def _powersgd_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    framework = FRAMEWORK_SPECS.get(topology.framework)
    if spec.cluster.compression != "powersgd" or framework.in_one_process:
        return []
    at = ("cluster", "compression")
    hint = "use compression none, fp16 or bf16, or framework allreduce with one worker group"
    if not framework.ddp_gradients:
        message = (
            f"framework {topology.framework} sends whole gradients"
            + (" to server shards" if topology.servers else "")
            + "; compression powersgd is a DDP communication hook of framework allreduce"
        )
        return [source.issue(at, message, hint)]
    if topology.servers:
        return [
            source.issue(
                at,
                "an allreduce hybrid pushes each group's whole mean gradient to the server "
                "shards; compression powersgd compresses the all-reduce of one worker group only",
                hint,
            )
        ]
    obstacle = _ddp_obstacle(spec, topology)
    if obstacle is not None:
        return [source.issue(at, f"compression powersgd needs DDP's hooks, and {obstacle}", hint)]
    return []


def _localsgd_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    issues = []
    if spec.cluster.localsgd_delay >= spec.cluster.sync_freq:
        issues.append(
            source.issue(
                ("cluster", "localsgd_delay"),
                f"localsgd_delay {spec.cluster.localsgd_delay} is not below sync_freq "
                f"{spec.cluster.sync_freq}: each averaging is taken in before the next starts",
                f"set localsgd_delay to at most {spec.cluster.sync_freq - 1}",
            )
        )
    if spec.cluster.compression != "none":
        issues.append(
            source.issue(
                ("cluster", "compression"),
                f"framework {topology.framework} averages parameters, not gradients, and "
                f"compression {spec.cluster.compression} is for gradients",
                "drop compression, or use framework allreduce",
            )
        )
    obstacle = _ddp_obstacle(spec, topology)
    if obstacle is not None:
        key = ("pipeline",) if topology.stages > 1 else ("train_one_batch", "alg")
        issues.append(
            source.issue(
                key,
                f"framework {topology.framework} runs on DDP's post-local SGD hook, and {obstacle}",
                "use framework allreduce",
            )
        )
    split = [
        ("neuralnet", "partition_dim")
        if spec.neuralnet.partition_dim != 0
        else ("neuralnet", "layers", index, "partition_dim")
        for index, layer in enumerate(spec.neuralnet.layers)
        if spec.neuralnet.partition_dim != 0
        or getattr(layer, "partition_dim", None) not in (None, 0)
    ]
    if split:
        issues.append(
            source.issue(
                split[0],
                f"framework {topology.framework} trains each replica apart between syncs, and a "
                "net split by feature or replicated (partition_dim 1 or -1) exchanges "
                "activations between the workers at every step",
                "use partition_dim 0 (split by batch), or framework allreduce",
            )
        )
    return issues
