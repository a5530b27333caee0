"""Read a rank's timeline (`Ledger.timeline()`): how much gradient communication hid behind backward.

The timeline holds marks ("backward begin", "backward end", one pair per backward pass, so K
pairs per step with gradient accumulation) and one record per collective with its start and
end time, taken when the collective really finished (see `zeroedu.runtime.comm.Handle`).

    overlap fraction = |async comm ∩ backward| / |comm|

where comm is the union-free sum of the intervals of the step's gradient reductions
(all_reduce and reduce_scatter) and backward the step's backward windows. Only collectives
issued asynchronously count as hidden: a synchronous one that runs inside backward (FSDP's
reduce-scatter in a post-backward hook) stops backward until it is done, so nothing overlaps
it. Every gradient reduction of the step is in the denominator, also one launched after
backward: naive DDP, which all-reduces after backward, scores 0; bucketed DDP, ZeRO-2 and the
FSDP strategies with an asynchronous reduce-scatter, which launch during backward, score above
0. (When every reduction is asynchronous and launched inside backward, this equals the
fraction of the time of "collectives launched in backward" that lies inside backward.)
It is a measurement, noisy like any wall-clock time; the byte counts are the exact numbers.
"""
from __future__ import annotations

from ..reports import CommRecord, Timeline
from ..kinds import EventKind

GRAD_OPS = ("all_reduce", "reduce_scatter")


def backward_windows(timeline: Timeline, step: int | None = None) -> list[tuple[float, float]]:
    """(begin, end) of every backward pass in `step` (all steps when None)."""
    out, begin = [], None
    for m in sorted(timeline.marks, key=lambda m: m.t):
        if step is not None and m.step != step:
            continue
        if m.kind == EventKind.BACKWARD_BEGIN:
            begin = m.t
        elif m.kind == EventKind.BACKWARD_END and begin is not None:
            out.append((begin, m.t))
            begin = None
    return out


def grad_comm(timeline: Timeline, step: int | None = None, ops=GRAD_OPS) -> list[CommRecord]:
    """The step's gradient-reduction records that finished (all steps when None)."""
    return [c for c in timeline.comm if c.op in ops and c.t_end is not None
            and (step is None or c.step == step)]


def _inside(a: float, b: float, windows) -> float:
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in windows)


def overlapped_by_backward(timeline: Timeline, step: int, progress_kinds, ops=GRAD_OPS) -> int:
    """How many of the step's gradient reductions had backward computation run while they were
    in flight: a `progress_kinds` event (a later unit's gradient arriving) between the
    reduction's launch (`t_start`) and the moment the caller first stopped for it (`waited`).
    Read from the timeline, not from how the reduction was issued: one launched asynchronously
    and waited for at once hid nothing. The reduction launched last in a backward pass has no
    backward left to hide behind, so a fully overlapped step scores one less than it has units."""
    kinds = {getattr(k, "value", k) for k in progress_kinds}
    marks = sorted(e.t for e in timeline.events if e.step == step and e.kind in kinds)
    n = 0
    for c in grad_comm(timeline, step, ops):
        end = c.waited if c.waited is not None else c.t_end
        if any(c.t_start < t < end for t in marks):
            n += 1
    return n


def overlap_fraction(timeline: Timeline, step: int | None = None, ops=GRAD_OPS) -> float | None:
    """Fraction of gradient-reduction time hidden behind backward (asynchronous collectives
    inside a backward window); None if no such time was spent
    (one rank: collectives of a group of one take no time)."""
    steps = sorted({c.step for c in grad_comm(timeline, step, ops)})
    total = inside = 0.0
    for s in steps:
        windows = backward_windows(timeline, s)
        for c in grad_comm(timeline, s, ops):
            total += c.t_end - c.t_start
            if not c.blocking:
                inside += _inside(c.t_start, c.t_end, windows)
    return inside / total if total > 0 else None


def launched_in_backward(timeline: Timeline, step: int | None = None, ops=GRAD_OPS) -> int:
    """How many gradient reductions started before their backward pass ended."""
    n = 0
    for s in sorted({c.step for c in grad_comm(timeline, step, ops)}):
        windows = backward_windows(timeline, s)
        n += sum(1 for c in grad_comm(timeline, s, ops) if any(b <= c.t_start <= e for b, e in windows))
    return n
