"""The ledger: what one rank holds and what it sends, measured, as plain picklable data.

All instrumentation of the suite lives here and in `zeroedu.runtime.comm`; strategies only *tell* the
ledger what a tensor is (``ledger.track(t, "grad")``) and *mark* lifecycle points
(``ledger.event(EventKind.UNSHARD, unit=3)``; the kinds are `zeroedu.kinds.EventKind`). The
ledger then measures.

Memory
    Bytes are counted from real tensor storages, never from shapes: a tracked tensor contributes
    ``untyped_storage().nbytes()``, each storage once (views of one flat buffer share a storage).
    A storage reached from two categories is charged to the first in `CATEGORIES` order, so a
    fp32 master that *is* the parameter is not counted twice. Freed memory really disappears:
    a storage resized to 0 (how FSDP frees an unsharded parameter while autograd still holds the
    tensor object) counts 0, and a dead tensor is dropped through its weak reference.
    Activations are the tensors autograd saves for backward, seen through
    `torch.autograd.graph.saved_tensors_hooks` (`Ledger.saving_activations`).

How the count is kept
    `bytes_by_category()` is the definition: walk every tracked tensor, read its storage now.
    That is O(tracked tensors), ~1 ms for gpt-small's FSDP2 (every shard, its gradient, Adam's
    m and v, every saved activation), and a step has dozens of lifecycle events. So events read
    a *running count* instead: one record per storage (keyed by its StorageImpl, which a resize
    keeps), updated when a tensor is tracked and when one dies (its weakref callback queues it;
    the comm thread can drop the last reference), and re-read only for storages that have been
    seen smaller than their tensors (FSDP's unsharded leaves, tracked with their bytes taken
    away, and the views of them autograd saves): O(resized storages) per event. The figures the
    report reads, model states at the optimizer step and activations at forward end, are taken
    from the full walk; if the running count disagrees there (a storage resized or a `.data`
    swapped behind the ledger's back) it is rebuilt and `resyncs` counts it. With ``check=True``
    every event compares the two (the tests run every strategy that way).

Model states
    ``model_states()`` is taken at the optimizer step, when parameters, gradients and optimizer
    state are all alive; that is what the closed forms in `zeroedu.theory` predict.

Activations
    The bytes in category "activation" at the forward/backward boundary (the ``forward end``
    event: loss computed, backward not started) of the last micro-batch: what autograd keeps
    for one micro-batch's backward, which `zeroedu.theory.activations` predicts.

Timeline (``timeline_mode``)
    "full" (default): ``event(kind, unit=...)`` appends (time, kind, unit, bytes by category) and updates the
    peak, at every lifecycle step that changes what a strategy holds (unshard, copy-out, reshard,
    post_backward, copy-in, buffer allocated or freed); `comm` reads the wire around every
    collective; and the first step's backward passes are watched op by op (`_BackwardWatch`, a
    dispatch mode): every storage an operation returns is counted as "backward_temp" while it
    lives, and the peak is checked after each operation. Events can be streamed to the parent
    while a job runs (``sink``), for live plots.
    "minimal": only what the report's figures need: the events at forward end and at the
    optimizer step (full walks), the peak at every lifecycle event (running count, no Event
    kept), every collective's record (the ring model), the wire per step (no per-collective
    windows). `benchmarks/bench_instrumentation.py` measures what "full" costs on top: on
    gpt-small at N = 4 (2 cores), steps after the first +0 to +5 % (DDP, ZeRO-2, FSDP2); a
    watched backward +4 % (DDP) to +20 % (FSDP2) of its step, paid once per run.

Peak (what torch's allocation-level tracker sees that a lifecycle event does not)
    The peak is the largest total seen: at a lifecycle event, and, in the watched backward
    passes (full timeline), after any operation. Against `MemTracker` entered before the run
    is built (gpt-small, N = 4, build + one step, `tests/test_peak.py`), rank 0:

        item                                              ledger               bytes at the peak
        gradients of activations inside a block's         "backward_temp"      2.36 MB fp32
        backward (grad of GELU in/out, of the LN input)   (watched backward)   (5.8 % of it)
        a parameter's full gradient between autograd      "backward_temp",     inside the above
        making it and the unit's post-backward hook       then "comm_buffer"
        the prefetched unit (parameters or, batched       "gathered" /         3.16 MB
        FSDP2, its all-gather output)                     "comm_buffer"
        the logits and the targets, kept alive through    not tracked          99 KB + 2 KB
        backward by the caller's local variables                               (0.25 %)
        a temporary inside one operation                  seen once the op     1 KB (a bias
                                                          returns              gradient's sum)
        allocator granularity                             none on CPU; CUDA    0 here
                                                          rounds to 512 B
        the ring collectives' scratch (comm thread:       neither (dispatch    2 chunks of
        dispatch modes are thread-local), gloo's buffers  modes, not tensors)  k elements
        Adam's scratch while the update runs              "optimizer_temp"     0 here; where the
        (`optim.adam_update`: one or two chunks of at     (`UPDATE` event)     update sets the peak
        most 4 MiB; `theory.memory.update_bytes`)                              it is that closed form

    tracker / ledger peak, fp32 (mixed-bf16 alike):
                     before  events only ("minimal")  full
        ddp          0.975   0.975                    0.999
        zero2        0.947   0.947                    0.998
        fsdp1        0.841   0.939                    0.998
        fsdp2        0.939   0.979                    0.998
        megatron     0.965   0.965                    0.998
        hsdp, hfsdp  -       0.954, 0.948             0.998
    ("before": lifecycle events only, per-parameter FSDP2, and FSDP1 whose parameter views were
    slices: backward made a zero tensor the size of the whole flat buffer per parameter, 6.3 MB
    at the peak, which the split views removed.) The FSDP peak at lifecycle events is a closed
    form, `zeroedu.theory.memory.fsdp_peak`, equal to the minimal timeline's byte for byte.
    On an MLP at one sample per rank, where DDP's peak is its optimizer update, every strategy's
    ratio is at least 0.996 (0.9998 for DDP); written whole, the update's 2-3 temporaries the
    size of the largest weight (1 MiB each) made DDP's 0.895 (fp32) and 0.869 (mixed-bf16).

Communication
    `zeroedu.runtime.comm` appends a `CommRecord` per collective: op, tag, mesh axis, group size, payload
    bytes, bytes this rank sends under the ring model (an exact `Fraction`), and when it started
    and finished.
"""
from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..kinds import CATEGORIES, MODEL_STATE, OPTIM_PARTS, TIMELINE_MODES, EventKind, TimelineMode
from ..kinds import WORLD
from ..reports import CommRecord, Event, Measured, StepTime, TimeReport, Timeline, WireReport


