"""The framework descriptors: one registry, and every reader's answer derived from it."""

from __future__ import annotations

import pytest

from dsl.compiler import compile_job
from dsl.errors import JobSpecError
from dsl.frameworks import (
    FRAMEWORK_SPECS,
    FrameworkSpec,
    Preset,
    Sync,
    register_framework,
    restarting_alone,
)
from dsl.layers.base import BuildContext
from dsl.registry import UnknownNameError
from dsl.schema import ClusterConfig, PipelineConfig, json_schema
from dsl.topology import resolve_topology, topology_problems

# framework -> (worker groups, workers per group, server groups, servers per group, separate):
# the presets as they were before the descriptors.
PRESETS = {
    "local": (1, 1, 0, 0, False),
    "sandblaster": (1, 2, 1, 1, True),
    "allreduce": (1, 2, 0, 0, False),
    "downpour": (2, 1, 1, 1, True),
    "hogwild": (2, 1, 2, 1, True),
    "localsgd": (1, 2, 0, 0, False),
}


def test_the_job_language_offers_the_registered_frameworks_in_their_order() -> None:
    names = FRAMEWORK_SPECS.names_as_registered()
    assert names == ["local", "sandblaster", "allreduce", "downpour", "hogwild", "localsgd"]
    framework = json_schema()["$defs"]["ClusterConfig"]["properties"]["framework"]
    assert framework["enum"] == names
    with pytest.raises(ValueError, match="'downpour', 'hogwild' or 'localsgd'"):
        ClusterConfig.model_validate({"framework": "easgd"})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_framework_resolves_to_its_preset(name: str) -> None:
    t = resolve_topology(ClusterConfig.model_validate({"framework": name}))
    counts = (
        t.nworker_groups,
        t.nworkers_per_group,
        t.nserver_groups,
        t.nservers_per_group,
        t.server_worker_separate,
    )
    assert counts == PRESETS[name]
    assert topology_problems(t) == []


def test_explicit_counts_override_the_preset() -> None:
    cluster = ClusterConfig(framework="downpour", nworker_groups=3, nservers_per_group=2)
    t = resolve_topology(cluster)
    assert (t.nworker_groups, t.nworkers_per_group, t.nserver_groups, t.nservers_per_group) == (
        3,
        1,
        1,
        2,
    )


@pytest.mark.parametrize("name", ["local", "allreduce"])
def test_a_pipeline_without_shards_drops_the_preset_shards(name: str) -> None:
    pipeline = PipelineConfig(stages=3)
    t = resolve_topology(ClusterConfig.model_validate({"framework": name}), pipeline)
    assert (t.nworker_groups, t.nworkers_per_group, t.servers, t.stages) == (1, 3, 0, 3)


def test_the_properties_every_reader_derives() -> None:
    specs = dict(FRAMEWORK_SPECS.items())
    assert [n for n, s in specs.items() if s.in_one_process] == ["local"]
    assert sorted(n for n, s in specs.items() if s.needs_servers) == [
        "downpour",
        "hogwild",
        "sandblaster",
    ]
    assert {n: s.pushers_per_group for n, s in specs.items() if s.pushers_per_group} == {
        "allreduce": 1
    }
    assert restarting_alone() == ["downpour", "hogwild"]
    assert sorted(n for n, s in specs.items() if not s.synchronous) == ["downpour", "hogwild"]


def test_a_name_registered_twice_raises() -> None:
    with pytest.raises(ValueError, match="framework 'allreduce' is registered twice"):
        register_framework(FRAMEWORK_SPECS.get("allreduce"))
    assert FRAMEWORK_SPECS.names_as_registered().count("allreduce") == 1


def test_an_unknown_name_raises_with_the_known_names_and_a_suggestion() -> None:
    with pytest.raises(UnknownNameError) as caught:
        FRAMEWORK_SPECS.get("allreduc")
    message = str(caught.value)
    assert "unknown framework 'allreduc'" in message
    assert "known: allreduce, downpour, hogwild, local, localsgd, sandblaster" in message
    assert "did you mean 'allreduce'?" in message


