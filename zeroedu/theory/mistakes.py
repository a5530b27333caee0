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
from .allocator import ROUND_LARGE, block_bytes
from .comm import comm_per_rank, sent_bytes
from .fp8 import FORMATS, get_format
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


# ----------------------------------------------------------------- a figure read off a report
def sign_flipped(difference) -> Mistake:
    """A difference taken the other way round: b - a where a - b was asked."""
    return Mistake("sign_flipped", -float(difference), "the sign: that is the difference the other way round")


def upside_down(ratio) -> Mistake:
    """A ratio inverted: b / a where a / b was asked."""
    return Mistake("upside_down", 1 / float(ratio), "upside down: that is the inverse ratio")


def complement(share) -> Mistake:
    """The rest's share, 1 - s, where the share s was asked."""
    return Mistake("complement", 1 - float(share), "that is the share of everything else")


def part_over_rest(share) -> Mistake:
    """A part divided by the rest, s / (1 - s), where its share of the whole was asked."""
    s = Fraction(share)
    return Mistake("part_over_rest", float(s / (1 - s)), "that divides by the rest, not by the whole")


def assumed_equal(kind: str) -> Mistake:
    """Two figures taken to be the same without reading them: a difference of 0, a ratio of 1."""
    if kind not in ("difference", "ratio"):
        raise ValueError("kind is 'difference' or 'ratio'")
    return Mistake("assumed_equal", 0.0 if kind == "difference" else 1.0,
                   "the two figures are not the same: read each one")


def framing_left_out(payload) -> Mistake:
    """The payload (the ring model's bytes) given where the wire's bytes were asked: the
    transport's framing, headers per message, forgotten."""
    return Mistake("framing_left_out", float(payload),
                   "that is the payload (the ring model); the wire also carries each message's framing")


def framing_not_subtracted(wire) -> Mistake:
    """The whole wire figure given where only the framing (wire - payload) was asked."""
    return Mistake("framing_not_subtracted", float(wire), "that is the whole wire figure; take the payload away")


def one_part_only(parts: dict, part: str) -> Mistake:
    """One part of a breakdown (one collective, one category, one phase) given for another part or
    for the whole."""
    return Mistake("one_part_only", float(parts[part]), f"that is {part} alone")


def own_shard_forgotten(full) -> Mistake:
    """What a sharded strategy saves taken as the whole buffer: the 1/N shard it still keeps
    forgotten."""
    return Mistake("own_shard_forgotten", float(full), "that is the whole buffer; the rank still keeps its own 1/N shard")


def not_per_parameter(total_bytes) -> Mistake:
    """A total in bytes given where bytes per parameter were asked."""
    return Mistake("not_per_parameter", float(total_bytes), "that is the total in bytes; divide by Ψ")


def root_of_every_parameter(psi, n, bytes_per_element: int = 4) -> Mistake:
    """The foreach optimizer's temporaries counted for the whole model on a rank that updates
    only its shard: Ψ elements where it is Ψ/N."""
    return Mistake("root_of_every_parameter", float(Fraction(int(psi)) * bytes_per_element),
                   f"that is a root for every parameter of the model; this rank updates only its shard, Ψ/{n} of them")


