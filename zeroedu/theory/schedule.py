"""Step time from a schedule: a small event simulator, one compute stream and one communication
stream per mesh axis.

A strategy's step is a program the rank runs top to bottom on its compute stream:

    Compute(name, seconds)                 the rank computes (a unit's forward, a bucket's share
                                           of backward, the optimizer step)
    Issue(name, collective, bytes, axis)   hands a collective to `axis`'s stream and goes on at
                                           once (asynchronous, as NCCL on its own stream)
    Wait(names)                            stops the compute stream until those collectives end
    Block(name, collective, bytes, axis)   Issue followed by Wait: a blocking collective

Each axis's stream runs its collectives one after another in issue order, as one link carries
one message at a time: a collective starts at max(when it was issued, when the previous one on
its axis ended, when the collectives it waits `after` ended) and lasts its ring time,
`timing.ring_time` with the axis's α and β: (g-1) steps of α + S/(g·β) for a reduce-scatter or
an all-gather, 2(g-1) for an all-reduce. Collectives on different axes run at the same time
(HSDP's dp_outer all-reduce beside the next dp_shard reduce-scatter). The step ends when the
compute stream reaches the end of its program; every collective must have been waited for by
then (the optimizer step needs every reduction).

    >>> link = {"dp_shard": Link(alpha=0, beta=1e6)}
    >>> simulate([Compute("backward", 3), Block("grads", "all_reduce", 1e6, "dp_shard", group=2)],
    ...          link).seconds
    4.0

`simulate` returns the step time and, per operation, when it started and ended, so a figure can
draw the two streams and a test can check a schedule by hand. Which schedule a strategy runs
(where its collectives are issued and waited) is stated in its module's docstring; `ddp` and
`fsdp` below write two of them out.

A run's own schedule is read from its timeline (`replay`): the ledger records where each
collective was issued and where the rank first stopped for it, and the compute between. So a
step can be predicted on a link it never ran on (`predict`, `zeroedu.train.run(predict=True)`):
a calibration run on links that cost nothing gives the compute and what moving each
collective's bytes takes the machine itself; each collective then takes the link's ring time
or that, whichever is longer (a paced message is held until the link would have delivered it,
so the machine's own time hides inside the link's), and the simulator replays the step.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..reports import CommRecord
from .timing import ring_time


@dataclass(frozen=True)
class Link:
    """An axis's link for the simulator: α seconds per ring step, β bytes per second."""
    alpha: float
    beta: float


@dataclass(frozen=True)
class Compute:
    name: str
    seconds: float


@dataclass(frozen=True)
class Issue:
    """An asynchronous collective of `nbytes` (its payload: the buffer it reduces or gathers)
    over `group` ranks of `axis`; it starts no earlier than the collectives named in `after`."""
    name: str
    collective: str
    nbytes: float
    axis: str
    group: int
    after: tuple[str, ...] = ()
    seconds: float | None = None  # its time when known rather than modelled (an axis with no link)
    floor: float = 0.0  # what moving the bytes takes the machine itself: the modelled time, if longer


@dataclass(frozen=True)
class Wait:
    names: tuple[str, ...]

    def __init__(self, *names: str):
        object.__setattr__(self, "names", tuple(names))


def Block(name: str, collective: str, nbytes: float, axis: str, group: int,
          after: tuple[str, ...] = ()) -> list:
    """A blocking collective: issued, then waited for at once."""
    return [Issue(name, collective, nbytes, axis, group, after), Wait(name)]


@dataclass(frozen=True)
class Span:
    """When an operation ran: `stream` is "compute" or an axis name."""
    name: str
    stream: str
    start: float
    end: float


@dataclass
class Result:
    seconds: float  # the step: when the compute stream reached the end of its program
    spans: list[Span] = field(default_factory=list)

    @property
    def compute(self) -> float:
        return sum(s.end - s.start for s in self.spans if s.stream == "compute")

    @property
    def exposed(self) -> float:
        """Time the compute stream stood waiting for communication."""
        return self.seconds - self.compute

    def comm(self, axis: str) -> float:
        return sum(s.end - s.start for s in self.spans if s.stream == axis)

    def span(self, name: str) -> Span:
        return next(s for s in self.spans if s.name == name)


