"""What one GPU holds beyond model states: activations (Korthikanti et al. 2022), the gathered
unit, offload, the GPU count with TP/PP, and "fits" on the full sum; through `theory` and
`zeroedu memory`.

Expected values are written out from the paper's expressions (§4.1 Eq. (1), §4.2.1 Eq. (2),
§4.3, Table 2), DeepSpeed's memory estimators (deepspeed/runtime/zero/stage_1_and_2.py and
stage3.py, v0.16.4) and the GPT-3 paper's model shapes, not from the code under test."""
import json
from fractions import Fraction

import pytest

from zeroedu import cli, theory
from zeroedu.theory import activations as A

pytestmark = pytest.mark.fast

GB = 10**9


def run_json(capsys, *argv) -> dict:
    assert cli.main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------ Korthikanti per layer
def test_gpt3_175b_layer():
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B (Brown et al. 2020, Table 2.1)
    sbh = s * b * h
    assert A.korthikanti_layer_bytes_tp(s, b, h, a) == 34 * sbh + 5 * a * s * s * b  # Eq. (1)
    assert A.korthikanti_layer_bytes_tp(s, b, h, a, recompute="selective") == 34 * sbh
    assert A.korthikanti_layer_bytes_tp(s, b, h, a, recompute="full") == 2 * sbh
    for r in A.RECOMPUTE:  # t = 1 is the existing Eq. (1) function
        assert A.korthikanti_layer_bytes_tp(s, b, h, a, 1, r) == A.korthikanti_layer_bytes(s, b, h, a, r)
    # Eq. (2), t = 8: sbh(10 + 24/t + 5as/(ht)); every term divides exactly here
    t = 8
    assert A.korthikanti_layer_bytes_tp(s, b, h, a, t) == 10 * sbh + 24 * sbh // t + 5 * a * s * sbh // (h * t)
    assert A.korthikanti_layer_bytes_tp(s, b, h, a, t, "selective") == 10 * sbh + 3 * sbh  # Table 2
    assert A.korthikanti_layer_bytes_tp(s, b, h, a, t, "full") == 2 * sbh  # not split without SP
    # fp32 activations (e = 4, masks still 1 byte): (4e+2)sbh + 12e·sbh/t + (2e+1)as²b/t
    assert A.korthikanti_layer_bytes_tp(s, b, h, a, 2, "none", 4) == 18 * sbh + 24 * sbh + 9 * a * s * s * b // 2
    # t not dividing h·a: an exact Fraction, not a rounded int
    assert A.korthikanti_layer_bytes_tp(3, 1, 4, 1, t=3, recompute="selective") == 10 * 12 + Fraction(24 * 12, 3)
    assert A.korthikanti_layer_bytes_tp(1, 1, 1, 1, t=5, recompute="selective") == Fraction(10 * 5 + 24, 5)


# ------------------------------------------------------------------ shapes
@pytest.mark.parametrize("psi, L, h, a", [
    (7e9, 32, 4096, 32),       # GPT-3 6.7B
    (13e9, 40, 5120, 40),      # GPT-3 13B
    (175e9, 96, 12288, 96),    # GPT-3 175B
])
def test_inferred_shape_is_gpt3_family(psi, L, h, a):
    sh = theory.transformer_shape(psi)
    assert (sh.layers, sh.hidden, sh.heads) == (L, h, a)
    assert (sh.seq, sh.micro_batch, sh.vocab) == (4096, 1, 50257)
    assert set(sh.inferred) == {"layers", "hidden", "heads"}
    assert sh.params == L * (12 * h * h + 13 * h) + 50257 * h + 2 * h
    assert 0.9 < sh.params / psi < 1.1


def test_given_sizes_are_kept_and_the_rest_inferred():
    # h given: L = round((Ψ - vh) / (12h² + 13h)); GPT-3 6.7B has 32 layers of 4096
    sh = theory.transformer_shape(6.7e9, hidden=4096)
    assert (sh.layers, sh.hidden, sh.heads, sh.inferred) == (32, 4096, 32, ("layers", "heads"))
    sh = theory.transformer_shape(6.7e9, layers=32, heads=16, seq=2048, micro_batch=2, vocab=32000)
    assert (sh.hidden, sh.heads, sh.seq, sh.micro_batch, sh.vocab) == (4096, 16, 2048, 2, 32000)
    assert sh.inferred == ("hidden",)
    assert theory.transformer_shape(1e6).layers >= 1  # tiny models still get a shape