def for_loop_temporaries(psi, n) -> Mistake:
    """The for-loop Adam's two shard-sized tensors given for foreach, which makes one."""
    return Mistake("for_loop_temporaries", float(Fraction(8 * (int(psi) // n))),
                   "that is the for-loop Adam's two tensors (the root and the quotient); foreach makes one root per "
                   "parameter, 4 bytes each, all at once")


# ----------------------------------------------------------------- counting per step
def once_per_micro_batch(per_step, k: int) -> Mistake:
    """What happens once per optimizer step counted once per micro-batch (K times)."""
    return Mistake("once_per_micro_batch", float(Fraction(per_step) * k),
                   f"that repeats it for each of the {k} micro-batches")


def split_over_micro_batches(per_step, k: int) -> Mistake:
    """A per-step figure divided among the K micro-batches, as if it shrank with the batch."""
    return Mistake("split_over_micro_batches", float(Fraction(per_step) / k),
                   "it does not shrink with the micro-batch: the gradient is as large as the model")


def per_step_not_per_unit(count: int, units: int) -> Mistake:
    """One collective per step counted where there is one per unit."""
    return Mistake("per_step_not_per_unit", float(Fraction(count, units)), f"there is one per unit ({units} units)")


def per_unit_for_per_parameter(units: int, per_unit: int = 3) -> Mistake:
    """The batched layout's count (per_unit collectives per FSDP unit) for a layout that
    communicates each parameter on its own."""
    return Mistake("per_unit_for_per_parameter", float(per_unit * units),
                   "that is the batched variant's count, per unit, not per parameter")


def one_per_parameter(params: int) -> Mistake:
    """One collective per parameter per step: the second all-gather and the reduce-scatter
    forgotten."""
    return Mistake("one_per_parameter", float(params),
                   "each parameter is gathered twice and reduce-scattered once per step")


def messages_for_collectives(collectives: int, n: int) -> Mistake:
    """Point-to-point messages counted (N-1 per ring pass) where collectives were asked."""
    return Mistake("messages_for_collectives", float(collectives * (n - 1)),
                   f"that counts point-to-point messages (N - 1 = {n - 1} per ring pass), not collectives")


# ----------------------------------------------------------------- how bytes scale
def doubles_with_n(n_from: int, n_to: int) -> Mistake:
    """Bytes per rank taken to grow in proportion to N."""
    return Mistake("doubles_with_n", n_to / n_from,
                   "bytes per rank do not grow in proportion to N: a ring sends (N-1)/N of each buffer per rank")


def shrinks_with_n(n_from: int, n_to: int) -> Mistake:
    """Bytes per rank taken to shrink as 1/N, like a shard."""
    return Mistake("shrinks_with_n", n_from / n_to,
                   "the shard shrinks with N, the bytes a rank sends do not: (N-1)/N of each buffer")


def one_over_m(m: int) -> Mistake:
    """A share of traffic taken as 1/M of the total, as if every axis carried the same."""
    return Mistake("one_over_m", 1 / m, "1/M would mean every axis carries the same bytes")


def naive_root_sends(nbytes, n: int) -> Mistake:
    """What the root of a naive gather-then-broadcast sends, (N-1)·S, for a ring rank's bytes."""
    return Mistake("naive_root_sends", float((n - 1) * Fraction(nbytes)),
                   "(N-1)·S is what the root of a gather-then-broadcast sends; a ring rank only sends chunks of S/N")


def one_chunk_only(nbytes, n: int) -> Mistake:
    """One chunk, S/N, for a ring pass that forwards N-1 of them."""
    return Mistake("one_chunk_only", float(Fraction(nbytes) / n),
                   "S/N is one chunk; each rank forwards N-1 of them around the ring")


def ring_model_share(op: str, strategy: str, psi, n, m=1, recipe=None, reduce_dtype=None) -> Mistake:
    """The share of one collective in a strategy's bytes on the ring model: right for the ring
    (and NCCL), not for a transport whose collective sends more, nor for another strategy."""
    c = comm_per_rank(strategy, psi, n, m, recipe, reduce_dtype=reduce_dtype)
    part = c.by_collective().get(op, Fraction(0))
    return Mistake("ring_model_share", float(part / Fraction(c.total())),
                   f"that is the {op.replace('_', '-')}'s share on the ring model of {_what(strategy)}")


# ----------------------------------------------------------------- time on a link
def bytes_time_kept(busy, collectives: int) -> Mistake:
    """A collective's fixed cost read as the link's whole busy time per collective: the bytes'
    own time S·r left in."""
    return Mistake("bytes_time_kept", float(busy) / collectives,
                   "that shares the bytes' time among the collectives too; take S·r out first")


def latency_alone(alpha, n: int) -> Mistake:
    """A ring all-reduce's fixed cost taken as the link's latency alone, 2(N-1)·α."""
    return Mistake("latency_alone", 2 * (n - 1) * float(alpha),
                   "that is the link's latency alone, 2(N-1)α; launching a collective and handing its "
                   "messages over cost more")


def bytes_time_ignored(nbytes, fixed, t_backward) -> Mistake:
    """The smallest bucket the link keeps up with, S·a/T_b: the bytes' own time S·r not taken out
    of backward."""
    return Mistake("bytes_time_ignored", float(nbytes) * float(fixed) / float(t_backward),
                   "the bytes' own time S·r has to fit inside backward too: only T_b - S·r is left for the fixed costs")


# ----------------------------------------------------------------- solving for N or M
def off_by_one(right: int, step: int = -1) -> Mistake:
    """A neighbour of the smallest N (or M) that satisfies a budget: the bound not checked at the
    answer given."""
    return Mistake("off_by_one", float(right + step), "one off: check the inequality at that value")


def power_of_two_habit(right: int) -> Mistake:
    """The next power of two where the smallest integer was asked."""
    p = 1
    while p < right:
        p *= 2
    return Mistake("power_of_two_habit", float(p), "a power of two fits, but it is not the smallest that does")


def optimizer_over_m_only(psi, n, m, recipe=None) -> Mistake:
    """HFSDP's model states with the optimizer state split M ways only (across domains), not N·M."""
    s = model_states("fsdp1", psi, n, 1, recipe)
    per_m = Fraction(model_states("ddp", psi, 1, 1, recipe).optim) / m
    return Mistake("optimizer_over_m_only", float(s.param + s.grad + per_m),
                   "the optimizer state is split over every rank, N·M ways, not M ways")


def elements_ratio(a_elements, b_elements) -> Mistake:
    """A ratio of bytes taken as the ratio of the elements moved: right only when every pass has
    the same dtype."""
    return Mistake("elements_ratio", float(Fraction(a_elements) / Fraction(b_elements)),
                   "that counts elements; in bytes it holds only when every pass uses the same dtype")


def kept_for_saved(kept) -> Mistake:
    """What a scheme keeps given where what it saves was asked."""
    return Mistake("kept_for_saved", float(kept), "that is what it keeps, not what it saves")


def nothing_kept(total) -> Mistake:
    """A saving taken as the whole: what the scheme still keeps forgotten."""
    return Mistake("nothing_kept", float(total), "that is everything; the scheme still keeps part of it")


def other_mode(figure, mode: str) -> Mistake:
    """A figure of another mode or option than the one asked (another recompute mode, resharding
    on where it is off)."""
    return Mistake("other_mode", float(figure), f"that is {mode}")


def transient_forgotten(states, *kept) -> Mistake:
    """A peak taken as the model states (plus `kept`): the transient buffers a unit holds at its
    peak (its gathered parameters, its unsharded gradient before the reduce-scatter) forgotten."""
    return Mistake("transient_forgotten", float(sum((Fraction(k) for k in kept), Fraction(states))),
                   "the transient buffers of the unit at work (gathered parameters, unsharded gradient) are missing")


def heads_alone(s, b, h, a) -> Mistake:
    """Korthikanti et al.'s attention term 5as/h taken as 5a: the scores' s/h forgotten."""
    return Mistake("heads_alone", float(s * b * h * (34 + 5 * a)), "5as/h: the heads times s over h, not the heads alone")


def all_sharded(strategy: str, psi, n, m=1, recipe=None) -> Mistake:
    """Every category divided by N, where the strategy keeps some of them whole (only ZeRO-3
    shards parameters, gradients and optimizer state alike)."""
    return Mistake("all_sharded", float(Fraction(model_states(strategy, psi, 1, 1, recipe).total) / n),
                   f"{_what(strategy)} does not shard every category: only ZeRO-3 divides all three by N")


def large_n_limit(strategy: str, psi, recipe=None) -> Mistake:
    """Model states per GPU in the limit N -> infinity (what stays whole), for a finite N asked."""
    one, two = (Fraction(model_states(strategy, psi, k, 1, recipe).total) for k in (1, 2))
    return Mistake("large_n_limit", float(2 * two - one),  # T(N) = U + S/N, so U = 2T(2) - T(1)
                   "that is the limit of large N; at the N asked the sharded terms still count")


def baseline_forgotten(figure) -> Mistake:
    """A difference between two strategies taken as one's whole buffer: what the other already
    holds of it forgotten."""
    return Mistake("baseline_forgotten", float(figure), "that is the whole buffer; the other strategy already holds part of it")


def whole_for_shard(shard, n: int) -> Mistake:
    """The whole model's bytes where each GPU handles only its 1/N shard."""
    return Mistake("whole_for_shard", float(Fraction(shard) * n), "that is the whole model's; each GPU moves its 1/N shard")


def other_recipe_bytes(asked: str, confused: str) -> Mistake:
    """Bytes per parameter of another precision recipe than the one asked."""
    from ..recipes import get_recipe

    return Mistake("other_recipe_bytes", float(get_recipe(confused).total_bytes),
                   f"that is the {confused} recipe's bytes per parameter, not {asked}'s")


def master_forgotten(recipe: str) -> Mistake:
    """Bytes per parameter of a mixed-precision recipe without its fp32 master copy: the
    optimizer updates an fp32 copy of every 16-bit weight (4 bytes), which is easy to leave out
    of "2 + 2 + 8"."""
    from ..recipes import get_recipe

    r = get_recipe(recipe)
    if r.master is None:
        raise ValueError(f"{recipe} keeps no separate master copy")
    return Mistake("master_forgotten", float(r.total_bytes - 4),
                   "that leaves out the fp32 master copy of the weights (4 bytes): Adam updates an fp32 copy, "
                   "not the 16-bit weight, so the optimizer state is master + m + v = 12 bytes")


def gathers_counted_as_allreduces(psi, n) -> Mistake:
    """ZeRO-3's traffic over DDP's with the two parameter all-gathers and the gradient
    reduce-scatter counted as two all-reduces: the "double" some notes quote."""
    ddp = Fraction(comm_per_rank("ddp", psi, n).total())  # one all-reduce of the gradients
    return Mistake("gathers_counted_as_allreduces", float(2 * ddp / ddp),
                   "the \"double\" myth: an all-gather or a reduce-scatter moves half an all-reduce's bytes, "
                   "so two gathers and one reduce-scatter are 3Ψ against DDP's 2Ψ, 1.5 times, not 2")


def forward_flops_only(seconds, psi, flops) -> Mistake:
    """Tokens whose compute lasts `seconds` at `flops`, counted with 2Ψ FLOPs per token (the
    forward alone) instead of 6Ψ (forward 2Ψ + backward 4Ψ)."""
    return Mistake("forward_flops_only", float(seconds) * float(flops) / (2 * float(psi)),
                   "a token costs 6Ψ FLOPs in training, forward 2Ψ and backward 4Ψ; 2Ψ is the forward alone")


def one_latency_per_collective(n: int, bandwidth, alpha, efficiency) -> Mistake:
    """The bucket at which a ring all-reduce's bytes take `efficiency` of its time, with one α
    per collective instead of one per ring step, 2(N-1) of them."""
    e = float(efficiency)
    transfer_per_byte = 2 * (n - 1) / (n * float(bandwidth))
    return Mistake("one_latency_per_collective", e / (1 - e) * float(alpha) / transfer_per_byte,
                   "a ring all-reduce pays α at each of its 2(N-1) steps, not once")


# ----------------------------------------------------------------- pipelines
def bubble_over_busy(p: int, m: int) -> Mistake:
    """The pipeline's idle slots divided by its busy ones, (p-1)/m, where their share of the step,
    (p-1)/(m+p-1), was asked. (p-1)/m is a convention of its own, not an error: Narayanan et al.
    2021, §2.2.1, call it the bubble time fraction, the idle time over the ideal time; the
    feedback names both."""
    return Mistake("bubble_over_busy", float(Fraction(p - 1, m)),
                   f"that is (p - 1)/m, the {p - 1} idle slots over the {m} busy ones: the bubble against the ideal "
                   f"time (Narayanan et al. 2021's \"bubble time fraction\"); the question asks its share of the "
                   f"whole step, m + p - 1 = {m + p - 1} slots long")


# ----------------------------------------------------------------- context and expert parallelism
def ring_hops_all(batch: int, kv_heads: int, seq: int, d_head: int, cp: int, dtype_bytes: int) -> Mistake:
    """K and V sent cp times around the ring, 2·cp·b, where each travels cp - 1 hops, 2(cp-1)·b
    (b = batch·kv_heads·(seq/cp)·d_head·dtype_bytes, one K or V block)."""
    b = batch * kv_heads * (seq // cp) * d_head * dtype_bytes
    return Mistake("ring_hops_all", 2 * cp * b,
                   f"a rank's own K and V block never travels: each goes cp - 1 = {cp - 1} hops, not {cp}")


def imbalance_vs_mean(cp: int) -> Mistake:
    """The last rank's causal score work over the mean rank's, 2cp/(cp+1), where over the first
    rank's, cp, was asked."""
    return Mistake("imbalance_vs_mean", 2 * cp / (cp + 1),
                   f"that compares the last rank with the mean; the first rank computes 1 block, the last {cp}")


def top_k_forgotten(total, top_k: int) -> Mistake:
    """A top-k figure (bytes or capacity) computed as if every token chose one expert."""
    return Mistake("top_k_forgotten", float(total) / top_k,
                   f"each token goes to each of its k = {top_k} experts: k rows, and k places in the capacity")


def tp_forward_only(total) -> Mistake:
    """Tensor parallelism's bytes per layer counted for the forward pass alone (2 all-reduces of 4)."""
    return Mistake("tp_forward_only", float(total) / 2,
                   "backward all-reduces the input gradients of both column-parallel matmuls: 4 per layer, not 2")


def tp_splits_everything(s: int, b: int, h: int, t: int) -> Mistake:
    """A layer's activations under tensor parallelism without sequence parallelism counted as 34sbh/t,
    as if t split every tensor."""
    return Mistake("tp_splits_everything", 34 * s * b * h / t,
                   "that is with sequence parallelism; tensor parallelism alone keeps 10sbh of every layer whole "
                   "on each rank (the LayerNorm inputs, the inputs of the first matmuls, the dropout masks)")


def recompute_in_mfu(tokens_per_second, psi, peak_flops) -> Mistake:
    """MFU counted with the recomputed forward's FLOPs, 8Ψ per token: that is the hardware FLOPs utilisation."""
    return Mistake("recompute_in_mfu", 8 * float(psi) * float(tokens_per_second) / float(peak_flops),
                   "the recomputed forward is work the hardware does, not the model: 8Ψ per token is HFU; MFU counts 6Ψ")


def one_head_scores(b: int, s: int, dtype_bytes: int) -> Mistake:
    """The attention scores of one layer counted for one head, b·s²·bytes."""
    return Mistake("one_head_scores", b * s * s * dtype_bytes,
                   "every head has its own S × S scores: a of them per layer")


def masked_scores_only(cp: int) -> Mistake:
    """The last rank's causal score work over the first's counted in the scores the mask keeps,
    (cp - 1/2)/(1/2) = 2cp - 1, where each diagonal block is computed whole: cp blocks over 1.
    2cp - 1 is right where a causal kernel runs the diagonal block (ring-flash-attention's ring
    and zig-zag attention do, causal=True on the diagonal step): the feedback says so."""
    return Mistake("masked_scores_only", 2 * cp - 1,
                   f"that counts only the scores the mask keeps, r + 1/2 blocks for rank r: right with a causal "
                   f"kernel on the diagonal block (ring-flash-attention runs it so); here a diagonal block is "
                   f"computed whole and then masked, so rank r computes r + 1 blocks: {cp} over 1")


def scale_inverted(amax, fmt: str = "e4m3") -> Mistake:
    """An FP8 scale taken as amax / max, the inverse of max / amax."""
    return Mistake("scale_inverted", float(Fraction(str(amax)) / get_format(fmt).max),
                   "upside down: that is amax / max, which shrinks the tensor further below the format's smallest "
                   "normal; the scale is max / amax")


def other_fp8_format(amax, fmt: str = "e4m3") -> Mistake:
    """An FP8 scale computed with the other format's largest value."""
    other = next(f for name, f in FORMATS.items() if name != fmt)
    return Mistake("other_fp8_format", float(other.max / Fraction(str(amax))),
                   f"that scales to {other.name.upper()}'s largest, {float(other.max):g}; "
                   f"{fmt.upper()} tops out at {float(FORMATS[fmt].max):g}, so the cast would overflow")


def block_as_reserved(nbytes) -> Mistake:
    """The allocator's reservation taken as the request, or as its block rounded up to 512 bytes (the
    two are within the grader's tolerance of each other)."""
    return Mistake("block_as_reserved", float(block_bytes(nbytes)),
                   "that is the request, or its block rounded up to 512 bytes; the allocator takes a whole segment "
                   "from the driver and keeps the rest of it cached")


def large_rounding_everywhere(nbytes) -> Mistake:
    """A 1-10 MiB request's segment rounded up to 2 MiB, the rule for requests of 10 MiB and more."""
    return Mistake("large_rounding_everywhere", float(-(-block_bytes(nbytes) // ROUND_LARGE) * ROUND_LARGE),
                   "that rounds up to 2 MiB, the rule from 10 MiB on; a request between 1 and 10 MiB takes a "
                   "20 MiB segment")


def home_rows_counted(every_row) -> Mistake:
    """An expert-parallel dispatch's bytes counted from every row a rank routed, its own experts'
    rows too, which never leave the rank."""
    return Mistake("home_rows_counted", float(every_row),
                   "that counts every row the rank routed, with the ones for experts it holds itself, which "
                   "never leave the rank")


def home_rows_only(home_rows) -> Mistake:
    """The rows that stay on the rank (to the experts it holds) given for the ones that cross."""
    return Mistake("home_rows_only", float(home_rows),
                   "those are the rows that stay: they go to the experts the rank holds itself")


MISTAKES = (home_rows_counted, home_rows_only, scale_inverted, other_fp8_format, block_as_reserved, large_rounding_everywhere,
            masked_scores_only, bubble_over_busy, ring_hops_all, tp_forward_only, tp_splits_everything,
            recompute_in_mfu, one_head_scores, imbalance_vs_mean, top_k_forgotten, whole_buffer_sent, one_pass_of_allreduce, allreduce_for, elements_for_bytes, other_stage_states,
            optimizer_forgotten, parameters_only, other_recompute, one_layer_only, even_split,
            full_chunk_everywhere, floor_rows, unpadded_buffer, one_padded_chunk, only_optimizer_shard, missing_gradients, ring_factor_dropped,
            allreduce_counted_once, other_stage_comm, fp32_gradients, sign_flipped, upside_down, complement,
            part_over_rest, assumed_equal, framing_left_out, framing_not_subtracted, one_part_only,
            own_shard_forgotten, not_per_parameter, once_per_micro_batch, split_over_micro_batches,
            per_step_not_per_unit, per_unit_for_per_parameter, one_per_parameter, messages_for_collectives,
            doubles_with_n, shrinks_with_n, one_over_m, naive_root_sends, one_chunk_only,
            ring_model_share, bytes_time_kept, latency_alone, bytes_time_ignored, off_by_one, power_of_two_habit,
            optimizer_over_m_only, elements_ratio, kept_for_saved, nothing_kept, other_mode,
            transient_forgotten, heads_alone, all_sharded, large_n_limit, baseline_forgotten,
            whole_for_shard, other_recipe_bytes, forward_flops_only, one_latency_per_collective, master_forgotten,
            gathers_counted_as_allreduces, root_of_every_parameter, for_loop_temporaries)

__all__ = ["Mistake", "MISTAKES", *[f.__name__ for f in MISTAKES]]
