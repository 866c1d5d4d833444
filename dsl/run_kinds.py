"""The run kinds: what a job's processes do, one descriptor each, which every reader derives its
answer from.

A job is one kind of run. A training run's workers train the net its document describes, as
its framework says (dsl/frameworks.py). A prediction run's workers score a user's dataset with
a trained model, each worker its own shard of the rows (workers/prediction.py,
contract/prediction.py); it has no framework: its workers exchange nothing. A job's row keeps
its kind (`Job.kind`), its allocation records carry it (`AllocationInfo.kind`), and the API
serves it (`JobOut.kind`). The worker process (workers/entry.py), the recovery policy's facts
(scheduler/recovery/actions.py), admission and the job list's progress read the descriptor;
nothing compares a kind's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsl.registry import Registry


@dataclass(frozen=True, kw_only=True)
class RunKindSpec:
    name: str
    # Its workers train a net, with a framework: the run leaves checkpoints, a model to predict
    # with, and its progress is its steps over train_steps.
    trains: bool
    # Its workers score shards of a dataset with a trained model (workers/prediction.py); the
    # run's own row (`Prediction`) holds what they score, and its progress is its rows.
    scores_rows: bool = False
    # A failed worker restarts alone whatever the framework: its peers' work does not depend
    # on it (a prediction run's workers score disjoint shards; one scores its own again).
    restarts_alone: bool = False


RUN_KINDS: Registry[RunKindSpec] = Registry("run kind")


def register_run_kind(spec: RunKindSpec) -> RunKindSpec:
    return RUN_KINDS.register(spec.name)(spec)


TRAINING = register_run_kind(
    RunKindSpec(
        name="training",  # its workers train the job's net, as its framework says
        trains=True,
    )
)
PREDICTION = register_run_kind(
    RunKindSpec(
        name="prediction",  # its workers score a dataset with a trained model, a shard each
        trains=False,
        scores_rows=True,
        restarts_alone=True,
    )
)