@pytest.mark.parametrize(
    ("synchronous", "sync"), [(True, Sync.SERVERS), (False, Sync.GROUP_THEN_SERVERS)]
)
def test_only_an_asynchronous_parameter_server_framework_restarts_a_worker_alone(
    synchronous: bool, sync: Sync
) -> None:
    with pytest.raises(ValueError, match="can restart a worker alone"):
        FrameworkSpec(
            name="bad",
            doc="",
            preset=Preset(nworker_groups=2, nworkers_per_group=1),
            sync=sync,
            synchronous=synchronous,
            restart="alone",
        )


def test_a_descriptor_is_frozen() -> None:
    spec = FRAMEWORK_SPECS.get("local")
    with pytest.raises(AttributeError):
        spec.restart = "alone"  # type: ignore[misc]


def test_a_worker_gets_no_more_gpus_than_its_framework_drives() -> None:
    text = """
name: two-gpus
data: {source: digits}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc, type: innerproduct, srclayers: [data], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 10
cluster:
  resources: {gpus_per_worker: 2}
"""
    with pytest.raises(JobSpecError) as caught:
        compile_job(text, BuildContext(sample_shape=(1, 8, 8), num_classes=10))
    [issue] = caught.value.issues
    assert issue.path == "cluster.resources.gpus_per_worker" and issue.line == 12
    assert "uses 1 GPU" in issue.message


@pytest.mark.parametrize(("name", "server_groups"), [("downpour", 1), ("hogwild", 2)])
def test_an_asynchronous_pipeline_has_its_replicas_and_a_shard_per_stage(
    name: str, server_groups: int
) -> None:
    t = resolve_topology(
        ClusterConfig.model_validate({"framework": name}), PipelineConfig(stages=3)
    )
    counts = (t.nworker_groups, t.nworkers_per_group, t.nserver_groups, t.nservers_per_group)
    assert counts == (2, 3, server_groups, 3)
    assert t.stages == 3 and t.server_worker_separate
    assert topology_problems(t) == []


PIPELINED = """
name: async-pipeline
data: {source: digits}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: innerproduct, srclayers: [data], units: 16}
    - {name: fc2, type: innerproduct, srclayers: [fc1], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc2]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 10
pipeline: {stages: 2, microbatches: 2}
cluster:
"""


@pytest.mark.parametrize(
    ("cluster", "path", "line", "message"),
    [
        (
            "  framework: sandblaster",
            "cluster.framework",
            14,
            "pipelines that average every step through server shards (framework sandblaster) "
            "are not built",
        ),
        (
            "  framework: downpour\n  nservers_per_group: 1",
            "cluster.nservers_per_group",
            15,
            "each of the 2 stages keeps its layers on shards of its own, and the cluster "
            "section gives 1 shard(s) per server group",
        ),
        (
            "  framework: hogwild\n  nworker_groups: 1",
            "cluster.nserver_groups",
            13,  # not written: the cluster section's
            "2 server groups for 1 pipeline(s): each server group needs at least one pipeline, "
            "and there must be one server group",
        ),
        (
            "  framework: downpour\n  server_worker_separate: false",
            "cluster.server_worker_separate",
            15,
            "framework downpour runs its server shards as processes of their own; shards inside "
            "the workers (server_worker_separate: false) are not built",
        ),
    ],
    ids=["sandblaster", "a-shard-short", "no-pipeline-for-a-server-group", "shards-inside"],
)
def test_what_an_asynchronous_pipeline_cannot_run_is_refused_where_it_is_written(
    cluster: str, path: str, line: int, message: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        compile_job(
            PIPELINED + cluster + "\n", BuildContext(sample_shape=(1, 8, 8), num_classes=10)
        )
    [issue] = [i for i in caught.value.issues if i.path == path]
    assert issue.message == message
    assert issue.line == line