# The memory categories (MODEL_STATE, then TRANSIENT: the charging precedence) and the timeline
# modes are `zeroedu.kinds`'s, re-exported here for the code that reads them from the ledger.


def _kind(kind) -> EventKind:
    if not isinstance(kind, EventKind):
        raise TypeError(f"a ledger event's kind is a zeroedu.kinds.EventKind, got {kind!r}: "
                        "for a point of your own, event(EventKind.OTHER, note=...)")
    return kind


class _Saved:
    """Holder for one tensor autograd saved for backward; dies when autograd releases it."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


def _storage(obj) -> torch.UntypedStorage:
    """The storage a tracked object stands for: a tensor's, a saved tensor's (`_Saved`), or
    the storage itself (what the backward watch tracks)."""
    if type(obj) is _Saved:
        return obj.t.untyped_storage()
    if isinstance(obj, torch.UntypedStorage):
        return obj
    return obj.untyped_storage()


class _Storage:
    """One storage in the running count: its bytes when last read, how many live tracked
    tensors of each category use it, and those tensors (weakly), in `entries`."""

    __slots__ = ("nbytes", "counts", "entries", "rank")

    def __init__(self):
        self.nbytes, self.rank = 0, -1  # rank: index in CATEGORIES it is charged to (-1: none)
        self.counts = [0] * len(CATEGORIES)
        self.entries: list = []  # [weakref, category index] per tracked tensor on this storage


_RANK = {c: i for i, c in enumerate(CATEGORIES)}
_BACKWARD_TEMP = _RANK["backward_temp"]


class _BackwardWatch(TorchDispatchMode):
    """While backward runs (full timeline): every tensor an operation returns is counted as
    "backward_temp" until it dies, and the peak is checked after every operation, so the
    gradients of activations and a parameter's gradient before its hook takes it are seen
    where they are largest. Thread-local, like every dispatch mode: the comm thread's ring
    scratch is not seen."""

    def __init__(self, ledger: "Ledger"):
        super().__init__()
        self.ledger = ledger

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        led = self.ledger
        led._drain()
        grew = False
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                st = t.untyped_storage()
                # Only new storages matter (a view or an in-place result adds no bytes), and
                # each is followed through the storage itself, which outlives its first tensor
                # as long as any view of it lives.
                if st._cdata not in led._storages and st.nbytes():
                    led._add(st, st, _BACKWARD_TEMP)
                    grew = True
        if grew:
            led._probe(func)
        return out
# The events a minimal timeline keeps: the ones the report's figures are read at.
REPORT_EVENTS = (EventKind.FORWARD_END, EventKind.OPTIMIZER_STEP)


def _union(intervals) -> float:
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


@dataclass
class Ledger:
    rank: int = 0
    sink: Callable[[dict], None] | None = None
    wire: Any = None  # a zeroedu.runtime.wire.WireMeter, or None
    # The run's mesh (`zeroedu.mesh.Mesh`): says which axis the world group's sockets carry.
    # None: a job without one (the world group's bytes count as `world`).
    mesh: Any = None
    step: int = -1  # -1: set-up, before the first training step
    t0: float = field(default_factory=time.perf_counter)
    events: list[Event] = field(default_factory=list)
    comm: list[CommRecord] = field(default_factory=list)
    wire_windows: list = field(default_factory=list)  # (step, kinds of collective, bytes)
    marks: list[Event] = field(default_factory=list)  # points in time, no bytes
    model_state_bytes: dict[str, int] = field(default_factory=dict)
    activation_bytes: int = 0  # activations at the last forward/backward boundary (one micro-batch)
    peak: int = 0
    peak_label: str = ""
    peak_bytes: dict[str, int] = field(default_factory=dict)  # by category, at the peak
    timeline_mode: str = "full"  # "full" | "minimal" (see "Timeline")
    check: bool = False  # walk every storage at every event and compare (tests)
    watch: str = "first"  # full timeline: watch the backward of the "first" step or of "every" step

    def __post_init__(self):
        if self.timeline_mode not in TIMELINE_MODES:
            raise ValueError(f"timeline must be one of {TIMELINE_MODES}, got {self.timeline_mode!r}")
        self._wire_start = None  # the meter's reading at the start of the current step
        # The running count ("How the count is kept"): one record per storage, keyed by the
        # address of its StorageImpl, which a resize keeps (only the data pointer moves).
        self._storages: dict[int, _Storage] = {}
        self._resized: dict[int, _Storage] = {}  # storages seen smaller than their tensors
        self._totals = [0] * len(CATEGORIES)
        self._dead: list = []  # (storage key, entry) of tracked tensors that died
        self.resyncs = 0  # times a full walk found the running count wrong (then rebuilt it)
        self._watch = None  # the backward watch while it runs
        self._watched_step = None  # the step whose backward passes are watched (the first)
        # Time (`time_report`): each step's window on this rank and the intervals it spent
        # waiting for communication, both kept in either timeline mode (a few floats a step).
        self.step_windows: list[tuple[int, float, float]] = []
        self.waits: list[tuple[int, float, float]] = []
        self._step_start: float | None = None

    @property
    def per_collective_wire(self) -> bool:
        """Whether `comm` reads the wire around each collective (full timeline only)."""
        return self.timeline_mode == TimelineMode.FULL

    # ------------------------------------------------------------------ memory
    def track(self, tensor: torch.Tensor, category: str) -> torch.Tensor:
        rank = _RANK.get(category)
        if rank is None:
            raise ValueError(f"unknown category {category!r}; one of {CATEGORIES}")
        self._add(tensor, tensor, rank)
        return tensor

    def _add(self, holder, t, rank: int) -> None:
        """Count the storage of `t` (a tensor, or a storage) in category `rank` for as long as
        `holder` lives (t itself, the `_Saved` box of an activation, or the storage)."""
        # Deaths first: a storage freed before `t` was made may have had the address of t's.
        # (This runs once per tensor autograd saves, inside forward: kept to plain steps.)
        if self._dead:
            self._drain()
        st = t if isinstance(t, torch.UntypedStorage) else t.untyped_storage()
        key, nbytes = st._cdata, st.nbytes()
        rec = self._storages.get(key)
        if rec is None:
            rec = self._storages[key] = _Storage()
        entry = [None, rank]
        dead = self._dead  # the callback may run on another thread (comm): it only appends
        entry[0] = weakref.ref(holder, lambda _r, key=key, entry=entry: dead.append((key, entry)))
        rec.entries.append(entry)
        rec.counts[rank] += 1
        if st is not t:
            # An FSDP leaf is tracked with its bytes taken away (and Linear saves views of it):
            # such a storage changes size at every unshard / reshard, so it is re-read at each look.
            numel = t.numel()
            if numel and nbytes < (t.storage_offset() + numel) * t.element_size():
                self._resized[key] = rec
        # A storage already charged to this category or an earlier one, at this size, stays
        # where it is (`rank` is the first category with a live tensor, see `_settle`).
        if rec.rank < 0 or rank < rec.rank or nbytes != rec.nbytes:
            self._settle(rec, nbytes)

    def _settle(self, rec: _Storage, nbytes: int) -> None:
        """Charge the storage's current size to its current category: the first one in
        CATEGORIES order that has a live tracked tensor on it."""
        if rec.rank >= 0:
            self._totals[rec.rank] -= rec.nbytes
        rec.nbytes = nbytes
        rec.rank = -1
        for i, c in enumerate(rec.counts):
            if c:
                rec.rank = i
                break
        if rec.rank >= 0:
            self._totals[rec.rank] += nbytes

    def _drain(self) -> None:
        dead = self._dead
        while dead:
            key, entry = dead.pop()
            rec = self._storages.get(key)
            if rec is None or entry[1] < 0:
                continue
            for i, e in enumerate(rec.entries):
                if e is entry:
                    del rec.entries[i]
                    rec.counts[entry[1]] -= 1
                    break
            else:
                continue
            if rec.entries:
                self._settle(rec, rec.nbytes)
            else:
                if rec.rank >= 0:
                    self._totals[rec.rank] -= rec.nbytes
                del self._storages[key]
                self._resized.pop(key, None)

    def _refresh(self) -> None:
        """Up to date: forget the dead, re-read every storage that has been resized."""
        self._drain()
        for rec in self._resized.values():
            for ref, _ in rec.entries:
                obj = ref()
                if obj is not None:
                    nbytes = _storage(obj).nbytes()
                    if nbytes != rec.nbytes:
                        self._settle(rec, nbytes)
                    break

    def _probe(self, func) -> None:
        """The peak, checked from the running count without re-reading resized storages (they
        change size only at unshard / reshard, each followed by an event that re-reads them)."""
        self._drain()
        total = sum(self._totals)
        if total > self.peak:
            self.peak, self.peak_label = total, f"backward: {getattr(func, '__name__', func)}"
            self.peak_bytes = dict(zip(CATEGORIES, self._totals))

    def running_bytes(self) -> dict[str, int]:
        """Live bytes per category from the running count: O(storages that have been resized),
        what every lifecycle event reads. Equal to `bytes_by_category()` as long as nothing
        resizes a tracked storage that was tracked at full size (with `check`, asserted)."""
        self._refresh()
        out = dict(zip(CATEGORIES, self._totals))
        if self.check:
            walked = self.bytes_by_category()
            if walked != out:
                raise AssertionError(f"ledger running count {out} != full walk {walked}")
        return out

    def bytes_by_category(self) -> dict[str, int]:
        """Live bytes per category, read from every tracked tensor's storage now: each storage
        (by data pointer) once, charged to the first of its categories in CATEGORIES order; a
        storage of 0 bytes (resized away) counts nothing. The definition; O(tracked tensors)."""
        self._drain()
        seen: dict[int, int] = {}
        sizes: dict[int, int] = {}
        for rec in self._storages.values():
            for ref, rank in rec.entries:
                obj = ref()
                if obj is None:
                    continue
                st = _storage(obj)
                nbytes = st.nbytes()
                if nbytes == 0:
                    continue
                key = st.data_ptr()
                if key not in seen or rank < seen[key]:
                    seen[key] = rank
                sizes[key] = max(sizes.get(key, 0), nbytes)
        out = dict.fromkeys(CATEGORIES, 0)
        for key, rank in seen.items():
            out[CATEGORIES[rank]] += sizes[key]
        return out

    def _exact(self) -> dict[str, int]:
        """The full walk, for the figures the report reads (forward end, optimizer step). A
        running count that disagrees with it (a storage changed behind the ledger's back,
        say a tracked tensor's `.data` swapped) is rebuilt from the live tensors."""
        walked = self.bytes_by_category()
        self._refresh()
        if walked != dict(zip(CATEGORIES, self._totals)):
            self.resyncs += 1
            self._rebuild()
        return walked

    def _rebuild(self) -> None:
        live = []
        for rec in self._storages.values():
            for e in rec.entries:
                obj = e[0]()
                if obj is not None:
                    live.append((obj, e[1]))
                e[1] = -1  # retired: its weakref callback, when it comes, changes nothing
        self._storages, self._resized = {}, {}
        self._totals = [0] * len(CATEGORIES)
        for obj, rank in live:
            st = _storage(obj)
            self._add(obj, st, rank)
            self._resized[st._cdata] = self._storages[st._cdata]  # changed behind our back: re-read

    @contextmanager
    def saving_activations(self):
        """Count what autograd saves for backward as 'activation' while the block runs."""
        act = _RANK["activation"]

        def pack(t):
            h = _Saved(t)
            self._add(h, t, act)
            return h

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
                yield
        finally:
            self._stop_watch()

    def _start_watch(self) -> None:
        # The first step's backward passes only: every step repeats the same allocations, and
        # a watched backward costs (a Python call per aten operation, ~1,200 per gpt-small
        # backward) +4 % (DDP) to +20 % (FSDP2) of its step (benchmarks/bench_instrumentation.py).
        if self._watched_step is None:
            self._watched_step = self.step
        if (self.timeline_mode == TimelineMode.FULL and self._watch is None
                and (self.watch == "every" or self.step == self._watched_step)):
            self._watch = _BackwardWatch(self)
            self._watch.__enter__()

    def _stop_watch(self) -> None:
        if self._watch is not None:
            w, self._watch = self._watch, None
            w.__exit__(None, None, None)

    # ------------------------------------------------------------------ timeline
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def event(self, kind: EventKind, unit: int | None = None, *, note: str = "") -> Event | None:
        """A lifecycle point: the bytes by category now, the peak updated. With a minimal
        timeline only the report's events (forward end, optimizer step) are kept and sent;
        the others update the peak and leave nothing behind."""
        kind = _kind(kind)
        b = self._exact() if kind in REPORT_EVENTS else self.running_bytes()
        ev = Event(self.now(), kind, self.step, b, unit=unit, note=note)
        total = sum(b.values())
        if total > self.peak:
            self.peak, self.peak_label, self.peak_bytes = total, ev.label, b
        if kind is EventKind.FORWARD_END:
            self.activation_bytes = b["activation"]
        if self.timeline_mode != TimelineMode.FULL and kind not in REPORT_EVENTS:
            return None
        self.events.append(ev)
        if self.sink is not None:
            self.sink({"type": "event", "rank": self.rank, **ev.plain()})
        return ev

    def mark(self, kind: EventKind, *, bucket: int | None = None, block: int | None = None,
             unit: int | None = None, micro: int | None = None) -> None:
        """A point in time with no memory change worth measuring (e.g. backward's end).
        BACKWARD_BEGIN inside `saving_activations` starts watching backward's tensors
        (full timeline); the block's end stops it."""
        kind = _kind(kind)
        self.marks.append(Event(self.now(), kind, self.step, unit=unit, bucket=bucket, block=block, micro=micro))
        if kind is EventKind.BACKWARD_BEGIN:
            self._start_watch()
        elif kind is EventKind.BACKWARD_END:
            self._stop_watch()

    def begin_step(self, step: int) -> None:
        self.step = step
        if self.wire is not None:
            self._wire_start = self.wire.snapshot()
        self.mark(EventKind.STEP_BEGIN)
        self._step_start = self.now()

    def end_step(self) -> None:
        """The step's optimizer update is done: its window closes (the runner calls this)."""
        if self._step_start is not None:
            self.step_windows.append((self.step, self._step_start, self.now()))
            self._step_start = None

    def add_wait(self, t0: float, t1: float) -> None:
        """This rank's thread waited for communication from t0 to t1 (`comm`)."""
        if t1 > t0:
            self.waits.append((self.step, t0, t1))

    def time_report(self) -> TimeReport:
        """Every finished step's time split (`reports.StepTime`), read from the step windows,
        the waits and the collectives' start and end times."""
        out = []
        for step, a, b in self.step_windows:
            waits = [(max(a, s), min(b, e)) for st, s, e in self.waits if st == step]
            by_axis: dict[str, list] = {}
            for r in self.comm:
                if r.step == step and r.t_end is not None and r.t_end > r.t_start:
                    by_axis.setdefault(r.axis, []).append((max(a, r.t_start), min(b, r.t_end)))
            exposed = _union(waits)
            out.append(StepTime(step, b - a, (b - a) - exposed, exposed,
                                {ax: _union(iv) for ax, iv in sorted(by_axis.items())}, start=a))
        return TimeReport(out)

    def record_model_states(self) -> dict[str, int]:
        """Call at the optimizer step, when param, grad and optimizer state are all alive."""
        b = self.event(EventKind.OPTIMIZER_STEP).bytes  # kept in either timeline mode
        self.model_state_bytes = {c: b[c] for c in MODEL_STATE}
        return self.model_state_bytes

    # ------------------------------------------------------------------ communication
    def add_comm(self, rec: CommRecord) -> None:
        self.comm.append(rec)

    def add_wire_window(self, recs: list[CommRecord], sent: int) -> None:
        """Bytes measured on the wire while `recs` (and nothing else) were in flight."""
        self.wire_windows.append((recs[0].step, frozenset(r.op for r in recs), sent))

    def comm_by_collective(self, step: int | None = None) -> dict[str, Fraction]:
        step = self.step if step is None else step
        out: dict[str, Fraction] = {}
        for r in self.comm:
            if r.step == step:
                out[r.op] = out.get(r.op, Fraction(0)) + r.sent
        return out

    def comm_by_axis(self, step: int | None = None) -> dict[str, dict[str, Fraction]]:
        step = self.step if step is None else step
        out: dict[str, dict[str, Fraction]] = {}
        for r in self.comm:
            if r.step == step:
                d = out.setdefault(r.axis, {})
                d[r.op] = d.get(r.op, Fraction(0)) + r.sent
        return out

    # ------------------------------------------------------------------ report
    def measured(self) -> Measured:
        """The report's `measured` block: model states at the last optimizer step + comm of that step."""
        b = self.model_state_bytes
        optim = sum(b.get(c, 0) for c in OPTIM_PARTS)
        return Measured(
            param=b.get("param", 0), grad=b.get("grad", 0), optim=optim,
            total=b.get("param", 0) + b.get("grad", 0) + optim,
            optim_detail={c: b.get(c, 0) for c in OPTIM_PARTS},
            # What autograd saved for backward at the last forward/backward boundary.
            activations=self.activation_bytes,
            # Zero-byte entries (a group of one) are dropped, as in the prediction.
            comm={k: float(v) for k, v in sorted(self.comm_by_collective().items()) if v},
            comm_by_axis={a: {k: float(v) for k, v in sorted(d.items()) if v}
                          for a, d in sorted(self.comm_by_axis().items()) if any(d.values())})

    def wire_report(self) -> WireReport:
        """Bytes this rank wrote to its sockets since the current step began (the last step,
        when called after training): per step, per mesh axis, and per collective where each
        collective of that kind ran alone."""
        method = ("kernel TCP counters of this rank's own sockets (getsockopt TCP_INFO: "
                  "tcpi_bytes_sent - tcpi_bytes_retrans + tcpi_notsent_bytes), the rendezvous "
                  "store's socket excluded; gloo's framing included, TCP/IP headers not")
        if self.wire is None or not getattr(self.wire, "available", False):
            reason = getattr(self.wire, "reason", "") or "no wire meter on this rank"
            return WireReport(sent=None, method=method, reason=reason)
        d = self.wire.sent_since(self._wire_start)
        by_axis: dict[str, int] = {}
        for label, b in d.per_label.items():
            # Sockets are labelled with the axis that opened them (`RankContext.axes`); the world
            # group's carry the mesh's axis that runs on it, if one does.
            ax = (label if label != WORLD or self.mesh is None else self.mesh.world_group_axis) or "other"
            by_axis[ax] = by_axis.get(ax, 0) + b
        recs = [r for r in self.comm if r.step == self.step]
        # A kind of collective is measured on its own when every window it was in held only it.
        by_op: dict[str, int | None] = {}
        for step, kinds, sent in self.wire_windows:
            if step != self.step:
                continue
            for op in kinds:
                prev = by_op.get(op, 0)
                by_op[op] = prev + sent if prev is not None and len(kinds) == 1 else None
        return WireReport(sent=d.sent, method=method, by_axis=dict(sorted(by_axis.items())),
                          by_collective={k: v for k, v in sorted(by_op.items()) if v is not None},
                          messages=sum(r.messages for r in recs), complete=d.complete, retransmitted=d.retrans)

    def timeline(self) -> Timeline:
        # copies: the ledger goes on recording; the report's collectives hold plain bytes and tags
        return Timeline(events=[replace(e, bytes=None if e.bytes is None else dict(e.bytes)) for e in self.events],
                        marks=list(self.marks), comm=[r.settled() for r in self.comm], origin=self.t0,
                        origin_ns=time.time_ns() - round((time.perf_counter() - self.t0) * 1e9))
