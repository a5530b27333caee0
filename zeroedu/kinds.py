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

`Mesh`: the run's ranks as a grid of named axes (`DP_OUTER`, `DP_SHARD`, `TP`; `WORLD` for the
default group), the one description of where a rank sits that every layer reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from math import prod


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
    # a pipeline stage's work on one micro-batch (with `micro`): between begin and end the stage
    # computes; outside them it waits for a neighbour (`strategies.pipeline`)
    MICRO_FORWARD_BEGIN = "forward begins on micro-batch"
    MICRO_FORWARD_END = "forward ends on micro-batch"
    MICRO_BACKWARD_BEGIN = "backward begins on micro-batch"
    MICRO_BACKWARD_END = "backward ends on micro-batch"
    OTHER = "other"                       # a point of a user's own strategy (its `note` says what)

    def label(self, *, unit: int | None = None, bucket: int | None = None, block: int | None = None,
              note: str = "", micro: int | None = None) -> str:
        """The text people read: "unit 3 unshard", "bucket 2 ready", "recompute 1", "replicas built",
        "forward begins on micro-batch 2"."""
        if micro is not None:
            return f"{self.value} {micro}"
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


# ------------------------------------------------------------------ the mesh
# A run's ranks as a grid of named axes: the one description every layer reads.
#
# A mesh is a list of (axis name, size), outermost first; rank r sits at the row-major
# coordinates of r, so the innermost axis holds contiguous ranks (under torchrun, the ranks of one
# node: where tensor parallelism's blocking collectives belong). The axes, in their fixed order:
#
#     pp         pipeline parallel: one replica's layers cut into stages (`strategies.pipeline`)
#     dp_outer   data parallel across domains (a hybrid strategy's replicas or outer shards)
#     dp_shard   data parallel inside a domain: the axis a strategy shards over
#     ep         expert parallel: each rank holds E/ep of every MoE layer's experts and trains on
#                its own share of the batch; tokens travel to the experts by all-to-all
#                (`strategies.expert_parallel`)
#     cp         context parallel: every sequence split over these ranks, keys and values passed
#                around a ring (`strategies.context_parallel`)
#     tp         tensor parallel: one model replica split over these ranks
#
# The data axes (dp_outer, dp_shard, ep) split the global batch; the others split the model (cp
# splits the sequences, tp the layers' matrices, pp the layers), so the ranks along them hold one
# replica between them (`replica_groups`). ep is both: each ep rank trains on its own share of the
# batch, and holds E/ep of every MoE layer's experts, so the ranks along ep hold one replica's
# experts between them. The strategy's group, over which gradients of replicated parameters are
# summed and ZeRO shards, is dp_shard flattened with ep and cp (`SHARD_AXES`): a cp rank holds a
# whole replica, so it reduces and shards like a data-parallel rank, though it trains on the same
# sequences' other positions; an expert's gradient is reduced and sharded over dp_shard alone, the
# ranks that hold the same experts (docs/architecture.md, "The mesh", has the roles as a table).
#
# Built once from the resolved configuration (`train.config.ResolvedConfig.mesh`); the rank side
# makes one process group per axis from it (`runtime.rank.RankContext.axes`), and the predictions
# read sizes and coordinates from it. Plain data, no torch: it crosses layers and processes freely.


