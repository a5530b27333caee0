"""Fact-check claims (zeroedu.quiz.factcheck): each settled figure against closed forms written
out by hand here (ZeRO §3.1, §5.1, §7), and the runs' measurements equal to the theory."""
from __future__ import annotations

from fractions import Fraction

from zeroedu.models import param_count
from zeroedu.quiz import factcheck as fc


def test_fact_model_has_no_padding_at_n4():
    dims = [12, 20, 20, 8]
    units = [a * b + b for a, b in zip(dims[:-1], dims[1:])]
    assert sum(units) == param_count(fc.FACT_MODEL) == fc.psi()
    assert all(u % fc.N == 0 for u in units) and all(d % fc.N == 0 for d in dims[1:])


def test_zero3_is_one_and_a_half_ddp():
    c = fc.zero3_doubles_comm()
    psi, n, b = fc.psi(), fc.N, 2  # bf16 on the wire
    assert c["ddp_sent"] == 2 * Fraction(n - 1, n) * psi * b
    assert c["zero3_sent"] == 3 * Fraction(n - 1, n) * psi * b
    assert c["measured_ratio"] == Fraction(3, 2) and c["match"] and not c["holds"]


def test_dp_bytes_and_adam_state():
    c2, c3 = fc.dp_needs_7x(), fc.adam_state_2x()
    assert c2["bytes_per_param"] == 2 + 2 + 12 and c2["times_model_size"] == 8 and not c2["holds"]
    assert c3["detail_bytes_per_param"] == {"master": 4, "m": 4, "v": 4} and not c3["holds"]


def test_zero2_gathers_parameters():
    c = fc.zero2_gathers_grads()
    ops = [r["op"] for r in c["records"]]
    assert ops.count("reduce_scatter") == ops.count("all_gather") == 3  # one each per unit
    assert all("grads" in r["tag"] for r in c["records"] if r["op"] == "reduce_scatter")
    assert c["gather_tags"] == ["params"] and c["gathers_after_step"]
    assert c["gathered_bytes"] == 2 * fc.psi() and c["grad_bytes_per_rank"] == 2 * fc.psi() // fc.N
    assert not c["holds"]


def test_fsdp_shards_optimizer_state():
    c = fc.fsdp_shards_only_params_grads()
    assert [r["optim"] for r in c["per_rank"]] == [12 * fc.psi() // fc.N] * fc.N
    assert c["match"] and not c["holds"]


def test_deepspeed_pipeline_source():
    c = fc.deepspeed_pp_zero3()
    s = c["source"]
    assert s["url"].startswith("https://github.com/deepspeedai/DeepSpeed/") and "pipe/engine.py" in s["url"]
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in s["statement"]
    assert [k for k, ok in c["allowed_with_pipeline"].items() if ok] == ["disabled", "optimizer_states"]


def test_zero1_ratio_at_8():
    c = fc.zero1_4x_at_8()
    assert c["ratio_7b_n8"] == Fraction(16, 4 + Fraction(12, 8)) and c["limit"] == 4
    assert c["measured_ratio_n8"] == c["exact_theory_n8"] and c["match"] and not c["holds"]
