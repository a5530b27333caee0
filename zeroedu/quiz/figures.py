"""The figures the interview cards quote, as named functions of the theory layer.

A card's data file (`zeroedu/quiz/cards/*.yaml`) names a figure's function and its arguments::

    figures:
      z1: {fn: model_states, strategy: zero1, psi: 7.0e+9, n: 8}

and `deck.Fig.value()` calls ``FIGURES["model_states"](strategy="zero1", psi=7e9, n=8)``: no
expression is evaluated, and every figure goes through `zeroedu.theory` except `given`, an
assumption (a GPU's memory, a library default), which the card marks ``input: true`` with a note
saying where it comes from. A new kind of figure is a new function here, registered in
`FIGURES`, with the closed form it computes in its docstring.
"""
from __future__ import annotations

from fractions import Fraction

from .. import recipes, theory
from ..theory import activations, allocator, hybrid
from ..theory import fp8 as fp8_theory
from ..theory import context as context_theory
from ..theory import tensor_parallel as tp_theory
from ..theory import experts as experts_theory
from ..theory import pipeline as pipeline_theory

LINKS = ("dp_shard", "dp_outer")  # the links' presets: inside an NVLink domain, across domains


def _link(link: str) -> float:
    if link not in LINKS:
        raise ValueError(f"link is one of {LINKS}, got {link!r}")
    return theory.DEFAULT_BANDWIDTH[link]


def given(value):
    """An assumption, not a theory output (the card says where it comes from)."""
    return value


def recipe_bytes(recipe: str, part: str = "total_bytes"):
    """Bytes per parameter of a precision recipe: `total_bytes`, `optim_bytes`, `grad_bytes`, ..."""
    return getattr(recipes.get_recipe(recipe), part)


def model_states(strategy: str, psi, n: int, m: int = 1, recipe: str | None = None, part: str = "total"):
    """Model-state bytes per GPU (`theory.model_states`), one category or the total."""
    return getattr(theory.model_states(strategy, psi, n, m, recipe), part)


def comm_total(strategy: str, psi, n: int, m: int = 1, recipe: str | None = None, micro_batches: int = 1,
               reshard_after_forward: bool = True, reduce_dtype: str | None = None):
    """Bytes one rank sends per optimizer step, ring model (`theory.comm_per_rank`)."""
    return theory.comm_per_rank(strategy, psi, n, m, recipe, reshard_after_forward=reshard_after_forward,
                                micro_batches=micro_batches, reduce_dtype=reduce_dtype).total()


def comm_collective(strategy: str, psi, n: int, collective: str, clip: bool = False):
    """Bytes one rank sends per step in one kind of collective."""
    return theory.comm_per_rank(strategy, psi, n, clip=clip).by_collective()[collective]


def comm_ratio(strategy: str, versus: str, psi, n: int, reduce_dtype: str | None = None,
               versus_reduce_dtype: str | None = None):
    """One strategy's bytes per step divided by another's, each with its reduce dtype."""
    return (comm_total(strategy, psi, n, reduce_dtype=reduce_dtype)
            / comm_total(versus, psi, n, reduce_dtype=versus_reduce_dtype))


def zeropp_ratio(psi, n: int):
    """ZeRO-3's bytes over ZeRO++'s (Wang et al. 2023 §3): one all-gather of Ψ bf16 parameters (the
    backward one is served from the secondary shard inside the node, counted away) and a
    reduce-scatter of int4 gradients, Ψ/2 bytes."""
    zpp = theory.sent_bytes("all_gather", psi * 1, n) + theory.sent_bytes("reduce_scatter", Fraction(psi) / 2, n)
    return comm_total("fsdp1", psi, n) / zpp


def sent_bytes(collective: str, nbytes, n: int, times: int = 1):
    """Bytes one rank sends in `times` ring collectives of an `nbytes` buffer."""
    return times * theory.sent_bytes(collective, nbytes, n)


def recipe_sent(collective: str, psi, n: int, recipe: str):
    """Bytes one rank sends in a ring collective of Ψ gradients in the recipe's gradient dtype."""
    return theory.sent_bytes(collective, psi * recipes.get_recipe(recipe).grad_bytes, n)


