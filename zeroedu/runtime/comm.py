"""Thin wrappers over torch.distributed collectives: the only code in zeroedu that talks to the network.

Every call records a `CommRecord` in the rank's ledger: the op, a tag saying what moved
(``"zero2/unit3/grads"``), the mesh axis, the payload, and two byte figures:

* ``sent``, the **ring model**: the bytes this rank sends if the collective runs the ring
  algorithm, computed from the payload (the same arithmetic as `zeroedu.theory`, so it agrees
  with the closed forms by construction: it is a model, not a measurement). With S the payload
  bytes and g ranks:

    reduce-scatter (input S)   sends (g-1)/g * S    g-1 ring steps, each one chunk of S/g
    all-gather (output S)      sends (g-1)/g * S    the same ring, forwarding instead of adding
    all-reduce                 sends 2(g-1)/g * S   = reduce-scatter followed by all-gather
    broadcast                  sends S              root's view, pipelined chain
    send / recv                sends S / 0

Harness plumbing that is not training traffic (result gathering under torchrun, barriers
around a checkpoint write) uses torch.distributed directly and is deliberately not recorded.

  These are exact rationals (`fractions.Fraction`), comparable for equality with the closed forms.
* ``wire``, the **measurement**: bytes this rank's sockets really took for the collective, read
  from the kernel by `zeroedu.runtime.wire.WireMeter` around it, when the collective ran alone
  (nothing else in flight from its launch to its wait: otherwise bytes of overlapping
  collectives cannot be told apart, and ``wire`` is None; the ledger's per-step total is
  always measured). None on NCCL, whose bytes do not pass through this process's sockets.

Which implementation runs (``collectives``):

* ``"ring"``: zeroedu's own ring reduce-scatter and all-gather from point-to-point messages
  (`zeroedu.runtime.ring`), which send exactly the ring bound; all-reduce stays the backend's,
  which on gloo is already a ring (and bitwise equal to `ring.ring_all_reduce`).
* ``"backend"``: torch's collectives. On gloo, `reduce_scatter_single` is an all-reduce with one
  chunk kept (ProcessGroupGloo's reduce_scatter_tensor_coalesced: clone, all-reduce, copy), so
  it sends an all-reduce's bytes, 2(g-1)/g·S, twice the ring bound; its all-gather is on it.
* ``"auto"`` (the default): "ring" on gloo, where it halves the reduce-scatter's bytes. Notebook
  01's committed run (3 MiB, N = 4) took 0.50x gloo's time for the reduce-scatter and 1.41x for
  the all-gather, which sends the same bytes either way and pays here a Python hand-off per
  message against gloo's C++ loop; over whole training steps (benchmarks/results/collectives.json,
  gpt-small, N = 4) ring runs ZeRO-2 and FSDP2 in 0.88x the backend's step time.
  "backend" on NCCL. NCCL picks per call among its algorithms (Ring, Tree, CollNet, NVLS,
  NVLSTree and, in recent releases, PAT); NVLS and CollNet reduce inside the switch, so an
  all-reduce sends about S per GPU rather than the ring's 2(g-1)/g·S, and the ring model holds
  under ``NCCL_ALGO=Ring`` (what NVIDIA advises for measuring the network: nccl-tests issue 196).

`ring_all_reduce` below builds an all-reduce by hand from send/recv through this class (every
message recorded), for notebook 01 to show where 2(g-1)/g comes from.

torch 2.13 renamed `all_gather_into_tensor` / `reduce_scatter_tensor` to `all_gather_single` /
`reduce_scatter_single` (the old names warn); `_all_gather_single` / `_reduce_scatter_single`
below take whichever this torch has, so the declared range of torch versions works.

Async ops return a `Handle`; the completion time is taken by a callback on the work's future,
when the collective really finished, not when someone got round to waiting on it — that is what
makes the overlap on the timeline honest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
import threading
import weakref

import torch
import torch.distributed as dist

from ..kinds import IMPLEMENTATIONS, Implementation  # noqa: F401  (IMPLEMENTATIONS re-exported)
from . import ring, wire
from ..reports import CommRecord
from .ledger import Ledger
from .errors import CollectiveError
from .links import Links, Pacer

# One compatibility point for the renamed collectives (torch >= 2.13 has the *_single names).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def resolve_implementation(collectives: str, backend: str) -> str:
    """"ring" or "backend" for a run's `collectives` choice on this backend (see above)."""
    if collectives not in IMPLEMENTATIONS:
        raise ValueError(f"collectives must be one of {IMPLEMENTATIONS}, got {collectives!r}")
    if collectives == Implementation.AUTO:
        return "ring" if backend == "gloo" else "backend"
    return collectives


