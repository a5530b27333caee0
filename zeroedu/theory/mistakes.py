"""Known mistakes as closed forms: what a learner gets who reasons one known wrong way.

Each function computes, from the same inputs as the right closed form (`memory.model_states`,
`comm.comm_per_rank`), the figure one misconception produces, and `Mistake.why` says which
misconception that is. A check that receives exactly that figure can then name the mistake
instead of reporting "off by a factor": an answer of 16Ψ to a ZeRO-1 question is DDP's replica,
not a slip. The notebooks' exercises (`notebook.exercises`: `Wrong(mistake(...))`) and the
deck use them; `tests/test_mistakes.py` checks every one against its message.

    >>> other_stage_states("zero1", "ddp", 13e9, 16).why
    "that is ddp's model states, not zero1's: ..."
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..catalog import get_spec
from .activations import korthikanti_layer_bytes
from .comm import comm_per_rank, sent_bytes
from .memory import model_states


@dataclass(frozen=True)
class Mistake:
    """A wrong figure and the misconception that produces it."""
    name: str  # the function that computed it
    value: float
    why: str


def _what(strategy: str) -> str:
    return get_spec(strategy).name


def other_stage_states(asked: str, confused: str, psi, n, m=1, recipe=None) -> Mistake:
    """Model states per GPU of another strategy than the one asked: the stages confused
    (DDP's whole replica for ZeRO-1, ZeRO-3's 16Ψ/N for ZeRO-2, ...)."""
    have = model_states(confused, psi, n, m, recipe)
    keeps = {"param": "parameters", "grad": "gradients", "optim": "optimizer state"}
    sharded = [v for k, v in keeps.items() if getattr(have, k) < getattr(model_states("ddp", psi, n, 1, recipe), k)]
    return Mistake("other_stage_states", float(have.total),
                   f"that is {_what(confused)}'s model states, not {_what(asked)}'s: {_what(confused)} shards "
                   f"{', '.join(sharded) if sharded else 'nothing'}")


def only_optimizer_shard(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """Only the sharded optimizer state counted: the parameters and gradients forgotten."""
    s = model_states(strategy, psi, n, m, recipe)
    return Mistake("only_optimizer_shard", float(s.optim),
                   "that is the optimizer state alone; the parameters and gradients a GPU holds count too")


def missing_gradients(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """The gradients left out of the model states (parameters and optimizer state only)."""
    s = model_states(strategy, psi, n, m, recipe)
    return Mistake("missing_gradients", float(s.total - s.grad),
                   "the gradients are missing: a GPU holds its gradients (or their slice) beside the parameters")


def optimizer_forgotten(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """The optimizer state left out: the 16-bit weights and gradients counted, Adam's fp32
    master, m and v (12 bytes per parameter with mixed-bf16) not."""
    s = model_states(strategy, psi, n, m, recipe)
    return Mistake("optimizer_forgotten", float(s.total - s.optim),
                   "the optimizer state is missing: Adam's fp32 master, m and v add 12 bytes per parameter, "
                   "or their shard")


def parameters_only(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """Only the parameters a GPU holds counted."""
    s = model_states(strategy, psi, n, m, recipe)
    return Mistake("parameters_only", float(s.param), "that is the parameters alone")


def ring_factor_dropped(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """Bytes sent per step without the ring's (N-1)/N: every collective counted as moving its
    whole buffer."""
    total = comm_per_rank(strategy, psi, n, m, recipe).total()
    return Mistake("ring_factor_dropped", float(Fraction(total) * n / (n - 1)),
                   "that drops the ring's (N-1)/N: a rank sends N-1 of the N chunks, not all of them")


def allreduce_counted_once(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """Half of the all-reduce's bytes: an all-reduce counted as one pass over the buffer, not a
    reduce-scatter followed by an all-gather."""
    total = comm_per_rank(strategy, psi, n, m, recipe).total()
    return Mistake("allreduce_counted_once", float(Fraction(total) / 2),
                   "an all-reduce is two passes, a reduce-scatter and an all-gather: 2(N-1)/N of the buffer, "
                   "not (N-1)/N")


def other_stage_comm(asked: str, confused: str, psi, n, m=1, recipe=None) -> Mistake:
    """Bytes sent per step by another strategy than the one asked."""
    return Mistake("other_stage_comm", float(comm_per_rank(confused, psi, n, m, recipe).total()),
                   f"that is what {_what(confused)} sends, not {_what(asked)}")


def fp32_gradients(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """Communication counted with 4-byte gradients where the recipe's are 2 bytes."""
    return Mistake("fp32_gradients", float(comm_per_rank(strategy, psi, n, m, recipe, reduce_dtype="fp32").total()),
                   "the recipe's gradients are bf16 (2 bytes), not fp32")


