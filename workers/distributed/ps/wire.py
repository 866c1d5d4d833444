"""The parameter server's wire format: raw tensor bytes behind small fixed headers, no pickle.

A blob is a sequence of frames, one per slice:

    frame   = header (48 bytes) + payload (the slice's elements, padded to 8 bytes)
    header  = magic "TY", dtype code (u8), ndim (u8), slice id (u32), version (u64), 8 x dim (u32)

A gradient message (worker -> shard) puts a 40-byte message header in front of its frames:
magic "TG", part (u8), parts (u8), worker (u32), group (u32), frame count (u32), step (u64),
global gradient norm (f64) and the parameter version the gradients were computed on (u64).
A worker's gradient for one shard and step travels as `parts` messages (one, or one per bucket
when it is sent during the backward pass); the last part carries the norm.

All integers are little-endian. Gradients may travel as fp16 or bf16 (half the bytes); the shard
widens them back to fp32 before the update. Parameters always travel as fp32.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch

Compression = Literal["none", "fp16", "bf16"]

WIRE_DTYPES: dict[str, torch.dtype] = {
    "none": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
_DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}

FRAME = struct.Struct("<2sBBIQ8I")
_VERSION = struct.Struct("<Q")
_VERSION_OFFSET = 8  # of the version inside a frame header
MESSAGE = struct.Struct("<2sBBIIIQdQ")
MAX_PARTS = 255  # of one worker's gradient for one shard and step (a u8 in the header)
MAX_DIMS = 8
_ALIGN = 8
_PADDING = bytes(_ALIGN)


Range = tuple[int, memoryview]  # (offset, bytes) of part of a blob


class WireError(ValueError):
    """A blob that is not in the wire format (truncated, wrong magic, unknown dtype)."""


@dataclass(frozen=True)
class Frame:
    """One decoded slice. `tensor` views the blob's memory: copy it before the blob goes away."""

    slice_id: int
    version: int
    tensor: torch.Tensor


@dataclass(frozen=True)
class GradHeader:
    worker: int
    group: int
    step: int
    version: int  # the parameter version the gradients were computed on
    norm: float  # global L2 norm of the worker's whole gradient (for clipping at the shards)
    part: int = 0  # which of the `parts` messages of this gradient (the last carries `norm`)
    parts: int = 1


def wire_dtype(compression: str) -> torch.dtype:
    try:
        return WIRE_DTYPES[compression]
    except KeyError:
        raise WireError(
            f"unknown compression '{compression}'; known: {', '.join(WIRE_DTYPES)}"
        ) from None


