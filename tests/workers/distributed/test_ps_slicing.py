"""Slice maps: balanced, deterministic, JSON round trip, and a lossless cut of the tensors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.distributed.ps.slicing import (
    MIN_SPLIT,
    ParamInfo,
    SliceMap,
    assemble,
    plan_slices,
    plan_stage_slices,
    slice_views,
)

torch.set_num_threads(1)

# The MLP of bench/overhead.py (784-1000-500-10), 1.3M parameters.
MLP = [
    ParamInfo("fc1/w", (1000, 784)),
    ParamInfo("fc1/b", (1000,), lr_scale=2.0, wd_scale=0.0),
    ParamInfo("fc2/w", (500, 1000)),
    ParamInfo("fc2/b", (500,)),
    ParamInfo("fc3/w", (10, 500)),
    ParamInfo("fc3/b", (10,)),
]


def _random_tensors(params: list[ParamInfo]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {p.name: torch.randn(p.shape, generator=gen) for p in params}


@pytest.mark.parametrize("nshards", [1, 2, 3, 4, 7])
def test_mlp_shards_are_balanced_and_cover_every_element(nshards: int) -> None:
    smap = plan_slices(MLP, nshards)
    total = sum(p.numel for p in MLP)
    sizes = smap.shard_sizes()
    assert sum(sizes) == total
    # Within one row of fc1/w (784 elements) plus the small tensors that are never split.
    assert max(sizes) - min(sizes) <= 2 * 1000 + 784 + 10
    for p in MLP:
        covered = sorted((s.start, s.stop) for s in smap.slices if s.param == p.name)
        assert covered[0][0] == 0 and covered[-1][1] == p.numel
        assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))


def test_large_tensors_split_along_rows_small_ones_stay_whole() -> None:
    smap = plan_slices(MLP, 4)
    fc1 = [s for s in smap.slices if s.param == "fc1/w"]
    assert len(fc1) >= 2  # 784k elements over shards of ~325k each
    for s in fc1:
        assert s.start % 784 == 0 and s.stop % 784 == 0
        assert s.shape == (s.numel // 784, 784)
    for name in ("fc1/b", "fc2/b", "fc3/w", "fc3/b"):
        assert len([s for s in smap.slices if s.param == name]) == 1


def test_small_neighbours_are_grouped_on_one_shard() -> None:
    params = [ParamInfo(f"l{i}/b", (100,)) for i in range(12)]
    smap = plan_slices(params, 3)
    assert [len(smap.shard_slices(k)) for k in range(3)] == [4, 4, 4]
    assert all(len([s for s in smap.slices if s.param == p.name]) == 1 for p in params)


def test_rows_too_long_for_balance_are_cut_flat() -> None:
    smap = plan_slices([ParamInfo("emb/w", (3, 100_000))], 2)
    first, second = smap.slices
    assert first.stop == second.start == 150_000  # mid-row: a flat range
    assert first.shape == (150_000,)


def test_the_map_is_deterministic_and_round_trips_through_json() -> None:
    a, b = plan_slices(MLP, 3), plan_slices(list(MLP), 3)
    assert a == b
    text = a.to_json()
    assert SliceMap.from_json(text) == a
    assert SliceMap.from_json(text.encode()).param("fc1/b").lr_scale == 2.0


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(
        st.lists(st.integers(1, 70), min_size=1, max_size=3).map(tuple), min_size=1, max_size=8
    ),
    nshards=st.integers(1, 6),
)
def test_cutting_and_assembling_is_lossless(shapes: list[tuple[int, ...]], nshards: int) -> None:
    params = [ParamInfo(f"p{i}/w", shape) for i, shape in enumerate(shapes)]
    smap = plan_slices(params, nshards)
    tensors = _random_tensors(params)
    views = slice_views(tensors, smap)
    assert sum(v.numel() for v in views) == sum(p.numel for p in params)
    pieces = {s.id: v.clone().view(s.shape) for s, v in zip(smap.slices, views, strict=True)}
    rebuilt = assemble(pieces, smap)
    for name, tensor in tensors.items():
        assert torch.equal(rebuilt[name], tensor)
    # Each shard's share is within one split unit of the ideal.
    unit = max(min(p.numel, MIN_SPLIT) for p in params)
    assert max(smap.shard_sizes()) <= math.ceil(sum(p.numel for p in params) / nshards) + unit


def test_bad_requests_raise() -> None:
    with pytest.raises(ValueError, match="at least one shard"):
        plan_slices(MLP, 0)
    with pytest.raises(ValueError, match="unique"):
        plan_slices([MLP[0], MLP[0]], 2)


def test_a_pipelines_stages_each_have_shards_of_their_own() -> None:
    """Each shard holds one stage's slices; the spare shards go where shards are fullest; the
    map still cuts every tensor losslessly."""
    stages = [MLP[:2], MLP[2:]]  # 785k and 505k elements
    slice_map = plan_stage_slices(stages, 5)
    owner = {p.name: i for i, params in enumerate(stages) for p in params}
    by_shard: dict[int, set[int]] = {}
    for s in slice_map.slices:
        by_shard.setdefault(s.shard, set()).add(owner[s.param])
    assert by_shard == {0: {0}, 1: {0}, 2: {0}, 3: {1}, 4: {1}}
    assert [p.name for p in slice_map.params] == [p.name for p in MLP]
    assert SliceMap.from_json(slice_map.to_json()) == slice_map
    tensors = {p.name: torch.randn(p.shape) for p in MLP}
    pieces = dict(enumerate(t.clone() for t in slice_views(tensors, slice_map)))
    for name, whole in assemble(pieces, slice_map).items():
        assert torch.equal(whole, tensors[name])


def test_a_pipeline_needs_a_shard_per_stage() -> None:
    with pytest.raises(ValueError, match="3 stages need a shard each, and there are 2"):
        plan_stage_slices([MLP[:2], MLP[2:4], MLP[4:]], 2)
