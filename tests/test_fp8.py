"""FP8's closed forms (`theory.fp8`) against the numbers published for the formats (Micikevicius et
al. 2022, Table 1: E4M3's largest 448 and smallest normal 2^-6, E5M2's 57344 and 2^-14) and against
torch's own float8 dtypes: their `finfo`, and casts made by torch."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from zeroedu.theory import fp8

pytestmark = pytest.mark.fast

TORCH = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
PUBLISHED = {"e4m3": (448, 2.0 ** -6, 2.0 ** -9), "e5m2": (57344, 2.0 ** -14, 2.0 ** -16)}


@pytest.mark.parametrize("name", sorted(fp8.FORMATS))
def test_each_format_holds_what_is_published_and_what_torch_casts(name):
    f, dt = fp8.get_format(name), TORCH[name]
    assert (f.max, f.min_normal, f.min_subnormal) == PUBLISHED[name]
    assert f.max == torch.finfo(dt).max and f.min_normal == torch.finfo(dt).smallest_normal
    assert f.relative_step == torch.finfo(dt).eps
    cast = lambda x: torch.tensor([float(x)]).to(dt).float().item()  # noqa: E731
    assert cast(f.max) == f.max and cast(f.min_subnormal) == f.min_subnormal
    assert cast(f.min_subnormal / 4) == 0.0  # below half the smallest subnormal: flushed to zero
    assert math.isinf(cast(f.max * 1.5)) == f.ieee  # only E5M2 has an infinity to overflow into


def test_a_scaled_tensor_lands_on_the_formats_largest_and_loses_at_most_half_a_step():
    torch.manual_seed(0)
    x = torch.randn(4096) * 3e-3  # a gradient-sized tensor: far below E4M3's range as it is
    amax = x.abs().max().item()
    s = float(fp8.scale(amax, "e4m3"))
    q = (x * s).to(torch.float8_e4m3fn)
    back = q.float() / s
    assert q.float().abs().max().item() == 448.0 and torch.isfinite(q.float()).all()
    normal = (x * s).abs() >= float(fp8.E4M3.min_normal)
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max().item() <= float(fp8.E4M3.relative_step) / 2 + 1e-7
    # unscaled, most of it falls below E4M3's smallest normal and loses its digits
    assert (x.abs() < float(fp8.E4M3.min_normal)).float().mean().item() > 0.99
    assert fp8.scale(amax, "e4m3", margin=1) == fp8.scale(amax, "e4m3") / 2


def test_bytes_are_one_per_element_plus_the_scales():
    n = 4096 * 4096
    assert torch.empty(n, dtype=torch.float8_e4m3fn).element_size() * n == n
    assert fp8.tensor_bytes(n) == n + 4 and fp8.tensor_bytes(n, "mxfp8") == n + n // 32
    assert fp8.tensor_bytes(33, "mxfp8") == 33 + 2
    with pytest.raises(ValueError, match="unknown scaling"):
        fp8.tensor_bytes(n, "row")
    with pytest.raises(ValueError, match="unknown FP8 format"):
        fp8.scale(1.0, "e3m4")
    with pytest.raises(ValueError, match="amax must be > 0"):
        fp8.scale(0.0)


def test_fp8_activations_halve_the_four_linear_inputs_of_korthikantis_34():
    from zeroedu.theory import activations

    s, b, h, t = 2048, 2, 4096, 4
    # Korthikanti et al. 2022, Table 2: 34·sbh/t with selective recompute and sequence parallelism
    bf16 = activations.korthikanti_layer_bytes(s, b, h, 32, "selective")
    assert bf16 == 34 * s * b * h
    # QKV input 2, output projection input 2, first linear input 2, GeLU output 8: 14 sbh, halved
    assert fp8.layer_activation_bytes(s, b, h, t) == Fraction(bf16 - 7 * s * b * h, t) == Fraction(27 * s * b * h, t)
