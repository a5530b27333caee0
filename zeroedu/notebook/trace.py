"""A run's timelines as a Chrome trace: what a GPU user opens in Perfetto or chrome://tracing,
and what Holistic Trace Analysis reads.

The shape is torch.profiler's `export_chrome_trace` (torch 2.13): the same top-level keys
(`schemaVersion`, `deviceProperties`, `trace_id`, `profile_memory`, `host_name`,
`displayTimeUnit`, `baseTimeNanoseconds`, `traceEvents`, `traceName`), times in microseconds,
`M` metadata events naming processes and threads, `X` slices with `dur`. Per rank:

* one process (`pid` = rank, `process_name` "rank r");
* a **compute** track (`tid` 0): one slice per step, named as torch.profiler names it
  (`ProfilerStep#k`, category `user_annotation`), and inside it forward, backward and the
  optimizer step (from the ledger's marks; with K micro-batches, K forward/backward pairs);
  the ledger's lifecycle events (unshard, reshard, bucket ready ...) as instant events `i`;
* one track per **communication axis** (`comm dp_shard`, `comm dp_outer`, `comm world`): every
  collective the ledger recorded, once, from its issue to its end, named by collective and tag,
  with `bytes` (its payload), `sent` (this rank's bytes, ring model), `axis`, `step`, `unit` and
  whether it blocked, in `args`. Collectives in flight together on one axis (queued buckets)
  go on further tracks of that axis ("comm dp_shard #2"), since slices on one track must nest;
* memory as a **counter** track (`C` events named "memory"), one series per category, whose
  values are the ledger's bytes at each lifecycle event. (torch.profiler writes memory as
  instant events named `[memory]`, one per allocation; a counter draws as a stacked area.)

`write(report, path)`: a file, all ranks in one trace, lined up on the machine's monotonic
clock. `write(report, dir, per_rank=True)`: one file per rank, `rank<r>.json`, each with a
top-level `"distributedInfo": {"rank": r, "world_size": W, "backend": ...}`, the layout Holistic
Trace Analysis reads (a directory of one trace per rank). A run recorded with
`timeline="minimal"` has no lifecycle events to draw: the trace says so and keeps what there is.
"""
from __future__ import annotations

import json
import os
import socket
import uuid

from ..kinds import CATEGORIES, EventKind
from ..reports import RankReport, RunReport

COMPUTE_TID = 0


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _meta(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": args}


def _compute_slices(r: RankReport, shift: float) -> list[dict]:
    """Steps, and forward / backward / optimizer inside each, on the compute track."""
    out = []
    marks = sorted(r.timeline.marks, key=lambda m: m.t)
    for st in r.time.steps:
        a, b = st.start, st.start + st.seconds
        # torch.profiler's name for a step (`prof.step()`), by which Holistic Trace Analysis finds iterations
        ev = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{st.step}", "pid": r.rank, "tid": COMPUTE_TID,
              "ts": _us(a + shift), "dur": _us(b - a),
              "args": {"step": st.step, "compute_s": st.compute, "exposed_s": st.exposed}}
        out.append(ev)
        t, k = a, 0
        for m in marks:
            if m.step != st.step or not a <= m.t <= b:
                continue
            if m.kind == EventKind.BACKWARD_BEGIN:
                out.append(_slice(r.rank, f"forward {k}" if k else "forward", "forward", t, m.t, shift, st.step))
                t = m.t
            elif m.kind == EventKind.BACKWARD_END:
                out.append(_slice(r.rank, f"backward {k}" if k else "backward", "backward", t, m.t, shift, st.step))
                t, k = m.t, k + 1
        if k:
            out.append(_slice(r.rank, "optimizer step", "optimizer", t, b, shift, st.step))
    return out


def _slice(pid, name, cat, a, b, shift, step) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": COMPUTE_TID, "ts": _us(a + shift),
            "dur": _us(max(0.0, b - a)), "args": {"step": step}}