def bandwidth(link: str):
    """The link preset's bandwidth per GPU, bytes per second."""
    return _link(link)


def bandwidth_ratio(link: str, versus: str):
    return _link(link) / _link(versus)


def alpha(link: str):
    """The link preset's latency per message, seconds."""
    _link(link)
    return theory.DEFAULT_ALPHA[link]


def all_gather_time(nbytes, n: int, link: str):
    """A ring all-gather of `nbytes` on the link, bandwidth term only."""
    return theory.all_gather_time(nbytes, n, _link(link))


def ring_allreduce_time(nbytes, n: int, link: str):
    """A ring all-reduce of `nbytes` on the link: 2(N-1)α + 2(N-1)/N · S/β."""
    return theory.ring_allreduce_time(nbytes, n, _link(link), theory.DEFAULT_ALPHA[link])


def min_bucket_bytes(n: int, link: str, efficiency: float):
    """The smallest all-reduce bucket that reaches `efficiency` of the link's bandwidth."""
    return theory.min_bucket_bytes(n, _link(link), theory.DEFAULT_ALPHA[link], efficiency=efficiency)


def comm_time(strategy: str, psi, n: int, link: str | None = None, per_second: float | None = None):
    """A step's communication time on the ring model; `link` puts the strategy's one axis on that
    preset (default: its own); `per_second` on a link of that bandwidth instead (an achieved rate
    where the presets are line rates, `theory.timing.DEFAULT_BANDWIDTH`)."""
    bw = None if link is None else {"dp_shard": _link(link)}
    if per_second is not None:
        bw = {"dp_shard": per_second}
    return theory.comm_time(theory.comm_per_rank(strategy, psi, n), bw)


def tokens_to_hide(strategy: str, psi, n: int, flops: float, link: str | None = None,
                   per_second: float | None = None):
    """Tokens per GPU per step whose compute (6Ψ FLOPs each at `flops`) lasts as long as the
    step's communication: fewer, and the link shows."""
    return comm_time(strategy, psi, n, link, per_second) * flops / (6 * psi)


def cross_domain_bytes(layout: str, psi, n: int, m: int):
    """Bytes per rank per step that cross NVLink domains (`theory.hybrid`)."""
    return hybrid.cross_domain_bytes(layout, psi, n, m)


def cross_domain_ratio(layout: str, versus: str, psi, n: int, m: int):
    return hybrid.cross_domain_bytes(layout, psi, n, m) / hybrid.cross_domain_bytes(versus, psi, n, m)


def step_comm_time(layout: str, psi, n: int, m: int, flat_ring: str | None = None):
    """A step's communication time for a hybrid layout on the two link presets."""
    return hybrid.step_comm_time(layout, psi, n, m, **({"flat_ring": flat_ring} if flat_ring else {}))


def layer_activations(s: int, b: int, h: int, a: int, recompute: str = "none", layers: int = 1):
    """Activation bytes of `layers` transformer layers (Korthikanti et al. 2022, Table 2)."""
    return layers * activations.korthikanti_layer_bytes(s, b, h, a, recompute)


def layer_activations_fused(s: int, b: int, h: int, a: int, attention: str = "fused"):
    """One layer's activations with fused attention (the S×S scores never stored)."""
    return activations.korthikanti_layer_bytes_tp(s, b, h, a, 1, "none", 2, attention)


def offloaded(strategy: str, psi, n: int, side: str, parts: tuple = ("total",), per_second: float | None = None):
    """ZeRO-Offload's bytes on `side` (device or host) per GPU, summed over `parts`; divided by
    `per_second` (a PCIe link) it is the time to move them."""
    states = theory.offload(strategy, psi, n)[side]
    total = sum(getattr(states, p) for p in parts)
    return total if per_second is None else total / per_second


def offload_pcie(strategy: str, psi, n: int, upload: str = "bit16", per_second: float | None = None):
    """Bytes one GPU moves over PCIe per step under optimizer offload, both directions
    (`theory.offload_pcie_bytes`; `upload` as DeepSpeed's version does it); divided by
    `per_second` (a PCIe link) it is the time to move them one direction after the other."""
    total = theory.offload_pcie_bytes(strategy, psi, n, upload=upload)["total"]
    return total if per_second is None else total / per_second