# ------------------------------------------------------------------ activations on one GPU
def test_activation_total_7b():
    sh = theory.transformer_shape(7e9, seq=2048, micro_batch=2)
    s, b, h, a, L, v = 2048, 2, 4096, 32, 32, 50257
    sbh = s * b * h
    layer = {"none": 34 * sbh + 5 * a * s * s * b, "selective": 34 * sbh, "full": 2 * sbh}
    outside = sbh + 2 * sbh + 2 * sbh + 4 * s * b * v  # §4.3 at p = 1: mask, LN, output input, logits
    assert outside == sum(A.korthikanti_extra_bytes(s, b, h, v).values())
    for r in A.RECOMPUTE:
        got = theory.transformer_activation_bytes(sh, r, attention="eager")  # the paper's count
        assert got["total"] == L * layer[r] + outside and got["per_layer"] == layer[r]
    # fused attention (the default): no s² scores, one fp32 log-sum-exp per row and head
    fused = {"none": 34 * sbh + 4 * a * s * b, "selective": 34 * sbh, "full": 2 * sbh}
    for r in A.RECOMPUTE:
        got = theory.transformer_activation_bytes(sh, r)
        assert got["attention"] == "fused" and got["total"] == L * fused[r] + outside and got["per_layer"] == fused[r]
    # pipeline: the first stage keeps p micro-batches of L/p layers = L layers' worth (§4.2.3),
    # plus p embedding masks; no output layer there
    got = theory.transformer_activation_bytes(sh, "selective", pp=4)
    assert got["layers_held"] == L and got["total"] == L * 34 * sbh + 4 * sbh
    # L not divisible by p: ⌈L/p⌉ layers per stage, p in flight
    assert theory.transformer_activation_bytes(sh, "full", pp=5)["layers_held"] == 7 * 5
    # tensor parallel t = 4 without SP: Eq. (2) per layer, logits split by t
    got = theory.transformer_activation_bytes(sh, "none", tp=4, attention="eager")
    per = 10 * sbh + 24 * sbh // 4 + 5 * a * s * s * b // 4
    assert got["total"] == L * per + sbh + 4 * sbh + 4 * s * b * v // 4
    got = theory.transformer_activation_bytes(sh, "none", tp=4)
    assert got["per_layer"] == 10 * sbh + 24 * sbh // 4 + 4 * a * s * b // 4
    # fp32 activations: e = 4 in the layer and in the LN/output-input terms
    got = theory.transformer_activation_bytes(sh, "selective", dtype_bytes=4)
    assert got["total"] == L * 66 * sbh + sbh + 8 * sbh + 4 * s * b * v


def test_gathered_unit():
    sh = theory.transformer_shape(70e9, layers=80, hidden=8192, heads=64)
    h = 8192
    # ZeRO-3 family: one unsharded layer, 12h² + 13h params (the layer beats the embedding here)
    for s in ("fsdp1", "fsdp2", "hsdp", "hfsdp"):
        u = theory.gathered_unit_bytes(s, sh)
        assert u == {"bytes": 2 * (12 * h * h + 13 * h), "unit": "layer", "params": 12 * h * h + 13 * h}
    assert theory.gathered_unit_bytes("fsdp1", sh, recipe="fp32")["bytes"] == 4 * (12 * h * h + 13 * h)
    # tensor parallel: weights and column-parallel biases split, row-parallel biases and LNs whole
    assert theory.gathered_unit_bytes("fsdp1", sh, tp=8)["params"] == (12 * h * h + 7 * h) // 8 + 6 * h
    for s in ("ddp", "zero1", "zero2", "megatron_distopt"):
        assert theory.gathered_unit_bytes(s, sh)["bytes"] == 0
    # 7B with GPT-2's vocabulary: the embedding (v·h) outgrows a layer (12h² + 13h)
    small = theory.transformer_shape(7e9)
    u = theory.gathered_unit_bytes("fsdp2", small)
    assert u["unit"] == "embedding" and u["bytes"] == 2 * 50257 * 4096


