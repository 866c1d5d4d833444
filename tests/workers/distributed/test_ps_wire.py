"""The wire format: exact round trips, half the bytes with fp16/bf16, clear errors."""

from __future__ import annotations

import pytest
import torch

from workers.distributed.ps.slicing import ParamInfo, plan_slices, slice_views
from workers.distributed.ps.wire import (
    FRAME,
    MESSAGE,
    FrameBuffer,
    GradHeader,
    WireError,
    decode_frames,
    decode_grad_message,
    encode_frames,
    encode_grad_message,
    wire_dtype,
)

torch.set_num_threads(1)

MLP = [  # bench/overhead.py's 784-1000-500-10
    ParamInfo("fc1/w", (1000, 784)),
    ParamInfo("fc1/b", (1000,)),
    ParamInfo("fc2/w", (500, 1000)),
    ParamInfo("fc2/b", (500,)),
    ParamInfo("fc3/w", (10, 500)),
    ParamInfo("fc3/b", (10,)),
]


def _mlp_slices() -> list[tuple[int, torch.Tensor]]:
    smap = plan_slices(MLP, 3)
    gen = torch.Generator().manual_seed(0)
    tensors = {p.name: torch.randn(p.shape, generator=gen) for p in MLP}
    views = slice_views(tensors, smap)
    return [(s.id, v.view(s.shape)) for s, v in zip(smap.slices, views, strict=True)]


def test_frames_round_trip_exactly() -> None:
    items = _mlp_slices()
    blob = encode_frames(items, version=41)
    frames = decode_frames(blob)
    assert [f.slice_id for f in frames] == [i for i, _ in items]
    for frame, (_, tensor) in zip(frames, items, strict=True):
        assert frame.version == 41
        assert frame.tensor.dtype == torch.float32
        assert torch.equal(frame.tensor, tensor)
    # Raw bytes plus a fixed 48-byte header per slice (payloads are 8-byte aligned).
    payload = sum(t.numel() * 4 for _, t in items)
    assert len(blob) - payload <= len(items) * (FRAME.size + 7)


def test_a_frame_buffer_is_rebuilt_from_its_ranges_over_an_older_blob() -> None:
    """What a shard does with the staged blob: some frames written as they are updated, the
    rest and the others' headers at the commit, over a blob of an older version."""
    items = [(0, torch.arange(3.0)), (1, torch.tensor(7.0)), (2, torch.ones(5)), (3, torch.ones(2))]
    buffer = FrameBuffer(items, version=4)
    older = bytearray(buffer.view())

    def write(ranges: list[tuple[int, memoryview]]) -> None:
        for offset, data in ranges:
            older[offset : offset + len(data)] = data

    for tensor in buffer.tensors.values():
        tensor.add_(1)
    early = buffer.ranges([0, 1, 3])
    assert [offset for offset, _ in early] == [0, buffer.ranges([3])[0][0]]  # 0 and 1 joined
    write(early)  # still at version 4 in their headers
    buffer.set_version(5)
    write(buffer.ranges([2]) + buffer.ranges([0, 1, 3], headers_only=True))
    assert bytes(older) == bytes(buffer.view())
    assert all(len(data) == FRAME.size for _, data in buffer.ranges([0, 3], headers_only=True))
    assert [f.version for f in decode_frames(bytes(older))] == [5] * 4


def test_odd_sizes_and_scalars_keep_alignment() -> None:
    items = [(0, torch.arange(3.0)), (1, torch.tensor(7.0)), (2, torch.ones(2, 1, 1, 2))]
    frames = decode_frames(encode_frames(items, 0, torch.float16))
    assert [tuple(f.tensor.shape) for f in frames] == [(3,), (), (2, 1, 1, 2)]
    assert torch.equal(frames[0].tensor.float(), torch.arange(3.0))
    assert float(frames[1].tensor) == 7.0


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compressed_gradients_take_half_the_bytes(compression: str) -> None:
    items = _mlp_slices()
    header = GradHeader(worker=3, group=1, step=9, version=8, norm=2.5)
    full = encode_grad_message(header, items)
    half = encode_grad_message(header, items, wire_dtype(compression))
    overhead = MESSAGE.size + len(items) * (FRAME.size + 7)
    assert len(half) <= (len(full) - overhead) / 2 + overhead
    assert len(half) / len(full) == pytest.approx(0.5, abs=0.001)
    decoded_header, frames = decode_grad_message(half)
    assert decoded_header == header
    tolerance = 1e-3 if compression == "fp16" else 1e-2  # 10 vs 7 mantissa bits
    for frame, (_, tensor) in zip(frames, items, strict=True):
        assert frame.tensor.dtype == wire_dtype(compression)
        torch.testing.assert_close(frame.tensor.float(), tensor, rtol=tolerance, atol=1e-4)


def test_broken_blobs_raise_wire_errors() -> None:
    blob = encode_frames([(0, torch.ones(10))], 1)
    with pytest.raises(WireError, match="truncated"):
        decode_frames(blob[:-8])
    with pytest.raises(WireError, match="no frame"):
        decode_frames(b"XX" + blob[2:])
    with pytest.raises(WireError, match="not a gradient message"):
        decode_grad_message(blob)
    with pytest.raises(WireError, match="unknown compression"):
        wire_dtype("int8")
    with pytest.raises(WireError, match="cannot travel"):
        encode_frames([(0, torch.ones(2, dtype=torch.float64))], 0, torch.float64)
