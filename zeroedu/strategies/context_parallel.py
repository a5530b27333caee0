"""Context parallelism: causal attention with the sequence split over a `cp` axis (ring attention).

Algorithm (Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise Transformers", §3; the
online softmax of Milakov & Gimelshein 2018 and FlashAttention, Dao et al. 2022, §3.1). Each of
the cp ranks holds S/cp of every sequence's positions (its *chunks*) and computes q, k, v for them
only. Attention needs every key at or before each query, so the key/value blocks travel around the
ring: in step i = 0 .. cp-1 rank r holds the K, V block of rank (r - i) mod cp, computes its
queries' scores against it and folds them into a running maximum m, sum l and unnormalised output
per query row (online softmax), while it sends the block on to rank r + 1. No rank ever holds more
than its own block of S/cp × S/cp scores (here, one chunk pair at a time); the S × S matrix exists
nowhere. Each step posts the next block's send and receive before computing on the block it holds,
and waits after: the transfer runs under the compute (`RingStats.compute_spans` against the comm
records' issue and wait times). The output is acc / l; the log-sum-exp m + log l is kept for backward.

Backward recomputes each block's probabilities from q, k and the log-sum-exp (FlashAttention's
backward, §3.1 and Alg. 4 of its appendix): dV_j += Pᵀ dO, dS = P ⊙ (dO Vⱼᵀ - rowsum(dO ⊙ O)),
dQ += dS Kⱼ, dK_j += dSᵀ Q. The K, V block travels the ring again, now with its dK, dV
accumulators, which after the last step are one hop from home and make one more hop back.

Causal masking by global position: a chunk pair whose every key comes after every query is
skipped (no compute), one whose every key comes first needs no mask, a chunk with itself is
triangular. With the plain split (rank r holds positions [r·S/cp, (r+1)·S/cp)) rank r computes
r + 1 of the cp blocks, so the last rank works cp times as long as the first while the others
wait. The zig-zag split (`zigzag=True`) cuts the sequence into 2·cp chunks of c = S/(2cp) and
gives rank r chunks r and 2cp - 1 - r: chunk x attends to chunks 0..x, so every rank computes (r + 1) + (2cp - r) = 2cp + 1
chunk pairs, c² score elements each, per head: the same on every rank (`work_elements`).

Bytes per rank per layer and micro-batch, b = B·H·(S/cp)·D_h·bytes (one K or V block):
    forward    K and V sent cp - 1 times:                         2(cp - 1)·b
    backward   K and V sent cp - 1 times, dK and dV cp times:     2(cp - 1)·b + 2·cp·b
(`theory_bytes`, i.e. `theory.context.ring_bytes`); with cp = 1 nothing moves. Activations per rank: q, k, v, the output (each
S/cp tokens wide) and one fp32 log-sum-exp per query row, never a score matrix.

Everything goes through `comm` (isend/irecv on the `cp` axis, recorded by the ledger); the score
elements each rank computed are counted from the tensors it multiplied (`RingStats`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..runtime.comm import Axis, Comm, tag
# the split and its closed forms live in theory (the predictions read them without the algorithm)
from ..theory.context import chunks, positions, work_elements
from ..theory.context import ring_bytes as theory_bytes


# ------------------------------------------------------------------ the ring
@dataclass
class RingStats:
    """What one rank's ring attention did, counted from the tensors it computed on."""
    forward_elements: int = 0  # score elements computed in forward
    backward_elements: int = 0
    forward_seconds: float = 0.0  # wall time of the score/softmax/output compute in forward, sends excluded
    compute_spans: list = field(default_factory=list)  # (start, end) on the ledger's clock of each forward block computed while the next travels


@dataclass(frozen=True)
class RingContext:
    comm: Comm
    axis: Axis
    seq_len: int
    zigzag: bool
    tag: str = "cp"
    stats: RingStats | None = None

    @property
    def cp(self) -> int:
        return self.axis.size

    def my_chunks(self, rank: int | None = None) -> list[range]:
        return chunks(self.seq_len, self.cp, self.axis.rank if rank is None else rank, self.zigzag)

    def pairs(self, owner: int):
        """(query slice, key slice, mask kind) of every chunk pair to compute against rank `owner`'s
        block: 'full' (no mask), 'diag' (triangular); pairs with every key after every query are
        left out (causal masking would zero them all)."""
        q_off = 0
        for qc in self.my_chunks():
            k_off = 0
            for kc in self.my_chunks(owner):
                if kc.start <= qc.stop - 1:
                    kind = "diag" if kc.start == qc.start else "full"
                    yield slice(q_off, q_off + len(qc)), slice(k_off, k_off + len(kc)), kind
                k_off += len(kc)
            q_off += len(qc)


def _scores(q, k, kind):
    s = q @ k.transpose(-2, -1)
    if kind == "diag":
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    elif kind == "future":  # every key after every query: all masked
        s = torch.full_like(s, float("-inf"))
    return s


def _post(ctx: RingContext, tensors: list[torch.Tensor], what: str):
    """Start sending `tensors` to the next rank on the ring and receiving the previous rank's;
    `_wait` finishes. Sends and receives are posted together on every rank: no deadlock."""
    nxt, prv = (ctx.axis.rank + 1) % ctx.cp, (ctx.axis.rank - 1) % ctx.cp
    out = [torch.empty_like(t) for t in tensors]
    handles = []
    for t, o in zip(tensors, out):
        # the one tag format: cp/ring/data/<what> (what: kv, kv_grads, dkv_home), read by its parts
        handles.append(ctx.comm.isend(t.contiguous(), nxt, ctx.axis, tag(ctx.tag, "ring", "data", what)))
        handles.append(ctx.comm.irecv(o, prv, ctx.axis, tag(ctx.tag, "ring", "data", what)))
    return out, handles


