"""Jobs that exercise the collectives on real ranks: the lesson of notebook 01 and the harness tests.

`collectives_job` runs, on every rank, the four facts the rest of the suite stands on:
all-reduce, reduce-scatter followed by all-gather (which equals all-reduce), and a hand-written
ring all-reduce from send/recv; it returns the results and this rank's ledger records so a
notebook or test can check values and bytes against the ring formulas.
"""
from __future__ import annotations

import torch

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

    out["comm"] = {s: {k: float(v) for k, v in ledger.comm_by_collective(s).items()} for s in (0, 1, 2)}
    out["records"] = [r.plain() for r in ledger.comm]
    return out


def wire_payload_job(ctx, nbytes: int) -> dict:
    """Each rank sends `nbytes` to its right neighbour and receives as many from its left, once,
    through `Comm` send/recv; the kernel's count of what this rank wrote, beside the payload."""
    ledger = Ledger(ctx.rank, wire=ctx.wire)
    comm = Comm(ledger, meter=ctx.wire)
    axis = ctx.world_axis()
    n, r = ctx.world_size, ctx.rank
    out = torch.full((nbytes,), r, dtype=torch.uint8)
    inp = torch.empty(nbytes, dtype=torch.uint8)
    snap = ctx.wire.snapshot()
    hs = comm.isend(out, (r + 1) % n, axis, "lesson/payload")
    hr = comm.irecv(inp, (r - 1) % n, axis, "lesson/payload")
    hs.wait()
    hr.wait()
    d = ctx.wire.sent_since(snap)
    return {"sent": d.sent, "received": d.received, "payload": nbytes, "messages": 1,
            "ok": bool((inp == (r - 1) % n).all())}


def ring_equivalence_job(ctx, sizes: list[int], dtype: str = "float32") -> dict:
    """zeroedu's ring reduce-scatter / all-gather against torch's on the same inputs: for each
    k in `sizes` (elements per rank, 0 and odd included), max |ring - backend|. Integer-valued
    inputs make every sum exact in fp32, so any difference is a wrong element, not round-off."""
    from .comm import _all_gather_single, _reduce_scatter_single
    from .ring import ring_all_gather, ring_reduce_scatter

    dt = getattr(torch, dtype)
    n, r = ctx.world_size, ctx.rank

    def inp(q, k):  # rank q's input, which every rank can regenerate
        g = torch.Generator().manual_seed(1000 * k + q)
        return torch.randint(-50, 50, (n * k,), generator=g).to(dt)

    out = {}
    for k in sizes:
        x = inp(r, k)
        a, b = torch.empty(k, dtype=dt), torch.empty(k, dtype=dt)
        ring_reduce_scatter(a, x.clone())
        _reduce_scatter_single(b, x.clone())
        want = sum(inp(q, k) for q in range(n))[r * k:(r + 1) * k]  # the sum, by hand
        c, d = torch.empty(n * k, dtype=dt), torch.empty(n * k, dtype=dt)
        ring_all_gather(c, x[:k])
        _all_gather_single(d, x[:k])
        out[k] = {"ring_equals_backend": bool(torch.equal(a, b) and torch.equal(c, d)),
                  "reduce_scatter_is_the_sum": bool(torch.equal(a, want.to(dt))),
                  "all_gather_is_the_concatenation": bool(torch.equal(c, torch.cat([inp(q, k)[:k] for q in range(n)])))}
    return out


def hidden_names_job(ctx) -> dict:
    """Run the backend collectives through `Comm` on a torch without the *_single names (as
    torch before 2.13): hide them, reload `zeroedu.runtime.comm`, reduce-scatter and all-gather,
    put everything back. Returns which torch functions ran and the results' correctness."""
    import importlib
    import warnings

    import torch.distributed as dist

    from . import comm as comm_mod

    hidden = {name: getattr(dist, name) for name in ("all_gather_single", "reduce_scatter_single")
              if hasattr(dist, name)}
    try:
        for name in hidden:
            delattr(dist, name)
        fresh = importlib.reload(comm_mod)
        c = fresh.Comm(Ledger(ctx.rank), collectives="backend")
        axis = ctx.world_axis()
        n, r = ctx.world_size, ctx.rank
        x = torch.arange(2 * n, dtype=torch.float32) + r
        out = torch.empty(2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the old names warn on 2.13
            c.reduce_scatter(out, x, axis, "lesson/compat")
            full = torch.empty(2 * n)
            c.all_gather(full, out, axis, "lesson/compat")
        want = torch.arange(2 * n, dtype=torch.float32)[2 * r:2 * r + 2] * n + sum(range(n))
        return {"functions": fresh.backend_functions(), "ok": bool(torch.equal(out, want)),
                "gathered_ok": bool(torch.equal(full[2 * r:2 * r + 2], out))}
    finally:
        for name, fn in hidden.items():
            setattr(dist, name, fn)
        importlib.reload(comm_mod)
