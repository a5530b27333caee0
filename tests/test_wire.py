"""Bytes on the wire, read from the kernel, against independent figures: a known payload, the
closed forms (`zeroedu.theory`) with zeroedu's ring collectives, gloo's own collectives (its
reduce-scatter sends an all-reduce's bytes), and the results of torch's collectives."""
from __future__ import annotations

import pytest

from zeroedu import catalog, theory
from zeroedu.models import MLPConfig, unit_shapes
from zeroedu.runtime import cluster
from tests.rank_jobs import hidden_names_job, ring_equivalence_job, wire_payload_job
from zeroedu.runtime.ledger import Ledger
from zeroedu.runtime.wire import FRAMING_PER_MESSAGE, WireMeter
from zeroedu.train import RunConfig, run

# The model: large enough that gloo's framing (144 B a message) is far below 3 %.
WIDE = MLPConfig(d_in=384, hidden=384, depth=6, d_out=381)
MARGIN = 0.03


@pytest.mark.parametrize("n", [2, 3, 4])
def test_meter_against_a_known_payload(n):
    nbytes = 1_000_003
    for r in cluster.run(wire_payload_job, n, {"nbytes": nbytes}):
        assert r["ok"]
        # one message out (payload + 96 B of gloo headers) and, for the one coming in, a 48 B
        # notice that this rank is ready to receive it: exactly the framing we allow for
        assert r["sent"] == nbytes + FRAMING_PER_MESSAGE
        assert r["received"] >= nbytes


def _closed_form(strategy, n, m, recipe="fp32", model=WIDE):
    return theory.exact_comm(strategy, unit_shapes(model.build()), n, m, recipe=recipe).total()


# every flat strategy at N = 2, 3, 4; the hybrids on a 2 x 2 mesh (both axes checked)
CASES = [(s, n) for s in catalog.STRATEGIES for n in (2, 3, 4) if not catalog.get_spec(s).hybrid or n == 4]


@pytest.mark.parametrize("strategy,n", CASES)
def test_ring_collectives_put_the_closed_forms_on_the_wire(strategy, n):
    spec = catalog.get_spec(strategy)
    m = 2 if spec.hybrid else 1
    r = run(RunConfig(strategy, n, steps=2, recipe="fp32", m=m, model=WIDE, global_batch=12,
                      collectives="ring"))
    assert r.collectives == "ring" and r.match.wire is True
    want = float(_closed_form(strategy, n // m, m))
    for rk in r.ranks:
        sent = rk.wire.sent
        assert want <= sent <= (1 + MARGIN) * want, (sent, want)
        if spec.hybrid:  # both mesh axes, each against its own closed form
            c = theory.exact_comm(strategy, unit_shapes(WIDE.build()), n // m, m, recipe="fp32")
            for axis in ("dp_shard", "dp_outer"):
                got, exp = rk.wire.by_axis[axis], float(c.axis_total(axis))
                assert exp <= got <= (1 + MARGIN) * exp, (axis, got, exp)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "megatron_distopt"])
def test_gloo_reduce_scatter_sends_an_all_reduce(strategy):
    """With the backend's collectives the wire shows what gloo does: its reduce-scatter sends
    2(g-1)/g of its input (an all-reduce), twice the ring model; its all-gather is on the ring
    bound. Measured per kind of collective (ZeRO-1/2 reduce, then gather, in separate windows)."""
    r = run(RunConfig(strategy, 4, steps=2, recipe="fp32", model=WIDE, global_batch=12, collectives="backend"))
    assert r.match.wire is True  # against the model of gloo's algorithm
    for rk in r.ranks:
        ring = rk.measured.comm
        wire = rk.wire.by_collective
        assert 2 * ring["reduce_scatter"] <= wire["reduce_scatter"] <= 2 * (1 + MARGIN) * ring["reduce_scatter"]
        assert ring["all_gather"] <= wire["all_gather"] <= (1 + MARGIN) * ring["all_gather"]
    # ...so ZeRO-1's 2Ψ becomes 3Ψ on gloo's own collectives, and stays 2Ψ on the ring ones
    ring_run = run(RunConfig(strategy, 4, steps=2, recipe="fp32", model=WIDE, global_batch=12, collectives="ring"))
    ratio = r.ranks[0].wire.sent / ring_run.ranks[0].wire.sent
    assert 1.45 <= ratio <= 1.55


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_collectives_equal_the_backend(n):
    out = cluster.run(ring_equivalence_job, n, {"sizes": [0, 1, 7, 64, 1001]})
    for rank in out:
        for k, res in rank.items():
            assert all(res.values()), (k, res)


def test_older_torch_names_work():
    """On a torch without all_gather_single / reduce_scatter_single (before 2.13), the backend
    path uses all_gather_into_tensor / reduce_scatter_tensor. A fresh pool: the job reloads
    zeroedu.runtime.comm with the new names hidden and puts everything back."""
    with cluster.Pool(2) as pool:
        for r in pool.run(hidden_names_job):
            assert r["functions"] == {"all_gather": "all_gather_into_tensor",
                                      "reduce_scatter": "reduce_scatter_tensor"}
            assert r["ok"] and r["gathered_ok"]


def test_nccl_has_no_wire_figure_only_a_reason():
    meter = WireMeter(backend="nccl")
    assert not meter.available and "NCCL" in meter.reason
    rep = Ledger(0, wire=meter).wire_report()
    assert rep.sent is None and "NCCL" in rep.reason


@pytest.mark.fast
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "fsdp2"])
def test_the_predicted_wire_doubles_reduce_scatter_on_gloo_only(strategy):
    """gloo's own reduce-scatter is an all-reduce (twice the ring's bytes); NCCL's is the ring.
    A run on GPUs ("auto" collectives: the backend's) must not predict gloo's doubling."""
    from zeroedu.theory.comm import on_the_wire
    from zeroedu.train.launch import predicted

    comm = theory.exact_comm(strategy, unit_shapes(WIDE.build()), 4, recipe="fp32")
    ring = on_the_wire(comm, "ring")
    rs = comm.by_collective()["reduce_scatter"]
    assert on_the_wire(comm, "backend", "gloo") == ring + rs  # hand: the reduce-scatters once more
    assert on_the_wire(comm, "backend", "nccl") == ring
    with pytest.raises(ValueError, match="transport must be one of"):
        on_the_wire(comm, "backend", "mpi")
    cfg = RunConfig(strategy, 4, steps=1, recipe="fp32", model=WIDE, collectives="auto")
    assert predicted(cfg, 0, "nccl").wire == float(ring)
    assert predicted(cfg, 0, "gloo").wire == float(ring)  # auto on gloo: zeroedu's rings
    backend = RunConfig(strategy, 4, steps=1, recipe="fp32", model=WIDE, collectives="backend")
    assert predicted(backend, 0, "gloo").wire == float(ring + rs)