def _wait(posted) -> list[torch.Tensor]:
    out, handles = posted
    for h in handles:
        h.wait()
    return out


def _exchange(ctx: RingContext, tensors: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    return _wait(_post(ctx, tensors, what))


def _span(ctx: RingContext, t0: float) -> None:
    if ctx.stats is not None:
        ctx.stats.compute_spans.append((t0, ctx.comm.ledger.now()))


def _acc_dtype(q: torch.Tensor) -> torch.dtype:
    # Running max, sum and output in fp32 at least: bf16/fp16 inputs would lose the online rescaling.
    return torch.promote_types(q.dtype, torch.float32)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(fctx, q, k, v, ctx: RingContext):
        B, H, S, Dh = q.shape
        acc_t = _acc_dtype(q)
        m = torch.full((B, H, S, 1), float("-inf"), dtype=acc_t, device=q.device)
        l = torch.zeros((B, H, S, 1), dtype=acc_t, device=q.device)
        acc = torch.zeros((B, H, S, Dh), dtype=acc_t, device=q.device)
        kb, vb = k, v
        for i in range(ctx.cp):
            owner = (ctx.axis.rank - i) % ctx.cp
            # the next block travels while this one is computed (the sends only read kb, vb)
            nxt = _post(ctx, [kb, vb], "kv") if i < ctx.cp - 1 else None
            t0, c0 = time.perf_counter(), ctx.comm.ledger.now() if ctx.cp > 1 else 0.0
            for qs, ks, kind in ctx.pairs(owner):
                s = _scores(q[:, :, qs].to(acc_t), kb[:, :, ks].to(acc_t), kind)
                if ctx.stats is not None:
                    ctx.stats.forward_elements += s.numel()
                m_new = torch.maximum(m[:, :, qs], s.amax(-1, keepdim=True))
                p = torch.exp(s - m_new)
                scale = torch.exp(m[:, :, qs] - m_new)
                l[:, :, qs] = l[:, :, qs] * scale + p.sum(-1, keepdim=True)
                acc[:, :, qs] = acc[:, :, qs] * scale + p @ vb[:, :, ks].to(acc_t)
                m[:, :, qs] = m_new
            if ctx.stats is not None:
                ctx.stats.forward_seconds += time.perf_counter() - t0
            if nxt is not None:
                _span(ctx, c0)
                kb, vb = _wait(nxt)
        out = (acc / l).to(q.dtype)
        lse = m + torch.log(l)  # every query sees at least itself: l > 0
        fctx.save_for_backward(q, k, v, out, lse)
        fctx.ring = ctx
        return out

    @staticmethod
    def backward(fctx, dout):
        q, k, v, out, lse = fctx.saved_tensors
        ctx: RingContext = fctx.ring
        acc_t = _acc_dtype(q)
        dout = dout.to(acc_t)
        delta = (dout * out.to(acc_t)).sum(-1, keepdim=True)  # rowsum(dO ⊙ O)
        dq = torch.zeros(q.shape, dtype=acc_t, device=q.device)
        kb, vb = k, v
        dkb = torch.zeros(k.shape, dtype=acc_t, device=k.device)
        dvb = torch.zeros(v.shape, dtype=acc_t, device=v.device)
        for i in range(ctx.cp):
            owner = (ctx.axis.rank - i) % ctx.cp
            # K and V travel on while this block's gradients are computed; dK and dV, still being
            # summed into, go after
            nxt = _post(ctx, [kb, vb], "kv_grads") if i < ctx.cp - 1 else None
            for qs, ks, kind in ctx.pairs(owner):
                qf, kf, vf = q[:, :, qs].to(acc_t), kb[:, :, ks].to(acc_t), vb[:, :, ks].to(acc_t)
                p = torch.exp(_scores(qf, kf, kind) - lse[:, :, qs])  # masked: exp(-inf) = 0
                if ctx.stats is not None:
                    ctx.stats.backward_elements += p.numel()
                do = dout[:, :, qs]
                dvb[:, :, ks] += p.transpose(-2, -1) @ do
                ds = p * (do @ vf.transpose(-2, -1) - delta[:, :, qs])
                dq[:, :, qs] += ds @ kf
                dkb[:, :, ks] += ds.transpose(-2, -1) @ qf
            if nxt is not None:
                dkb, dvb = _exchange(ctx, [dkb, dvb], "kv_grads")
                kb, vb = _wait(nxt)
        if ctx.cp > 1:
            # The accumulators hold the block of rank r + 1 (the next one): one hop home.
            dkb, dvb = _exchange(ctx, [dkb, dvb], "dkv_home")
        return dq.to(q.dtype), dkb.to(k.dtype), dvb.to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: RingContext) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence's keys (q scaled already);
    q, k, v are (B, H, S/cp, D_h), this rank's positions in `ctx.my_chunks()` order."""
    return _RingAttention.apply(q, k, v, ctx)


class RingAttentionCore(torch.nn.Module):
    """Drop-in for `models.gpt.AttentionCore` on a cp rank: the same softmax(q kᵀ + causal) v over
    the whole sequence, with this rank holding only its positions."""

    def __init__(self, ctx: RingContext):
        super().__init__()
        self.ctx = ctx

    def forward(self, q, k, v):
        return ring_attention(q, k, v, self.ctx)


def reference_attention(q, k, v) -> torch.Tensor:
    """One process, the whole sequence: softmax(q kᵀ + causal) v (the oracle)."""
    S = q.shape[-2]
    s = q @ k.transpose(-2, -1)
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


__all__ = ["RingAttentionCore", "RingContext", "RingStats", "chunks", "positions", "reference_attention",
           "ring_attention", "theory_bytes", "work_elements"]