def backend_functions() -> dict:
    """Which torch functions the backend implementation calls (for tests and reports)."""
    return {"all_gather": _all_gather_single.__name__, "reduce_scatter": _reduce_scatter_single.__name__}


@dataclass
class Axis:
    """One mesh axis as this rank sees it: a process group, its size and this rank's place in it."""

    name: str
    group: object  # a torch.distributed ProcessGroup (None = the default world group)
    size: int
    rank: int  # this rank's index within the axis
    ranks: tuple[int, ...] = field(default=())  # global ranks on this axis, in axis order

    def global_rank(self, axis_rank: int) -> int:
        return self.ranks[axis_rank] if self.ranks else axis_rank


class UnitName(str):
    """A unit's name, ``unit3``, that keeps its number: a tag built from it records the unit
    as a field, so no reader takes the number back out of the text."""

    number: int  # (not `index`: that is str's method)

    def __new__(cls, number: int):
        self = super().__new__(cls, f"unit{number}")
        self.number = number
        return self

    def __reduce__(self):
        return (UnitName, (self.number,))


class Tag(str):
    """A collective's tag: the text people read (``fsdp2/unit3/params/param1``) with its parts
    as attributes code reads: `strategy`, `where`, `moves` (grads, params, data), `detail`,
    and `unit` (the unit's number when `where` is a `UnitName`, else None)."""

    strategy: str
    where: str
    moves: str
    detail: tuple[str, ...]
    unit: int | None

    def __new__(cls, strategy: str, where: str, moves: str, *detail: str):
        self = super().__new__(cls, "/".join((strategy, str(where), moves) + detail))
        self.strategy, self.where, self.moves, self.detail = strategy, str(where), moves, tuple(detail)
        self.unit = where.number if isinstance(where, UnitName) else None
        return self

    def __reduce__(self):
        return (_tag, (self.strategy, self.where, self.moves, self.detail, self.unit))


def _tag(strategy, where, moves, detail, unit):  # unpickling: the unit's number kept
    return Tag(strategy, UnitName(unit) if unit is not None else where, moves, *detail)


def tag(strategy: str, where: str, payload: str, *detail: str) -> Tag:
    """The one format of a collective's tag: ``<strategy>/<where>/<payload>[/<detail>...]``.

    `where` names the buffer (``unit3``, a `UnitName`; ``bucket0``, ``param5``), `payload` what
    moves (``grads`` or ``params``), `detail` anything finer (``param1`` inside a unit,
    ``outer``). The mesh axis is recorded separately, so it is not part of the tag; the
    collective's record carries `unit` and `moves` as fields (`CommRecord`)."""
    if payload not in PAYLOADS:
        raise ValueError(f"payload must be one of {PAYLOADS}, got {payload!r}")
    return Tag(strategy, where, payload, *detail)


PAYLOADS = ("grads", "params", "data")