def _flatten(program) -> list:
    out = []
    for op in program:
        out.extend(_flatten(op) if isinstance(op, (list, tuple)) else [op])
    return out


def simulate(program, links: dict[str, Link]) -> Result:
    """Run `program` (Compute / Issue / Wait / Block, nested lists allowed) on one compute
    stream and one stream per axis; see the module docstring for the rules."""
    t = 0.0  # the compute stream's clock
    free: dict[str, float] = {}  # when each axis's stream is free again
    ends: dict[str, float] = {}  # collective name -> end time
    spans: list[Span] = []
    pending: set[str] = set()
    for op in _flatten(program):
        if isinstance(op, Compute):
            if op.seconds < 0:
                raise ValueError(f"{op.name}: negative compute time {op.seconds}")
            spans.append(Span(op.name, "compute", t, t + op.seconds))
            t += op.seconds
        elif isinstance(op, Issue):
            if op.name in ends:
                raise ValueError(f"two collectives named {op.name!r}")
            if op.seconds is None and op.axis not in links:
                raise ValueError(f"{op.name}: no link for axis {op.axis!r} (links: {sorted(links)})")
            missing = [a for a in op.after if a not in ends]
            if missing:
                raise ValueError(f"{op.name} waits after {missing}, not issued before it")
            start = max([t, free.get(op.axis, 0.0)] + [ends[a] for a in op.after])
            end = start + (op.seconds if op.seconds is not None else max(op.floor, _time(op, links[op.axis])))
            free[op.axis] = ends[op.name] = end
            pending.add(op.name)
            spans.append(Span(op.name, op.axis, start, end))
        elif isinstance(op, Wait):
            unknown = [n for n in op.names if n not in ends]
            if unknown:
                raise ValueError(f"waits for {unknown}, never issued")
            t = max([t] + [ends[n] for n in op.names])
            pending -= set(op.names)
        else:
            raise TypeError(f"not a schedule operation: {op!r}")
    if pending:
        raise ValueError(f"the step ends with collectives never waited for: {sorted(pending)}")
    return Result(t, spans)


def _time(op: Issue, link: Link) -> float:
    """A collective on its link: a ring collective's steps (`timing.ring_time`); a point-to-point
    message α + bytes/β, paid by the receiver (the sender's isend returns at once)."""
    if op.group <= 1 or op.nbytes <= 0 or op.collective in ("send", "broadcast"):
        return 0.0
    if op.collective == "recv":
        return link.alpha + op.nbytes / link.beta
    return ring_time(op.collective, op.nbytes, op.group, link.beta, link.alpha)


# --------------------------------------------------------------------------- a recorded schedule
def _union_before(intervals: list[tuple[float, float]], t: float) -> float:
    """Length of the union of `intervals` (sorted by start) that lies before t."""
    total, reach = 0.0, float("-inf")
    for a, b in intervals:
        a, b = max(a, reach), min(b, t)
        if b > a:
            total += b - a
        reach = max(reach, min(b, t))
    return total


