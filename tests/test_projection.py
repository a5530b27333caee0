"""The projection to H100s (`zeroedu.theory.projection`): the simulator's schedule filled with the
7B shape and the stated inputs, checked against the same quantities worked by hand."""
from __future__ import annotations

import pytest

from zeroedu.theory import projection as P
from zeroedu.theory import transformer_shape
from zeroedu.theory.timing import ring_time

pytestmark = pytest.mark.fast
HW = P.H100


def _units():
    s = transformer_shape(7e9, seq=4096, micro_batch=1)
    return [s.vocab * s.hidden + 2 * s.hidden] + [s.layer_params] * s.layers


def test_one_node_is_compute_bound_and_its_compute_is_six_psi_tokens():
    p = P.project("fsdp2", 8)
    units = _units()
    optimizer = 7e9 / 8 * 32 / HW.hbm.value
    assert p.compute == pytest.approx(6 * sum(units) * 4096 / HW.flops.value + optimizer, rel=1e-12)
    assert p.step == pytest.approx(p.compute + p.exposed) and p.exposed < 0.02 * p.step
    # in flight: each unit gathered twice (forward, backward) and reduce-scattered, bf16, on NVLink
    link = (HW.nvlink_beta.value, HW.nvlink_alpha.value)
    by_hand = sum(2 * ring_time("all_gather", 2 * u, 8, *link) + ring_time("reduce_scatter", 2 * u, 8, *link)
                  for u in units)
    assert p.comm == {"dp_shard": pytest.approx(by_hand, rel=1e-12)}
    assert p.dominant == "flops" and p.sensitivity["flops"] > 0.45


def test_a_flat_ring_over_two_nodes_is_network_bound_and_hsdp_is_not():
    flat, hsdp = P.project("fsdp2", 16), P.project("hsdp", 8, 2)
    link = (HW.network_beta.value, HW.network_alpha.value)
    units = _units()
    assert flat.comm["dp_shard"] == pytest.approx(sum(
        2 * ring_time("all_gather", 2 * u, 16, *link) + ring_time("reduce_scatter", 2 * u, 16, *link)
        for u in units), rel=1e-12)
    assert flat.dominant == "network_beta" and flat.step > 1.9 * hsdp.step
    # HSDP: each unit's gradient shard all-reduced over the 2 domains on the network
    assert hsdp.comm["dp_outer"] == pytest.approx(sum(ring_time("all_reduce", 2 * u / 8, 2, *link) for u in units),
                                                  rel=1e-12)
    assert hsdp.dominant == "flops" and hsdp.tokens_per_second == pytest.approx(16 * 4096 / hsdp.step)


def test_rings_striped_over_the_nics_make_flat_two_nodes_as_fast_as_hsdp():
    """NCCL stripes its rings over a node's NICs: the boundary carries min(NVLink, 8 x NIC)."""
    striped, hsdp = P.project("fsdp2", 16, flat_ring="striped"), P.project("hsdp", 8, 2)
    beta = min(HW.nvlink_beta.value, 8 * HW.network_beta.value)
    assert beta == 368e9  # 8 x 46 GB/s, just under NVLink's 370
    units = _units()
    assert striped.comm["dp_shard"] == pytest.approx(sum(
        2 * ring_time("all_gather", 2 * u, 16, beta, HW.network_alpha.value)
        + ring_time("reduce_scatter", 2 * u, 16, beta, HW.network_alpha.value) for u in units), rel=1e-12)
    assert striped.dominant == "flops" and abs(striped.step / hsdp.step - 1) < 0.02
    with pytest.raises(ValueError, match="flat_ring"):
        P.project("fsdp2", 16, flat_ring="tree")


def test_the_table_is_labelled_a_model_and_names_every_input_with_its_source():
    text = P.table_text(P.projection_table())
    assert text.startswith("A MODEL, not a measurement")
    for name, inp in HW.inputs().items():
        assert name in text and inp.source in text
    with pytest.raises(ValueError, match="ZeRO-3 / FSDP and HSDP"):
        P.project("ddp", 8)
    with pytest.raises(ValueError, match="M > 1"):
        P.project("hsdp", 8, 1)


def test_the_readme_prints_the_table_the_module_computes():
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert P.table_text(P.projection_table()) in readme