def _comm_slices(r: RankReport, shift: float) -> tuple[list[dict], list[dict]]:
    """Every collective once, on its axis's tracks; and the tracks' metadata."""
    lanes: dict[str, list[float]] = {}  # axis -> end of the last slice on each of its tracks
    tids: dict[tuple[str, int], int] = {}
    out = []
    for c in sorted((c for c in r.timeline.comm if c.t_end is not None), key=lambda c: c.t_start):
        ends = lanes.setdefault(c.axis, [])
        lane = next((i for i, e in enumerate(ends) if e <= c.t_start), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = c.t_end
        tid = tids.setdefault((c.axis, lane), len(tids) + 1)
        out.append({"ph": "X", "cat": "collective", "name": f"{c.op} {c.tag}", "pid": r.rank, "tid": tid,
                    "ts": _us(c.t_start + shift), "dur": _us(c.t_end - c.t_start),
                    "args": {"collective": c.op, "bytes": c.payload, "sent": c.sent, "axis": c.axis,
                             "group_size": c.group_size, "step": c.step, "unit": c.unit,
                             "blocking": c.blocking, "implementation": c.implementation}})
    meta = []
    for (axis, lane), tid in sorted(tids.items(), key=lambda kv: kv[1]):
        meta.append(_meta(r.rank, tid, "thread_name", {"name": f"comm {axis}" + (f" #{lane + 1}" if lane else "")}))
        meta.append(_meta(r.rank, tid, "thread_sort_index", {"sort_index": tid}))
    return out, meta


def _memory(r: RankReport, shift: float) -> list[dict]:
    """The ledger's bytes by category at each lifecycle event, as a counter track."""
    return [{"ph": "C", "name": "memory", "pid": r.rank, "tid": COMPUTE_TID, "ts": _us(e.t + shift),
             "args": {c: e.bytes.get(c, 0) for c in CATEGORIES}}
            for e in r.timeline.events if e.bytes is not None]


def _instants(r: RankReport, shift: float) -> list[dict]:
    return [{"ph": "i", "cat": "lifecycle", "s": "t", "pid": r.rank, "tid": COMPUTE_TID,
             "name": EventKind(e.kind).label(unit=e.unit, bucket=e.bucket, block=e.block),
             "ts": _us(e.t + shift), "args": {"step": e.step, "unit": e.unit, "bucket": e.bucket}}
            for e in r.timeline.events]


def rank_events(r: RankReport, shift: float) -> list[dict]:
    """One rank's trace events; `shift` (seconds) moves its timeline onto the trace's clock."""
    comm, comm_meta = _comm_slices(r, shift)
    meta = [_meta(r.rank, 0, "process_name", {"name": f"rank {r.rank}"}),
            _meta(r.rank, 0, "process_labels", {"labels": "CPU"}),
            _meta(r.rank, 0, "process_sort_index", {"sort_index": r.rank}),
            _meta(r.rank, COMPUTE_TID, "thread_name", {"name": "compute"}),
            _meta(r.rank, COMPUTE_TID, "thread_sort_index", {"sort_index": 0}), *comm_meta]
    return meta + _compute_slices(r, shift) + _instants(r, shift) + comm + _memory(r, shift)


def trace(report: RunReport, ranks: list[RankReport] | None = None, name: str = "") -> dict:
    """The Chrome trace of `ranks` (default: every rank), lined up on the earliest timeline."""
    ranks = report.ranks if ranks is None else ranks
    zero = min(r.timeline.origin for r in report.ranks)
    events = []
    for r in ranks:
        events += rank_events(r, r.timeline.origin - zero)
    first = min(report.ranks, key=lambda r: r.timeline.origin)
    return {"schemaVersion": 1, "deviceProperties": [], "trace_id": uuid.uuid4().hex.upper(),
            "profile_memory": 1, "host_name": socket.gethostname(), "displayTimeUnit": "ms",
            "baseTimeNanoseconds": first.timeline.origin_ns, "traceEvents": events, "traceName": name}


def write(report: RunReport, path: str, per_rank: bool = False) -> list[str]:
    """Write the trace to `path` (one file), or with `per_rank` one file per rank in the folder
    `path`, each with the `distributedInfo` Holistic Trace Analysis reads. Returns the files."""
    if not per_rank:
        with open(path, "w") as f:
            json.dump(trace(report, name=path), f, allow_nan=False)
        return [path]
    os.makedirs(path, exist_ok=True)
    out = []
    for r in report.ranks:
        p = os.path.join(path, f"rank{r.rank}.json")
        d = trace(report, [r], name=p)
        d["distributedInfo"] = {"rank": r.rank, "world_size": report.world_size, "backend": report.backend}
        with open(p, "w") as f:
            json.dump(d, f, allow_nan=False)
        out.append(p)
    return out
