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

from .shared_runs import RUNS

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
    r = RUNS(RunConfig(strategy, m * n, m=m, steps=5, recipe="fp32", return_params=True, model="mlp"))
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
    assert _rel(r.losses, r.reference_losses) <= 1e-6
    assert _param_rel(r.params, r.reference_params) <= 1e-6
    comm = theory.exact_comm(strategy, SHAPES, n, m, recipe="fp32")
    expect = {a: {k: float(v) for k, v in c.items() if v} for a, c in comm.items()}
    for rk in r.ranks:
        # The ledger splits traffic by mesh axis: dp_shard and dp_outer each equal theory.
        assert rk.measured.comm_by_axis == expect
    # By hand (fp32: P = G = 4, K = m + v = 8), padding to a multiple of N·M:
    c = sum(PADDED(n * m)) // n  # this rank's inner chunk, all units
    k_elems = c if strategy == "hsdp" else c // m
    assert r.ranks[0].measured.total == 8 * c + 8 * k_elems


@pytest.mark.parametrize("m, n", [(2, 2), (2, 4)])
def test_default_recipe_bytes_exact(m, n):
    c = sum(PADDED(n * m)) // n
    for strategy, total in [("hsdp", 16 * c), ("hfsdp", 4 * c + 12 * (c // m))]:
        r = run(RunConfig(strategy, m * n, m=m, steps=2, model="mlp"))
        assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}
        assert all(rk.measured.total == total for rk in r.ranks)
        assert _rel(r.losses, r.reference_losses) <= 2e-3  # bf16 weights: see test_megatron


def test_one_domain_is_flat_fsdp1():
    a = run(RunConfig("hfsdp", 3, m=1, steps=3, recipe="fp32", return_params=True, model="mlp"))
    b = run(RunConfig("fsdp1", 3, steps=3, recipe="fp32", return_params=True, model="mlp"))
    assert a.losses == b.losses
    assert all((p == q).all() for p, q in zip(a.params, b.params))
    assert a.ranks[0].measured.total == b.ranks[0].measured.total


# ------------------------------------------------------------------ theory: cross-domain table
@pytest.mark.fast
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
    # Both readings side by side: striped over the node's 8 NICs, flat ZeRO-3 takes
    # 39.375 GB / min(450, 8 x 50) GB/s = 98.4 ms, HSDP stays at 116.7 ms.
    table = format_cross_domain_table(cross_domain_table(7e9, 8, 2),
                                      striped=cross_domain_table(7e9, 8, 2, flat_ring="striped"))
    lines = {ln.split()[0]: ln.split() for ln in table.splitlines()[1:]}
    assert "striped ms" in table.splitlines()[0]
    assert lines["flat_zero3"][-2:] == ["787.5", "98.4"] and lines["hsdp"][-2:] == ["116.7", "116.7"]
    with pytest.raises(ValueError, match="same layouts"):
        format_cross_domain_table(cross_domain_table(7e9, 8, 2), striped=cross_domain_table(7e9, 8, 2)[:1])


@pytest.mark.fast
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


@pytest.mark.fast
def test_time_model_assumptions_are_inputs():
    psi = 7 * GB
    flat_sent = 3 * Fraction(15, 16) * 2 * psi  # 39.375 GB per rank per step
    rows = {r["layout"]: r for r in cross_domain_table(7e9, 8, 2)}
    flat = rows["flat_zero3"]
    # one lockstep ring over one 50 GB/s NIC per boundary hop (the default reading) ...
    assert flat["comm_seconds_single_ring"] == flat["comm_seconds"] == pytest.approx(0.7875)
    # ... vs rings striped over the node's 8 NICs: one rank's sent bytes leave each node over
    # 8 × 50 GB/s = 400 GB/s, below NVLink's 450: 39.375 / 400 = 98.4 ms
    assert flat["comm_seconds_striped"] == pytest.approx(float(flat_sent) / min(450e9, 8 * 50e9))
    assert flat["comm_seconds_striped"] == pytest.approx(0.0984375)
    for h in ("hsdp", "hfsdp"):  # their outer rings are per rank, one NIC each: both readings agree
        assert rows[h]["comm_seconds_single_ring"] == rows[h]["comm_seconds_striped"] == \
            pytest.approx(0.11666666666666667)
    # HSDP still sends 2.8x fewer bytes across domains than flat ZeRO-3
    assert flat["cross_domain_per_rank"] / rows["hsdp"]["cross_domain_per_rank"] == Fraction(45, 16)
    assert cross_domain_table(7e9, 8, 2, flat_ring="striped")[0]["comm_seconds"] == \
        flat["comm_seconds_striped"]
    # achieved NIC bandwidth (46-48 GB/s per 400 Gb/s NDR NIC), one NIC per node, latency
    assert step_comm_time("flat_zero3", 7e9, 8, 2, nic_bandwidth=47e9) == pytest.approx(float(flat_sent) / 47e9)
    assert step_comm_time("flat_zero3", 7e9, 8, 2, flat_ring="striped", nics_per_node=1) == \
        pytest.approx(float(flat_sent) / 50e9)
    inner = 3 * Fraction(7, 8) * 2 * psi
    assert step_comm_time("hsdp", 7e9, 8, 2, nics_per_node=1) == pytest.approx(
        float(inner) / 450e9 + 1.75 * GB / (50e9 / 8))  # 8 GPUs share one NIC
    # α per ring step: 3 collectives × 15 steps per unit, at the slow link's α, for flat ZeRO-3;
    # HSDP: 3 × 7 steps inside at the fast α, 2 × 1 (all-reduce over M = 2) across
    a = {"dp_shard": 1e-6, "dp_outer": 1e-5}
    assert step_comm_time("flat_zero3", 7e9, 8, 2, alpha=a, units=32) - flat["comm_seconds"] == \
        pytest.approx(32 * 45 * 1e-5)
    assert step_comm_time("hsdp", 7e9, 8, 2, alpha=a, units=32) - rows["hsdp"]["comm_seconds"] == \
        pytest.approx(32 * (21 * 1e-6 + 2 * 1e-5))
    with pytest.raises(ValueError, match="flat_ring"):
        step_comm_time("flat_zero3", 7e9, 8, 2, flat_ring="tree")
    with pytest.raises(ValueError, match="nic_bandwidth"):
        cross_domain_table(7e9, 8, 2, nic_bandwidth=0)
    with pytest.raises(ValueError, match="nics_per_node"):
        step_comm_time("hsdp", 7e9, 8, 2, nics_per_node=0)


@pytest.mark.fast
def test_exact_model_states_accepts_global_mesh_rank():
    # Inner ranks are contiguous: global rank 5 on a 2 x 4 mesh is inner rank 1.
    assert theory.exact_model_states("hfsdp", SHAPES, 4, 2, rank=5) == \
        theory.exact_model_states("hfsdp", SHAPES, 4, 2, rank=1)
    with pytest.raises(ValueError, match="rank"):
        theory.exact_model_states("hfsdp", SHAPES, 4, 2, rank=8)
