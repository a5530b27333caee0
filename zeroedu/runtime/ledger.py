"""The ledger: what one rank holds and what it sends, measured, as plain picklable data.

All instrumentation of the suite lives here and in `zeroedu.runtime.comm`; strategies only *tell* the
ledger what a tensor is (``ledger.track(t, "grad")``) and *mark* lifecycle points
(``ledger.event("unit 3 all-gather")``). The ledger then measures.

Memory
    Bytes are counted from real tensor storages, never from shapes: a tracked tensor contributes
    ``untyped_storage().nbytes()``, each storage once (views of one flat buffer share a storage).
    A storage reached from two categories is charged to the first in `CATEGORIES` order, so a
    fp32 master that *is* the parameter is not counted twice. Freed memory really disappears:
    a storage resized to 0 (how FSDP frees an unsharded parameter while autograd still holds the
    tensor object) counts 0, and a dead tensor is dropped through its weak reference.
    Activations are the tensors autograd saves for backward, seen through
    `torch.autograd.graph.saved_tensors_hooks` (`Ledger.saving_activations`).

Model states
    ``model_states()`` is taken at the optimizer step, when parameters, gradients and optimizer
    state are all alive; that is what the closed forms in `zeroedu.theory` predict.

Activations
    The bytes in category "activation" at the forward/backward boundary (the ``forward end``
    event: loss computed, backward not started) of the last micro-batch: what autograd keeps
    for one micro-batch's backward, which `zeroedu.theory.activations` predicts.

Timeline
    ``event(label)`` appends (time, label, bytes by category) and updates the peak. The peak is
    the largest total seen at an event: strategies emit one at every lifecycle step that changes
    what they hold (unshard, reshard, buffer allocated or freed). Short-lived temporaries inside
    one operation (autograd's gradients of activations, an fp32 cast of a gradient inside the
    optimizer) are not tracked, so torch's own tracker, which sees every allocation, reads a
    somewhat higher peak; `tests/test_fsdp.py` bounds that margin. Events can be streamed to the
    parent while a job runs (``sink``), for live plots.

Communication
    `zeroedu.runtime.comm` appends a `CommRecord` per collective: op, tag, mesh axis, group size, payload
    bytes, bytes this rank sends under the ring model (an exact `Fraction`), and when it started
    and finished.
"""
from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Callable

import torch

# Lifecycle marks that other code reads back (`analysis`, the figures): each name written once.
BACKWARD_BEGIN = "backward begin"
BACKWARD_END = "backward end"
GRADS_SYNCED = "grads synced"
FORWARD_END = "forward end"
OPTIMIZER_STEP = "optimizer step"
STEP_END = "step end"

# Model-state categories first (their order is the charging precedence), then transient ones.
MODEL_STATE = ("param", "grad", "master", "main_grad", "m", "v")
OPTIM_PARTS = ("master", "main_grad", "m", "v")
TRANSIENT = ("gathered", "comm_buffer", "activation")
CATEGORIES = MODEL_STATE + TRANSIENT


@dataclass
class CommRecord:
    op: str
    tag: str
    axis: str
    group_size: int
    payload: int  # bytes of the full logical tensor (all-reduce input, all-gather output, ...)
    sent: Fraction  # bytes this rank sends, ring model
    step: int
    t_start: float
    t_end: float | None = None
    implementation: str = "backend"  # "ring" (zeroedu's) or "backend" (torch's)
    messages: int = 0  # point-to-point messages this rank sends in it (gloo framing: 144 B each)
    wire: int | None = None  # bytes measured on this rank's sockets, when it ran alone

    def plain(self) -> dict:
        d = asdict(self)
        d["sent"] = float(self.sent)
        return d


@dataclass
class Event:
    t: float
    label: str
    step: int
    bytes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


class _Saved:
    """Holder for one tensor autograd saved for backward; dies when autograd releases it."""

    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


