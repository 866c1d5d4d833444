"""The allocation record: what the scheduler writes and a node agent and its worker read back,
the states a process goes through and the codes it exits with."""

from __future__ import annotations

from pathlib import Path

from contract.allocation import AllocationInfo, AllocationState, ExitCode
from dsl.run_kinds import RUN_KINDS, TRAINING


def test_exit_codes_keep_their_numbers() -> None:
    assert [(code.name, int(code)) for code in ExitCode] == [
        ("OK", 0),
        ("FAILED", 1),
        ("INVALID", 2),
        ("CANCELLED", 3),
        ("DRAINED", 4),
        ("DIVERGED", 5),
        ("OUT_OF_MEMORY", 6),
    ]


def test_an_allocation_reads_back_as_the_scheduler_wrote_it() -> None:
    info = AllocationInfo(
        allocation_id=7,
        job_id=3,
        role="worker",
        group=1,
        rank=0,
        world=2,
        slots=1,
        gpus=0,
        node="n1",
        framework="downpour",
        topology={"workers": 2},
        spec={"train_steps": 10},
        run_dir=Path("/runs/3"),
        kind="prediction",
        attempt=2,
        resume_from="/runs/3/restart/attempt-2.safetensors",
        restart_seconds=0.25,
        start_step=40,
        memory_mb=2048,
        devices=(1, 3),
        prediction={"rows": 40, "key": "x"},
    )
    fields = info.to_hash()
    assert "allocation_id" not in fields  # the hash's key holds it
    assert fields["topology"] == '{"workers": 2}' and fields["restart_seconds"] == "0.25"
    assert fields["memory_mb"] == "2048" and fields["devices"] == "[1, 3]"
    assert AllocationInfo.from_hash(7, fields) == info


def test_an_allocation_of_an_older_scheduler_still_reads() -> None:
    """Fields added since (kind, attempt, resume_from, restart_seconds, start_step,
    prediction) have defaults: an older scheduler's allocations are a training run's."""
    fields = {
        "job_id": "3",
        "role": "server",
        "group": "0",
        "rank": "1",
        "world": "1",
        "slots": "1",
        "gpus": "0",
        "node": "n1",
        "framework": "downpour",
        "topology": "{}",
        "spec": "{}",
        "run_dir": "/runs/3",
    }
    info = AllocationInfo.from_hash(9, fields)
    assert (info.allocation_id, info.attempt, info.resume_from, info.start_step) == (9, 0, "", 0)
    assert RUN_KINDS.get(info.kind) is TRAINING and info.prediction is None


def test_only_pending_and_running_processes_are_active() -> None:
    assert {state for state in AllocationState if state.active} == {
        AllocationState.PENDING,
        AllocationState.RUNNING,
    }
