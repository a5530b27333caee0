"""The run report, typed: what `zeroedu.train.run` returns and every reader above it (the CLI,
the notebooks, their figures, the fact-check, the tests) reads by attribute.

Next to the bottom layer (it imports only `zeroedu.kinds`), as torch's FSDP2 keeps its state in typed
objects (`TrainingState`, `AllGatherState`) so that no reader parses text or guesses a key. The
ranks return plain data across the process boundary (`train.launch.train_job`); the parent
turns it into these types once (`RankReport.from_plain`), and `.plain()` turns a report back
into the JSON that ``zeroedu run --json`` prints (README, "JSON report"), whose keys are the
fields' names: the schema is the one before these types existed.

* `RunReport`: the run (strategy, mesh, recipe, steps ...), one `RankReport` per rank, the mean
  losses beside single-process training's and the `Match` verdicts;
* `RankReport`: one rank's `Measured` (what its ledger counted), `Predicted` (the closed forms,
  exact mode), its `WireReport` (the kernel's byte counters), peak, losses and `Timeline`;
* `Measured` / `Predicted`: model states at the optimizer step (param, grad, optim, total and
  the optimizer's parts), the activations of one micro-batch, the ring model's bytes per
  collective and per mesh axis; `Predicted.wire` is the payload the wire should carry.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .kinds import EventKind

SCHEMA = 8  # the JSON's shape (README, "JSON report"); a change of shape changes it
# 2: each rank's "time" (compute, exposed communication, communication by axis, per step) and
#    the run's "links" (the emulated links it ran on, or null)
# 5: GPU runs: each rank's "cuda" (`CudaMemory`: the allocator's peaks, the cuBLAS workspace, what lies
#    outside the allocator), in place of "cuda_max_memory_allocated"
# 6: "matmul16": how the ranks multiplied the recipe's 16-bit matrices ("native" or "emulated",
#    `runtime.matmul16`; null for fp32); "recipe_losses": one process in the run's 16-bit recipe


def _plain_fields(obj, drop_none: tuple[str, ...] = ()) -> dict[str, Any]:
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if v is None and f.name in drop_none:
            continue  # absent from the JSON when not measured
        out[f.name] = v.plain() if hasattr(v, "plain") else v
    return out


def _known(cls, d: dict) -> dict:
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {unknown}; its fields: {sorted(names)}")
    return d


@dataclass
class States:
    """Bytes of this rank's model states at the optimizer step, and its collectives' payloads."""
    param: int = 0
    grad: int = 0
    optim: int = 0
    total: int = 0
    optim_detail: dict[str, int] = field(default_factory=dict)  # by kinds.OPTIM_PARTS
    activations: int | None = None  # one micro-batch's saved tensors (None: no closed form)
    comm: dict[str, float] = field(default_factory=dict)  # ring model, by collective
    comm_by_axis: dict[str, dict[str, float]] = field(default_factory=dict)  # by mesh axis

    @property
    def comm_total(self) -> float:
        return sum(self.comm.values())

    def model_states(self) -> dict[str, int]:
        return {"param": self.param, "grad": self.grad, "optim": self.optim, "total": self.total}

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self)

    @classmethod
    def from_plain(cls, d):
        return d if isinstance(d, cls) else cls(**_known(cls, d))


@dataclass
class Measured(States):
    """What the rank's ledger counted (tensor storages) and its comm recorded (payloads)."""


@dataclass
class Predicted(States):
    """`zeroedu.theory`'s closed forms for this rank, exact mode."""
    wire: float = 0.0  # payload the kernel should count on this rank's sockets, per step


@dataclass
class WireReport:
    """Bytes this rank wrote to its sockets in the last step (kernel TCP counters); `sent` None
    where nothing could be measured (NCCL, or no meter), `reason` says why."""
    sent: int | None = None
    method: str = ""
    reason: str | None = None
    by_axis: dict[str, int] = field(default_factory=dict)
    by_collective: dict[str, int] = field(default_factory=dict)  # where a collective ran alone
    messages: int = 0
    complete: bool | None = None
    retransmitted: int | None = None

    @property
    def measured(self) -> bool:
        return self.sent is not None

    def plain(self) -> dict[str, Any]:
        if self.sent is None:
            return {"sent": None, "method": self.method, "reason": self.reason}
        return _plain_fields(self, drop_none=("reason",))

    @classmethod
    def from_plain(cls, d) -> "WireReport":
        return d if isinstance(d, cls) else cls(**_known(cls, d))