def test_fits_flips_when_activations_are_counted():
    sh = theory.transformer_shape(7e9)  # L = 32, h = 4096, a = 32, S = 4096, B = 1
    s, b, h, a, L, v = 4096, 1, 4096, 32, 32, 50257
    states = 16 * 7 * GB // 8  # ZeRO-3: 14 GB
    act = L * (34 * s * b * h + 5 * a * s * s * b) + 5 * s * b * h + 4 * s * b * v  # no recompute, eager
    unit = 2 * 50257 * 4096
    assert states < 80 * GB < states + act  # model states alone fit, with the paper's activations they do not
    assert theory.fits("fsdp1", 7e9, 8, gpu_bytes=80e9)
    eager = {"recompute": "none", "attention": "eager"}
    assert not theory.fits("fsdp1", 7e9, 8, gpu_bytes=80e9, shape=sh, **eager)
    d = theory.device_bytes("fsdp1", 7e9, 8, shape=sh, **eager)
    assert (d["model_states"].total, d["activations"], d["gathered_unit"]) == (states, act, unit)
    assert d["total"] == states + act + unit
    # the boundary: exactly the sum fits, a byte less does not
    assert theory.fits("fsdp1", 7e9, 8, gpu_bytes=states + act + unit, shape=sh, **eager)
    assert not theory.fits("fsdp1", 7e9, 8, gpu_bytes=states + act + unit - 1, shape=sh, **eager)
    # with fused attention (the default) nothing s² is stored: the same run fits without recompute
    fused = L * (34 * s * b * h + 4 * a * s * b) + 5 * s * b * h + 4 * s * b * v
    assert theory.device_bytes("fsdp1", 7e9, 8, shape=sh, recompute="none")["activations"] == fused
    assert theory.fits("fsdp1", 7e9, 8, gpu_bytes=80e9, shape=sh, recompute="none")
    # the same through explicit byte terms, and the old keyword API unchanged
    assert not theory.fits("fsdp1", 7e9, 8, activation_bytes=act, unit_bytes=unit,
                           gpu_bytes=states + act + unit - 1)
    assert theory.fits("fsdp1", 7e9, 8, gpu_bytes=80e9, reserve_bytes=60e9)


# ------------------------------------------------------------------ offload vs DeepSpeed
def test_offload_matches_deepspeeds_estimators():
    psi, n = 70 * GB, 8
    # estimate_zero2_model_states_mem_needs, cpu_offload=True: gpu_mem = 2 * total_params
    z2 = theory.offload("zero2", psi, n)
    assert z2["device"].total == 2 * psi == 140 * GB
    assert (z2["device"].param, z2["device"].grad, z2["device"].optim) == (2 * psi, 0, 0)
    assert z2["host"].total == 16 * psi / n  # fp32 grads 4 + master 4 + m 4 + v 4, this rank's 1/N
    # estimate_zero3_model_states_mem_needs, offload optimizer: gpu = largest layer + 2Ψ/N
    # (the gathered unit is counted separately here); CPU 16Ψ per node over its GPUs
    z3 = theory.offload("fsdp1", psi, n)
    assert z3["device"].total == 2 * psi / n and z3["host"].total == 16 * psi / n
    # offload optimizer + params: gpu = largest layer only; CPU 18Ψ per node over its GPUs
    inf = theory.offload("fsdp2", psi, n, what="optimizer+params")
    assert inf["device"].total == 0 and inf["host"].total == 18 * psi / n
    # stage 1 keeps the full 16-bit gradients until they are reduced after backward: 4Ψ
    for s in ("zero1", "zero1_allreduce"):
        z1 = theory.offload(s, psi, n)
        assert z1["device"].total == 4 * psi and z1["host"].total == 16 * psi / n
    # fp32 recipe: the device keeps fp32 params, the host an fp32 master copy + grads + m + v
    f32 = theory.offload("zero2", psi, n, recipe="fp32")
    assert f32["device"].total == 4 * psi and f32["host"].total == 16 * psi / n
    # hybrids: ZeRO-3 on their own shards (HFSDP's optimizer partition is 1/(NM))
    hf = theory.offload("hfsdp", psi, n, m=2)
    assert hf["device"].total == 2 * psi / n and hf["host"].total == 16 * psi / (n * 2)
    for s in ("ddp", "ddp_bucketed"):
        with pytest.raises(ValueError, match="ZeRO stages 1-3 only"):
            theory.offload(s, psi, n, what="optimizer")
        assert theory.offload(s, psi, n, what="none")["device"].total == 16 * psi
    assert "Megatron-Core" in theory.offload_not_applicable("megatron_distopt")
    assert theory.offload_not_applicable("zero2") is None


