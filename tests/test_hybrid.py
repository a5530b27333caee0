"""HSDP / HFSDP on an M × N mesh, and the cross-domain comparison in `zeroedu.theory.hybrid`.

Expected values: `zeroedu.theory` exact closed forms (bytes per rank, comm per mesh axis),
single-process fp32 torch Adam (`train.reference`), flat FSDP1 (M = 1 must be it), and byte
arithmetic written out here from the seed's 7B, 2 domains x 8 GPUs figures.
"""
from fractions import Fraction

import pytest

from zeroedu import shard, theory
from zeroedu.models import MLPConfig, make_model, unit_shapes
from zeroedu.theory.hybrid import cross_domain_bytes, cross_domain_table, step_comm_time
from zeroedu.notebook.report import format_cross_domain_table
from zeroedu.train import RunConfig, run

GB = 10**9
SHAPES = unit_shapes(make_model(MLPConfig()))
PADDED = lambda mult: [shard.padded_numel(sum(shard.numel(s) for s in u), mult) for u in SHAPES]


def _rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _param_rel(params, ref):
    return max(((p - q).abs().max() / q.abs().max()).item() for p, q in zip(params, ref))


# ------------------------------------------------------------------ real runs
@pytest.mark.parametrize("strategy", ["hsdp", "hfsdp"])
@pytest.mark.parametrize("m, n", [(2, 2), (2, 4), (2, 3)])
def test_fp32_equals_single_process_and_theory(strategy, m, n):
    r = run(RunConfig(strategy, m * n, m=m, steps=5, recipe="fp32", return_params=True, model="mlp"))
    assert r["match"] == {"model_states": True, "comm": True, "activations": True}
    assert _rel(r["losses"], r["reference_losses"]) <= 1e-6
    assert _param_rel(r["params"], r["reference_params"]) <= 1e-6
    comm = theory.exact_comm(strategy, SHAPES, n, m, recipe="fp32")
    expect = {a: {k: float(v) for k, v in c.items() if v} for a, c in comm.items()}
    for rk in r["ranks"]:
        # The ledger splits traffic by mesh axis: dp_shard and dp_outer each equal theory.
        assert rk["measured"]["comm_by_axis"] == expect
    # By hand (fp32: P = G = 4, K = m + v = 8), padding to a multiple of N·M:
    c = sum(PADDED(n * m)) // n  # this rank's inner chunk, all units
    k_elems = c if strategy == "hsdp" else c // m
    assert r["ranks"][0]["measured"]["total"] == 8 * c + 8 * k_elems


