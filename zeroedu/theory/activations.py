"""Activation memory in closed form: zeroedu's own models exactly, and Korthikanti et al. 2022.

Pure Python (no torch): every function takes sizes and returns integer bytes.

"Activations" are the tensors autograd saves for backward, measured at the forward/backward
boundary (loss computed, backward not started) for one micro-batch, each storage once, parameters
excluded: what `zeroedu.runtime.ledger.Ledger.saving_activations` counts. The tests check
formula == measurement byte for byte (`tests/test_activations.py`).

Notation: B sequences × S tokens, T = B·S; D = d_model, H = n_heads, L = n_layers, r = mlp_ratio,
V = vocab; a = bytes of one activation element (4 fp32, 2 bf16 / fp16: the recipe's parameter
dtype, which the model computes in); m = bytes of one LayerNorm mean/rstd element
(`ln_stats_bytes`: torch's CPU kernel keeps them in the input dtype, m = a; its CUDA kernel in
fp32, m = 4).

Korthikanti et al. 2022 = V. Korthikanti, J. Casper, S. Lym, L. McAfee, M. Andersch, M. Shoeybi,
B. Catanzaro, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198
(MLSys 2023). Their symbols: s sequence, b micro-batch, h hidden, a heads, v vocabulary, t tensor-
and p pipeline-parallel size. Their assumptions (§4, before §4.1): "activations" are tensors
created in forward and needed in backward, dropout masks included, parameters and optimizer
state excluded; 16-bit activations (2 bytes), 1-byte dropout masks; small buffers ignored, in
particular LayerNorm's mean and variance ("we only include sbh, not sbh + 2sb").
Where their numbers are: §4.1 and Eq. (1), per layer without model parallelism; §4.2.1 Eq. (2)
tensor parallel, §4.2.2 Eq. (4) tensor + sequence parallel, §4.2.3 Eq. (5) the first pipeline
stage, sbhL/t·(34 + 5as/h); §4.3 the terms outside the layers (an unnumbered equation);
§5 and Table 2, selective (34sbh/t with sequence parallelism; 34sbh at t = 1) and full
recomputation (2sbh).

For one GPU of a large run (`zeroedu memory`, `theory.fits`): `transformer_shape(psi)` infers a
GPT-3-family shape from Ψ (or keeps the sizes given), `korthikanti_layer_bytes_tp` is Eq. (2)
(tensor parallel, no sequence parallelism) and `transformer_activation_bytes` adds up the busiest
pipeline stage: L layer-equivalents (§4.2.3) plus the §4.3 terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from ..kinds import RECOMPUTE_MODES, RecomputeMode

INT64, FP32 = 8, 4
RECOMPUTE = RECOMPUTE_MODES  # `zeroedu.kinds.RecomputeMode`


@dataclass(frozen=True)
class Term:
    """One kind of saved tensor: `count` tensors of `numel` elements of `elem_bytes` each
    (for unit "block": in one block; the model has L of them)."""

    unit: str  # "embed", "block" (one block; multiply by L), "head"
    name: str
    saved_by: str  # the op whose backward needs it
    numel: int
    elem_bytes: int
    count: int = 1

    @property
    def bytes(self) -> int:
        return self.count * self.numel * self.elem_bytes


def _dims(cfg_like) -> tuple[int, int, int, int, int]:
    """(V, D, H, L, r) from a GPTConfig, any object with those attributes, or a dict."""
    get = (lambda k, d=None: cfg_like.get(k, d)) if isinstance(cfg_like, dict) else \
        (lambda k, d=None: getattr(cfg_like, k, d))
    V, D, H, L, r = (get("vocab"), get("d_model"), get("n_heads"), get("n_layers"), get("mlp_ratio", 4))
    for name, v in zip(("vocab", "d_model", "n_heads", "n_layers", "mlp_ratio"), (V, D, H, L, r)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if D % H:
        raise ValueError(f"d_model ({D}) must be divisible by n_heads ({H})")
    return V, D, H, L, r


ATTENTION = ("eager", "fused")  # `models.gpt.GPTConfig.attention`


def gpt_activation_terms(cfg_like, batch: int, seq: int, dtype_bytes: int, recompute: str = "none",
                         ln_stats_bytes: int | None = None, attention: str | None = None) -> list[Term]:
    """The saved tensors of `zeroedu.models.gpt.GPT` and its loss, term by term (see
    `gpt_activation_bytes`). `attention`: "eager" or "fused"; None: `cfg_like`'s own (eager
    when it has none)."""
    V, D, H, L, r = _dims(cfg_like)
    if attention is None:
        attention = (cfg_like.get("attention") if isinstance(cfg_like, dict)
                     else getattr(cfg_like, "attention", None)) or "eager"
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    if not (isinstance(batch, int) and isinstance(seq, int) and batch >= 1 and seq >= 1):
        raise ValueError(f"batch and seq must be integers >= 1, got {batch!r}, {seq!r}")
    if dtype_bytes not in (1, 2, 4, 8):
        raise ValueError(f"dtype_bytes must be 1, 2, 4 or 8, got {dtype_bytes!r}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    a = dtype_bytes
    m = a if ln_stats_bytes is None else ln_stats_bytes
    B, S, T = batch, seq, batch * seq
    terms = [Term("embed", "token ids (int64)", "embedding (index for the scatter-add)", T, INT64)]
    if recompute in (RecomputeMode.NONE, RecomputeMode.SELECTIVE):
        terms += [
            Term("block", "ln1 input (residual stream)", "layer_norm", T * D, a),
            Term("block", "ln1 mean, rstd", "layer_norm", T, m, count=2),
            Term("block", "qkv input = ln1 output", "qkv Linear (for dW)", T * D, a),
            Term("block", "q (scaled), k", "q @ kᵀ (selective: kept to re-run the attention core)",
                 T * D, a, count=2),
        ]
        if recompute == RecomputeMode.NONE and attention == "eager":
            terms.append(Term("block", "softmax output (B·H·S² probs)", "softmax, and att @ v (one storage)",
                              B * H * S * S, a))
        if recompute == RecomputeMode.NONE and attention == "fused":
            terms += [Term("block", "attention output, (B, H, S, D/H)", "scaled_dot_product_attention", T * D, a),
                      Term("block", "log-sum-exp per row (fp32), (B, H, S)", "scaled_dot_product_attention",
                           B * H * S, FP32)]
        terms += [
            Term("block", "v", "att @ v (selective: kept to re-run the attention core)", T * D, a),
            Term("block", "heads merged = proj input", "proj Linear (for dW)", T * D, a),
            Term("block", "ln2 input (residual stream)", "layer_norm", T * D, a),
            Term("block", "ln2 mean, rstd", "layer_norm", T, m, count=2),
            Term("block", "fc input = ln2 output", "fc Linear (for dW)", T * D, a),
            Term("block", "GELU input = fc output", "gelu (tanh)", T * r * D, a),
            Term("block", "GELU output = fc2 input", "fc2 Linear (for dW)", T * r * D, a),
        ]
    else:
        terms.append(Term("block", "block input (checkpoint)", "checkpoint (kept to re-run the block)", T * D, a))
    terms += [
        Term("head", "ln_f input (last block output)", "layer_norm", T * D, a),
        Term("head", "ln_f mean, rstd", "layer_norm", T, m, count=2),
        Term("head", "lm_head input = ln_f output", "lm_head Linear (for dW)", T * D, a),
        Term("head", "log-probs (fp32)", "log_softmax and nll_loss (one storage)", T * V, FP32),
        Term("head", "targets (int64)", "nll_loss", T, INT64),
        Term("head", "total_weight (fp32 scalar)", "nll_loss (mean reduction)", 1, FP32),
    ]
    return terms


def gpt_activation_bytes(cfg_like, batch: int, seq: int, dtype_bytes: int, recompute: str = "none",
                         ln_stats_bytes: int | None = None, attention: str | None = None) -> int:
    """Exact bytes autograd saves for one micro-batch of `zeroedu.models.gpt.GPT` and its
    cross-entropy loss (torch 2.13).

    Parameters: `cfg_like` has vocab V, d_model D, n_heads H, n_layers L, mlp_ratio r (default 4);
    B = batch, S = seq (S <= the model's seq_len), T = B·S; a = dtype_bytes of the activations
    (the model cast to that dtype); m = ln_stats_bytes, the LayerNorm mean/rstd element: None
    means m = a, which is torch's CPU kernel (it keeps them in the input dtype when the
    LayerNorm parameters have that dtype); pass 4 for CUDA, which keeps them in fp32.

    embed (once):
        8T        token ids, int64, saved by the embedding (the position slice saves nothing)
    per block (× L), recompute="none":
        aTD       ln1 input (the residual stream)          layer_norm
        2mT       ln1 mean and rstd, (B, S, 1) each         layer_norm
        aTD       ln1 output = qkv input                    qkv Linear, for its weight gradient
        2aTD      q (already scaled) and k, (B, H, S, D/H)  q @ kᵀ
        aBHS²     softmax output                            softmax; att @ v saves the same storage
        aTD       v                                         att @ v
        aTD       heads merged = proj input                 proj Linear
        aTD       ln2 input                                 layer_norm
        2mT       ln2 mean and rstd                         layer_norm
        aTD       ln2 output = fc input                     fc Linear
        a·rTD     fc output = GELU input                    gelu
        a·rTD     GELU output = fc2 input                   fc2 Linear
        ------------------------------------------------------------------------
        = a·(8 + 2r)·TD + a·BHS² + 4mT   (r = 4: 16aTD + aBHS² + 4mT)
      Nothing else: the residual adds, the causal bias add, the scale multiply, views, splits
      and .contiguous() copies save nothing; Linear's other saved tensor is its weight, a
      parameter. Not saved: the qkv output itself (only its contiguous q/k/v copies), the
      scores before softmax, the attention output before merging heads.
    per block (× L), recompute="full" (torch.utils.checkpoint, use_reentrant=False):
        aTD       the block input, kept by checkpoint to re-run the block in backward
    head (once):
        aTD       ln_f input (the last block's output)      layer_norm
        2mT       ln_f mean and rstd                        layer_norm
        aTD       ln_f output = lm_head input               lm_head Linear
        4TV       log-probabilities, fp32                   log_softmax; nll_loss saves the same
        8T        targets, int64                            nll_loss
        4         total_weight, a 0-dim fp32 tensor         nll_loss (reduction="mean")
      The logits (activation dtype) and their fp32 cast are *not* saved: cross-entropy is
      log_softmax + nll_loss, and log_softmax's backward needs only its output.

    per block (× L), recompute="selective" (the attention core re-run in backward):
        as "none" without the softmax output aBHS²; q, k, v are kept as the core's inputs.

    attention="fused" (`F.scaled_dot_product_attention`, torch 2.13's CPU flash kernel): the
    softmax output is never stored; the kernel saves q, k, v (the same tensors as above), its
    output and one fp32 log-sum-exp per row:
        per block, recompute="none":  as eager, less aBHS², plus
        aTD       attention output, (B, H, S, D/H)          scaled_dot_product_attention
        4BHS      log-sum-exp per row, fp32                 scaled_dot_product_attention
      (the heads are then merged into a new tensor, the proj input, as in eager). With
      "selective" the fused core is re-run in backward from the q, k, v it keeps: its output and
      log-sum-exp are dropped, so fused and eager save the same; selective recompute now saves
      only aTD + 4BHS per layer, which is why it is nearly free. "full" is the same for both.

    Total, recompute="none":       16T + L·(a(8+2r)TD + aBHS² + 4mT) + 2aTD + 2mT + 4TV + 4
    Total, recompute="selective":  16T + L·(a(8+2r)TD + 4mT) + 2aTD + 2mT + 4TV + 4
    Total, recompute="full":       16T + L·aTD + 2aTD + 2mT + 4TV + 4
    Total, fused, recompute="none": 16T + L·(a(9+2r)TD + 4BHS + 4mT) + 2aTD + 2mT + 4TV + 4

    Assumes the ids and the targets are two separate contiguous (B, S) int64 tensors, as the
    runner gives each rank (a view into a bigger batch would be counted with its whole storage,
    as the ledger counts storages).
    """
    L = _dims(cfg_like)[3]
    return sum(t.bytes * (L if t.unit == "block" else 1)
               for t in gpt_activation_terms(cfg_like, batch, seq, dtype_bytes, recompute, ln_stats_bytes,
                                             attention))


def gpt_activation_table(cfg_like, batch: int, seq: int, dtype_bytes: int, recompute: str = "none",
                         ln_stats_bytes: int | None = None, attention: str | None = None) -> list[dict]:
    """Rows for a notebook table: unit, tensor, saved by, elements, bytes each, bytes in total
    (block rows multiplied by L)."""
    L = _dims(cfg_like)[3]
    rows = []
    for t in gpt_activation_terms(cfg_like, batch, seq, dtype_bytes, recompute, ln_stats_bytes, attention):
        n = L if t.unit == "block" else 1
        rows.append({"unit": t.unit, "tensor": t.name, "saved_by": t.saved_by, "numel": t.numel,
                     "count": t.count * n, "elem_bytes": t.elem_bytes, "bytes": t.bytes * n})
    return rows


# ----------------------------------------------------------------------------- Korthikanti et al.
def korthikanti_layer_terms(s: int, b: int, h: int, a: int) -> list[tuple[str, str, int]]:
    """Korthikanti et al. 2022, §4.1, one transformer layer, no tensor/sequence parallelism,
    16-bit activations, 1-byte dropout masks: (block, tensor, bytes)."""
    sbh, as2b = s * b * h, a * s * s * b
    return [
        ("attention", "QKV matmul input (shared)", 2 * sbh),
        ("attention", "Q and K for QKᵀ", 4 * sbh),
        ("attention", "softmax output", 2 * as2b),
        ("attention", "softmax dropout mask", as2b),
        ("attention", "softmax-dropout output (for attention over V)", 2 * as2b),
        ("attention", "V", 2 * sbh),
        ("attention", "output projection input", 2 * sbh),
        ("attention", "attention dropout mask", sbh),
        ("mlp", "first linear input", 2 * sbh),
        ("mlp", "GeLU input", 8 * sbh),
        ("mlp", "second linear input (GeLU output)", 8 * sbh),
        ("mlp", "dropout mask", sbh),
        ("layernorm", "two LayerNorm inputs", 4 * sbh),
    ]


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, recompute: str = "none",
                            dtype_bytes: int = 2) -> int:
    """Activation bytes of one Megatron GPT layer, no tensor/sequence parallelism (t = 1),
    Korthikanti et al. 2022, with their 16-bit activations (dtype_bytes = 2) and 1-byte masks:

        "none"       s·b·h·(34 + 5·a·s/h) = 34sbh + 5as²b   (§4.1, Eq. (1): attention 11sbh + 5as²b,
                                                            MLP 19sbh, LayerNorms 4sbh)
        "selective"  34·s·b·h   (§5 and Table 2 at t = 1: QKᵀ, softmax, softmax dropout and
                                 attention over V, the 5as²b part, are recomputed)
        "full"       2·s·b·h    (§5 and Table 2: only the layer input is kept)

    With e = dtype_bytes per activation element and masks still 1 byte, the same terms read
    (16e + 2)·sbh + (2e + 1)·as²b, (16e + 2)·sbh and e·sbh (e = 2 gives the paper's numbers).
    The as²b form keeps the result an exact integer (5as/h need not be one)."""
    if min(s, b, h, a, dtype_bytes) < 1:
        raise ValueError("s, b, h, a and dtype_bytes must be >= 1")
    sbh, e = s * b * h, dtype_bytes
    if recompute == RecomputeMode.NONE:
        return (16 * e + 2) * sbh + (2 * e + 1) * a * s * s * b
    if recompute == RecomputeMode.SELECTIVE:
        return (16 * e + 2) * sbh
    if recompute == RecomputeMode.FULL:
        return e * sbh
    raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")


def korthikanti_extra_bytes(s: int, b: int, h: int, v: int, p: int = 1) -> dict[str, int]:
    """The whole-model terms outside the L layers (Korthikanti et al. 2022, §4.3, t = 1): "position
    and word embeddings do not require any considerable activations"; the embedding dropout
    mask, sbh per in-flight micro-batch (p of them on the first pipeline stage, so sbhp); and,
    only for p = 1 (they count the first stage, which then also holds the output layer), the
    LayerNorm before the output layer 2sbh, the output-layer projection's input 2sbh and the
    logits cross-entropy keeps "calculated in 32-bit floating point", 4sbv: 4sbh(1 + v/h) in
    all. In total sbhL·(p/L + δ_{p=1}·(4/L)(1 + v/h)), which they call negligible and drop from
    then on (by this formula, at their 22B shape, s 2048, h 6144, L 48, v 51200, p = 1, it is
    2.3 % of the layers' 34sbhL: small, not nothing). Megatron-LM's code for this accounting
    (megatron/training/theoretical_memory_usage.py, compute_activation_memory, "formula in
    Table 2") also adds the int64 token ids, 8sb per in-flight micro-batch."""
    out = {"embedding dropout mask": s * b * h * p}
    if p == 1:
        out["final LayerNorm input"] = 2 * s * b * h
        out["output layer input"] = 2 * s * b * h
        out["fp32 logits (cross-entropy)"] = 4 * s * b * v
    return out


# ----------------------------------------------------------------------------- one GPU, with TP and PP
def _exact(x: Fraction) -> Fraction | int:
    """A whole Fraction as an int, so divisible configurations stay plain integers."""
    return int(x) if x.denominator == 1 else x


def korthikanti_layer_bytes_tp(s: int, b: int, h: int, a: int, t: int = 1, recompute: str = "none",
                               dtype_bytes: int = 2, attention: str = "eager") -> Fraction | int:
    """Activation bytes of one Megatron GPT layer on one tensor-parallel rank, tensor
    parallelism WITHOUT sequence parallelism (Korthikanti et al. 2022, §4.2.1, Eq. (2)):

        "none"       sbh·(10 + 24/t + 5as/(ht))    Eq. (2)
        "selective"  sbh·(10 + 24/t)               Table 2, "tensor parallel + selective"
        "full"       2·sbh                         Table 2 (the layer input, not split without SP)

    The 10sbh that t does not divide are what every tensor-parallel rank holds whole: the two
    LayerNorm inputs (4sbh), the inputs of the QKV and first MLP matmuls (2sbh each: a
    column-parallel matmul needs its whole input) and the two 1-byte dropout masks after attention
    and after the MLP (sbh each). The 24sbh/t are Q, K (4), V (2), the output-projection input
    (2), the GeLU input and output (8 + 8); the 5as²b/t are the attention scores, split by head.
    With e = dtype_bytes (masks 1 byte): (4e + 2)·sbh + 12e·sbh/t + (2e + 1)·as²b/t.
    t = 1 is `korthikanti_layer_bytes` (Eq. (1)). The result is an exact Fraction where t does not
    divide h or a (Megatron itself requires both), an int otherwise.

    `attention="fused"` (FlashAttention; torch's scaled_dot_product_attention; the fused
    attention of Transformer Engine used by Megatron-Core; what current trainers run): the
    5as²b/t of scores, softmax dropout mask and its output are never stored; the kernel keeps
    q, k, v (already in the 24sbh/t), its output (the output projection's input, already
    counted) and one fp32 log-sum-exp per row and head, 4asb/t, and recomputes the scores in
    backward (the softmax dropout is regenerated from its random seed, no mask kept). So
    fused "none" is sbh·(10 + 24/t) + 4asb/t, and "selective" (re-running the attention core,
    which then drops its log-sum-exp) is Table 2's sbh·(10 + 24/t) for either attention."""
    if min(s, b, h, a, t, dtype_bytes) < 1:
        raise ValueError("s, b, h, a, t and dtype_bytes must be >= 1")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    sbh, e = s * b * h, dtype_bytes
    if recompute == RecomputeMode.FULL:
        return e * sbh
    out = (4 * e + 2) * sbh + Fraction(12 * e * sbh, t)
    if recompute == RecomputeMode.NONE:
        out += Fraction((2 * e + 1) * a * s * s * b if attention == "eager" else FP32 * a * s * b, t)
    return _exact(out)


@dataclass(frozen=True)
class TransformerShape:
    """A GPT (Megatron-style: LayerNorm, biases, 4h MLP, embeddings tied to the output layer):
    `layers` L, `hidden` h, `heads` a, micro-batch of `micro_batch` b sequences of `seq` s tokens,
    vocabulary `vocab` v. `inferred` names the fields `transformer_shape` chose itself."""

    layers: int
    hidden: int
    heads: int
    seq: int = 4096
    micro_batch: int = 1
    vocab: int = 50257
    inferred: tuple[str, ...] = ()

    @property
    def layer_params(self) -> int:
        """12h² weights (QKV 3h², projection h², MLP 8h²) + 13h biases and LayerNorm (3h + h +
        4h + h, two LayerNorms 4h)."""
        return 12 * self.hidden ** 2 + 13 * self.hidden

    @property
    def params(self) -> int:
        """L·(12h² + 13h) + vh (tied input/output embedding) + 2h (final LayerNorm); no learned
        position embedding (rotary or none)."""
        return self.layers * self.layer_params + self.vocab * self.hidden + 2 * self.hidden

    def as_dict(self) -> dict:
        return {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "seq": self.seq,
                "micro_batch": self.micro_batch, "vocab": self.vocab, "inferred": list(self.inferred)}


DEFAULT_SEQ, DEFAULT_MICRO_BATCH, DEFAULT_VOCAB = 4096, 1, 50257  # GPT-2/GPT-3 BPE vocabulary
HEAD_DIM = 128  # GPT-3's larger models: h = 128·a


def _size(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return v


def transformer_shape(psi, layers: int | None = None, hidden: int | None = None,
                      heads: int | None = None, seq: int = DEFAULT_SEQ,
                      micro_batch: int = DEFAULT_MICRO_BATCH, vocab: int = DEFAULT_VOCAB) -> TransformerShape:
    """A GPT shape for Ψ parameters; any of `layers`, `hidden`, `heads` given is kept.

    With neither L nor h given, the GPT-3 family's large models set the rule (Brown et al. 2020,
    Table 2.1: 6.7B L = 32, h = 4096; 13B 40, 5120; 175B 96, 12288, i.e. h = 128·L and 128-wide
    heads): h = 128·L with L a multiple of 8 (or 1..7 for tiny Ψ), the L whose `params` is nearest
    Ψ in ratio. 7e9 -> L = 32, h = 4096, a = 32 (6.65e9 parameters by this count); 175e9 -> 96,
    12288, 96. With h given, L = round((Ψ - vh) / (12h² + 13h)); with L given, h solves
    `params` = Ψ, rounded to a multiple of 128. a = h/128 (h/64, else 1, when 128 does not divide
    h). The shape only sizes activations and gathered units: model states still use Ψ."""
    psi = float(psi)
    if not psi > 0:
        raise ValueError(f"psi must be > 0, got {psi!r}")
    seq, micro_batch, vocab = _size(seq, "seq"), _size(micro_batch, "micro_batch"), _size(vocab, "vocab")
    inferred = []
    if layers is None and hidden is None:
        cands = list(range(1, 8)) + list(range(8, 8 * 200 + 1, 8))
        count = lambda L: TransformerShape(L, HEAD_DIM * L, 1, vocab=vocab).params
        layers = min(cands, key=lambda L: (abs(math.log(count(L) / psi)), L))
        hidden = HEAD_DIM * layers
        inferred += ["layers", "hidden"]
    elif hidden is None:
        L = _size(layers, "layers")
        # L·12h² + (13L + v + 2)·h = Ψ, the positive root, to the nearest multiple of 128
        b_ = 13 * L + vocab + 2
        h = (-b_ + math.sqrt(b_ * b_ + 48 * L * psi)) / (24 * L)
        hidden = max(1, round(h / HEAD_DIM)) * HEAD_DIM
        inferred.append("hidden")
    elif layers is None:
        h = _size(hidden, "hidden")
        layers = max(1, round((psi - vocab * h) / (12 * h * h + 13 * h)))
        inferred.append("layers")
    layers, hidden = _size(layers, "layers"), _size(hidden, "hidden")
    if heads is None:
        heads = next((hidden // d for d in (HEAD_DIM, 64) if hidden % d == 0), 1)
        inferred.append("heads")
    heads = _size(heads, "heads")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    return TransformerShape(layers, hidden, heads, seq, micro_batch, vocab, tuple(inferred))


DEFAULT_ATTENTION = "fused"  # what trainers run today; "eager" is the paper's count (Eq. (1)/(2))


def transformer_activation_bytes(shape: TransformerShape, recompute: str = "selective",
                                 dtype_bytes: int = 2, tp: int = 1, pp: int = 1,
                                 attention: str = DEFAULT_ATTENTION) -> dict:
    """Activation bytes on the busiest GPU (the first pipeline stage) for one step of `shape`.

    * Per layer: `korthikanti_layer_bytes_tp` (Eq. (1) at t = 1, Eq. (2) for t > 1; Table 2 for
      recomputation); tensor parallelism without sequence parallelism. `attention`: "fused"
      (the default: FlashAttention-style kernels store no scores, 4asb/t for the log-sum-exp
      instead of 5as²b/t) or "eager" (the paper's count).
    * Layers held: ⌈L/p⌉·p layer-equivalents. Under the non-interleaved 1F1B schedule the first
      stage keeps p micro-batches in flight, each with its ⌈L/p⌉ layers, so that stage holds L
      layers' worth whatever p is (Korthikanti §4.2.3, Eq. (5); Megatron-LM's
      megatron/training/theoretical_memory_usage.py, compute_activation_memory, multiplies by
      num_layers, not num_layers/p). Assumes at least p micro-batches per step; the interleaved
      schedule's extra factor 1 + (p-1)/(pm) is not modelled.
    * Outside the layers (§4.3, `korthikanti_extra_bytes` at e = 2, t = 1): the embedding
      dropout mask sbh per micro-batch in flight (p of them); for p = 1 also the final LayerNorm
      input e·sbh, the output layer's input e·sbh and the fp32 logits 4sbv/t (the output layer is
      vocab-parallel, so each tensor-parallel rank keeps its v/t columns; without sequence
      parallelism the other terms are not split). For p > 1 the output layer sits on the last
      stage, which keeps one micro-batch and is not the busiest.
    The int64 token ids (8sb per micro-batch, which Megatron-LM's code adds) are left out, as
    in the paper.

    Returns {"total", "per_layer", "layers_held", "layers_bytes", "extra": {term: bytes},
    "formula", "recompute", "dtype_bytes", "tp", "pp", "shape"} (bytes exact: int or Fraction).
    """
    if not isinstance(shape, TransformerShape):
        raise ValueError(f"shape must be a TransformerShape, got {shape!r}")
    if dtype_bytes not in (1, 2, 4, 8):
        raise ValueError(f"dtype_bytes must be 1, 2, 4 or 8, got {dtype_bytes!r}")
    tp, pp = _size(tp, "tp"), _size(pp, "pp")
    s, b, h, a, L, v = shape.seq, shape.micro_batch, shape.hidden, shape.heads, shape.layers, shape.vocab
    per_layer = korthikanti_layer_bytes_tp(s, b, h, a, tp, recompute, dtype_bytes, attention)
    layers_held = -(-L // pp) * pp
    extra = {"embedding dropout mask": s * b * h * pp}
    if pp == 1:
        extra["final LayerNorm input"] = dtype_bytes * s * b * h
        extra["output layer input"] = dtype_bytes * s * b * h
        extra["fp32 logits (cross-entropy)"] = _exact(Fraction(4 * s * b * v, tp))
    fused = attention == "fused"
    if tp == 1:
        eq, per = "Eq. (1), no tensor parallelism", {"none": "34sbh + 4asb" if fused else "34sbh + 5as²b",
                                                     "selective": "34sbh", "full": "2sbh"}[recompute]
    else:
        eq = "Eq. (2), tensor parallel without sequence parallelism"
        per = {"none": "sbh(10 + 24/t) + 4asb/t" if fused else "sbh(10 + 24/t + 5as/(ht))",
               "selective": "sbh(10 + 24/t)", "full": "2sbh"}[recompute]
    per = (f"{eq}" + ("" if recompute == RecomputeMode.NONE else f", {recompute} recompute (Table 2)")
           + (", fused attention (no scores stored; fp32 log-sum-exp)" if fused and recompute == RecomputeMode.NONE else "")
           + f": {per}")
    layers_bytes = per_layer * layers_held
    return {"total": _exact(Fraction(layers_bytes) + sum(extra.values())), "per_layer": per_layer,
            "layers_held": layers_held, "layers_bytes": layers_bytes, "extra": extra,
            "formula": f"Korthikanti et al. 2022, {per} per layer (the paper's e = 2 bytes per "
                       f"element; here e = {dtype_bytes}) x {layers_held} layer-equivalents (§4.2.3) "
                       f"+ §4.3 terms outside the layers",
            "recompute": recompute, "attention": attention, "dtype_bytes": dtype_bytes, "tp": tp, "pp": pp,
            "shape": shape}


# ----------------------------------------------------------------------------- the MLP
def mlp_activation_bytes(dims: list[int], batch: int, dtype_bytes: int) -> int:
    """Exact bytes autograd saves for one micro-batch of `zeroedu.models.mlp.MLP` and its MSE
    loss: the input (a·d_in per sample, saved by the first Linear), each Tanh output (a·hidden,
    saved by the Tanh and again by the next Linear: one storage), and for the fp32 loss the
    output cast to fp32 and the fp32 target (4·d_out each). `dims` = [d_in, hidden..., d_out]."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch!r}")
    a = dtype_bytes
    return batch * (a * dims[0] + a * sum(dims[1:-1]) + 2 * FP32 * dims[-1])


def compare_with_korthikanti(cfg_like, batch: int, seq: int, ln_stats_bytes: int | None = None) -> list[dict]:
    """Per layer, 16-bit activations: each Korthikanti term beside what our GPT saves for it
    (bf16 model, `gpt_activation_terms`), so a notebook can show where 34sbh + 5as²b and our
    exact count part. Bytes for one layer; s = seq, b = batch, h = d_model, a = n_heads."""
    V, D, H, L, r = _dims(cfg_like)
    s, b, h, a = seq, batch, D, H
    sbh, as2b, sb = s * b * h, a * s * s * b, s * b
    m = 2 if ln_stats_bytes is None else ln_stats_bytes
    k = {name: n for _, name, n in korthikanti_layer_terms(s, b, h, a)}
    rows = [
        ("QKV matmul input (shared)", 2 * sbh, "qkv input = ln1 output: the same"),
        ("Q and K for QKᵀ", 4 * sbh, "q (scaled) and k: the same"),
        ("softmax output", 2 * as2b, "the same"),
        ("softmax dropout mask", 0, "no dropout"),
        ("softmax-dropout output (for attention over V)", 0,
         "no dropout: att @ v saves the softmax output itself, counted once"),
        ("V", 2 * sbh, "the same"),
        ("output projection input", 2 * sbh, "the same"),
        ("attention dropout mask", 0, "no dropout"),
        ("first linear input", 2 * sbh, "the same"),
        ("GeLU input", 2 * r * sbh, "the same (GELU saves its input)"),
        ("second linear input (GeLU output)", 2 * r * sbh, "the same: GELU input AND output are both saved"),
        ("dropout mask", 0, "no dropout"),
        ("two LayerNorm inputs", 4 * sbh, "the same"),
        ("(not counted by them) LayerNorm mean, rstd", 4 * m * sb,
         "2 LayerNorms × (mean, rstd), s·b each; bf16 on CPU, fp32 (m = 4) on CUDA"),
    ]
    return [{"term": name, "korthikanti": k.get(name, 0), "ours": ours, "note": note}
            for name, ours, note in rows]