def replay(comm: list[CommRecord], step: int, start: float, end: float, recorded: frozenset = frozenset(),
           transport: bool = False) -> list:
    """The program one rank ran in one step, read from its timeline (`Timeline.comm`, the
    ledger's records: where each collective was issued, `t_start`, and where the rank first
    stopped for it, `waited`), with the step's window [start, end] (`StepTime`): compute
    segments are the time between those points less the time the rank stood waiting (from
    `waited` to the collective's end), so they hold what the rank computed, whatever the link
    was. A collective never waited for is waited for at the step's end.

    What each collective took is read too: from when its axis's stream could start it (its
    issue, or the end of the one before it on the axis) to its end. `recorded`: axes whose
    collectives keep that time instead of a modelled one (an axis with no link). `transport`:
    every other collective gets it as its `floor` (a calibration run on links that cost nothing
    took only what moving the bytes costs this machine): an emulated link holds each message
    until the link would have delivered it, so the machine's own time hides inside the link's
    unless it is longer."""
    recs = [r for r in comm if r.step == step]
    clamp = lambda t: min(max(t, start), end)  # noqa: E731
    waits = sorted((clamp(r.waited), clamp(max(r.waited, r.t_end or r.waited)))
                   for r in recs if r.waited is not None)
    clock = lambda t: (t - start) - _union_before(waits, t)  # noqa: E731 - compute time since start
    took, free = {}, {}
    for k in sorted(range(len(recs)), key=lambda k: recs[k].t_start):
        r = recs[k]
        began = max(r.t_start, free.get(r.axis, r.t_start))
        end_k = max(began, r.t_end if r.t_end is not None else began)
        took[k], free[r.axis] = end_k - began, end_k
    names = [f"{r.op} {k} ({r.tag})" for k, r in enumerate(recs)]
    points = []  # (time, 0 issue / 1 wait, order, op)
    for k, (r, name) in enumerate(zip(recs, names)):
        kept = r.axis in recorded
        points.append((clamp(r.t_start), 0, k, Issue(name, r.op, r.payload, r.axis, r.group_size,
                                                      seconds=took[k] if kept else None,
                                                      floor=took[k] if transport and not kept else 0.0)))
        w = r.waited
        points.append((end if w is None else clamp(w), 1, k, Wait(name)))
    prog, at = [], start
    for t, _, k, op in sorted(points, key=lambda p: p[:3]):
        if clock(t) > clock(at):
            prog.append(Compute(f"compute to {op.names[0] if isinstance(op, Wait) else op.name}", clock(t) - clock(at)))
        prog.append(op)
        at = t
    if clock(end) > clock(at):
        prog.append(Compute("to the step's end", clock(end) - clock(at)))
    return prog


# --------------------------------------------------------------------------- strategies' schedules
def ddp(forward: float, backward: list[float], bucket_bytes: list[float], optimizer: float, group: int,
        axis: str = "dp_shard", overlap: bool = True) -> list:
    """Bucketed DDP (`strategies.ddp_bucketed`): backward computes the buckets' gradients in
    order, segment i ending with bucket i's last gradient; with `overlap` each bucket's
    all-reduce is issued right then and backward goes on; the optimizer step waits for all of
    them. Without overlap every bucket is all-reduced after backward, blocking (naive DDP)."""
    if len(backward) != len(bucket_bytes):
        raise ValueError("one backward segment per bucket")
    names = [f"all_reduce bucket {i}" for i in range(len(bucket_bytes))]
    prog: list = [Compute("forward", forward)]
    for i, (sec, b) in enumerate(zip(backward, bucket_bytes)):
        prog.append(Compute(f"backward bucket {i}", sec))
        if overlap:
            prog.append(Issue(names[i], "all_reduce", b, axis, group))
    if not overlap:
        prog += [Block(n, "all_reduce", b, axis, group) for n, b in zip(names, bucket_bytes)]
    return prog + [Wait(*names), Compute("optimizer", optimizer)]


