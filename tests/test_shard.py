"""Properties of the shard index math in `zeroedu.shard`, checked against plain Python lists."""
import pytest
from hypothesis import given, settings, strategies as st

from zeroedu import shard

pytestmark = pytest.mark.fast

ns = st.integers(1, 12)
totals = st.integers(0, 200)
shape_st = st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple)


@settings(max_examples=200)
@given(total=totals, n=ns)
def test_shard_ranges_partition_padded_buffer(total, n):
    padded = shard.padded_numel(total, n)
    assert padded % n == 0 and total <= padded < total + n
    ranges = [shard.shard_range(total, n, r) for r in range(n)]
    assert ranges[0].start == 0 and ranges[-1].end == padded
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))
    assert all(r.size == shard.shard_numel(total, n) for r in ranges)


@settings(max_examples=200)
@given(total=totals, n=ns)
def test_data_ranges_partition_real_elements(total, n):
    covered = []
    for r in range(n):
        d = shard.data_range(total, n, r)
        # padding is never data (an empty range may sit in the padding; it holds nothing)
        assert d.size == 0 or (0 <= d.start and d.end <= total)
        assert d.size == len(set(range(d.start, d.end)) & set(range(total)))
        covered += range(d.start, d.end)
    assert covered == list(range(total))


@settings(max_examples=200)
@given(shapes=st.lists(shape_st, min_size=1, max_size=5), n=ns)
def test_flat_layout_slices_cover_each_element_once(shapes, n):
    layout = shard.FlatLayout(shapes, n)
    seen = {i: [] for i in range(len(shapes))}
    for r in range(n):
        mine = layout.shard_range(r)
        for sl in layout.param_slices(r):
            # the three index spaces describe the same elements
            assert sl.buffer.size == sl.param.size == sl.local.size > 0
            assert sl.buffer.start == layout.offsets[sl.index] + sl.param.start
            assert sl.buffer.start == mine.start + sl.local.start
            assert 0 <= sl.local.start and sl.local.end <= layout.shard_numel
            seen[sl.index] += range(sl.param.start, sl.param.end)
    for i, k in enumerate(layout.numels):
        assert sorted(seen[i]) == list(range(k))


@settings(max_examples=200)
@given(shapes=st.lists(shape_st, min_size=1, max_size=5), n=ns, data=st.data())
def test_flat_shard_then_concatenate_roundtrip(shapes, n, data):
    layout = shard.FlatLayout(shapes, n)
    flat = list(range(1, layout.numel + 1))  # stand-in for the concatenated parameters
    buf = flat + [0] * (layout.padded_numel - layout.numel)
    chunks = [buf[s.start:s.end] for s in (layout.shard_range(r) for r in range(n))]
    assert sum(chunks, [])[:layout.numel] == flat
    # rebuilding each parameter from the per-rank slices gives it back exactly
    rebuilt = [[None] * k for k in layout.numels]
    for r in range(n):
        for sl in layout.param_slices(r):
            rebuilt[sl.index][sl.param.start:sl.param.end] = chunks[r][sl.local.start:sl.local.end]
    for i, k in enumerate(layout.numels):
        off = layout.offsets[i]
        assert rebuilt[i] == flat[off:off + k]


@settings(max_examples=200)
@given(shape=shape_st, n=ns)
def test_dim0_rows_partition_and_padding(shape, n):
    d0 = shape[0]
    rows = [shard.dim0_rows(d0, n, r) for r in range(n)]
    assert sum((list(range(r.start, r.end)) for r in rows), []) == list(range(d0))
    assert all(r.size <= shard.dim0_chunk_rows(d0, n) for r in rows)
    total = sum(shard.dim0_shard_numel(shape, n, r) for r in range(n))
    assert total == shard.numel(shape)
    assert shard.dim0_padded_numel(shape, n) >= shard.numel(shape)


@settings(max_examples=200)
@given(shape=shape_st, n=ns)
def test_dim0_shard_then_concatenate_roundtrip(shape, n):
    rest = shard.numel(shape[1:])
    rows = [list(range(i * rest, (i + 1) * rest)) for i in range(shape[0])]
    pieces = [rows[r.start:r.end] for r in (shard.dim0_rows(shape[0], n, k) for k in range(n))]
    assert sum(pieces, []) == rows
