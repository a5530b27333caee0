"""What torch's CUDA caching allocator takes from the driver for a tensor, and what it keeps.

A tensor's storage is not a `cudaMalloc` of its bytes. torch's caching allocator (torch 2.13:
the constants in c10/core/AllocatorConfig.h, the logic in c10/cuda/CUDACachingAllocator.cpp,
`round_size` and `get_allocation_size`) does three things:

1. **Rounds the request** up to a multiple of 512 bytes (`kMinBlockSize`): the block the tensor
   gets. (`roundup_power2_divisions` in PYTORCH_CUDA_ALLOC_CONF can round coarser; off by
   default, not modelled.)
2. **Takes a segment** from the driver when no cached free block of the stream fits:
   a request of at most 1 MiB (`kSmallSize`) goes to the small pool and takes a 2 MiB segment
   (`kSmallBuffer`); one under 10 MiB (`kMinLargeAlloc`) a 20 MiB segment
   (`large_segment_size`, 20 MiB by default); a larger one a segment rounded up to 2 MiB
   (`kRoundLarge`). `torch.cuda.memory_reserved` counts segments.
3. **Splits and caches** (`should_split`): the rest of a segment is split off as a free block
   for later requests of the same pool and stream when it is at least 512 bytes (small pool) or
   over 1 MiB (large pool); a shorter large tail stays in the block, so the tensor's block is the
   whole segment. `torch.cuda.memory_allocated` counts blocks. A freed tensor's block returns to
   the cache, not to the driver, until `torch.cuda.empty_cache()` releases wholly free segments.

So reserved − allocated is the cache: split-off tails and freed blocks. A first 5,000,000-byte tensor
is a 5,000,192-byte block in a 20,971,520-byte segment, 15,971,328 bytes cached beside it.
"""
from __future__ import annotations

MIN_BLOCK = 512  # kMinBlockSize: every block a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: the largest request of the small pool
SMALL_SEGMENT = 2 << 20  # kSmallBuffer: the small pool's segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from here a segment of its own size
LARGE_SEGMENT = 20 << 20  # large_segment_size's default: the segment for a 1-10 MiB request
ROUND_LARGE = 2 << 20  # kRoundLarge: a large segment's granularity


def _request(nbytes) -> int:
    if isinstance(nbytes, bool) or int(nbytes) != nbytes or nbytes < 0:
        raise ValueError(f"a request is a whole number of bytes >= 0, got {nbytes!r}")
    return int(nbytes)


def block_bytes(nbytes) -> int:
    """The block a request gets: rounded up to 512 bytes, at least 512 (`round_size`)."""
    n = _request(nbytes)
    return max(MIN_BLOCK, -(-n // MIN_BLOCK) * MIN_BLOCK)


def pool(nbytes) -> str:
    """"small" for a request of at most 1 MiB, else "large"."""
    return "small" if block_bytes(nbytes) <= SMALL_SIZE else "large"


def segment_bytes(nbytes) -> int:
    """The segment taken from the driver when the cache has no free block that fits
    (`get_allocation_size` of the rounded request)."""
    size = block_bytes(nbytes)
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def allocated_bytes(nbytes) -> int:
    """What `memory_allocated` grows by for a request served by a new segment: the rounded
    block, or the whole segment where the tail is too short to split off."""
    block, tail = block_bytes(nbytes), segment_bytes(nbytes) - block_bytes(nbytes)
    split = tail >= MIN_BLOCK if pool(nbytes) == "small" else tail > SMALL_SIZE
    return block if split else block + tail


def cached_beside(nbytes) -> int:
    """Bytes the first such request leaves reserved but unallocated in its new segment."""
    return segment_bytes(nbytes) - allocated_bytes(nbytes)


__all__ = ["LARGE_SEGMENT", "MIN_BLOCK", "MIN_LARGE_ALLOC", "ROUND_LARGE", "SMALL_SEGMENT", "SMALL_SIZE",
           "allocated_bytes", "block_bytes", "cached_beside", "pool", "segment_bytes"]