@dataclass
class StepTime:
    """One optimizer step's time on one rank, read from its timeline (seconds):
    `seconds` from the step's start to the end of its optimizer step; `exposed` the time the
    rank waited for communication (a blocking collective from start to end, an asynchronous
    one from the wait to its end), the union of those intervals; `compute` the rest of the step
    (forward, backward, optimizer, the loop); `comm` by mesh axis the union of the intervals
    its collectives were in flight, waited for or hidden behind compute."""
    step: int
    seconds: float
    compute: float
    exposed: float
    comm: dict[str, float] = field(default_factory=dict)
    start: float = 0.0  # when the step began, on the rank's timeline (seconds, as Timeline's t)
    # A predicted step only: the best step any overlap of its work reaches on the links
    # (`theory.schedule.bound`); measured `seconds` over it is the overlap's shortfall.
    bound: float | None = None

    @property
    def hidden(self) -> float:
        """Communication time that overlapped compute: in flight, not waited for."""
        return max(0.0, self.comm_total - self.exposed)

    @property
    def comm_total(self) -> float:
        return sum(self.comm.values())

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self, drop_none=("bound",))


def _median_step(steps: list[StepTime]) -> StepTime | None:
    """The medians over the steps after the first (the first pays one-off costs: buffers
    allocated, threads started), or of the one step there is."""
    steps = steps[1:] or steps
    if not steps:
        return None

    def med(xs):
        xs = sorted(xs)
        k = len(xs) // 2
        return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2

    axes = sorted({a for s in steps for a in s.comm})
    bounds = [s.bound for s in steps if s.bound is not None]
    return StepTime(-1, med([s.seconds for s in steps]), med([s.compute for s in steps]),
                    med([s.exposed for s in steps]), {a: med([s.comm.get(a, 0.0) for s in steps]) for a in axes},
                    start=steps[0].start,  # the medians have no one start: the first counted step's
                    bound=med(bounds) if len(bounds) == len(steps) else None)


@dataclass
class TimeReport:
    """One rank's step times: `steps`, measured on its timeline (`measured` is the same list),
    and `predicted`, the same steps replayed on the run's links by `theory.schedule.predict`
    from a calibration run (empty unless asked for: `train.run(..., predict=True)`). `median()`
    and `predicted_median()`: over the steps after the first."""
    steps: list[StepTime] = field(default_factory=list)
    predicted: list[StepTime] = field(default_factory=list)

    @property
    def measured(self) -> list[StepTime]:
        return self.steps

    def median(self) -> StepTime | None:
        return _median_step(self.steps)

    def predicted_median(self) -> StepTime | None:
        return _median_step(self.predicted)

    def efficiency(self) -> float | None:
        """Overlap efficiency: the bound (`theory.schedule.bound`, with the prediction) over the
        measured step, medians after the first step; None without a prediction."""
        p, m = self.predicted_median(), self.median()
        return None if p is None or p.bound is None or m is None else p.bound / m.seconds

    def plain(self) -> dict[str, Any]:
        return {"steps": [s.plain() for s in self.steps], "predicted": [s.plain() for s in self.predicted]}

    @classmethod
    def from_plain(cls, d: "dict | TimeReport") -> "TimeReport":
        if isinstance(d, TimeReport):
            return d
        return cls([StepTime(**_known(StepTime, s)) for s in d.get("steps", [])],
                   [StepTime(**_known(StepTime, s)) for s in d.get("predicted", [])])