@pytest.mark.parametrize("m, n", [(2, 2), (2, 4)])
def test_default_recipe_bytes_exact(m, n):
    c = sum(PADDED(n * m)) // n
    for strategy, total in [("hsdp", 16 * c), ("hfsdp", 4 * c + 12 * (c // m))]:
        r = run(RunConfig(strategy, m * n, m=m, steps=2, model="mlp"))
        assert r["match"] == {"model_states": True, "comm": True, "activations": True}
        assert all(rk["measured"]["total"] == total for rk in r["ranks"])
        assert _rel(r["losses"], r["reference_losses"]) <= 2e-3  # bf16 weights: see test_megatron


def test_one_domain_is_flat_fsdp1():
    a = run(RunConfig("hfsdp", 3, m=1, steps=3, recipe="fp32", return_params=True, model="mlp"))
    b = run(RunConfig("fsdp1", 3, steps=3, recipe="fp32", return_params=True, model="mlp"))
    assert a["losses"] == b["losses"]
    assert all((p == q).all() for p, q in zip(a["params"], b["params"]))
    assert a["ranks"][0]["measured"]["total"] == b["ranks"][0]["measured"]["total"]


# ------------------------------------------------------------------ theory: cross-domain table
def test_seed_7b_two_domains_of_8():
    rows = {r["layout"]: r for r in cross_domain_table(7e9, 8, 2)}
    psi = 7 * GB
    assert rows["flat_zero3"]["bytes_per_rank"] == 7 * GB  # 16Ψ/16
    assert rows["hsdp"]["bytes_per_rank"] == 14 * GB  # 16Ψ/8
    assert rows["hfsdp"]["bytes_per_rank"] == Fraction("8.75") * GB  # 4Ψ/8 + 12Ψ/16
    # Cross-domain bytes per rank: HSDP all-reduces its 2Ψ/8-byte grad shard over M = 2
    # (2·(1/2)·1.75 GB); HFSDP reduce-scatters it and all-gathers the bf16 param shard
    # ((1/2)·1.75 GB each). Flat ZeRO-3: 3 ring collectives of 2Ψ bytes over 16 ranks,
    # of which the average rank's share crossing the boundary is 1/N.
    assert rows["hsdp"]["cross_domain_per_rank"] == Fraction("1.75") * GB
    assert rows["hfsdp"]["cross_domain_per_rank"] == Fraction("1.75") * GB
    flat_sent = 3 * Fraction(15, 16) * 2 * psi
    assert rows["flat_zero3"]["sent_per_rank"] == flat_sent
    assert rows["flat_zero3"]["cross_domain_per_rank"] == flat_sent / 8
    # Time: flat ring paced by the 50 GB/s NIC; hybrids: NVLink for the inner axis.
    assert rows["flat_zero3"]["comm_seconds"] == pytest.approx(float(flat_sent) / 50e9)
    inner = 3 * Fraction(7, 8) * 2 * psi
    assert rows["hsdp"]["comm_seconds"] == pytest.approx(float(inner) / 450e9 + 1.75 * GB / 50e9)
    assert rows["flat_zero3"]["comm_seconds"] > 6 * rows["hsdp"]["comm_seconds"]
    assert "hfsdp" in format_cross_domain_table(list(rows.values()))


def test_one_domain_and_bandwidth_choices():
    rows = {r["layout"]: r for r in cross_domain_table(1e6, 4, 1)}
    assert all(r["cross_domain_per_rank"] == 0 for r in rows.values())
    assert rows["flat_zero3"]["bytes_per_rank"] == rows["hsdp"]["bytes_per_rank"] == 16 * 10**6 // 4
    # Inside one domain flat ZeRO-3 never leaves NVLink.
    assert rows["flat_zero3"]["comm_seconds"] == pytest.approx(rows["hsdp"]["comm_seconds"])
    # Equal links: the hybrid only pays for its extra outer step.
    same = {"dp_shard": 100e9, "dp_outer": 100e9}
    assert step_comm_time("hsdp", 1e6, 4, 2, bandwidth=same) == pytest.approx(
        float(theory.comm_per_rank("hsdp", 1e6, 4, 2).total()) / 100e9)
    # megatron-bf16 grads are fp32 on the wire: HFSDP's outer step is then 4 + 2 bytes, HSDP's 2·4.
    assert cross_domain_bytes("hfsdp", 8, 1, 2, recipe="megatron-bf16") == Fraction(1, 2) * 8 * 6
    assert cross_domain_bytes("hsdp", 8, 1, 2, recipe="megatron-bf16") == 2 * Fraction(1, 2) * 8 * 4
    with pytest.raises(ValueError, match="bandwidth"):
        cross_domain_table(1e6, 4, 2, bandwidth={"dp_outer": 0})
    with pytest.raises(ValueError, match="layout"):
        step_comm_time("ddp", 1e6, 4, 2)


def test_exact_model_states_accepts_global_mesh_rank():
    # Inner ranks are contiguous: global rank 5 on a 2 x 4 mesh is inner rank 1.
    assert theory.exact_model_states("hfsdp", SHAPES, 4, 2, rank=5) == \
        theory.exact_model_states("hfsdp", SHAPES, 4, 2, rank=1)
    with pytest.raises(ValueError, match="rank"):
        theory.exact_model_states("hfsdp", SHAPES, 4, 2, rank=8)