def fsdp(forward: list[float], backward: list[float], unit_bytes: list[float], optimizer: float,
         group: int, prefetch: bool = True, reshard_after_forward: bool = True, axis: str = "dp_shard",
         outer: int = 1, outer_axis: str = "dp_outer", grad_bytes: list[float] | None = None) -> list:
    """ZeRO-3 / FSDP over units 0..U-1 (`strategies.fsdp_units`), unit u's parameters
    `unit_bytes[u]` when gathered. Forward: each unit's all-gather, waited for before its
    compute; with `prefetch` the next unit's all-gather is issued as this unit starts computing.
    Backward, units in reverse: with `reshard_after_forward` each unit is gathered again
    (prefetched the same way), then its backward computes and its gradients' reduce-scatter is
    issued. With `outer` > 1 (HSDP) each reduce-scatter's shard is then all-reduced over
    `outer_axis`, starting when the reduce-scatter ends. The optimizer step waits for every
    reduction. `grad_bytes`: the gradients' bytes per unit when they differ from the
    parameters' (a recipe that reduces in another precision)."""
    u_count = len(unit_bytes)
    grad_bytes = unit_bytes if grad_bytes is None else grad_bytes
    if len(grad_bytes) != u_count:
        raise ValueError("one gradient size per unit")
    if not len(forward) == len(backward) == u_count:
        raise ValueError("one forward and one backward time per unit")
    prog: list = []

    def gathers(kind, order, compute):
        issued = set()
        for k, u in enumerate(order):
            name = f"all_gather {kind} unit {u}"
            if name not in issued:
                prog.append(Issue(name, "all_gather", unit_bytes[u], axis, group))
            prog.append(Wait(name))
            if prefetch and k + 1 < len(order):
                nxt = f"all_gather {kind} unit {order[k + 1]}"
                prog.append(Issue(nxt, "all_gather", unit_bytes[order[k + 1]], axis, group))
                issued.add(nxt)
            compute(u)

    reductions: list[str] = []

    def backward_unit(u):
        prog.append(Compute(f"backward unit {u}", backward[u]))
        rs = f"reduce_scatter unit {u}"
        prog.append(Issue(rs, "reduce_scatter", grad_bytes[u], axis, group))
        reductions.append(rs)
        if outer > 1:
            ar = f"all_reduce unit {u} over {outer_axis}"
            prog.append(Issue(ar, "all_reduce", grad_bytes[u] / group, outer_axis, outer, after=(rs,)))
            reductions.append(ar)

    gathers("forward", list(range(u_count)), lambda u: prog.append(Compute(f"forward unit {u}", forward[u])))
    if reshard_after_forward:
        gathers("backward", list(reversed(range(u_count))), backward_unit)
    else:
        for u in reversed(range(u_count)):
            backward_unit(u)
    return prog + [Wait(*reductions), Compute("optimizer", optimizer)]


def bound(program, links: dict[str, Link]) -> float:
    """The best step any schedule of `program`'s work could reach on `links`:

        max(P + X, H + C + T)

    P all its compute; X the communication no schedule can hide behind compute. A collective can
    start once its data exists: a reduction when the compute before its issue is done (its
    gradients), a parameter all-gather at the step's start (the shard is there; one issued after
    the last reduction, the gather of updated parameters, waits for the optimizer); it must end
    before the compute after its wait. With less compute in that stretch than the collective
    takes, the compute stream idles for the difference, whatever the schedule: the first unit's
    all-gather before the first layer, the last reduction between the last gradient and the
    optimizer. Stretches that do not overlap in program order idle at different times, so X is
    the largest sum over such stretches. C the time of one axis's collectives back to back (the
    busiest axis); H the compute before its first collective is issued (its data does not exist earlier: the
    first gradients, the first unit's shard) and T the compute after its last wait (the
    optimizer step needs every reduction). No overlap can hide more: compute runs one thing at
    a time, and so does a link. A measured step over this bound is the overlap's efficiency."""
    ops = _flatten(program)
    compute = [op for op in ops if isinstance(op, Compute)]
    p = sum(op.seconds for op in compute)
    first_issue = next((k for k, op in enumerate(ops) if isinstance(op, Issue)), None)
    if first_issue is None:
        return p
    last_wait = max(k for k, op in enumerate(ops) if isinstance(op, Wait))
    head = sum(op.seconds for op in ops[:first_issue] if isinstance(op, Compute))
    tail = sum(op.seconds for op in ops[last_wait:] if isinstance(op, Compute))

    def took(op: Issue) -> float:
        return op.seconds if op.seconds is not None else max(op.floor, _time(op, links[op.axis]))

    busy: dict[str, float] = {}
    for op in ops:
        if isinstance(op, Issue):
            busy[op.axis] = busy.get(op.axis, 0.0) + took(op)
    # X: each collective's stretch (from where its data exists to its wait) and the idle it
    # forces there, t - (compute in the stretch); then the heaviest set of stretches that do
    # not overlap in program order (weighted interval scheduling, stretches sorted by wait)
    last_reduction = max((k for k, op in enumerate(ops) if isinstance(op, Issue)
                          and op.collective != "all_gather"), default=-1)
    done, issued, windows = 0.0, {}, []
    for k, op in enumerate(ops):
        if isinstance(op, Compute):
            done += op.seconds
        elif isinstance(op, Issue):
            early = op.collective == "all_gather" and k < last_reduction  # a parameter shard
            issued[op.name] = (-1, 0.0, op) if early else (k, done, op)
        elif isinstance(op, Wait):
            for name in op.names:
                if name in issued:
                    i, ready, c = issued.pop(name)
                    if (w := took(c) - (done - ready)) > 0:
                        windows.append((i, k, w))
    windows.sort(key=lambda x: x[1])
    best = [0.0]  # best[j]: the heaviest set among the first j stretches
    for j, (i, _, w) in enumerate(windows):
        before = bisect.bisect_left([x[1] for x in windows[:j]], i)  # stretches waited before i
        best.append(max(best[j], best[before] + w))
    exposed = best[-1]
    return max(p + exposed, head + max(busy.values()) + tail)