@dataclass
class Event:
    """A ledger event (bytes by category at a lifecycle point) or mark (``bytes`` None): what
    happened, typed. `kind` says what it is and `unit` / `bucket` / `block` which one; `label`
    is for people (legends, the peak's "at ..."), built from them, never read back."""
    t: float  # seconds since the timeline's origin
    kind: EventKind
    step: int  # -1: set-up, before the first training step
    bytes: dict[str, int] | None = None  # by `kinds.CATEGORIES`; None for a mark
    unit: int | None = None
    bucket: int | None = None
    block: int | None = None
    note: str = ""  # what an `EventKind.OTHER` point (or a `BUILT` one) is
    micro: int | None = None  # the micro-batch a pipeline stage's work point is about

    @property
    def label(self) -> str:
        return self.kind.label(unit=self.unit, bucket=self.bucket, block=self.block, note=self.note,
                               micro=self.micro)

    @property
    def total(self) -> int:
        """Bytes held at this event, every category."""
        return sum(self.bytes.values())

    def held(self, without: tuple[str, ...] = ()) -> int:
        """Bytes held at this event, the categories `without` left out."""
        return sum(v for k, v in self.bytes.items() if k not in without)

    def plain(self) -> dict[str, Any]:
        d = {"t": self.t, "kind": self.kind.value, "unit": self.unit, "bucket": self.bucket,
             "block": self.block, "label": self.label, "step": self.step}
        if self.note:
            d["note"] = self.note
        if self.micro is not None:
            d["micro"] = self.micro
        if self.bytes is not None:
            d["bytes"] = self.bytes
        return d

    @classmethod
    def from_plain(cls, d: "dict | Event") -> "Event":
        if isinstance(d, Event):
            return d
        d = {k: v for k, v in d.items() if k != "label"}  # derived: rebuilt from kind and number
        try:
            kind = EventKind(d["kind"])
        except ValueError:  # a kind a newer ledger wrote: a plain point, its name kept as the note
            kind, d["note"] = EventKind.OTHER, d.get("note") or str(d["kind"])
        return cls(**{**_known(cls, d), "kind": kind})


@dataclass
class CommRecord:
    """One collective as `comm` recorded it on this rank: what moved, on which axis, how many
    bytes the ring model says this rank sends, and when it was issued, waited for and done."""
    op: str
    tag: str
    axis: str
    group_size: int
    payload: int  # bytes of the full logical tensor (all-reduce input, all-gather output, ...)
    sent: float  # bytes this rank sends, ring model (a Fraction while the ledger records)
    step: int
    t_start: float
    t_end: float | None = None
    implementation: str = "backend"  # "ring" (zeroedu's) or "backend" (torch's)
    messages: int = 0  # point-to-point messages this rank sends in it (gloo framing: 144 B each)
    wire: int | None = None  # bytes measured on this rank's sockets, when it ran alone
    # Issued synchronously: the caller waited for it, so no computation ran beside it (an FSDP
    # reduce-scatter inside a backward hook stalls backward rather than hiding behind it).
    blocking: bool = False
    # When the caller's thread first stopped for it (`Handle.wait`; a blocking one: at its start).
    # With `t_start`, where it was issued, this is the schedule `theory.schedule.replay` reads.
    waited: float | None = None
    # From the tag's parts (`zeroedu.runtime.comm.Tag`), so readers never split the tag text:
    unit: int | None = None  # the unit whose buffer moved, when the tag names one
    moves: str | None = None  # "grads", "params" or "data"; None for a plain-text tag
    detail: list[str] = field(default_factory=list)  # the tag's finer parts: ["param8"] in a unit

    def plain(self) -> dict[str, Any]:
        d = asdict(self)
        d["sent"] = float(self.sent)
        d["tag"] = str(self.tag)
        return d

    @classmethod
    def from_plain(cls, d: "dict | CommRecord") -> "CommRecord":
        return d if isinstance(d, CommRecord) else cls(**_known(cls, d))

    def settled(self) -> "CommRecord":
        """A copy as the report holds it: bytes as a float, the tag as plain text."""
        return replace(self, sent=float(self.sent), tag=str(self.tag), detail=list(self.detail))