class Handle:
    """An in-flight collective. `wait()` blocks until done; the record's end time is already set;
    `done()` says, without blocking, whether the work has finished."""

    def __init__(self, work, rec: CommRecord, comm: "Comm", hold=None):
        self.work, self.rec, self.comm, self._hold = work, rec, comm, hold
        self.ledger = comm.ledger
        self._thread, self._error, self._waited = None, None, False
        if work is None:
            return
        try:
            fut = work.get_future()
        except RuntimeError:  # gloo's reduce-scatter has no future: a waiter thread times it
            self._thread = threading.Thread(target=self._wait_in_thread, daemon=True)
            self._thread.start()
            return

        def _done(_f, rec=rec, ledger=self.ledger):
            rec.t_end = ledger.now()

        fut.add_done_callback(_done)

    def _wait_in_thread(self):
        try:
            self.work.wait()
        except BaseException as e:  # re-raised in wait(), on the caller's thread
            self._error = e
        self.rec.t_end = self.ledger.now()

    def done(self) -> bool:
        """True once the collective has finished (from the work object, not from the ledger)."""
        if self._thread is not None:
            return not self._thread.is_alive()
        return self.work is None or self.work.is_completed()

    def wait(self):
        t0 = self.ledger.now()
        if self.rec.waited is None:  # the first time this thread stopped for it
            self.rec.waited = t0
        try:
            self._wait()
        except RuntimeError as e:
            raise _failed(self.rec, e) from e
        if self._hold is not None:  # a paced message: held until the link delivers it
            hold, self._hold = self._hold, None
            hold()
            self.rec.t_end = self.ledger.now()
        if not self.rec.blocking:  # an asynchronous collective's wait: exposed from here to its end
            self.ledger.add_wait(t0, self.ledger.now())
        if not self._waited:
            self._waited = True
            self.comm._finished(self)
        return self

    def _wait(self):
        if self._thread is not None:
            self._thread.join()
            if self._error is not None:
                raise self._error
        elif self.work is not None:
            self.work.wait()
            if self.rec.t_end is None:  # callback not run yet: it finished no later than now
                self.rec.t_end = self.ledger.now()


def _issue(rec: CommRecord, start):
    """Start a collective; an error the backend raises at once (a peer gone, a sync ring op run
    inline) becomes a `CollectiveError`, as one raised when it is waited for does."""
    try:
        return start()
    except RuntimeError as e:
        raise _failed(rec, e) from e