@dataclass
class Ledger:
    rank: int = 0
    sink: Callable[[dict], None] | None = None
    wire: Any = None  # a zeroedu.runtime.wire.WireMeter, or None
    wire_axes: dict = field(default_factory=dict)  # socket label -> mesh axis name
    step: int = -1  # -1: set-up, before the first training step
    t0: float = field(default_factory=time.perf_counter)
    events: list[Event] = field(default_factory=list)
    comm: list[CommRecord] = field(default_factory=list)
    wire_windows: list = field(default_factory=list)  # (step, kinds of collective, bytes)
    marks: list[tuple[float, str, int]] = field(default_factory=list)
    model_state_bytes: dict[str, int] = field(default_factory=dict)
    activation_bytes: int = 0  # activations at the last forward/backward boundary (one micro-batch)
    peak: int = 0
    peak_label: str = ""

    def __post_init__(self):
        self._tracked: list[tuple[weakref.ref, str]] = []
        self._wire_start = None  # the meter's reading at the start of the current step

    # ------------------------------------------------------------------ memory
    def track(self, tensor: torch.Tensor, category: str) -> torch.Tensor:
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {CATEGORIES}")
        self._tracked.append((weakref.ref(tensor), category))
        return tensor

    def bytes_by_category(self) -> dict[str, int]:
        seen: dict[int, str] = {}
        sizes: dict[int, int] = {}
        alive = []
        rank_of = {c: i for i, c in enumerate(CATEGORIES)}
        for ref, cat in self._tracked:
            obj = ref()
            if obj is None:
                continue
            alive.append((ref, cat))
            t = obj.t if isinstance(obj, _Saved) else obj
            st = t.untyped_storage()
            key = st.data_ptr()
            nbytes = st.nbytes()
            if nbytes == 0:
                continue
            if key not in seen or rank_of[cat] < rank_of[seen[key]]:
                seen[key] = cat
            sizes[key] = max(sizes.get(key, 0), nbytes)
        self._tracked = alive
        out = {c: 0 for c in CATEGORIES}
        for key, cat in seen.items():
            out[cat] += sizes[key]
        return out

    @contextmanager
    def saving_activations(self):
        """Count what autograd saves for backward as 'activation' while the block runs."""

        def pack(t):
            h = _Saved(t)
            self._tracked.append((weakref.ref(h), "activation"))
            return h

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
            yield

    # ------------------------------------------------------------------ timeline
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def event(self, label: str) -> Event:
        ev = Event(self.now(), label, self.step, self.bytes_by_category())
        self.events.append(ev)
        if label == FORWARD_END:
            self.activation_bytes = ev.bytes["activation"]
        if ev.total > self.peak:
            self.peak, self.peak_label = ev.total, label
        if self.sink is not None:
            self.sink({"kind": "event", "rank": self.rank, "t": ev.t, "label": label,
                       "step": ev.step, "bytes": ev.bytes})
        return ev

    def mark(self, label: str) -> None:
        """A point in time with no memory change worth measuring (e.g. 'backward end')."""
        self.marks.append((self.now(), label, self.step))

    def begin_step(self, step: int) -> None:
        self.step = step
        if self.wire is not None:
            self._wire_start = self.wire.snapshot()
        self.mark(f"step {step} begin")

    def record_model_states(self) -> dict[str, int]:
        """Call at the optimizer step, when param, grad and optimizer state are all alive."""
        b = self.bytes_by_category()
        self.model_state_bytes = {c: b[c] for c in MODEL_STATE}
        self.event(OPTIMIZER_STEP)
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
    def measured(self) -> dict[str, Any]:
        """The report's `measured` block: model states at the last optimizer step + comm of that step."""
        b = self.model_state_bytes
        optim = sum(b.get(c, 0) for c in OPTIM_PARTS)
        return {
            "param": b.get("param", 0),
            "grad": b.get("grad", 0),
            "optim": optim,
            "total": b.get("param", 0) + b.get("grad", 0) + optim,
            "optim_detail": {c: b.get(c, 0) for c in OPTIM_PARTS},
            # What autograd saved for backward at the last forward/backward boundary.
            "activations": self.activation_bytes,
            # Zero-byte entries (a group of one) are dropped, as in the prediction.
            "comm": {k: float(v) for k, v in sorted(self.comm_by_collective().items()) if v},
            "comm_by_axis": {a: {k: float(v) for k, v in sorted(d.items()) if v}
                             for a, d in sorted(self.comm_by_axis().items()) if any(d.values())},
        }

    def wire_report(self) -> dict[str, Any]:
        """Bytes this rank wrote to its sockets since the current step began (the last step,
        when called after training): per step, per mesh axis, and per collective where each
        collective of that kind ran alone."""
        method = ("kernel TCP counters of this rank's own sockets (getsockopt TCP_INFO: "
                  "tcpi_bytes_sent - tcpi_bytes_retrans + tcpi_notsent_bytes), the rendezvous "
                  "store's socket excluded; gloo's framing included, TCP/IP headers not")
        if self.wire is None or not getattr(self.wire, "available", False):
            reason = getattr(self.wire, "reason", "") or "no wire meter on this rank"
            return {"sent": None, "method": method, "reason": reason}
        d = self.wire.sent_since(self._wire_start)
        by_axis: dict[str, int] = {}
        for label, b in d.per_label.items():
            ax = self.wire_axes.get(label, label or "other")
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
        return {"sent": d.sent, "method": method, "by_axis": dict(sorted(by_axis.items())),
                "by_collective": {k: v for k, v in sorted(by_op.items()) if v is not None},
                "messages": sum(r.messages for r in recs), "complete": d.complete,
                "retransmitted": d.retrans}

    def timeline(self) -> dict[str, Any]:
        return {
            "events": [{"t": e.t, "label": e.label, "step": e.step, "bytes": e.bytes} for e in self.events],
            "marks": [{"t": t, "label": lab, "step": s} for t, lab, s in self.marks],
            "comm": [r.plain() for r in self.comm],
        }