@dataclass
class Timeline:
    """What the ledger recorded, typed: events (bytes by category at each lifecycle point), marks
    (points without bytes) and collectives (`Ledger.timeline`), with the queries readers need."""
    events: list[Event] = field(default_factory=list)
    marks: list[Event] = field(default_factory=list)
    comm: list[CommRecord] = field(default_factory=list)
    # The timeline's zero on the machine's monotonic clock (time.perf_counter, CLOCK_MONOTONIC on
    # Linux: one clock for every process), and the same moment on the wall clock (ns since the
    # epoch): ranks' timelines line up by `origin`, a trace dates them by `origin_ns`.
    origin: float = 0.0
    origin_ns: int = 0

    def __post_init__(self):
        self.events = [Event.from_plain(e) for e in self.events]
        self.marks = [Event.from_plain(m) for m in self.marks]
        self.comm = [CommRecord.from_plain(c) for c in self.comm]

    def events_of(self, step: int | None = None, kind: EventKind | None = None) -> list[Event]:
        """The events of one step and/or one kind, in order."""
        return [e for e in self.events if (step is None or e.step == step) and (kind is None or e.kind == kind)]

    def marks_of(self, step: int | None = None, kind: EventKind | None = None) -> list[Event]:
        """The marks of one step and/or one kind, in time order."""
        return sorted((m for m in self.marks if (step is None or m.step == step) and (kind is None or m.kind == kind)),
                      key=lambda m: m.t)

    def comm_of(self, step: int | None = None, op: str | None = None) -> list[CommRecord]:
        """The collectives of one step and/or one kind ("all_gather", ...), in issue order."""
        return [c for c in self.comm if (step is None or c.step == step) and (op is None or c.op == op)]

    def peak_event(self, without: tuple[str, ...] = ()) -> tuple[Event, int]:
        """The event holding the most bytes, the categories `without` left out, and that total
        (e.g. without autograd's "backward_temp": the largest lifecycle moment)."""
        if not self.events:
            raise ValueError("no events: a minimal timeline keeps only the report's events")
        top = max(self.events, key=lambda e: e.held(without))
        return top, top.held(without)

    def plain(self) -> dict[str, Any]:
        return {"events": [e.plain() for e in self.events], "marks": [m.plain() for m in self.marks],
                "comm": [c.plain() for c in self.comm], "origin": self.origin, "origin_ns": self.origin_ns}

    @classmethod
    def from_plain(cls, d: "dict | Timeline") -> "Timeline":
        return d if isinstance(d, Timeline) else cls(**_known(cls, d))


@dataclass
class CudaMemory:
    """What the CUDA caching allocator and the device say on one rank (GPU runs), to set beside
    the ledger's peak; every field read from torch or the driver, none assumed.

    ``max_allocated``: `torch.cuda.max_memory_allocated`, the allocator's peak of live blocks.
    ``max_reserved``: `torch.cuda.max_memory_reserved`, the segments it held from the driver at
    most; ``max_reserved - max_allocated`` is the caching allocator's own share (freed blocks kept
    for reuse, fragmentation). ``cublas_workspace``: bytes the cuBLAS / cuBLASLt workspaces held in
    the allocator at the end of the run, read by freeing them (one per handle and stream that ran
    a matmul); None where not read. ``device_used``: total − free from `torch.cuda.mem_get_info`
    (what nvidia-smi shows for the process, near enough) and ``outside_allocator``: device_used −
    memory_reserved now: the CUDA context, the kernels' modules, NCCL's buffers."""
    max_allocated: int
    max_reserved: int
    device_used: int
    outside_allocator: int
    cublas_workspace: int | None = None

    def named(self, ledger_peak: int) -> int:
        """The ledger's peak plus the named terms that live inside the allocator."""
        if self.cublas_workspace is None:
            raise ValueError("the cuBLAS workspace was not read on this run (benchmarks/gpu_memory_check.py reads it)")
        return ledger_peak + self.cublas_workspace

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self)

    @classmethod
    def from_plain(cls, d: "dict | CudaMemory") -> "CudaMemory":
        return d if isinstance(d, CudaMemory) else cls(**_known(cls, d))


@dataclass
class RingWork:
    """What a rank's ring attention did under context parallelism, from the tensors it computed on
    (`strategies.context_parallel.RingStats`), beside the closed form (`theory.context.work_elements`)."""
    positions: list[list[int]]       # the runs of sequence positions it holds: [[start, stop], ...]
    score_elements: int              # score elements its forwards computed over the run, all layers
    predicted_score_elements: int
    # the first forward, each hop: (K/V sends issued, waited for, the block computed meanwhile:
    # start, end) on the ledger's clock
    hops: list[list[float]] = field(default_factory=list)

    REPORT_FIELD = "ring"

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self)

    @classmethod
    def from_plain(cls, d: dict) -> "RingWork":
        return cls(**_known(cls, d))


