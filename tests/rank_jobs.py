"""Rank jobs only the tests use (ranks import them by name, as `tests.rank_jobs:<job>`): the
package keeps the jobs its lessons run (`zeroedu.runtime.collectives`), and these check it."""
from __future__ import annotations

import sys
import time

import torch


def chatty(ctx, mib: int, marker: str) -> int:
    """Print `mib` MiB to stdout in 64 KiB lines, then the marker; then give the log's watcher
    time to look (it checks four times a second)."""
    line = "x" * (64 * 1024 - 1)
    for _ in range(mib * 16):
        print(line)
    print(marker, flush=True)
    sys.stdout.flush()
    time.sleep(1.0)
    return ctx.rank


def own_error_in_transport_words(ctx, bad_rank: int = 1) -> float:
    """Rank `bad_rank` leaves the process group (its peers' all-reduce then fails with gloo's
    "Connection closed by peer"), then raises an error of its own whose words are a transport's.
    The cause is `bad_rank`'s own exception, whatever its message says."""
    import torch
    import torch.distributed as dist

    from zeroedu.runtime.comm import Comm
    from zeroedu.runtime.ledger import Ledger

    if ctx.rank == bad_rank:
        dist.destroy_process_group()
        time.sleep(0.3)
        raise RuntimeError("Gloo connection closed by peer (ProcessGroup): words only, a bug of this rank")
    t = torch.ones(4)
    Comm(Ledger(ctx.rank)).all_reduce(t, ctx.world_axis(), tag="faults/probe")
    return t.sum().item()


def wire_payload_job(ctx, nbytes: int) -> dict:
    """Each rank sends `nbytes` to its right neighbour and receives as many from its left, once,
    through `Comm` send/recv; the kernel's count of what this rank wrote, beside the payload."""
    from zeroedu.runtime.comm import Comm
    from zeroedu.runtime.ledger import Ledger

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
    from zeroedu.runtime.comm import _all_gather_single, _reduce_scatter_single
    from zeroedu.runtime.ring import ring_all_gather, ring_reduce_scatter

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

    from zeroedu.runtime import comm as comm_mod
    from zeroedu.runtime.ledger import Ledger

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


def ring_threads(ctx) -> dict:
    """A ring reduce-scatter through a Comm, then the Comm dropped: which ring threads remain."""
    import gc
    import threading

    from zeroedu.runtime import ring
    from zeroedu.runtime.comm import Comm
    from zeroedu.runtime.ledger import Ledger

    comm = Comm(Ledger(ctx.rank), collectives="ring")
    x = torch.ones(4 * ctx.world_size)
    out = torch.empty(4)
    h = comm.reduce_scatter(out, x, ctx.world_axis(), "test/ring", async_op=True)
    h.wait()
    during = [t.name for t in threading.enumerate() if t.name == "ring-comm"]
    own = comm.stream is not ring._default_stream
    del comm, h
    gc.collect()
    # the thread ends once its Comm is collected; on a busy machine that can take longer than a
    # moment, so wait for it (a thread that never ends still fails the check, after the deadline)
    deadline = time.monotonic() + 20.0
    while any(t.name == "ring-comm" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"during": during, "own_stream": own, "ok": bool((out == ctx.world_size).all()),
            "after": [t.name for t in threading.enumerate() if t.name == "ring-comm"]}