def composed_states(strategy: str, psi, n: int, tp: int):
    """Model-state bytes per GPU with tensor parallelism of degree `tp` composed (`theory.compose`)."""
    return theory.compose(strategy, psi, n, tp=tp).total


def adam_step_temporaries(implementation: str, psi, n: int):
    """Bytes one Adam step allocates for an instant beyond its state, on a rank that updates one
    flat fp32 shard of Ψ/N elements (ZeRO-1 / ZeRO-2 / FSDP1): `theory.memory.adam_step_temporaries`
    for "foreach" (4Ψ/N), "for-loop" (8Ψ/N), "fused" (0) or "zeroedu" (two 4 MiB chunks)."""
    return theory.memory.adam_step_temporaries(implementation, [int(psi) // n], copied=implementation == "zeroedu")


def pipeline_bubble(p: int, m: int):
    """The share of a step each of p pipeline stages idles with m micro-batches, (p-1)/(m+p-1)
    (`theory.pipeline.bubble_fraction`)."""
    return pipeline_theory.bubble_fraction(p, m)


def pipeline_in_flight(schedule: str, p: int, m: int, stage: int = 0):
    """The most micro-batches whose activations a stage holds at once (`theory.pipeline.in_flight`):
    m under GPipe, min(p - stage, m) under 1F1B."""
    return pipeline_theory.in_flight(schedule, p, m, stage)


def cp_ring_bytes(batch: int, kv_heads: int, seq: int, d_head: int, cp: int, dtype_bytes: int,
                  direction: str = "forward"):
    """Bytes one rank sends around the context-parallel ring per attention layer and micro-batch
    (`theory.context.ring_bytes`): forward 2(cp-1)·b, backward 2(cp-1)·b + 2cp·b."""
    return context_theory.ring_bytes(batch, kv_heads, seq, d_head, cp, dtype_bytes)[direction]


def cp_imbalance(seq: int, cp: int, zigzag: bool = False):
    """The most-loaded rank's causal score work over the least-loaded's (`theory.context.work_elements`)."""
    work = [context_theory.work_elements(1, 1, seq, cp, r, zigzag) for r in range(cp)]
    return Fraction(max(work), min(work))


def cp_blocks(seq: int, cp: int, rank: int, zigzag: bool = False):
    """Score blocks rank `rank` computes per head, in units of the zig-zag chunk squared, (S/2cp)²."""
    return Fraction(context_theory.work_elements(1, 1, seq, cp, rank, zigzag), (seq // (2 * cp)) ** 2)


def ep_balanced_bytes(tokens: int, top_k: int, d_model: int, ep: int, dtype_bytes: int):
    """One all-to-all's bytes per rank at a perfectly balanced router (`theory.experts.balanced_bytes`)."""
    return experts_theory.balanced_bytes(tokens, top_k, d_model, ep, dtype_bytes)


def ep_capacity(capacity_factor, top_k: int, tokens: int, experts: int):
    """Assignments an expert takes of T tokens, ceil(cf·k·T/E) (`theory.experts.capacity`)."""
    return experts_theory.capacity(capacity_factor, top_k, tokens, experts)


def tp_block_bytes(batch: int, seq: int, hidden: int, t: int, elem: int, bandwidth: float | None = None):
    """Bytes one tensor-parallel rank sends per layer per step, 4 all-reduces of b·s·h (`theory.tensor_parallel
    .block_bytes`); divided by `bandwidth` it is the time."""
    nbytes = tp_theory.block_bytes(batch, seq, hidden, t, elem)
    return nbytes if bandwidth is None else nbytes / Fraction(bandwidth)


def layer_activations_tp(s: int, b: int, h: int, a: int, t: int, recompute: str = "selective", sp: bool = False):
    """One layer's activation bytes on a tensor-parallel rank (Korthikanti et al. 2022, Table 2):
    sbh(10 + 24/t) with selective recompute, 34sbh/t with sequence parallelism too."""
    if sp:
        return Fraction(34 * s * b * h, t)
    return activations.korthikanti_layer_bytes_tp(s, b, h, a, t, recompute)


def utilisation(tokens_per_second, psi, peak_flops, flops_per_token: int = 6):
    """Model FLOPs utilisation, 6Ψ per token (8Ψ with full recompute: the hardware's) over the peak."""
    return Fraction(flops_per_token) * Fraction(psi) * Fraction(tokens_per_second) / Fraction(peak_flops)


def attention_scores_bytes(b: int, a: int, s: int, dtype_bytes: int = 2, fused: bool = False):
    """One layer's attention scores, b·a·s² elements; FlashAttention keeps one fp32 log-sum-exp per
    row and head instead, 4·b·a·s bytes (Dao et al. 2022, §3.1)."""
    return 4 * b * a * s if fused else b * a * s * s * dtype_bytes


def bus_bandwidth(collective: str, n: int, algbw=None):
    """nccl-tests' bus bandwidth of a collective over n ranks measured at `algbw` (`theory.bus_factor`:
    2(n-1)/n for all-reduce); without `algbw`, the factor busbw / algbw itself."""
    factor = theory.bus_factor(collective, n)
    return factor if algbw is None else Fraction(algbw) * factor


def fp8_limit(fmt: str, what: str = "max"):
    """A limit of an FP8 format (`theory.fp8`): its largest finite value ("max"), smallest normal
    ("min_normal") or smallest subnormal ("min_subnormal"), from its bits."""
    if what not in ("max", "min_normal", "min_subnormal"):
        raise ValueError(f"what is max, min_normal or min_subnormal, got {what!r}")
    return getattr(fp8_theory.get_format(fmt), what)


def fp8_scale(amax, fmt: str = "e4m3", margin: int = 0):
    """The per-tensor scale (max / amax) / 2^margin that puts a tensor's amax at the format's largest
    (amax read as the decimal the card writes: 0.002 is 1/500, not its nearest double)."""
    return fp8_theory.scale(Fraction(str(amax)), fmt, margin)


def allocator_bytes(nbytes: int, what: str = "segment"):
    """torch's CUDA caching allocator on one request (`theory.allocator`): the rounded "block", the
    "segment" it takes from the driver, what memory_allocated grows by ("allocated"), or the bytes
    left "cached" beside it in the new segment."""
    fns = {"block": allocator.block_bytes, "segment": allocator.segment_bytes,
           "allocated": allocator.allocated_bytes, "cached": allocator.cached_beside}
    if what not in fns:
        raise ValueError(f"what is one of {', '.join(fns)}, got {what!r}")
    return fns[what](nbytes)


def allocator_limit(what: str):
    """One of the caching allocator's sizes (`theory.allocator`, torch's constants): "small_size",
    "small_segment", "min_large_alloc", "large_segment" or "round_large"."""
    sizes = {"small_size": allocator.SMALL_SIZE, "small_segment": allocator.SMALL_SEGMENT,
             "min_large_alloc": allocator.MIN_LARGE_ALLOC, "large_segment": allocator.LARGE_SEGMENT,
             "round_large": allocator.ROUND_LARGE}
    if what not in sizes:
        raise ValueError(f"what is one of {', '.join(sizes)}, got {what!r}")
    return sizes[what]


FIGURES = {f.__name__: f for f in (fp8_limit, fp8_scale, allocator_bytes, allocator_limit, bus_bandwidth, pipeline_bubble, pipeline_in_flight, tp_block_bytes, layer_activations_tp,
    utilisation, attention_scores_bytes, cp_ring_bytes, cp_imbalance, cp_blocks,
    ep_balanced_bytes, ep_capacity,
    given, recipe_bytes, model_states, comm_total, comm_collective, comm_ratio, zeropp_ratio, sent_bytes,
    recipe_sent, bandwidth, bandwidth_ratio, alpha, all_gather_time, ring_allreduce_time, min_bucket_bytes,
    comm_time, tokens_to_hide, cross_domain_bytes, cross_domain_ratio, step_comm_time, layer_activations,
    layer_activations_fused, offloaded, offload_pcie, composed_states, adam_step_temporaries)}