PP, DP_OUTER, DP_SHARD, EP, CP, TP = "pp", "dp_outer", "dp_shard", "ep", "cp", "tp"
# outermost first: pipeline stages across the widest links (one send per boundary and micro-batch),
# tensor parallel innermost (its blocking collectives inside a node), as Megatron-LM orders them
AXIS_ORDER = (PP, DP_OUTER, DP_SHARD, EP, CP, TP)
DATA_AXES = (DP_OUTER, DP_SHARD, EP)  # the axes that split the batch
REPLICA_AXES = (DP_OUTER, DP_SHARD)  # the axes along which whole replicas of the model repeat
# The axes a strategy's inner group spans: the ranks whose gradients of the replicated parameters
# are summed and over which ZeRO shards. cp ranks hold whole replicas and train on the same
# sequences' other positions, so their gradients are reduced (and sharded) with dp_shard's, as
# torchtitan's `dp_shard_cp` mesh (torchtitan/distributed/parallel_dims.py, FSDP's mesh) and
# picotron's `cp_dp_group` (picotron/process_group_manager.py) do; ep ranks train on their own
# shares of the batch, so every parameter but the experts is reduced over dp_shard x ep too (the
# experts over dp_shard alone: Megatron-Core's expert data-parallel group, "data parallelism of
# expert which replicates weight across the group", megatron/core/parallel_state.py's
# _EXPERT_DATA_PARALLEL_GROUP, Megatron-LM main at 00caa53). The strategy runs on that flattened
# group under the name dp_shard.
SHARD_AXES = (DP_SHARD, EP, CP)
SHARD_GROUP = "dp_shard+ep+cp"  # the key of that flattened group among a rank's axes, where it is not dp_shard's
WORLD = "world"  # the default group, every rank: a hybrid's one all-reduce over both data axes