def paced(ctx, op: str, nbytes: int, alpha: float, beta: float) -> dict:
    """One collective (or rank 0 -> 1 message) of `nbytes` on an emulated link, after a barrier
    (unrecorded): when this rank joined and finished (CLOCK_MONOTONIC, one clock for every
    process), its process CPU time meanwhile, the result, and the wire bytes it wrote."""
    import torch.distributed as dist

    from zeroedu.runtime.comm import Comm
    from zeroedu.runtime.ledger import Ledger
    from zeroedu.runtime.links import Link, Links

    paced = alpha is not None
    link = Link(alpha, beta) if paced else None
    comm = Comm(Ledger(ctx.rank), collectives="ring", meter=ctx.wire,
                links=Links(link, link) if paced else None, pacer=ctx.pacer() if paced else None)
    axis = ctx.world_axis()
    g, r = ctx.world_size, ctx.rank
    numel = nbytes // 4
    x = torch.arange(numel, dtype=torch.float32) * (r + 1) + r
    dist.barrier()
    snap = ctx.wire.snapshot()
    t0, c0 = time.monotonic(), time.process_time()
    if op == "all_reduce":
        comm.all_reduce(x, axis, "test/paced")
        out = x
    elif op == "reduce_scatter":
        out = torch.empty(numel // g)
        comm.reduce_scatter(out, x, axis, "test/paced")
    elif op == "all_gather":
        out = torch.empty(numel * g)
        comm.all_gather(out, x, axis, "test/paced")
    elif op == "p2p":
        out = x
        if r == 0:
            comm.send(x, 1, axis, "test/paced")
        elif r == 1:
            comm.recv(x, 0, axis, "test/paced")
    t1, c1 = time.monotonic(), time.process_time()
    sent = ctx.wire.sent_since(snap).sent
    comm.close()
    return {"t0": t0, "t1": t1, "cpu": c1 - c0, "out": out, "sent": sent,
            "held": comm.pacer.held if paced else 0.0}


def stop_self(ctx, rank: int) -> int:
    """Rank `rank` stops itself (SIGSTOP, as Ctrl-Z or a debugger would); the others wait for it
    in a collective."""
    import os
    import signal

    import torch
    import torch.distributed as dist

    if ctx.rank == rank:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
    return ctx.rank


def tp_axis_names(ctx, cfg: dict) -> dict:
    """A --tp run built on this rank: the names of the axes it communicates on, the axis the
    world group's sockets count on, and the labels its sockets carry."""
    from zeroedu.train.config import config_from_dict
    from zeroedu.train.runner import build_run

    run = build_run(ctx, config_from_dict(cfg))
    labels = sorted(ctx.wire.labels()) if ctx.wire.available else None
    # a warm rank may have built other runs' meshes before (a cp or pp run): their axes' sockets
    # keep their own names
    earlier = sorted({a for mesh in ctx._meshes for a in mesh.names} - {"dp_shard", "tp"})
    return {"dp": run.dist.inner.name, "tp": run.dist.axes["tp"].name, "outer": run.dist.outer,
            "world_group_axis": run.ledger.mesh.world_group_axis, "labels": labels, "earlier": earlier,
            "axes": {k: list(a.ranks) for k, a in run.dist.axes.items()}}


def bytes_on_both_paths(ctx, cfgs: list[dict]) -> list[dict]:
    """Each configuration trained twice on this rank, its 16-bit products native then emulated
    (`zeroedu.runtime.matmul16`, the process's decision replaced for the job and restored): per
    run and path, every byte figure the report holds (model states, activations and the comm
    payloads the ledger counted, the peak, what the kernel counted on the wire) and the losses."""
    from dataclasses import replace

    from zeroedu.reports import RankReport
    from zeroedu.runtime import matmul16
    from zeroedu.train.launch import train_job

    out = []
    before = matmul16.decision()
    try:
        for cfg in cfgs:
            row = {}
            for mode in matmul16.Matmul16:
                matmul16._DECISION = replace(before, bf16=mode, fp16=mode, forced=True)
                plain = train_job(ctx, cfg)
                plain.pop("backend")
                how = plain.pop("matmul16")
                r = RankReport.from_plain(plain)
                row[mode.value] = {"states": r.measured.plain(), "peak": r.peak, "wire": r.wire.sent,
                                   "wire_by_axis": r.wire.by_axis, "matmul16": how, "losses": r.losses}
            out.append(row)
    finally:
        matmul16._DECISION = before
    return out
