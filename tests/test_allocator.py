"""The caching allocator's closed forms (`theory.allocator`) against torch's own source: the
constants read from the installed torch's c10/core/AllocatorConfig.h, and cases worked by hand
from `round_size`, `get_allocation_size` and `should_split` (c10/cuda/CUDACachingAllocator.cpp)."""
from __future__ import annotations

import os
import re

import pytest
import torch

from zeroedu.theory import allocator as A

pytestmark = pytest.mark.fast
MiB = 1 << 20


def _header_constants() -> dict[str, int]:
    path = os.path.join(os.path.dirname(torch.__file__), "include", "c10", "core", "AllocatorConfig.h")
    text = open(path, encoding="utf-8").read()
    got = {k: int(v) for k, v in re.findall(r"constexpr size_t (k\w+) = (\d+);", text)}
    got["large_segment_size"] = int(re.search(r"large_segment_size_\{(\d+)\}", text).group(1))
    return got


def test_the_constants_are_torchs():
    h = _header_constants()
    assert (h["kMinBlockSize"], h["kSmallSize"], h["kSmallBuffer"], h["kMinLargeAlloc"], h["kRoundLarge"],
            h["large_segment_size"]) == (A.MIN_BLOCK, A.SMALL_SIZE, A.SMALL_SEGMENT, A.MIN_LARGE_ALLOC,
                                          A.ROUND_LARGE, A.LARGE_SEGMENT)


@pytest.mark.parametrize("request_bytes,block,segment,allocated", [
    (1, 512, 2 * MiB, 512),  # the smallest block; a small segment, its tail split off
    (600_000, 1172 * 512, 2 * MiB, 1172 * 512),  # 600,064
    (MiB, MiB, 2 * MiB, MiB),  # the largest small request
    (MiB + 1, MiB + 512, 20 * MiB, MiB + 512),  # large pool, a 20 MiB segment
    (5_000_000, 9766 * 512, 20 * MiB, 9766 * 512),  # 5,000,192 in 20,971,520
    (10 * MiB, 10 * MiB, 10 * MiB, 10 * MiB),  # a segment of its own size, nothing left
    (30_000_000, 58594 * 512, 15 * 2 * MiB, 58594 * 512),  # 2 MiB steps; a 1.39 MiB tail is split off
    (21 * MiB + 1, 21 * MiB + 512, 22 * MiB, 22 * MiB),  # a tail under 1 MiB stays in the block
])
def test_blocks_segments_and_what_is_cached_worked_by_hand(request_bytes, block, segment, allocated):
    assert A.block_bytes(request_bytes) == block
    assert A.segment_bytes(request_bytes) == segment
    assert A.allocated_bytes(request_bytes) == allocated
    assert A.cached_beside(request_bytes) == segment - allocated
    assert A.pool(request_bytes) == ("small" if request_bytes <= MiB else "large")


def test_a_request_is_a_whole_number_of_bytes():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="whole number of bytes"):
            A.block_bytes(bad)