def test_gpu_count():
    assert theory.gpu_count("zero2", 8, tp=8, pp=4) == 256
    assert theory.gpu_count("zero2", 8, m=2, tp=8, pp=4) == 256  # non-hybrids ignore M
    assert theory.gpu_count("hsdp", 8, m=2, tp=8, pp=4) == 512
    with pytest.raises(ValueError, match="tp must"):
        theory.gpu_count("ddp", 8, tp=0)


# ------------------------------------------------------------------ the CLI
def test_cli_7b_explicit_shape_equals_the_formula(capsys):
    rep = run_json(capsys, "--psi", "7e9", "--n", "8", "--layers", "32", "--hidden", "4096",
                   "--heads", "32", "--seq", "2048", "--micro-batch", "2", "--recompute", "none",
                   "--vocab", "32000", "--attention", "eager")
    s, b, h, a, L, v = 2048, 2, 4096, 32, 32, 32000
    sbh = s * b * h
    layer = 34 * sbh + 5 * a * s * s * b  # Eq. (1)
    act = L * layer + sbh + 4 * sbh + 4 * s * b * v
    blk = rep["activations"]
    assert blk["bytes"] == act and blk["per_layer"] == layer and blk["layers_held"] == 32
    assert blk["inputs"] == {"s": s, "b": b, "h": h, "a": a, "L": L, "v": v, "t": 1, "p": 1}
    assert blk["shape"]["inferred"] == [] and "Eq. (1)" in blk["formula"]
    assert blk["recompute"] == "none" and blk["dtype_bytes"] == 2
    unit = 2 * (12 * h * h + 13 * h)  # a layer: 12h² + 13h > v·h at v = 32000
    for name, r in rep["strategies"].items():
        assert r["activations"] == act
        want_unit = unit if name in ("fsdp1", "fsdp2", "hsdp", "hfsdp") else 0
        assert r["gathered_unit"] == want_unit
        assert r["device_total"] == r["total"] + act + want_unit
        assert r["fits"] == (r["device_total"] <= 80 * GB)
    # Megatron's 52.5 GB of model states fit 80 GB; with 61 GB of activations they do not
    mg = rep["strategies"]["megatron_distopt"]
    assert mg["total"] == 52.5 * GB and act > 61 * GB and not mg["fits"]
    assert rep["strategies"]["fsdp1"]["fits"]


