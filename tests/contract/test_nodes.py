"""A node agent's registration reads back as its agent wrote it."""

from __future__ import annotations

import pytest

from contract.nodes import NodeRegistration


def test_a_registration_reads_back_as_written() -> None:
    registration = NodeRegistration(
        queue="trainyard.node.n1",
        slots=4,
        gpus=1,
        heartbeat=1700000000.125,
        host="n1.example",
        pid=42,
        draining=True,
        ps_unreachable=("10.0.0.3:6379: connection refused",),
    )
    assert NodeRegistration.from_hash(registration.to_hash()) == registration


def test_an_agent_that_says_less_still_registers() -> None:
    read = NodeRegistration.from_hash({"queue": "q", "slots": "2", "gpus": "0", "heartbeat": "1.0"})
    assert (read.draining, read.ps_unreachable, read.host) == (False, (), "")


def test_a_hash_that_is_no_registration_is_refused() -> None:
    with pytest.raises(KeyError, match="slots"):
        NodeRegistration.from_hash({"queue": "q", "gpus": "0", "heartbeat": "1.0"})