@dataclass
class PipelineWork:
    """What a rank's pipeline stage did in the last step, read from its timeline's marks (each
    micro-batch's forward and backward, begun and ended), beside the schedule's closed form."""
    stage: int
    layers: list[int]          # the blocks it runs, [first, last)
    in_flight: int             # the most micro-batches whose activations it held at once
    predicted_in_flight: int   # `theory.pipeline.in_flight` of the schedule
    # its actions: [what ("F" or "B"), micro-batch, start, end], seconds on the machine's monotonic
    # clock (a local pool's ranks read the same clock, so the stages line up)
    work: list[list] = field(default_factory=list)

    REPORT_FIELD = "pipeline"

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self)

    @classmethod
    def from_plain(cls, d: dict) -> "PipelineWork":
        return cls(**_known(cls, d))


def measured_bubble(stages: list[PipelineWork]) -> list[float]:
    """Each stage's idle share of the step: 1 - (its actions' time) / (the step's span, from the
    first action's start on any stage to the last one's end); `stages` one per stage, in order."""
    t0 = min(w[2] for s in stages for w in s.work)
    t1 = max(w[3] for s in stages for w in s.work)
    return [1.0 - sum(w[3] - w[2] for w in s.work) / (t1 - t0) for s in stages]


@dataclass
class ExpertRouting:
    """What a rank's MoE layers did in the last step under expert parallelism, from the router's
    and the counts all-to-all's own numbers (what the all-to-alls' closed form reads)."""
    held: list[int]                 # the experts this rank holds, by id
    sent: list[list[list[int]]]     # [layer][micro-batch][expert]: rows this rank sent to each expert
    received: list[list[list[int]]]  # [layer][micro-batch][ep rank]: rows it received from each
    dropped: list[int]              # [layer]: its tokens' assignments over capacity, dropped

    REPORT_FIELD = "routing"

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self)

    @classmethod
    def from_plain(cls, d: dict) -> "ExpertRouting":
        return cls(**_known(cls, d))


@dataclass
class RankReport:
    """One rank's results."""
    rank: int
    measured: Measured
    predicted: Predicted
    wire: WireReport
    peak: int = 0
    peak_label: str = ""
    losses: list[float | None] = field(default_factory=list)  # None off a pipeline's last stage
    timeline: Timeline = field(default_factory=Timeline)
    overlap: float | None = None  # share of gradient communication hidden behind backward
    time: TimeReport = field(default_factory=TimeReport)  # per step: compute, exposed comm, comm by axis
    cuda: CudaMemory | None = None  # what the CUDA allocator and the device say (GPU runs)
    extra: Any = None  # what the strategy adds (`Strategy.report_extra`)
    routing: ExpertRouting | None = None  # expert parallelism: the router's counts of the last step
    ring: RingWork | None = None  # context parallelism: the ring's work, counted
    pipeline: PipelineWork | None = None  # pipeline parallelism: the stage's last step, from its marks
    params: list | None = None  # the full parameters (asked with return_params)

    def plain(self, timeline: bool = False) -> dict[str, Any]:
        out = _plain_fields(self, drop_none=("cuda", "extra", "routing", "ring", "pipeline"))
        out.pop("params")
        if not timeline:
            out.pop("timeline")
        return out

    @classmethod
    def from_plain(cls, d: dict) -> "RankReport":
        d = dict(_known(cls, d))
        d["measured"] = Measured.from_plain(d["measured"])
        d["predicted"] = Predicted.from_plain(d["predicted"])
        d["wire"] = WireReport.from_plain(d["wire"])
        if "timeline" in d:
            d["timeline"] = Timeline.from_plain(d["timeline"])
        if "time" in d:
            d["time"] = TimeReport.from_plain(d["time"])
        if d.get("cuda") is not None:
            d["cuda"] = CudaMemory.from_plain(d["cuda"])
        if d.get("routing") is not None:
            d["routing"] = ExpertRouting.from_plain(d["routing"])
        if d.get("ring") is not None:
            d["ring"] = RingWork.from_plain(d["ring"])
        if d.get("pipeline") is not None:
            d["pipeline"] = PipelineWork.from_plain(d["pipeline"])
        return cls(**d)


