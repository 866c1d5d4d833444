"""A job's stream records: one encoder and one decoder for all of them (contract/codec.py), and
a wire format that never changes under stored streams."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.stream import (
    CheckpointRecord,
    EventRecord,
    LogRecord,
    MetricRecord,
    Record,
    RecordError,
    StateRecord,
    TimelineRecord,
    decode_record,
    encode_record,
)

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
times = st.floats(allow_nan=False, allow_infinity=False)
# JSON carries infinities (as Infinity); NaN is left out only because NaN != NaN.
values = st.dictionaries(st.text(), st.floats(allow_nan=False))
records = st.one_of(
    st.builds(MetricRecord, step=ints, values=values, time=times, group=ints, rank=ints),
    st.builds(LogRecord, line=st.text(), group=ints, rank=ints, time=times),
    st.builds(
        CheckpointRecord, step=ints, path=st.text(), size=ints, time=times, best=st.booleans()
    ),
    st.builds(EventRecord, step=ints, message=st.text(), time=times),
    st.builds(
        StateRecord,
        allocation_id=ints,
        state=st.sampled_from(["PENDING", "RUNNING", "DONE", "FAILED", "CANCELLED"]),
        reason=st.text(),
        exit_code=st.none() | ints,
        time=times,
    ),
    st.builds(
        TimelineRecord,
        step=ints,
        events=st.lists(st.tuples(st.sampled_from(["F", "B", "W"]), ints, times, times, ints)).map(
            tuple
        ),
        group=ints,
        rank=ints,
        time=times,
    ),
)


def as_redis_returns(fields: dict[str, str]) -> dict[bytes, bytes]:
    """What XREAD hands back without decode_responses."""
    return {k.encode(): v.encode() for k, v in fields.items()}


@given(records)
def test_every_record_reads_back_as_written(record: Record) -> None:
    fields = encode_record(record)
    assert all(isinstance(v, str) for v in fields.values())
    assert decode_record(fields) == record
    assert decode_record(as_redis_returns(fields)) == record


def test_the_wire_format_is_the_one_stored_streams_hold() -> None:
    """Field names and their spelling, as workers have always written them (readers take an
    entry's fields by name, so their order is no part of the format)."""
    assert encode_record(MetricRecord(5, {"loss": 0.5}, 1.25, 1, 2)) == dict(
        [
            ("kind", "metric"),
            ("step", "5"),
            ("group", "1"),
            ("rank", "2"),
            ("time", "1.25"),
            ("values", '{"loss": 0.5}'),
        ]
    )
    assert encode_record(LogRecord("hi", 0, 3, 2.5)) == dict(
        [
            ("kind", "log"),
            ("group", "0"),
            ("rank", "3"),
            ("time", "2.5"),
            ("line", "hi"),
        ]
    )
    assert encode_record(CheckpointRecord(10, "/runs/1/step-10", 123, 3.0)) == dict(
        [
            ("kind", "checkpoint"),
            ("step", "10"),
            ("path", "/runs/1/step-10"),
            ("size", "123"),
            ("time", "3.0"),
            ("best", ""),
        ]
    )
    assert encode_record(CheckpointRecord(10, "/p", 1, 3.0, best=True))["best"] == "1"
    assert encode_record(EventRecord(40, "stopped early at step 40", 5.0)) == dict(
        [
            ("kind", "event"),
            ("step", "40"),
            ("message", "stopped early at step 40"),
            ("time", "5.0"),
        ]
    )
    assert encode_record(StateRecord(7, "RUNNING", time=4.0)) == dict(
        [
            ("kind", "state"),
            ("alloc", "7"),
            ("state", "RUNNING"),
            ("reason", ""),
            ("exit_code", ""),
            ("time", "4.0"),
        ]
    )
    assert encode_record(StateRecord(7, "FAILED", "boom", -15, 4.0))["exit_code"] == "-15"
    nan = decode_record(encode_record(MetricRecord(1, {"loss": float("nan")}, 1.0)))
    assert isinstance(nan, MetricRecord) and nan.values["loss"] != nan.values["loss"]


def test_a_checkpoint_record_carries_the_files_size(tmp_path: Path) -> None:
    path = tmp_path / "step-00000010.safetensors"
    path.write_bytes(b"x" * 123)
    record = CheckpointRecord.of_file(10, path)
    assert (record.step, record.path, record.size) == (10, str(path), 123)


def test_a_checkpoint_record_of_an_older_writer_is_not_the_best() -> None:
    fields = {"kind": "checkpoint", "step": "10", "path": "/p", "size": "1", "time": "3.0"}
    assert decode_record(fields) == CheckpointRecord(10, "/p", 1, 3.0, best=False)


def test_a_state_record_without_reason_or_exit_code_still_reads() -> None:
    record = decode_record({"kind": "state", "alloc": "3", "state": "DONE", "time": "1.0"})
    assert record == StateRecord(3, "DONE", "", None, 1.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "telemetry"}, "unknown record kind 'telemetry' (known: metric, log, "),
        ({"step": "1"}, "unknown record kind None"),
        ({"kind": "metric", "step": "oops"}, "a metric record lacks the field"),
        (
            {"kind": "metric", "step": "x", "group": "0", "rank": "0", "time": "1", "values": "{}"},
            "malformed metric record",
        ),
        (
            {"kind": "metric", "step": "1", "group": "0", "rank": "0", "time": "1", "values": "[]"},
            "values is not a JSON object",
        ),
        ({"kind": "log", "group": "0", "rank": "0", "time": "1"}, "a log record lacks the field"),
        (
            {"kind": "checkpoint", "step": "1", "path": "p", "size": "big", "time": "1"},
            "malformed checkpoint record",
        ),
        ({"kind": "state", "alloc": "1", "time": "1"}, "a state record lacks the field 'state'"),
        (
            {
                "kind": "timeline",
                "step": "1",
                "group": "0",
                "rank": "0",
                "time": "1",
                "events": '[["X", 0, 0.0, 1.0, 0]]',
            },
            "none of F (forward), B (backward), W (weight gradients)",
        ),
    ],
)
def test_malformed_or_unknown_records_are_refused_clearly(
    fields: dict[str, str], message: str
) -> None:
    with pytest.raises(RecordError, match=re.escape(message)):
        decode_record(fields)
