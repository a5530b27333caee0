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
(where its collectives are issued and waited) is stated in its module's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
            if op.axis not in links:
                raise ValueError(f"{op.name}: no link for axis {op.axis!r} (links: {sorted(links)})")
            missing = [a for a in op.after if a not in ends]
            if missing:
                raise ValueError(f"{op.name} waits after {missing}, not issued before it")
            link = links[op.axis]
            start = max([t, free.get(op.axis, 0.0)] + [ends[a] for a in op.after])
            end = start + (ring_time(op.collective, op.nbytes, op.group, link.beta, link.alpha)
                           if op.group > 1 and op.nbytes > 0 else 0.0)
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
         outer: int = 1, outer_axis: str = "dp_outer") -> list:
    """ZeRO-3 / FSDP over units 0..U-1 (`strategies.fsdp_units`), unit u's parameters
    `unit_bytes[u]` when gathered. Forward: each unit's all-gather, waited for before its
    compute; with `prefetch` the next unit's all-gather is issued as this unit starts computing.
    Backward, units in reverse: with `reshard_after_forward` each unit is gathered again
    (prefetched the same way), then its backward computes and its gradients' reduce-scatter is
    issued. With `outer` > 1 (HSDP) each reduce-scatter's shard is then all-reduced over
    `outer_axis`, starting when the reduce-scatter ends. The optimizer step waits for every
    reduction."""
    u_count = len(unit_bytes)
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
        prog.append(Issue(rs, "reduce_scatter", unit_bytes[u], axis, group))
        reductions.append(rs)
        if outer > 1:
            ar = f"all_reduce unit {u} over {outer_axis}"
            prog.append(Issue(ar, "all_reduce", unit_bytes[u] / group, outer_axis, outer, after=(rs,)))
            reductions.append(ar)

    gathers("forward", list(range(u_count)), lambda u: prog.append(Compute(f"forward unit {u}", forward[u])))
    if reshard_after_forward:
        gathers("backward", list(reversed(range(u_count))), backward_unit)
    else:
        for u in reversed(range(u_count)):
            backward_unit(u)
    return prog + [Wait(*reductions), Compute("optimizer", optimizer)]
