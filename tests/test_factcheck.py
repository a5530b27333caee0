"""Fact-check claims (zeroedu.quiz.factcheck): each settled figure against closed forms written
out by hand here (ZeRO §3.1, §5.1-5.2, §7.1-7.2), torch's own optimizer and FSDPMemTracker,
and the runs' measurements equal to the theory."""
from __future__ import annotations

from fractions import Fraction

from zeroedu.models import param_count
from zeroedu.quiz import factcheck as fc


def test_fact_model_has_no_padding_at_n4():
    dims = [12, 20, 20, 8]
    units = [a * b + b for a, b in zip(dims[:-1], dims[1:])]
    assert sum(units) == param_count(fc.FACT_MODEL) == fc.psi()
    assert all(u % fc.N == 0 for u in units) and all(d % fc.N == 0 for d in dims[1:])


def test_every_claim_is_settled_false_or_half_right():
    names = [f.__name__ for f in fc.CLAIMS]
    assert len(names) == len(set(names)) == 14
    # the pure ones here; the measured ones in the tests below
    for f in (fc.deepspeed_pp_zero3, fc.offload_optimizer_only_stage2):
        c = f()
        assert not c["holds"] and c["verdict"] == "false" and c["correct"]


def test_zero3_is_one_and_a_half_ddp():
    c = fc.zero3_doubles_comm()
    psi, n, b = fc.psi(), fc.N, 2  # bf16 on the wire
    assert c["ddp_sent"] == 2 * Fraction(n - 1, n) * psi * b
    assert c["zero3_sent"] == 3 * Fraction(n - 1, n) * psi * b
    assert c["ring_ratio"] == Fraction(3, 2) and c["match"] and not c["holds"]
    assert 1.45 < c["wire_ratio"] < 1.52  # gpt-small: padding and framing move it off 1.5 by < 1 %


def test_dp_bytes_and_adam_state():
    c2, c3 = fc.dp_needs_7x(), fc.adam_state_2x()
    assert c2["bytes_per_param"] == 2 + 2 + 12 and c2["times_model_size"] == 8 and not c2["holds"]
    assert c3["detail_bytes_per_param"] == {"master": 4, "m": 4, "v": 4} and not c3["holds"]
    assert c3["verdict"] == "half right"


def test_torch_adam_on_bf16_keeps_bf16_moments():
    t = fc.torch_adam_bf16(100)
    assert t["state_dtypes"]["exp_avg"] == t["state_dtypes"]["exp_avg_sq"] == "torch.bfloat16"
    assert t["moment_bytes"] == 2 * 2 * 100 and t["moments_over_params"] == 2
    assert t["state_bytes"]["step"] == 4  # torch's 0-d fp32 step counter


def test_zero2_gathers_parameters():
    c = fc.zero2_gathers_grads()
    ops = [r["op"] for r in c["records"]]
    assert ops.count("reduce_scatter") == ops.count("all_gather") == 3  # one each per unit
    assert all("grads" in r["tag"] for r in c["records"] if r["op"] == "reduce_scatter")
    assert c["gather_tags"] == ["params"] and c["gathers_after_step"]
    assert c["gathered_bytes"] == 2 * fc.psi() and c["grad_bytes_per_rank"] == 2 * fc.psi() // fc.N
    assert not c["holds"]