def _payload(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (numpy has no bf16: those go through int16)."""
    flat = tensor.detach().to("cpu").contiguous()
    if flat.dtype == torch.bfloat16:
        flat = flat.view(torch.int16)
    return flat.numpy().data.cast("B")


def frame_pieces(
    tensors: Iterable[tuple[int, torch.Tensor]], version: int, dtype: torch.dtype = torch.float32
) -> list[bytes | memoryview]:
    """Header and payload buffers of one frame per (slice id, tensor), converted to `dtype`.

    Returned as pieces so the caller joins everything it sends with a single copy.
    """
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        raise WireError(f"dtype {dtype} cannot travel on the wire")
    pieces: list[bytes | memoryview] = []
    for slice_id, tensor in tensors:
        shape = tuple(tensor.shape)
        if len(shape) > MAX_DIMS:
            raise WireError(f"slice {slice_id} has {len(shape)} dims; at most {MAX_DIMS} travel")
        dims = (*shape, *([0] * (MAX_DIMS - len(shape))))
        pieces.append(FRAME.pack(b"TY", code, len(shape), slice_id, version, *dims))
        payload = _payload(tensor if tensor.dtype == dtype else tensor.to(dtype))
        pieces.append(payload)
        pad = -len(payload) % _ALIGN
        if pad:
            pieces.append(_PADDING[:pad])
    return pieces


def encode_frames(
    tensors: Iterable[tuple[int, torch.Tensor]], version: int, dtype: torch.dtype = torch.float32
) -> bytes:
    return b"".join(frame_pieces(tensors, version, dtype))


class FrameBuffer:
    """Frames encoded once into a buffer whose payloads `tensors` view (slice id -> tensor).

    The owner updates the tensors in place and sends `view()` as it is: no encoding copy per
    version. Only the version fields of the headers change (`set_version`). `ranges` gives the
    byte ranges of some frames, to overwrite just those in a copy of the buffer kept elsewhere.
    """

    def __init__(self, tensors: Iterable[tuple[int, torch.Tensor]], version: int) -> None:
        self.buffer = bytearray(encode_frames(tensors, version))
        frames = decode_frames(self.buffer)  # writable views: the buffer is a bytearray
        self.tensors = {frame.slice_id: frame.tensor for frame in frames}
        self._spans: dict[int, tuple[int, int]] = {}  # slice id -> its frame's [start, stop)
        offset = 0
        for frame in frames:
            nbytes = frame.tensor.numel() * frame.tensor.element_size()
            stop = offset + FRAME.size + nbytes + (-nbytes % _ALIGN)
            self._spans[frame.slice_id] = (offset, stop)
            offset = stop

    def set_version(self, version: int) -> None:
        for start, _ in self._spans.values():
            _VERSION.pack_into(self.buffer, start + _VERSION_OFFSET, version)

    def view(self) -> memoryview:
        return memoryview(self.buffer)

    def ranges(self, slice_ids: Iterable[int], *, headers_only: bool = False) -> list[Range]:
        """(offset, bytes) of the frames of `slice_ids` (or of their headers alone), adjacent
        frames joined into one range, in buffer order."""
        wanted = sorted(self._spans[i] for i in slice_ids)
        if headers_only:
            wanted = [(start, start + FRAME.size) for start, _ in wanted]
        joined: list[list[int]] = []
        for start, stop in wanted:
            if joined and joined[-1][1] == start:
                joined[-1][1] = stop
            else:
                joined.append([start, stop])
        view = memoryview(self.buffer)
        return [(start, view[start:stop]) for start, stop in joined]


def decode_frames(
    blob: bytes | bytearray, offset: int = 0, count: int | None = None
) -> list[Frame]:
    """The frames of `blob` from `offset` (all of them, or the first `count`)."""
    frames: list[Frame] = []
    end = len(blob)
    # The tensors view `blob` (bytes are immutable, so torch warns that they are read-only);
    # callers copy out of them at once.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        while offset < end and (count is None or len(frames) < count):
            if end - offset < FRAME.size:
                raise WireError(f"truncated frame header at byte {offset}")
            magic, code, ndim, slice_id, version, *dims = FRAME.unpack_from(blob, offset)
            if magic != b"TY" or ndim > MAX_DIMS:
                raise WireError(f"no frame at byte {offset}")
            dtype = _CODE_DTYPES.get(code)
            if dtype is None:
                raise WireError(f"unknown dtype code {code} at byte {offset}")
            shape = tuple(dims[:ndim])
            numel = 1
            for d in shape:
                numel *= d
            offset += FRAME.size
            nbytes = numel * dtype.itemsize
            if end - offset < nbytes:
                raise WireError(f"slice {slice_id}: payload truncated at byte {offset}")
            if numel:
                flat = torch.frombuffer(blob, dtype=dtype, count=numel, offset=offset)
            else:
                flat = torch.empty(0, dtype=dtype)
            frames.append(Frame(slice_id, version, flat.view(shape)))
            offset += nbytes + (-nbytes % _ALIGN)
    if count is not None and len(frames) != count:
        raise WireError(f"expected {count} frames, found {len(frames)}")
    return frames


def encode_grad_message(
    header: GradHeader,
    tensors: Iterable[tuple[int, torch.Tensor]],
    dtype: torch.dtype = torch.float32,
) -> bytes:
    """A gradient message: the message header, then one frame per (slice id, gradient)."""
    items = list(tensors)
    if not 0 <= header.part < header.parts <= MAX_PARTS:
        raise WireError(f"part {header.part} of {header.parts}: at most {MAX_PARTS} parts")
    head = MESSAGE.pack(
        b"TG",
        header.part,
        header.parts,
        header.worker,
        header.group,
        len(items),
        header.step,
        header.norm,
        header.version,
    )
    pieces = frame_pieces(items, header.version, dtype)
    return b"".join([head, *pieces])


def decode_grad_message(blob: bytes) -> tuple[GradHeader, list[Frame]]:
    if len(blob) < MESSAGE.size:
        raise WireError("truncated gradient message")
    magic, part, parts, worker, group, count, step, norm, version = MESSAGE.unpack_from(blob, 0)
    if magic != b"TG" or part >= parts:
        raise WireError("not a gradient message")
    header = GradHeader(worker, group, step, version, norm, part, parts)
    return header, decode_frames(blob, MESSAGE.size, count)
