"""Cut a net's parameters into slices balanced over the shards of a server group.

All parameters, in net order, are laid end to end as one flat vector, which is cut into
`nshards` nearly equal contiguous ranges. A cut that falls inside a large tensor splits it
along dim 0 (at the nearest row boundary) or, when its rows are too long for that to keep the
shards balanced, as a flat range; a cut inside a small tensor moves to that tensor's nearer end,
so small tensors stay whole and neighbours in the net are grouped on one shard.

The map is a pure function of (parameter shapes, nshards): every worker computes the same one and
it is stored with the job as JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Tensors with fewer elements than this are never split (a split would cost more in headers
# and bookkeeping than it gains in balance).
MIN_SPLIT = 4096
# A cut may move to a row boundary by at most this fraction of a shard's share.
ROW_SNAP = 1 / 16


@dataclass(frozen=True)
class ParamInfo:
    """One parameter as the shards see it: its name, shape and per-parameter update scales."""

    name: str
    shape: tuple[int, ...]
    lr_scale: float = 1.0
    wd_scale: float = 1.0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Slice:
    """Elements [start, stop) of the flattened parameter `param`, owned by shard `shard`."""

    id: int
    param: str
    shard: int
    start: int
    stop: int
    shape: tuple[int, ...]  # (rows, *param.shape[1:]) for a dim-0 split, (n,) for a flat range

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class SliceMap:
    nshards: int
    params: tuple[ParamInfo, ...]
    slices: tuple[Slice, ...]

    def param(self, name: str) -> ParamInfo:
        for info in self.params:
            if info.name == name:
                return info
        raise KeyError(name)

    def shard_slices(self, shard: int) -> list[Slice]:
        return [s for s in self.slices if s.shard == shard]

    def shard_sizes(self) -> list[int]:
        sizes = [0] * self.nshards
        for s in self.slices:
            sizes[s.shard] += s.numel
        return sizes

    def to_json(self) -> str:
        return json.dumps(
            {
                "nshards": self.nshards,
                "params": [[p.name, list(p.shape), p.lr_scale, p.wd_scale] for p in self.params],
                "slices": [
                    [s.id, s.param, s.shard, s.start, s.stop, list(s.shape)] for s in self.slices
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SliceMap:
        raw = json.loads(text)
        return cls(
            nshards=int(raw["nshards"]),
            params=tuple(
                ParamInfo(name, tuple(shape), float(lr), float(wd))
                for name, shape, lr, wd in raw["params"]
            ),
            slices=tuple(
                Slice(int(i), param, int(shard), int(start), int(stop), tuple(shape))
                for i, param, shard, start, stop, shape in raw["slices"]
            ),
        )


def _snap(cut: int, offset: int, info: ParamInfo, share: float) -> int:
    """Move a global cut that falls inside `info` (which starts at `offset`) to where it may go."""
    inside = cut - offset
    if info.numel < MIN_SPLIT:
        return offset if inside * 2 <= info.numel else offset + info.numel
    row = info.numel // info.shape[0] if info.shape else info.numel
    nearest_row = round(inside / row) * row
    if abs(nearest_row - inside) <= share * ROW_SNAP:
        return offset + nearest_row
    return cut  # rows too long: a flat cut keeps the balance


def plan_slices(params: Sequence[ParamInfo], nshards: int) -> SliceMap:
    """The slice map of `params` (in net order) over `nshards` shards."""
    if nshards < 1:
        raise ValueError(f"a server group needs at least one shard, got {nshards}")
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise ValueError("parameter names must be unique")
    total = sum(p.numel for p in params)
    share = total / nshards
    offsets = [0]
    for info in params:
        offsets.append(offsets[-1] + info.numel)

    cuts = [0]
    for k in range(1, nshards):
        ideal = round(k * share)
        for info, offset in zip(params, offsets, strict=False):
            if offset < ideal < offset + info.numel:
                ideal = _snap(ideal, offset, info, share)
                break
        cuts.append(max(ideal, cuts[-1]))
    cuts.append(total)

    slices: list[Slice] = []
    for info, offset in zip(params, offsets, strict=False):
        end = offset + info.numel
        row = info.numel // info.shape[0] if info.shape and info.shape[0] else info.numel
        for shard in range(nshards):
            lo, hi = max(cuts[shard], offset), min(cuts[shard + 1], end)
            if lo >= hi:  # not on this shard (or an empty tensor: nothing to hold)
                continue
            start, stop = lo - offset, hi - offset
            if start % row == 0 and stop % row == 0 and info.shape:
                shape = ((stop - start) // row, *info.shape[1:])
            else:
                shape = (stop - start,)
            slices.append(Slice(len(slices), info.name, shard, start, stop, shape))
    return SliceMap(nshards=nshards, params=tuple(params), slices=tuple(slices))


def slice_views(tensors: dict[str, torch.Tensor], slice_map: SliceMap) -> list[torch.Tensor]:
    """Flat views (no copies) of each slice of contiguous `tensors`, in slice-id order."""
    return [tensors[s.param].view(-1)[s.start : s.stop] for s in slice_map.slices]


def assemble(pieces: dict[int, torch.Tensor], slice_map: SliceMap) -> dict[str, torch.Tensor]:
    """Whole parameters from their slices (`slice id -> tensor`); every slice must be present."""
    out = {p.name: torch.empty(p.shape) for p in slice_map.params}
    for s in slice_map.slices:
        out[s.param].view(-1)[s.start : s.stop] = pieces[s.id].reshape(-1)
    return out


def plan_stage_slices(stages: Sequence[Sequence[ParamInfo]], nshards: int) -> SliceMap:
    """The slice map of a pipeline's parameters, `stages` listing each stage's: every shard
    holds the slices of one stage only, so that one stage's push completes a shard's update and
    each stage pushes and pulls its own layers alone. The `nshards` shards are dealt to the
    stages, at least one each and the rest where a shard would hold the most elements; each
    stage's parameters are cut over its shards as `plan_slices` cuts a net's."""
    if nshards < len(stages):
        raise ValueError(f"{len(stages)} stages need a shard each, and there are {nshards}")
    sizes = [sum(p.numel for p in params) for params in stages]
    counts = [1] * len(stages)
    for _ in range(nshards - len(stages)):
        fullest = max(range(len(stages)), key=lambda i: sizes[i] / counts[i])
        counts[fullest] += 1
    slices: list[Slice] = []
    first = 0
    for params, count in zip(stages, counts, strict=True):
        for s in plan_slices(params, count).slices:
            slices.append(Slice(len(slices), s.param, first + s.shard, s.start, s.stop, s.shape))
        first += count
    every = tuple(p for params in stages for p in params)
    if len({p.name for p in every}) != len(every):
        raise ValueError("a parameter is in two stages")
    return SliceMap(nshards=nshards, params=every, slices=tuple(slices))