def test_cli_inferred_shape_and_fits_flip(capsys):
    rep = run_json(capsys, "--psi", "7e9", "--strategy", "zero3")
    sh = rep["activations"]["shape"]
    assert (sh["layers"], sh["hidden"], sh["heads"], sh["seq"], sh["micro_batch"]) == (32, 4096, 32, 4096, 1)
    assert rep["activations"]["recompute"] == "selective"
    assert rep["strategies"]["fsdp1"]["fits"]
    rep = run_json(capsys, "--psi", "7e9", "--strategy", "zero3", "--recompute", "none", "--attention", "eager")
    r = rep["strategies"]["fsdp1"]
    assert r["total"] == 14 * GB < 80 * GB and not r["fits"]  # the states fit, the sum does not
    # fused attention, the default: no s² scores stored, and the same run fits without recompute
    rep = run_json(capsys, "--psi", "7e9", "--strategy", "zero3", "--recompute", "none")
    assert rep["activations"]["attention"] == "fused" and rep["strategies"]["fsdp1"]["fits"]
    assert cli.main(["memory", "--psi", "7e9", "--strategy", "zero3", "--recompute", "none", "--attention", "eager"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("fsdp1 "))
    assert row[-1] == "no" and "activations: GPT L=32, h=4096, a=32" in out
    assert "inferred from psi" in out


def test_cli_offload_70b(capsys):
    rep = run_json(capsys, "--psi", "70e9", "--n", "8", "--offload", "optimizer")
    assert rep["strategies"]["zero2"]["total"] == 2 * 70 * GB == 140 * GB
    assert rep["strategies"]["zero2"]["host_total"] == 140 * GB  # 16Ψ/8
    for s in ("ddp", "ddp_bucketed", "megatron_distopt"):
        r = rep["strategies"][s]
        assert r["total"] is None and r["fits"] is None and rep["comm"][s] is None
        assert r["not_applicable"]
    assert "ZeRO stages 1-3" in rep["strategies"]["ddp"]["not_applicable"]
    assert cli.main(["memory", "--psi", "70e9", "--n", "8", "--offload", "optimizer"]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("ddp "))
    assert row[2:] == ["n/a"] * 10
    assert "n/a (ddp): ZeRO-Offload applies to ZeRO stages 1-3 only" in out


def test_cli_gpus_with_tp_pp(capsys):
    rep = run_json(capsys, "--psi", "70e9", "--n", "8", "--tp", "8", "--pp", "4")
    assert rep["gpus"] == 256 and rep["strategies"]["zero2"]["gpus"] == 256
    rep = run_json(capsys, "--psi", "70e9", "--n", "8", "--m", "2", "--tp", "8", "--pp", "4")
    assert (rep["gpus"], rep["gpus_hybrid"]) == (256, 512)
    assert rep["strategies"]["hsdp"]["gpus"] == 512 and rep["strategies"]["fsdp1"]["gpus"] == 256
    # activations with tp, pp: Eq. (2) per layer, the first stage's L layer-equivalents
    blk = rep["activations"]
    assert blk["inputs"]["t"] == 8 and blk["inputs"]["p"] == 4 and "Eq. (2)" in blk["formula"]
    assert cli.main(["memory", "--psi", "70e9", "--n", "8", "--m", "2", "--tp", "8", "--pp", "4"]) == 0
    out = capsys.readouterr().out
    assert "GPUs: N·tp·pp = 256; hsdp/hfsdp: N·M·tp·pp = 512" in out


@pytest.mark.parametrize("argv, msg", [
    (["--strategy", "ddp", "--offload", "optimizer"], "ZeRO stages 1-3 only"),
    (["--strategy", "megatron_distopt", "--offload", "optimizer"], "not modelled"),
    (["--hidden", "4096", "--heads", "3"], "divisible"),
    (["--seq", "0"], "--seq"),
    (["--micro-batch", "-1"], "--micro-batch"),
    (["--layers", "x"], "--layers"),
    (["--recompute", "partial"], "--recompute"),
])
def test_cli_bad_shape_or_offload_exits_2(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        cli.main(["memory", "--psi", "7e9", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err and msg in err


# ------------------------------------------------------------------ the dashboard
def test_memory_explorer_fits_on_the_full_sum():
    from zeroedu import catalog
    from zeroedu.notebook import widgets

    e = widgets.memory_explorer(psi=7e9, n=8, gpu_gb=80, recompute="none", attention="eager")
    sh = theory.transformer_shape(7e9)
    for s in catalog.STRATEGIES:
        assert e.data[s]["fits"] == theory.fits(s, 7e9, 8, gpu_bytes=80e9, shape=sh, recompute="none",
                                                attention="eager")
    # ZeRO-3's 14 GB of model states fit; with 104 GB of activations they do not
    assert theory.fits("fsdp1", 7e9, 8, gpu_bytes=80e9) and not e.data["fsdp1"]["fits"]
    assert "L = 32, h = 4096, a = 32" in e.note.value and "inferred from Ψ" in e.note.value
    assert "comm time, nothing overlapped" in e.table.value
    # hybrids at M = 1 are flat ZeRO-3: marked and greyed until M >= 2
    assert "hfsdp (M=1: fsdp1)" in e.table.value and "Greyed rows" in e.note.value
    assert e.set(m=2, recompute="selective", seq=2048, micro_batch=2)
    assert "(M=1" not in e.table.value and e.data["hfsdp"]["total"] == 8.75 * GB
    d = theory.device_bytes("hfsdp", 7e9, 8, 2, shape=theory.transformer_shape(7e9, seq=2048, micro_batch=2))
    assert e.data["hfsdp"]["device_total"] == pytest.approx(float(d["total"]))
    # offload: the DDP rows are n/a, ZeRO-2 keeps 2Ψ of bf16 params
    assert e.set(offload="optimizer", strategy="zero2")
    assert "error" in e.data["ddp"] and e.data["zero2"]["total"] == 14 * GB