@dataclass(frozen=True)
class Mesh:
    """Named axes and their sizes, outermost first (`AXIS_ORDER`); the product is the world size."""

    shape: tuple[tuple[str, int], ...]

    def __post_init__(self):
        names = [a for a, _ in self.shape]
        if len(set(names)) != len(names) or any(a not in AXIS_ORDER for a in names):
            raise ValueError(f"mesh axes must be distinct names from {AXIS_ORDER}, got {names}")
        if names != sorted(names, key=AXIS_ORDER.index):
            raise ValueError(f"mesh axes go outermost first, in the order {AXIS_ORDER}: got {names}")
        if DP_SHARD not in names:
            raise ValueError("every mesh has the dp_shard axis (a strategy shards over it, even of size 1)")
        bad = [(a, s) for a, s in self.shape if isinstance(s, bool) or not isinstance(s, int) or s < 1]
        if bad:
            raise ValueError(f"mesh axis sizes must be integers >= 1, got {bad}")

    @classmethod
    def build(cls, world_size: int, *, dp_outer: int | None = None, pp: int = 1, ep: int = 1, cp: int = 1,
              tp: int = 1) -> "Mesh":
        """The mesh of a run on `world_size` ranks: `dp_outer` = M for a hybrid strategy (None:
        no such axis), `pp` > 1 for pipeline stages, `ep` > 1 for expert parallelism, `cp` > 1 for
        context parallelism, `tp` > 1 for tensor parallelism; dp_shard takes the rest."""
        model = pp * tp * cp * ep
        data = dp_outer or 1
        if world_size % (model * data):
            sizes = ([(PP, pp)] * (pp > 1) + [(DP_OUTER, dp_outer)] * (dp_outer is not None) + [(EP, ep)] * (ep > 1)
                     + [(CP, cp)] * (cp > 1) + [(TP, tp)])
            raise ValueError(f"the world size {world_size} must be divisible by "
                             f"{' x '.join(f'{a} = {s}' for a, s in sizes)}")
        shape = ([(PP, pp)] if pp > 1 else []) + ([(DP_OUTER, dp_outer)] if dp_outer is not None else []) \
            + [(DP_SHARD, world_size // (model * data))] + ([(EP, ep)] if ep > 1 else []) \
            + ([(CP, cp)] if cp > 1 else []) + ([(TP, tp)] if tp > 1 else [])
        return cls(tuple(shape))

    @property
    def shard_size(self) -> int:
        """Ranks in the strategy's inner group: dp_shard, flattened with ep and cp (`SHARD_AXES`)."""
        return prod(self.size(a) for a in SHARD_AXES)

    def shard_coord(self, rank: int) -> int:
        """Rank `rank`'s place in the strategy's inner group (dp_shard outer, cp inner)."""
        r = 0
        for a in SHARD_AXES:
            r = r * self.size(a) + self.coord(rank, a)
        return r

    def shard_groups(self) -> list[tuple[int, ...]]:
        """Every inner group of the strategy (each rank in exactly one), in order of their first rank."""
        seen, out = set(), []
        for r in range(self.world_size):
            if r not in seen:
                g = self.shard_group(r)
                seen.update(g)
                out.append(g)
        return out

    def shard_group(self, rank: int) -> tuple[int, ...]:
        """The ranks of rank `rank`'s inner group, in `shard_coord` order."""
        c, out = self.coords(rank), []
        for i in range(self.shard_size):
            coords = dict(c)
            for a in reversed(SHARD_AXES):  # i is row-major over SHARD_AXES, the last fastest
                i, coords[a] = divmod(i, self.size(a))
            out.append(self.rank_at(coords))
        return tuple(out)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.shape)

    @property
    def world_size(self) -> int:
        return prod(s for _, s in self.shape)

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def size(self, name: str) -> int:
        """The axis's size; 1 for an axis this mesh does not have."""
        return dict(self.shape).get(name, 1)

    @property
    def data_parallel(self) -> int:
        """Replicas of the model: the product of the data axes."""
        return prod(self.size(a) for a in DATA_AXES)

    @property
    def model_axes(self) -> tuple[str, ...]:
        """The axes that split one replica (pp, ep, cp, tp), outermost first."""
        return tuple(a for a in self.names if a not in REPLICA_AXES)

    def coords(self, rank: int) -> dict[str, int]:
        """Rank `rank`'s place on every axis (row-major: the last axis varies fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a mesh of {self.world_size}")
        out = {}
        for name, size in reversed(self.shape):
            rank, out[name] = divmod(rank, size)
        return {a: out[a] for a in self.names}

    def coord(self, rank: int, name: str) -> int:
        """Rank `rank`'s index on axis `name` (0 on an axis the mesh does not have)."""
        return self.coords(rank).get(name, 0)

    def rank_at(self, coords: dict[str, int]) -> int:
        r = 0
        for name, size in self.shape:
            r = r * size + coords.get(name, 0)
        return r

    def group(self, rank: int, name: str) -> tuple[int, ...]:
        """The ranks on axis `name` through rank `rank`, in axis order."""
        c = self.coords(rank)
        return tuple(self.rank_at({**c, name: i}) for i in range(self.size(name)))

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group of axis `name` (each rank in exactly one), in order of their first rank."""
        seen, out = set(), []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group(r, name)
                seen.update(g)
                out.append(g)
        return out

    def data_rank(self, rank: int) -> int:
        """Which slice of the global batch rank `rank` trains on: its index over the data axes
        (the ranks of one replica, along the model axes, share a slice)."""
        r = 0
        for a in DATA_AXES:
            r = r * self.size(a) + self.coord(rank, a)
        return r

    def replica_groups(self) -> list[tuple[int, ...]]:
        """The ranks that hold one model replica between them (along the model axes, ep's
        included), one tuple per replica, in order; each rank alone when there is no model axis."""
        by_data: dict[int, list[int]] = {}
        for r in range(self.world_size):
            i = 0
            for a in REPLICA_AXES:
                i = i * self.size(a) + self.coord(r, a)
            by_data.setdefault(i, []).append(r)
        return [tuple(v) for _, v in sorted(by_data.items())]

    @property
    def world_group_axis(self) -> str:
        """The axis whose group is the whole world (a flat strategy's dp_shard, which runs on the
        default group), or `WORLD` where no single axis spans it."""
        spanning = [a for a, s in self.shape if s == self.world_size]
        return spanning[0] if len(self.shape) == 1 and spanning else WORLD

    def plain(self) -> dict[str, int]:
        return dict(self.shape)

    @classmethod
    def from_plain(cls, d: dict[str, int]) -> "Mesh":
        return cls(tuple(sorted(d.items(), key=lambda kv: AXIS_ORDER.index(kv[0]))))

    def __str__(self) -> str:
        return " x ".join(f"{a} {s}" for a, s in self.shape)
