"""Jobs that exercise the collectives on real ranks: the lesson of notebook 01 and the harness tests.

`collectives_job` runs, on every rank, the facts the rest of the suite stands on:
all-reduce, reduce-scatter followed by all-gather (which equals all-reduce), a hand-written
ring all-reduce from send/recv, and the reduce-scatter's shard gathered by hand around the
ring (`ring_all_gather_by_hand`); it returns the results and this rank's ledger records so a
notebook or test can check values and bytes against the ring formulas.

`wire_collectives_job` runs each collective alone, with gloo's own implementation and with
zeroedu's ring, and returns what the kernel counted on this rank's sockets for each, beside the
ring model, gloo's message count and the time taken: notebook 01's measurement.
`ring_all_gather_by_hand` is the all-gather half of a ring all-reduce written out with
send/recv, for reading (the reduce-scatter half is lab 1, `labs/README.md`).
"""
from __future__ import annotations

import time
from fractions import Fraction

import torch
import torch.distributed as dist

from .comm import Comm, ring_all_reduce
from .ledger import Ledger


def rank_tensor(rank: int, numel: int) -> torch.Tensor:
    """A deterministic, rank-dependent tensor (so sums are checkable by hand)."""
    return torch.arange(numel, dtype=torch.float32) * (rank + 1) + rank


def collectives_job(ctx, numel: int = 24) -> dict:
    ledger = Ledger(ctx.rank, sink=ctx.emit)
    comm = Comm(ledger)
    axis = ctx.world_axis()
    n = ctx.world_size
    x = rank_tensor(ctx.rank, numel).to(ctx.device)
    out = {}

    ledger.begin_step(0)
    t = x.clone()
    comm.all_reduce(t, axis, tag="lesson/all_reduce")
    out["all_reduce"] = t.cpu()

    ledger.begin_step(1)
    pad = (-numel) % n  # reduce-scatter needs equal chunks: pad, as every flat-buffer strategy does
    xp = torch.cat([x, x.new_zeros(pad)])
    shard = xp.new_empty(xp.numel() // n)
    comm.reduce_scatter(shard, xp, axis, tag="lesson/reduce_scatter")
    full = torch.empty_like(xp)
    comm.all_gather(full, shard, axis, tag="lesson/all_gather")
    out["shard"] = shard.cpu()
    out["rs_ag"] = full[:numel].cpu()

    ledger.begin_step(2)
    t = xp.clone()
    ring_all_reduce(comm, t, axis, tag="lesson/ring")
    out["ring"] = t[:numel].cpu()

    ledger.begin_step(3)  # the reduce-scatter's shard, gathered by hand around the ring
    full = torch.empty_like(xp)
    ring_all_gather_by_hand(comm, full, shard, axis)
    out["ring_all_gather"] = full[:numel].cpu()

    out["comm"] = {s: {k: float(v) for k, v in ledger.comm_by_collective(s).items()} for s in (0, 1, 2, 3)}
    out["records"] = [r.plain() for r in ledger.comm]
    return out


def ring_all_gather_by_hand(comm: Comm, out: torch.Tensor, inp: torch.Tensor, axis,
                            tag: str = "lesson/ring_all_gather") -> torch.Tensor:
    """All-gather around a ring, by hand: `out` (g chunks of k elements) gets every rank's `inp`
    (k elements) in axis order, each rank talking only to its two neighbours.

    Rank r first puts its own chunk in place. In step s = 0..g-2 it sends chunk r-s (its own at
    s = 0, afterwards the one that just arrived) to the right neighbour r+1 and receives chunk
    r-s-1 from the left neighbour r-1, straight into its slot of `out`. Nothing is added, chunks
    are only forwarded, so after g-1 steps every chunk has reached every rank. Each rank sends
    g-1 chunks of S/g bytes: (g-1)/g·S. Every message goes through `comm`, so the ledger records
    each send; an all-reduce is a reduce-scatter followed by exactly this loop."""
    g, r = axis.size, axis.rank
    if out.numel() != g * inp.numel():
        raise ValueError(f"all-gather: output has {out.numel()} elements, need {g} x {inp.numel()}")
    chunks = out.view(-1).chunk(g)  # contiguous 1-D views: the receives land in place
    chunks[r].copy_(inp.view(-1))
    right, left = (r + 1) % g, (r - 1) % g
    for s in range(g - 1):
        hs = comm.isend(chunks[(r - s) % g], right, axis, tag)
        hr = comm.irecv(chunks[(r - s - 1) % g], left, axis, tag)
        hs.wait()
        hr.wait()
    return out


WIRE_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def wire_collectives_job(ctx, numel: int, repeats: int = 3) -> dict:
    """Each collective alone, with gloo's own implementation ("backend") and with zeroedu's ring
    ("ring"), on S = 4·numel bytes of fp32 (the all-reduce's buffer, the reduce-scatter's input,
    the all-gather's output); `numel` must be divisible by the world size.

    Returns {implementation: {collective: figures}}, this rank's figures being
      wire      bytes the kernel counted on this rank's sockets while the collective ran alone
                (`Comm` reads the meter around it: gloo's framing included); one per repeat;
      model     the ring model's bytes, (g-1)/g·S or 2(g-1)/g·S (`CommRecord.sent`);
      messages  point-to-point messages gloo sent for it (`wire.messages`), 144 B of framing each;
      seconds   the fastest of `repeats` runs, each started after a barrier;
      ok        the result equals the sum (or concatenation) computed by hand.
    The all-reduce is gloo's (a ring already) in both columns: zeroedu's "ring" mode replaces
    only the reduce-scatter and the all-gather (`zeroedu.runtime.comm`)."""
    n, r = ctx.world_size, ctx.rank
    if numel % n:
        raise ValueError(f"numel {numel} must be divisible by the world size {n}")
    axis = ctx.world_axis()
    k = numel // n
    dev = ctx.device
    total = sum(rank_tensor(q, numel) for q in range(n)).to(dev)  # integer-valued: exact in fp32
    x = rank_tensor(r, numel).to(dev)
    out = {}
    for impl in ("backend", "ring"):
        ledger = Ledger(r, wire=ctx.wire)
        comm = Comm(ledger, collectives=impl, backend=ctx.backend, meter=ctx.wire)
        figures = {}
        for op in WIRE_OPS:
            wires, times, ok = [], [], True
            for _ in range(repeats):
                dist.barrier()  # everyone starts together: the time is the collective's own
                t = time.perf_counter()
                if op == "all_reduce":
                    res = x.clone()
                    comm.all_reduce(res, axis, tag=f"lesson/{impl}")
                    want = total
                elif op == "reduce_scatter":
                    res = torch.empty(k, device=dev)
                    comm.reduce_scatter(res, x, axis, tag=f"lesson/{impl}")
                    want = total[r * k:(r + 1) * k]
                else:
                    res = torch.empty(numel, device=dev)
                    comm.all_gather(res, x[:k], axis, tag=f"lesson/{impl}")
                    want = torch.cat([rank_tensor(q, numel)[:k] for q in range(n)]).to(dev)
                times.append(time.perf_counter() - t)
                ok = ok and bool(torch.equal(res, want))
                wires.append(ledger.comm[-1].wire)
            rec = ledger.comm[-1]
            figures[op] = {"wire": wires, "model": int(Fraction(rec.sent)), "messages": rec.messages,
                           "payload": rec.payload, "seconds": min(times), "ok": ok}
        out[impl] = figures
    return out