@dataclass
class Match:
    """Each figure against its prediction; None where nothing could be compared (no closed form
    for a custom model's activations, no wire measured on NCCL)."""
    model_states: bool
    comm: bool
    wire: bool | None
    activations: bool | None
    losses: bool  # every step's loss within the recipe's tolerance of single-process training

    def all(self) -> bool:
        return all(v for v in (self.model_states, self.comm, self.wire, self.activations, self.losses)
                   if v is not None)

    def plain(self) -> dict[str, Any]:
        return _plain_fields(self)


@dataclass
class RunReport:
    """A run on real ranks beside single-process training (`zeroedu.train.run`)."""
    strategy: str
    world_size: int
    n: int
    m: int
    recipe: str
    steps: int
    model: str
    global_batch: int
    micro_batches: int
    recompute: str
    clip_grad_norm: float | None
    collectives: str  # the implementation that ran: "ring" or "backend" (never "auto")
    backend: str  # "gloo" or "nccl": the transport the collectives ran on
    matmul16: str | None  # 16-bit products "native" or "emulated" in fp32 (`runtime.matmul16`); None in fp32
    options: dict[str, Any]
    timeline_mode: str
    psi: int
    ranks: list[RankReport]
    losses: list[float]
    reference_losses: list[float]
    match: Match
    # one process training in the run's 16-bit recipe (torch alone): the measured yardstick of the
    # recipe's drift from fp32 that `match.losses` allows (`recipes.loss_bound`); trained only when
    # a step's loss lies beyond the flat tolerance (None otherwise, and in fp32)
    recipe_losses: list[float] | None = None
    params: list | None = None  # rank 0's full parameters (return_params)
    reference_params: list | None = None  # single-process training's
    replica_max_diff: float | None = None  # largest difference of any rank's from rank 0's
    links: dict | None = None  # the emulated links the run used (`runtime.links.Links.plain`), or None
    tp: int = 1  # tensor-parallel ranks per replica (contiguous); n·m·tp = world_size
    sequence_parallel: bool = False  # Korthikanti's SP inside tp
    cp: int = 1  # context-parallel ranks per replica (each sequence split over them); n counts them too
    zigzag: bool = False  # cp's balanced split
    pp: int = 1  # pipeline stages per replica (outermost); a rank's losses are None off the last stage
    schedule: str = "1f1b"  # the pipeline's schedule
    emulate: list[float] | None = None  # with pp: the emulated device's (forward, backward) seconds, or None
    ep: int = 1  # expert-parallel ranks (each its own share of the batch, E/ep experts); n counts them too

    @property
    def rank0(self) -> RankReport:
        return self.ranks[0]

    def plain(self, timeline: bool = False) -> dict[str, Any]:
        out = {"schema": SCHEMA}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("params", "reference_params"):
                continue
            if f.name == "replica_max_diff" and v is None:
                continue
            out[f.name] = ([r.plain(timeline) for r in v] if f.name == "ranks"
                           else v.plain() if hasattr(v, "plain") else v)
        return out


# ----------------------------------------------------------------------------- provenance
# Reports `train.assemble` built in this process from its ranks' results. A check that grades a
# figure read off a run (a notebook's measure exercise) accepts only these: a report typed by
# hand, or a dict, could say anything. Held by id with a weak reference (a report is mutable,
# so not hashable), so a report that is gone is forgotten.
_MADE_HERE: dict[int, Any] = {}


def vouch(report: "RunReport") -> "RunReport":
    """Record `report` as made by a run in this process (`train.assemble` calls this)."""
    import weakref

    key = id(report)
    _MADE_HERE[key] = weakref.ref(report, lambda _r, k=key: _MADE_HERE.pop(k, None))
    return report


def made_here(report) -> bool:
    """Whether `report` is a RunReport a run in this process produced (`vouch`)."""
    ref = _MADE_HERE.get(id(report))
    return ref is not None and ref() is report
