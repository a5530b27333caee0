"""FP8: what its two formats can hold, how a tensor is scaled into one, and what it stores.

**The formats** (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Table 1). E4M3: a sign,
4 exponent bits (bias 7) and 3 mantissa bits; it gives up infinities and keeps only S.1111.111 for
NaN, so the top exponent holds numbers: the largest is 1.75 · 2^8 = 448. E5M2: a sign, 5 exponent
bits (bias 15) and 2 mantissa bits, IEEE-like (the top exponent is inf and NaN): the largest is
1.75 · 2^15 = 57344. E4M3 has the precision for weights and activations, E5M2 the range for gradients.

**Scaling.** A bf16 tensor rarely fits such a range as it is, so each tensor is multiplied by a
scale before the cast, s = (max / amax) / 2^margin, which puts its largest magnitude at the format's
largest, and the matmul's result is divided by its operands' scales. Delayed scaling takes amax
from a history of earlier steps (no extra pass over the tensor; a jump in amax overflows until the
history catches up); current scaling reads it from the tensor itself. Block scaling (MXFP8) keeps
one power-of-two scale (E8M0, one byte) per 32 consecutive values instead of one fp32 scale per
tensor. (Transformer Engine's recipes: transformer_engine/common/recipe/__init__.py, `Format`,
`DelayedScaling`'s scaling formula, `MXFP8BlockScaling`; read at its main branch, December 2026.)

**Bytes.** An FP8 tensor is 1 byte per element plus its scales: half of bf16 for a weight gathered
or an activation saved in FP8. What this closed form leaves as it was: the fp32 master weights and
Adam's moments of mixed precision (12 bytes per parameter).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class FP8Format:
    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    ieee: bool  # the top exponent is inf/NaN (E5M2); else only the all-ones mantissa there is NaN (E4M3)

    @property
    def max(self) -> Fraction:
        """The largest finite value."""
        m = self.mantissa_bits
        top = 2 ** self.exponent_bits - (2 if self.ieee else 1) - self.bias
        mantissa = 2 - Fraction(1, 2 ** m) * (1 if self.ieee else 2)  # E4M3: 1.110b, its 1.111b is NaN
        return mantissa * Fraction(2) ** top

    @property
    def min_normal(self) -> Fraction:
        return Fraction(2) ** (1 - self.bias)

    @property
    def min_subnormal(self) -> Fraction:
        return Fraction(2) ** (1 - self.bias - self.mantissa_bits)

    @property
    def relative_step(self) -> Fraction:
        """The gap between 1 and the next value: the most a normal value moves when rounded is half of it."""
        return Fraction(1, 2 ** self.mantissa_bits)


E4M3 = FP8Format("e4m3", 4, 3, 7, ieee=False)
E5M2 = FP8Format("e5m2", 5, 2, 15, ieee=True)
FORMATS = {f.name: f for f in (E4M3, E5M2)}
MX_BLOCK = 32  # values per E8M0 scale in MXFP8


def get_format(name: str) -> FP8Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown FP8 format {name!r}; choose one of {', '.join(FORMATS)}") from None


def scale(amax, fmt: str = "e4m3", margin: int = 0) -> Fraction:
    """Per-tensor scale s = (max / amax) / 2^margin: x·s has its largest magnitude at the format's max."""
    if not amax > 0:
        raise ValueError(f"amax must be > 0, got {amax!r}")
    return get_format(fmt).max / Fraction(amax) / Fraction(2) ** margin


def tensor_bytes(numel: int, scaling: str = "tensor") -> int:
    """Bytes of an FP8 tensor of `numel` elements: 1 each, plus one fp32 scale ('tensor') or one
    E8M0 byte per 32 values ('mxfp8')."""
    if scaling == "tensor":
        return numel + 4
    if scaling == "mxfp8":
        return numel + -(-numel // MX_BLOCK)
    raise ValueError(f"unknown scaling {scaling!r}; choose 'tensor' or 'mxfp8'")




# The tensors of one layer (Korthikanti et al. 2022, §4.1: `activations.korthikanti_layer_terms`) that
# feed a linear layer's matmul: in FP8 training the matmul's input is cast to FP8 and that copy is
# what is saved for the weight gradient, 1 byte per element instead of 2.
LINEAR_INPUTS = ("QKV matmul input (shared)", "output projection input", "first linear input",
                 "second linear input (GeLU output)")


def layer_activation_bytes(s: int, b: int, h: int, t: int = 1) -> Fraction:
    """One layer's activation bytes per tensor-parallel rank with selective recompute and sequence
    parallelism, the four linear inputs held in FP8: Korthikanti's 34·sbh/t with 2 + 2 + 2 + 8 = 14
    of its sbh halved, 27·sbh/t (their as²b terms are the ones selective recompute drops)."""
    from .activations import korthikanti_layer_terms

    terms = korthikanti_layer_terms(s, b, h, 1)
    kept = [(name, nbytes) for _, name, nbytes in terms if "softmax" not in name]  # the as²b three
    total = sum(nbytes // 2 if name in LINEAR_INPUTS else nbytes for name, nbytes in kept)
    return Fraction(total, t)


__all__ = ["E4M3", "E5M2", "FORMATS", "FP8Format", "LINEAR_INPUTS", "MX_BLOCK", "get_format", "layer_activation_bytes",
           "scale", "tensor_bytes"]
