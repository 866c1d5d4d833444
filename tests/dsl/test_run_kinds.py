"""The run kinds: one registry of descriptors, which the worker, recovery and admission read."""

from __future__ import annotations

import pytest

from dsl.registry import UnknownNameError
from dsl.run_kinds import PREDICTION, RUN_KINDS, TRAINING, RunKindSpec, register_run_kind


def test_a_training_run_trains_and_a_prediction_run_scores_rows_its_workers_apart() -> None:
    assert RUN_KINDS.names_as_registered() == [TRAINING.name, PREDICTION.name]
    assert TRAINING.trains and not TRAINING.scores_rows and not TRAINING.restarts_alone
    assert not PREDICTION.trains and PREDICTION.scores_rows and PREDICTION.restarts_alone


def test_a_kind_is_registered_once_and_an_unknown_one_is_named() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_run_kind(RunKindSpec(name=TRAINING.name, trains=True))
    with pytest.raises(UnknownNameError, match="did you mean 'prediction'"):
        RUN_KINDS.get("predictions")