def test_torch_fsdp_tracker_sees_sharded_optimizer_state():
    c = fc.fsdp_shards_only_params_grads()
    psi, n = fc.psi(), fc.N
    # torch keeps m and v in fp32 for its 1/N shard, plus a 4-byte step per parameter tensor (6 here)
    assert [r["OPT"] for r in c["per_rank"]] == [8 * psi // n + 4 * 6] * n
    assert [r["SHARDED_PARAM"] for r in c["per_rank"]] == [4 * psi // n] * n  # its fp32 master shard
    assert c["unsharded_mv"] == 8 * psi and c["match"] and not c["holds"]


def test_deepspeed_pipeline_source():
    c = fc.deepspeed_pp_zero3()
    s = c["source"]
    assert s["url"].startswith("https://github.com/deepspeedai/DeepSpeed/") and "pipe/engine.py" in s["url"]
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in s["statement"]
    assert [k for k, ok in c["allowed_with_pipeline"].items() if ok] == ["disabled", "optimizer_states"]
    assert c["gpus_tp8_pp4"] == {1: 32, 2: 64, 8: 256}


def test_zero1_and_zero2_ratios_at_8():
    c7, c9 = fc.zero1_4x_at_8(), fc.zero2_8x_at_8()
    assert c7["ratio_7b_n8"] == Fraction(16, 4 + Fraction(12, 8)) and c7["limit"] == 4
    assert c7["measured_ratio_n8"] == c7["exact_theory_n8"] and c7["match"] and not c7["holds"]
    assert c9["ratio_7b_n8"] == Fraction(16, 2 + Fraction(14, 8)) == Fraction(64, 15) and c9["limit"] == 8
    assert c9["measured_ratio_n8"] == c9["exact_theory_n8"] and c9["match"] and not c9["holds"]


def test_zero1_on_the_wire_ring_vs_gloo():
    c = fc.zero1_sends_like_ddp()
    assert c["match"] and c["verdict"] == "half right"
    assert abs(c["ratio_ring"] - 1) < 0.02          # 2Ψ, like DDP's all-reduce
    assert abs(c["ratio_gloo"] - 1.5) < 0.02        # gloo's reduce-scatter: an all-reduce's bytes
    assert abs(c["gloo_rs_over_ring_rs"] - 2) < 0.01


def test_allreduce_sends_two_n_minus_one_over_n():
    c = fc.allreduce_volume_is_psi()
    assert c["ring_factor"] == Fraction(3, 2) and c["match"] and not c["holds"]
    assert abs(c["elements_per_param"] / c["ring_factor"] - 1) < 0.015  # gloo framing < 1.5 %
    assert c["factor_by_n"][1024] == Fraction(1023, 512)


def test_zero1_without_gather_diverges():
    c = fc.zero1_gather_optional()
    assert c["loss_rel_diff"]["zero1"] <= 1e-6 < 1e-3 < c["loss_rel_diff"]["without_gather"]
    assert c["optim_per_rank"] * fc.N == c["optim_full"] == 8 * fc.psi()  # fp32: m and v, 4 + 4 bytes
    assert c["gathered_bytes"] == 4 * fc.psi() and c["match"] and not c["holds"]


def test_zero3_gathers_full_units_and_holds_16_over_n():
    c12, c13 = fc.zero3_fetches_neighbours(), fc.zero3_model_size_over_n()
    assert [u["unit"] for u in c12["units"]] == [0, 1, 2]
    assert all(u["gathered_bytes"] == u["full_unit_bytes"] == fc.N * u["shard_bytes"] for u in c12["units"])
    assert sum(u["full_unit_bytes"] for u in c12["units"]) == 2 * fc.psi() and not c12["holds"]
    assert c13["total_per_rank"] == 16 * fc.psi() // fc.N and c13["times"] == 8 and not c13["holds"]


def test_offload_moves_grads_and_works_with_stages_1_to_3():
    c = fc.offload_optimizer_only_stage2()
    rows = c["by_strategy_7b_n8"]
    assert not rows["ddp"]["applicable"]
    assert rows["zero2"]["device"] == 2 * 7 * 10**9  # DeepSpeed's estimator: gpu_mem = 2 * total_params
    assert rows["zero1"]["applicable"] and rows["fsdp1"]["applicable"]
    assert all(r["host_grad"] == 4 * 7 * 10**9 // 8 for r in rows.values() if r["applicable"])  # fp32 grads
    assert any("Valid for ZeRO stage 1, 2, 3" in s["statement"] for s in c["sources"])