def _failed(rec: CommRecord, e: RuntimeError) -> CollectiveError:
    return e if isinstance(e, CollectiveError) else CollectiveError(rec.op, rec.axis, rec.tag, e)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Comm:
    """The collectives one rank uses, each recorded in `ledger` (and measured on the wire)."""

    def __init__(self, ledger: Ledger, collectives: str = "auto", backend: str = "gloo",
                 meter: "wire.WireMeter | None" = None, links: "Links | None" = None,
                 pacer: "Pacer | None" = None):
        self.ledger, self.backend = ledger, backend
        self.implementation = resolve_implementation(collectives, backend)
        # Emulated links (`runtime.links`): every collective on a paced axis runs zeroedu's ring,
        # whose messages the pacer holds until the link would have delivered them.
        self.links, self.pacer = links, pacer
        if links is not None:
            if pacer is None:
                raise ValueError("emulated links need a pacer (RankContext.pacer())")
            if self.implementation != Implementation.RING or backend != "gloo":
                raise ValueError("emulated links pace zeroedu's ring collectives on gloo: "
                                 "use --collectives ring or auto, on CPU ranks")
        self.meter = meter if meter is not None and meter.available else None
        self._open: set = set()  # handles issued and not yet waited
        self._window = None  # (meter snapshot, records) of the collectives in flight
        self._streams: dict[str, ring.CommStream] = {}

    @property
    def stream(self) -> "ring.CommStream":
        """This Comm's thread for zeroedu's ring collectives on `dp_shard` (`stream_for`)."""
        return self.stream_for("dp_shard")

    def stream_for(self, axis: str) -> "ring.CommStream":
        """The thread that runs `axis`'s ring collectives, started at its first one: their issue
        order, as a CUDA stream orders NCCL's. One per mesh axis, as each process group has its
        own NCCL stream: HSDP's dp_outer all-reduce runs beside the next dp_shard reduce-scatter
        (what `theory.schedule` simulates), not queued behind it. The threads end when the Comm
        is closed or collected, so a warm rank that runs job after job keeps none of a finished one."""
        s = self._streams.get(axis)
        if s is None:
            s = self._streams[axis] = ring.CommStream()
            weakref.finalize(self, s.close, False)
        return s

    def _pace(self, axis: Axis):
        """The pace of `axis`'s emulated link, or None (not paced)."""
        if self.links is None:
            return None
        link = self.links.for_axis(axis.name)
        return None if link is None else self.pacer.on(link)

    def close(self) -> None:
        """End the ring threads once their queued collectives are done."""
        for s in self._streams.values():
            s.close()

    # ---------------------------------------------------------------- records and the wire
    # The wire is read in *windows*: from the moment a collective is issued while none is in
    # flight to the moment the last one in flight is waited for. Bytes of collectives that
    # overlap cannot be told apart, so a window's bytes are attributed to a kind of collective
    # only when every collective in it is of that kind (and to the record itself when it is
    # alone); the ledger's per-step total is measured whatever overlaps.
    def _record(self, op, tag, axis: Axis, payload: int, factor: Fraction, numel: int = 0,
                elem: int = 1) -> CommRecord:
        rec = CommRecord(op, str(tag), axis.name, axis.size, payload, factor * payload,
                         self.ledger.step, self.ledger.now(),
                         unit=getattr(tag, "unit", None), moves=getattr(tag, "moves", None),
                         detail=list(getattr(tag, "detail", ())))
        rec.implementation = self.implementation if op in ("reduce_scatter", "all_gather") else "backend"
        rec.messages = wire.messages(op, numel, elem, axis.size, rec.implementation)
        if self.meter is not None and self.ledger.per_collective_wire:
            if not self._open:
                self._window = (self.meter.snapshot(), [])
            self._window[1].append(rec)
        self.ledger.add_comm(rec)
        return rec

    def _finished(self, h: Handle) -> None:
        self._open.discard(h)
        if self.meter is None or self._open or self._window is None:
            return
        snap, recs = self._window
        self._window = None
        sent = self.meter.sent_since(snap).sent
        if len(recs) == 1:
            recs[0].wire = sent
        self.ledger.add_wire_window(recs, sent)

    def _finish(self, work, rec, async_op, hold=None):
        rec.blocking = not async_op
        if not async_op:  # the caller stopped from the start (it may have run inline, in `_issue`)
            rec.waited = rec.t_start
        if work is None and rec.t_end is None:  # group of one, or ran inline: it is done
            rec.t_end = self.ledger.now()
        h = Handle(work, rec, self, hold)
        self._open.add(h)
        if async_op:
            return h
        h.wait()
        # A blocking collective stops this thread from its start (it may have run inline,
        # inside `_issue`) to its end: exposed, all of it.
        self.ledger.add_wait(rec.t_start, self.ledger.now())
        return None

    # ---------------------------------------------------------------- collectives
    def all_reduce(self, t: torch.Tensor, axis: Axis, tag: str, async_op: bool = False):
        """SUM in place. Averaging is the caller's choice (gloo has no AVG/PREMUL_SUM)."""
        g = axis.size
        rec = self._record("all_reduce", tag, axis, _nbytes(t), Fraction(2 * (g - 1), g), t.numel(),
                           t.element_size())
        pace = self._pace(axis)
        if pace is not None and g > 1:
            # zeroedu's ring, cut into gloo's chunks and segments: gloo's messages (and bytes on
            # the wire) and gloo's sum, bitwise, but each message paced by the link
            work = _issue(rec, lambda: ring.ring_all_reduce(t, group=axis.group, async_op=async_op,
                                                            stream=self.stream_for(axis.name), chunks="gloo",
                                                            segment_bytes="gloo", pace=pace))
        else:
            work = _issue(rec, lambda: dist.all_reduce(t, group=axis.group, async_op=True) if g > 1 else None)
        return self._finish(work, rec, async_op)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, axis: Axis, tag: str,
                       async_op: bool = False):
        """SUM of `inp` (numel g*k) over the axis; this rank gets its k-element chunk in `out`."""
        g = axis.size
        if inp.numel() != out.numel() * g:
            raise ValueError(f"reduce_scatter: input has {inp.numel()} elements, need {g} x {out.numel()}")
        rec = self._record("reduce_scatter", tag, axis, _nbytes(inp), Fraction(g - 1, g), inp.numel(),
                           inp.element_size())
        if g == 1:
            out.copy_(inp)
            work = None
        elif rec.implementation == Implementation.RING:
            work = _issue(rec, lambda: ring.ring_reduce_scatter(out, inp, group=axis.group, async_op=async_op,
                                                                stream=self.stream_for(axis.name), pace=self._pace(axis)))
        else:
            work = _issue(rec, lambda: _reduce_scatter_single(out, inp, group=axis.group, async_op=True))
        return self._finish(work, rec, async_op)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, axis: Axis, tag: str,
                   async_op: bool = False):
        """Concatenate every rank's `inp` (numel k) into `out` (numel g*k), in axis order."""
        g = axis.size
        if out.numel() != inp.numel() * g:
            raise ValueError(f"all_gather: output has {out.numel()} elements, need {g} x {inp.numel()}")
        rec = self._record("all_gather", tag, axis, _nbytes(out), Fraction(g - 1, g), out.numel(),
                           out.element_size())
        if g == 1:
            out.copy_(inp)
            work = None
        elif rec.implementation == Implementation.RING:
            work = _issue(rec, lambda: ring.ring_all_gather(out, inp, group=axis.group, async_op=async_op,
                                                            stream=self.stream_for(axis.name), pace=self._pace(axis)))
        else:
            work = _issue(rec, lambda: _all_gather_single(out, inp, group=axis.group, async_op=True))
        return self._finish(work, rec, async_op)

    def broadcast(self, t: torch.Tensor, src_axis_rank: int, axis: Axis, tag: str):
        rec = self._record("broadcast", tag, axis, _nbytes(t), Fraction(0), t.numel(), t.element_size())
        rec.sent = Fraction(_nbytes(t)) if axis.rank == src_axis_rank and axis.size > 1 else Fraction(0)
        work = _issue(rec, lambda: dist.broadcast(t, src=axis.global_rank(src_axis_rank), group=axis.group,
                                                  async_op=True) if axis.size > 1 else None)
        return self._finish(work, rec, False)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                   axis: Axis, tag: str):
        """Rows `inp[sum(in_splits[:j]) : ...]` go to axis rank j; `out` receives out_splits[j] rows
        from rank j, in axis order. Sent: every row but the ones this rank keeps for itself."""
        g = axis.size
        if sum(in_splits) != inp.shape[0] or sum(out_splits) != out.shape[0] or len(in_splits) != g:
            raise ValueError(f"all_to_all: splits {in_splits} -> {out_splits} do not match {inp.shape[0]} -> "
                             f"{out.shape[0]} rows over {g} ranks")
        row = inp[:1].numel() * inp.element_size() if inp.shape[0] else 0
        rec = self._record("all_to_all", tag, axis, _nbytes(inp), Fraction(0), inp.numel(), inp.element_size())
        rec.sent = Fraction((sum(in_splits) - in_splits[axis.rank]) * row)

        def start():
            if g == 1:
                out.copy_(inp)
                return None
            return dist.all_to_all_single(out, inp, list(out_splits), list(in_splits), group=axis.group,
                                          async_op=True)
        return self._finish(_issue(rec, start), rec, False)

    # Point-to-point messages on a paced axis: the sender posts the start, the receiver's wait
    # holds the message until the link would have delivered it (`Handle.wait`).
    def send(self, t: torch.Tensor, dst_axis_rank: int, axis: Axis, tag: str):
        return self._send(t, dst_axis_rank, axis, tag, False)

    def recv(self, t: torch.Tensor, src_axis_rank: int, axis: Axis, tag: str):
        return self._recv(t, src_axis_rank, axis, tag, False)

    def isend(self, t, dst_axis_rank, axis, tag):
        return self._send(t, dst_axis_rank, axis, tag, True)

    def irecv(self, t, src_axis_rank, axis, tag):
        return self._recv(t, src_axis_rank, axis, tag, True)

    def _send(self, t, dst_axis_rank, axis, tag, async_op):
        rec = self._record("send", tag, axis, _nbytes(t), Fraction(1), t.numel(), t.element_size())
        dst = axis.global_rank(dst_axis_rank)
        pace = self._pace(axis)
        if pace is not None and t.numel():
            pace.sending(dst, _nbytes(t))
        work = _issue(rec, lambda: dist.isend(t, dst=dst, group=axis.group))
        return self._finish(work, rec, async_op)

    def _recv(self, t, src_axis_rank, axis, tag, async_op):
        rec = self._record("recv", tag, axis, _nbytes(t), Fraction(0), t.numel(), t.element_size())
        src = axis.global_rank(src_axis_rank)
        pace = self._pace(axis)
        work = _issue(rec, lambda: dist.irecv(t, src=src, group=axis.group))
        hold = (lambda: pace.received(src, _nbytes(t))) if pace is not None and t.numel() else None
        return self._finish(work, rec, async_op, hold)


