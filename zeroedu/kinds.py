"""Names the measuring core writes and everything above it reads: one enum per vocabulary.

The bottom layer (it imports nothing from the package), so the ledger that writes a name and the
figures, checks and quizzes that read it share one definition, as torch's FSDP2 shares its
`TrainingState` between the code that sets it and the code that tests it. Each member is a `str`
whose value is what the JSON report holds, so a report read back from a file compares equal to
the member (``e["kind"] == EventKind.UNSHARD``) and no reader parses text.

`Category` (what the ledger charges a storage to), `Layout` (how a strategy stores its shards),
`TimelineMode` (what the ranks record),
`Implementation` (whose reduce-scatter and all-gather run), `RecomputeMode` (which activations
are re-run): the tuples of their values (`CATEGORIES`, `TIMELINE_MODES`, `IMPLEMENTATIONS`,
`RECOMPUTE_MODES`) are what the dicts of a report are keyed by and what the CLI offers, so a
report's keys stay plain strings.

`EventKind`: what a ledger event or mark records. Unit lifecycle kinds come with the unit's
number, `BUCKET_READY` with the bucket's, `RECOMPUTE` with the block's; their `label` (for people:
legends, the peak's "at ...") is built from kind and number, never read back.
"""
from __future__ import annotations

from enum import Enum


class Category(str, Enum):
    """The ledger's memory categories: model states first (their order is the charging
    precedence: a storage reached from two is charged to the first), then transient ones."""
    PARAM = "param"
    GRAD = "grad"
    MASTER = "master"
    MAIN_GRAD = "main_grad"
    M = "m"
    V = "v"
    GATHERED = "gathered"
    COMM_BUFFER = "comm_buffer"
    ACTIVATION = "activation"
    BACKWARD_TEMP = "backward_temp"
    OPTIMIZER_TEMP = "optimizer_temp"  # the optimizer update's scratch, while it runs

    def __str__(self) -> str:
        return self.value


MODEL_STATE = tuple(c.value for c in (Category.PARAM, Category.GRAD, Category.MASTER, Category.MAIN_GRAD,
                                      Category.M, Category.V))
OPTIM_PARTS = MODEL_STATE[2:]  # master, main_grad, m, v: what the optimizer holds
TRANSIENT = tuple(c.value for c in Category if c.value not in MODEL_STATE)
CATEGORIES = MODEL_STATE + TRANSIENT


class Layout(str, Enum):
    """How a strategy stores what it shards (`zeroedu.catalog`): every tensor whole, each unit
    one flat padded buffer cut into equal chunks, or each parameter cut on dim 0."""
    REPLICATED = "replicated"
    FLAT = "flat"
    DIM0 = "dim0"

    def __str__(self) -> str:
        return self.value


class TimelineMode(str, Enum):
    FULL = "full"        # every lifecycle event, the wire around every collective
    MINIMAL = "minimal"  # only what the report's figures are read at

    def __str__(self) -> str:
        return self.value


class Implementation(str, Enum):
    AUTO = "auto"        # ring on gloo, the backend's on NCCL
    RING = "ring"        # zeroedu's ring reduce-scatter / all-gather
    BACKEND = "backend"  # torch's (gloo's reduce-scatter is an all-reduce)

    def __str__(self) -> str:
        return self.value


class RecomputeMode(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"

    def __str__(self) -> str:
        return self.value


TIMELINE_MODES = tuple(m.value for m in TimelineMode)
IMPLEMENTATIONS = tuple(m.value for m in Implementation)
RECOMPUTE_MODES = tuple(m.value for m in RecomputeMode)


class EventKind(str, Enum):
    # one step's frame (`Strategy`, the runner)
    STEP_BEGIN = "step begin"
    FORWARD_END = "forward end"           # loss computed, backward not started: the activations
    BACKWARD_BEGIN = "backward begin"
    BACKWARD_END = "backward end"
    RECOMPUTE = "recompute"               # a block's forward re-run in backward (with `block`)
    GRADS_SYNCED = "grads synced"
    OPTIMIZER_STEP = "optimizer step"     # model states alive: what the closed forms predict
    UPDATE = "update"                     # Adam's update running: its scratch buffer alive
    STEP_END = "step end"
    # a sharded unit's lifecycle (with `unit`)
    UNSHARD = "unshard"
    RESHARD = "reshard"
    COPY_OUT = "copy-out"
    COPY_IN = "copy-in"
    POST_BACKWARD = "post_backward"
    GRAD_ALLOC = "grad buffer allocated"
    GRADS_READY = "grads ready"
    GRAD_ZEROED = "full grad zeroed"
    GRAD_FREED = "full grad freed"
    REDUCE_SCATTER_STARTED = "reduce-scatter started"
    # DDP's buckets (with `bucket`)
    BUCKET_READY = "ready"
    # whole-model points
    BUILT = "built"                       # a strategy's state built (its `note` says what)
    PARAMS_GATHERED = "params all-gathered"
    PARAMS_NOT_GATHERED = "params not gathered"
    GRADS_REDUCE_SCATTERED = "grads reduce-scattered"
    GRADS_ALL_GATHERED = "grads all-gathered"
    OUTER_GRADS_SYNCED = "outer grad sync done"
    OTHER = "other"                       # a point of a user's own strategy (its `note` says what)

    def label(self, *, unit: int | None = None, bucket: int | None = None, block: int | None = None,
              note: str = "") -> str:
        """The text people read: "unit 3 unshard", "bucket 2 ready", "recompute 1", "replicas built"."""
        if unit is not None:
            return f"unit {unit} {self.value}"
        if bucket is not None:
            return f"bucket {bucket} {self.value}"
        if block is not None:
            return f"{self.value} {block}"
        if self in (EventKind.BUILT, EventKind.OTHER) and note:
            return f"{note} built" if self is EventKind.BUILT else note
        return self.value

    def __str__(self) -> str:  # f-strings and prints show the value, as the JSON does
        return self.value
