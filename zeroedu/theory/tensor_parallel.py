"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3) and sequence parallelism (Korthikanti
et al. 2022, §4.2.2) in closed form, for zeroedu's GPT on a tp axis of t ranks, alone or under a
data-parallel strategy on a (dp, tp) mesh. The algorithm is `zeroedu.strategies.tensor_parallel`.

What one tp rank holds of each block (h = d_model, r = MLP ratio; a GPT block's parameters in order):

    ln1 (h,) (h,)   qkv (3h/t, h) (3h/t,)   proj (h, h/t) (h,)   ln2 (h,) (h,)   fc (rh/t, h) (rh/t,)   fc2 (h, rh/t) (h,)

split: qkv and fc by rows (column-parallel: their output features), proj and fc2 by columns
(row-parallel: their input features); replicated: the LayerNorms and the row-parallel biases. The
embedding and the head are replicated (not vocab-parallel here). `gpt_units` lists these shapes
per unit, so the data-parallel closed forms (`memory.exact_model_states`, `comm.exact_comm`) apply
to them as to any model: FSDP2 over dp then holds 1/(dp·t) of each split matrix and 1/dp of each
replicated parameter, 16 bytes each with Adam.

Bytes per rank per step on the tp axis, b·s·h activation elements of a bytes (ring model):
    a block, TP:        4 all-reduces (f and g, attention and MLP, forward and backward): 4 · 2(t-1)/t · bsha
    a block, TP + SP:   8 all-gathers / reduce-scatters of bsha: 8 · (t-1)/t · bsha (the same), plus the
                        all-gathers again in backward of the qkv and fc inputs (saved as shards, as
                        Megatron-LM does): 2 · (t-1)/t · bsha, plus the all-reduce of the 6 replicated
                        h-vectors' gradients: 2(t-1)/t · 6ha
    the model, TP + SP: + the embedding output's f (all-reduce of bsha in backward): 2(t-1)/t · bsha
                        + the gather before the head (forward only): (t-1)/t · bsha
"""
from __future__ import annotations

from fractions import Fraction


def _check(t: int, d_model: int, n_heads: int, mlp_width: int) -> None:
    if t < 1 or n_heads % t or mlp_width % t or d_model % n_heads:
        raise ValueError(f"t = {t} must divide the heads ({n_heads}) and the MLP width ({mlp_width})")


def gpt_units(vocab: int, seq_len: int, d_model: int, n_layers: int, n_heads: int, mlp_ratio: int,
              t: int) -> list[list[tuple[int, ...]]]:
    """One tp rank's parameter shapes, per unit [embed, block 0 .. L-1, head] (module docstring)."""
    h, w = d_model, mlp_ratio * d_model
    _check(t, h, n_heads, w)
    block = [(h,), (h,), (3 * h // t, h), (3 * h // t,), (h, h // t), (h,),
             (h,), (h,), (w // t, h), (w // t,), (h, w // t), (h,)]
    return [[(vocab, h), (seq_len, h)], *([list(block)] * n_layers), [(h,), (h,), (vocab, h), (vocab,)]]


def block_bytes(batch: int, seq: int, hidden: int, t: int, elem: int, sp: bool = False) -> Fraction:
    """Bytes one rank sends on tp per block per step (module docstring)."""
    per = Fraction(t - 1, t) * batch * seq * hidden * elem
    if not sp:
        return 4 * 2 * per
    return 8 * per + 2 * per + Fraction(2 * (t - 1), t) * 6 * hidden * elem


def gpt_tp_bytes(batch: int, seq: int, hidden: int, n_layers: int, t: int, elem: int,
                 sp: bool = False) -> Fraction:
    """Bytes one rank sends on tp per step for the whole GPT: the blocks, and with SP the
    embedding's f and the gather before the head (module docstring)."""
    total = n_layers * block_bytes(batch, seq, hidden, t, elem, sp)
    if sp:
        per = Fraction(t - 1, t) * batch * seq * hidden * elem
        total += 2 * per + per
    return total


def gpt_tp_ops(batch: int, seq: int, hidden: int, n_layers: int, t: int, elem: int, sp: bool = False,
               micro_batches: int = 1) -> list:
    """The tp axis's collectives per step, as `comm.CommOp`s (so a run's prediction sets them
    beside its data-parallel axes' and counts them by collective), K micro-batches each sending
    what `gpt_tp_bytes` counts for one: per block without SP 4 all-reduces of b·s·h; with SP 4
    all-gathers and 4 reduce-scatters of it, 2 all-gathers more (the qkv and fc inputs again, in
    backward) and one all-reduce of the 6 replicated h-vectors' gradients; with SP, for the model, the embedding output's f (an all-reduce in backward) and
    the gather before the head. `batch` is one micro-batch's sequences on one replica."""
    from .comm import CommOp

    act = batch * seq * hidden * elem
    per_block = ([("all_reduce", "data", act)] * 4 if not sp else
                 [("all_gather", "data", act)] * 4 + [("reduce_scatter", "data", act)] * 4
                 + [("all_gather", "regather", act)] * 2 + [("all_reduce", "replicated_grads", 6 * hidden * elem)])
    model = [("all_reduce", "embed", act), ("all_gather", "head", act)] if sp else []
    one = [CommOp("tp", c, f"tp/block{i}/{what}", nbytes, t)
           for i in range(n_layers) for c, what, nbytes in per_block]
    one += [CommOp("tp", c, f"tp/{what}", nbytes, t) for c, what, nbytes in model]
    return one * micro_batches


def gpt_stage_activation_bytes(cfg_like, batch: int, seq: int, dtype_bytes: int, t: int, n_blocks: int,
                               first: bool, last: bool, ln_stats_bytes: int | None = None) -> int:
    """`gpt_activation_bytes` for a pipeline stage of `n_blocks` tp-split blocks: theirs, with the
    embedding's terms on the first stage and the head's and the loss's on the last
    (`theory.pipeline.stage_activation_bytes` for the unsplit blocks)."""
    from .activations import gpt_activation_terms

    m = dtype_bytes if ln_stats_bytes is None else ln_stats_bytes
    terms = gpt_activation_terms(cfg_like, batch, seq, dtype_bytes, ln_stats_bytes=m, attention="eager")
    per = {u: sum(x.bytes for x in terms if x.unit == u) for u in ("embed", "head")}
    whole = gpt_activation_bytes(cfg_like, batch, seq, dtype_bytes, t, ln_stats_bytes=ln_stats_bytes)
    block = (whole - per["embed"] - per["head"]) // cfg_like.n_layers
    return n_blocks * block + (per["embed"] if first else 0) + (per["head"] if last else 0)


def gpt_activation_bytes(cfg_like, batch: int, seq: int, dtype_bytes: int, t: int, sp: bool = False,
                         ln_stats_bytes: int | None = None, attention: str = "eager") -> int:
    """Bytes autograd saves on one tp rank for one micro-batch of zeroedu's GPT with every block
    tensor-parallel (eager attention, no recompute), T = b·s tokens, a bytes per element:

        per block, TP:        4·aTD + 2·2mT  (ln1 and ln2 inputs, qkv and fc inputs, LayerNorm
                              statistics: replicated)  +  (12·aTD + a·b·H·s²) / t  (q, k, v, the
                              heads' output, the scores, GELU input and output: split)
        per block, TP + SP:   everything / t: the LayerNorms' inputs and statistics, and the
                              qkv and fc inputs, saved as this rank's shard of the sequence and
                              all-gathered again in backward for the weight gradient, as Megatron-LM
                              does (`LinearWithGradAccumulationAndAsyncCommunication`,
                              megatron/core/tensor_parallel/layers.py), which is how Korthikanti's
                              34/t holds (§4.2.2): 2·aTD/t for the two inputs.
        attention="fused":    a core that keeps no scores (ring attention under cp): less
                              a·b·H·s²/t, plus its output aTD/t (none with one head per rank:
                              the merged heads are a view of it) and one fp32 log-sum-exp per
                              row, 4·b·(H/t)·s.

    The embedding, the head and the loss run whole on every rank: their terms are the unsplit
    model's (`activations.gpt_activation_terms`)."""
    from .activations import _dims, gpt_activation_terms

    V, D, H, L, r = _dims(cfg_like)
    _check(t, D, H, r * D)
    a = dtype_bytes
    m = a if ln_stats_bytes is None else ln_stats_bytes
    T = batch * seq
    rest = sum(x.bytes for x in gpt_activation_terms(cfg_like, batch, seq, a, ln_stats_bytes=m,
                                                               attention="eager") if x.unit != "block")
    ln = 2 * (a * T * D + 2 * m * T)  # two LayerNorms' inputs and mean, rstd
    split = (2 * a * T * D + a * T * D + a * T * D + 2 * r * a * T * D) // t + a * batch * (H // t) * seq * seq
    if attention == "fused":  # a core that keeps no scores (ring attention, FlashAttention): its
        # output and one fp32 log-sum-exp per row instead (`activations.gpt_activation_terms`).
        # With one head per rank the output (B, 1, s, D_h) transposed is already contiguous, so
        # merging the heads is a view of it: the proj input is that same storage, counted once.
        split += (a * T * D // t if H // t > 1 else 0) - a * batch * (H // t) * seq * seq + 4 * batch * (H // t) * seq
    gathered = 2 * a * T * D  # the qkv and fc inputs
    if sp:
        if seq % t:
            raise ValueError(f"sequence parallelism needs the sequence ({seq}) divisible by t = {t}")
        ln //= t
        gathered //= t  # saved as shards, gathered again in backward
    return rest + L * (ln + gathered + split)