@dataclass(frozen=True)
class Gap:
    """A stretch of a simulated step where one stream stood idle while the other ran: `wait`,
    the compute stream waiting for `on` (a collective); `idle`, an axis's link with nothing to
    carry before `next` (a collective whose data did not exist yet)."""
    kind: str
    start: float
    end: float
    on: str


def gaps(result: Result, axis: str) -> list[Gap]:
    """Where a simulated step loses time against the overlap bound: the compute stream's waits
    (each attributed to the collective whose end released it) and `axis`'s idle stretches
    between its first collective and its last (each before the collective that came next).
    A step reaches `bound` only when one of the two streams never pauses; these are the pauses."""
    comp = sorted((s for s in result.spans if s.stream == "compute"), key=lambda s: s.start)
    link = sorted((s for s in result.spans if s.stream == axis), key=lambda s: s.start)
    ends = {s.end: s.name for s in result.spans if s.stream != "compute"}
    out = []
    if comp and comp[0].start > 1e-12:  # the step opens waiting (the first unit's all-gather)
        out.append(Gap("wait", 0.0, comp[0].start, ends.get(comp[0].start, "communication")))
    for a, b in zip(comp, comp[1:]):
        if b.start > a.end + 1e-12:
            out.append(Gap("wait", a.end, b.start, ends.get(b.start, "communication")))
    if comp and result.seconds > comp[-1].end + 1e-12:
        out.append(Gap("wait", comp[-1].end, result.seconds, ends.get(result.seconds, "communication")))
    reach = link[0].end if link else 0.0
    for s in link[1:]:
        if s.start > reach + 1e-12:
            out.append(Gap("idle", reach, s.start, s.name))
        reach = max(reach, s.end)
    return sorted(out, key=lambda g: (g.start, g.kind))


def predict(comm: list[CommRecord], steps, links: dict[str, Link], transport: bool = False):
    """Each step of a calibration run (its timeline's records, its `reports.StepTime`s) replayed
    on `links` (by axis; an axis without one keeps its recorded times): the `StepTime` the
    schedule predicts there, with its compute, exposed communication and time per axis.
    `transport`: each collective takes at least what it took in the calibration run (`replay`)."""
    from ..reports import StepTime
    out = []
    for st in steps:
        axes = {r.axis for r in comm if r.step == st.step}
        prog = replay(comm, st.step, st.start, st.start + st.seconds,
                      recorded=frozenset(a for a in axes if a not in links), transport=transport)
        res = simulate(prog, links)
        out.append(StepTime(st.step, res.seconds, res.compute, res.exposed,
                            {a: res.comm(a) for a in sorted(axes)}, start=st.start, bound=bound(prog, links)))
    return out