def ring_all_reduce(comm: Comm, t: torch.Tensor, axis: Axis, tag: str = "ring") -> torch.Tensor:
    """All-reduce (SUM) `t` in place by hand, from send/recv around a ring.

    Cut `t` into g chunks. Phase 1, reduce-scatter: in step s each rank sends chunk (r - s) to
    its right neighbour and adds the chunk (r - s - 1) arriving from its left; after g-1 steps
    rank r holds the full sum of chunk (r + 1). Phase 2, all-gather: the same ring forwards the
    finished chunks for g-1 more steps. Each rank sends 2(g-1) chunks of S/g bytes:
    2(g-1)/g * S, independent of g for large g — why ring all-reduce is bandwidth-optimal.
    Requires numel divisible by g (pad first), so every chunk has the same size.
    """
    g, r = axis.size, axis.rank
    if g == 1:
        return t
    if t.numel() % g:
        raise ValueError(f"ring_all_reduce needs numel divisible by {g}; pad the tensor first")
    chunks = t.view(-1).chunk(g)
    right, left = (r + 1) % g, (r - 1) % g
    incoming = torch.empty_like(chunks[0])
    for s in range(g - 1):  # phase 1: reduce-scatter
        send_i, recv_i = (r - s) % g, (r - s - 1) % g
        hs = comm.isend(chunks[send_i].contiguous(), right, axis, f"{tag}/reduce_scatter")
        hr = comm.irecv(incoming, left, axis, f"{tag}/reduce_scatter")
        hs.wait(); hr.wait()
        chunks[recv_i].add_(incoming)
    for s in range(g - 1):  # phase 2: all-gather of the reduced chunks
        send_i, recv_i = (r + 1 - s) % g, (r - s) % g
        hs = comm.isend(chunks[send_i].contiguous(), right, axis, f"{tag}/all_gather")
        hr = comm.irecv(incoming, left, axis, f"{tag}/all_gather")
        hs.wait(); hr.wait()
        chunks[recv_i].copy_(incoming)
    return t