# ----------------------------------------------------------------- dim-0 shards (FSDP2)
def even_split(d0: int, n: int, per_row=1) -> Mistake:
    """d0/N rows each, fractions and all: a flat parameter's even split (FSDP1) for FSDP2's
    whole rows."""
    return Mistake("even_split", float(Fraction(d0, n) * per_row),
                   "that is an even split of the elements, FSDP1's flat chunks; FSDP2 gives each rank whole rows")


def full_chunk_everywhere(d0: int, n: int, per_row=1) -> Mistake:
    """ceil(d0/N) rows for every rank: the last rank's shorter (or empty) chunk forgotten."""
    return Mistake("full_chunk_everywhere", float(-(-d0 // n) * per_row),
                   "that is the chunk c = ceil(d0/N) of the first ranks; the last rank gets what is left")


def floor_rows(d0: int, n: int, per_row=1) -> Mistake:
    """floor(d0/N) rows each: the rows left over have no owner."""
    return Mistake("floor_rows", float(d0 // n * per_row),
                   "floor(d0/N) rows each would leave rows with no owner")


def unpadded_buffer(d0: int, n: int, per_row=1) -> Mistake:
    """The parameter's own elements for the all-gather's buffer: the short chunk's padding left out."""
    return Mistake("unpadded_buffer", float(d0 * per_row),
                   "that is the parameter itself; on the wire every rank's chunk is padded to c rows")


def one_padded_chunk(d0: int, n: int, per_row=1) -> Mistake:
    """One rank's padded chunk for the whole all-gather buffer (N of them)."""
    return Mistake("one_padded_chunk", float(-(-d0 // n) * per_row),
                   "that is one rank's padded chunk; the all-gather's buffer holds N of them")


# ----------------------------------------------------------------- activations
def other_recompute(asked: str, confused: str, s, b, h, a, layers: int = 1) -> Mistake:
    """The activations of another recompute mode than the one asked (Korthikanti et al. 2022)."""
    what = {"none": "without recompute, sbh(34 + 5as/h)", "selective": "selective recompute, 34sbh",
            "full": "full recompute, 2sbh: only the layer's input is kept"}
    return Mistake("other_recompute", float(layers * korthikanti_layer_bytes(s, b, h, a, confused)),
                   f"that is {what[confused]}, not {asked}")


def one_layer_only(s, b, h, a, recompute: str, layers: int) -> Mistake:
    """One layer's activations where the model's were asked."""
    return Mistake("one_layer_only", float(korthikanti_layer_bytes(s, b, h, a, recompute)),
                   f"one layer only; the model has {layers}")


# ----------------------------------------------------------------- one collective on a ring
def whole_buffer_sent(op: str, nbytes, n) -> Mistake:
    """A ring collective counted as sending its whole buffer (per pass) instead of N-1 of its N
    chunks: the large-N limit taken for the finite N asked."""
    passes = 2 if op == "all_reduce" else 1
    return Mistake("whole_buffer_sent", float(passes * nbytes),
                   "a rank never sends the chunk it would receive back: N-1 of the N chunks per pass, "
                   "the whole buffer only in the limit of large N")


def one_pass_of_allreduce(nbytes, n) -> Mistake:
    """An all-reduce counted as one pass: only its reduce-scatter (or only its all-gather)."""
    return Mistake("one_pass_of_allreduce", float(sent_bytes("reduce_scatter", nbytes, n)),
                   "that is one half of the ring, the reduce-scatter or the all-gather; an all-reduce runs both")


def allreduce_for(op: str, nbytes, n) -> Mistake:
    """An all-gather or a reduce-scatter counted as an all-reduce (two passes)."""
    return Mistake("allreduce_for", float(sent_bytes("all_reduce", nbytes, n)),
                   f"that is an all-reduce; a{'n' if op[0] == 'a' else ''} {op.replace('_', '-')} is one pass "
                   "around the ring")


def elements_for_bytes(nbytes, bytes_per_element: int) -> Mistake:
    """Elements counted where bytes were asked."""
    return Mistake("elements_for_bytes", float(Fraction(nbytes) / bytes_per_element),
                   f"that counts elements; each is {bytes_per_element} bytes")


MISTAKES = (whole_buffer_sent, one_pass_of_allreduce, allreduce_for, elements_for_bytes, other_stage_states,
            optimizer_forgotten, parameters_only, other_recompute, one_layer_only, even_split,
            full_chunk_everywhere, floor_rows, unpadded_buffer, one_padded_chunk, only_optimizer_shard, missing_gradients, ring_factor_dropped,
            allreduce_counted_once, other_stage_comm, fp32_gradients)

__all__ = ["Mistake", "MISTAKES", *[f.__name__ for f in MISTAKES]]
