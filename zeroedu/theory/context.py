"""Context parallelism's closed forms (the algorithm: `strategies.context_parallel`).

The split: rank r of cp holds positions [r·S/cp, (r+1)·S/cp), or with the zig-zag split chunks r
and 2cp-1-r of 2cp equal chunks (`chunks`). The bytes one rank sends per attention layer and
micro-batch, b = B·H_kv·(S/cp)·D_h·bytes for one K or V block: forward 2(cp-1)·b (K and V go
around the ring), backward 2(cp-1)·b + 2cp·b (K and V again, with dK and dV, and their hop home)
(`ring_bytes`). The causal score elements each rank computes (`work_elements`): r + 1 blocks of
(S/cp)² on rank r with the plain split, 2cp + 1 blocks of (S/2cp)² on every rank with the zig-zag.
Liu, Zaharia, Abbeel 2023 (Ring Attention) §3; Dao et al. 2022 (FlashAttention) §3.1.
"""
from __future__ import annotations

import torch


# ------------------------------------------------------------------ the split
def chunks(seq_len: int, cp: int, rank: int, zigzag: bool = False) -> list[range]:
    """The runs of positions rank `rank` holds: one of S/cp, or (zig-zag) chunks r and 2cp-1-r of S/(2cp)."""
    parts = 2 * cp if zigzag else cp
    if seq_len % parts:
        raise ValueError(f"context parallelism splits the sequence into {parts} equal chunks"
                         f"{' (zig-zag: 2 per rank)' if zigzag else ''}: seq_len {seq_len} is not divisible by {parts}")
    c = seq_len // parts
    ids = [rank, 2 * cp - 1 - rank] if zigzag else [rank]
    return [range(i * c, (i + 1) * c) for i in ids]


def positions(seq_len: int, cp: int, rank: int, zigzag: bool = False) -> torch.Tensor:
    """Rank `rank`'s positions of the sequence, in the order it holds them."""
    return torch.tensor([p for r in chunks(seq_len, cp, rank, zigzag) for p in r], dtype=torch.long)


# ------------------------------------------------------------------ closed forms
def ring_bytes(batch: int, heads: int, seq_len: int, d_head: int, cp: int, dtype_bytes: int = 4) -> dict[str, int]:
    """Bytes one rank sends on the cp axis per attention layer and micro-batch (module docstring)."""
    b = batch * heads * (seq_len // cp) * d_head * dtype_bytes
    return {"forward": 2 * (cp - 1) * b, "backward": 2 * (cp - 1) * b + (2 * cp * b if cp > 1 else 0)}


def work_elements(batch: int, heads: int, seq_len: int, cp: int, rank: int, zigzag: bool = False) -> int:
    """Score elements rank `rank` computes in one attention forward: every chunk pair it cannot
    skip, whole (a diagonal chunk is computed whole and masked)."""
    mine = chunks(seq_len, cp, rank, zigzag)
    total = 0
    for j in range(cp):
        for qc in mine:
            for kc in chunks(seq_len, cp, j, zigzag):
                if kc.start <= qc.stop - 1:  # some key at or before the last query
                    total += len(qc) * len(kc)
    return batch * heads * total



__all__ = ["chunks", "positions", "ring_bytes", "work_elements"]
