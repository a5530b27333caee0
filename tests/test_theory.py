"""Closed forms of `zeroedu.theory` against hand-worked figures and the exact per-model count.

Expected values come from the seed worked tables (7B, N = 8) and from the byte arithmetic
written out in each test, not from the code under test."""
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from zeroedu import catalog, recipes, shard, theory

pytestmark = pytest.mark.fast

GB = 10**9
PSI = 7 * 10**9


# ------------------------------------------------------------------ asymptotic memory
@pytest.mark.parametrize("name, gb", [
    ("ddp", 112), ("ddp_bucketed", 112), ("zero1", 38.5), ("zero1_allreduce", 38.5),
    ("zero2", 26.25), ("zero3", 14), ("fsdp1", 14), ("fsdp2", 14), ("megatron_distopt", 52.5),
])
def test_seed_table_7b_n8(name, gb):
    assert theory.model_states(name, 7e9, 8).total == gb * GB


def test_hybrid_7b_two_domains_of_8():
    assert theory.model_states("hsdp", 7e9, 8, m=2).total == 14 * GB
    assert theory.model_states("hfsdp", 7e9, 8, m=2).total == Fraction("8.75") * GB
    # flat ZeRO-3 over all 16 ranks
    assert theory.model_states("fsdp1", 7e9, 16).total == 7 * GB


def test_hybrid_m1_is_flat_zero3_and_nonhybrid_ignores_m():
    z3 = theory.model_states("fsdp1", PSI, 8)
    assert theory.model_states("hsdp", PSI, 8, m=1) == z3
    assert theory.model_states("hfsdp", PSI, 8, m=1) == z3
    assert theory.model_states("zero2", PSI, 8, m=4) == theory.model_states("zero2", PSI, 8)


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_megatron_recipes_per_param(n):
    per = lambda r: theory.model_states("megatron_distopt", 1, n, recipe=r).total
    assert per("megatron-bf16") == 6 + Fraction(12, n)
    assert per("fp16") == 4 + Fraction(16, n)
    assert per("fp32") == 8 + Fraction(8, n)


def test_fp32_recipe_has_no_master():
    ms = theory.model_states("ddp", 10, 1, recipe="fp32")
    assert ms.master == 0 and ms.main_grad == 0 and ms.optim == 80 and ms.total == 160


def test_as_dict_shape_and_plain_numbers():
    d = theory.model_states("zero1", 7e9, 8).as_dict()
    assert d == {"param": 14 * GB, "grad": 14 * GB, "optim": 10.5 * GB, "total": 38.5 * GB,
                 "optim_detail": {"master": 3.5 * GB, "main_grad": 0, "m": 3.5 * GB, "v": 3.5 * GB}}
    assert all(type(v) in (int, float) for k, v in d.items() if k != "optim_detail")


# ------------------------------------------------------------------ seed 003 corrections
def test_ddp_is_16_bytes_per_param_8x_bf16_weights_not_7x():
    ms = theory.model_states("ddp", PSI, 8)
    assert ms.total == 16 * PSI == 8 * (2 * PSI)


def test_optimizer_state_is_12_bytes_not_2x_params():
    assert theory.model_states("ddp", PSI, 8).optim == 12 * PSI


def test_zero3_comm_is_1_5x_ddp_not_2x():
    ddp = theory.comm_per_rank("ddp", PSI, 8).total()
    assert theory.comm_per_rank("zero3", PSI, 8).total() / ddp == Fraction(3, 2)
    assert theory.comm_per_rank("zero2", PSI, 8).total() == ddp
    # without the backward re-gather ZeRO-3 costs the same as DDP
    assert theory.comm_per_rank("fsdp1", PSI, 8, reshard_after_forward=False).total() == ddp


def test_zero3_over_ddp_ratio_depends_on_the_reduce_dtype():
    # Bytes per parameter on the wire, (g-1)/g dropped: ZeRO-3 = AG(P) + AG(P) + RS(G), DDP = 2·G.
    ratio = lambda z3, ddp: theory.comm_per_rank("fsdp1", PSI, 8, **z3).total() / \
        theory.comm_per_rank("ddp", PSI, 8, **ddp).total()
    assert ratio({}, {}) == Fraction(2 + 2 + 2, 2 * 2)  # mixed-bf16: 1.5
    fp32 = {"reduce_dtype": "fp32"}  # FSDP2 reduce_dtype=float32; Megatron's --bf16 default
    assert ratio(fp32, fp32) == Fraction(2 + 2 + 4, 2 * 4) == 1
    assert ratio(fp32, {}) == Fraction(2 + 2 + 4, 2 * 2) == 2
    # the megatron-bf16 recipe (fp32 grads) is the same wire as reduce_dtype="fp32"
    mb = {"recipe": "megatron-bf16"}
    assert ratio(mb, mb) == 1
    assert theory.comm_per_rank("fsdp1", PSI, 8, **mb) == theory.comm_per_rank("fsdp1", PSI, 8, **fp32)
    # the reduce dtype moves gradient bytes only: the all-gathers keep the param dtype
    ag = lambda **kw: theory.comm_per_rank("zero2", PSI, 8, **kw).by_collective()["all_gather"]
    assert ag(**fp32) == ag() == Fraction(7, 8) * 2 * PSI
    assert theory.exact_comm("fsdp1", [[(8, 4)]], 4, **fp32).by_collective() == \
        {"all_gather": Fraction(3, 4) * 32 * 2 * 2, "reduce_scatter": Fraction(3, 4) * 32 * 4}


def test_zero1_cut_at_n8_is_2_9x_not_4x():
    ratio = theory.model_states("ddp", PSI, 8).total / theory.model_states("zero1", PSI, 8).total
    assert ratio == Fraction(16, 4 + Fraction(12, 8)) == Fraction(32, 11)
    assert round(float(ratio), 1) == 2.9


def test_zero2_all_gathers_params_not_grads():
    ag = [op for op in theory.comm_per_rank("zero2", PSI, 8).ops if op.collective == "all_gather"]
    assert len(ag) == 1 and "params" in ag[0].tag and ag[0].nbytes == 2 * PSI


def test_fsdp_shards_optimizer_state_too():
    assert theory.model_states("fsdp2", PSI, 8).optim == 12 * PSI / 8


# ------------------------------------------------------------------ communication
def test_ring_bytes_per_collective():
    n, S = 8, 1000
    f = Fraction(n - 1, n)
    assert theory.sent_bytes("all_reduce", S, n) == 2 * f * S
    assert theory.sent_bytes("reduce_scatter", S, n) == f * S
    assert theory.sent_bytes("all_gather", S, n) == f * S
    assert theory.sent_bytes("all_reduce", S, 1) == 0


@pytest.mark.parametrize("name, expected", [
    ("ddp", {"all_reduce": 2 * 2}),
    ("zero1", {"reduce_scatter": 2, "all_gather": 2}),
    ("zero2", {"reduce_scatter": 2, "all_gather": 2}),
    ("zero1_allreduce", {"all_reduce": 2 * 2, "all_gather": 2}),
    ("megatron_distopt", {"reduce_scatter": 4, "all_gather": 2}),  # fp32 grads on the wire
    ("fsdp1", {"all_gather": 2 * 2, "reduce_scatter": 2}),
    ("fsdp2", {"all_gather": 2 * 2, "reduce_scatter": 2}),
])
def test_comm_per_strategy_non_hybrid(name, expected):
    n = 8
    c = theory.comm_per_rank(name, PSI, n)
    assert list(c) == ["dp_shard"]
    assert c.by_collective() == {k: Fraction(n - 1, n) * v * PSI for k, v in expected.items()}


def test_comm_hybrid_axes():
    n, m = 8, 2
    inner = {"all_gather": Fraction(7, 8) * 4 * PSI, "reduce_scatter": Fraction(7, 8) * 2 * PSI}
    hsdp = theory.comm_per_rank("hsdp", PSI, n, m)
    assert hsdp["dp_shard"] == inner
    assert hsdp["dp_outer"] == {"all_reduce": 2 * Fraction(1, 2) * 2 * Fraction(PSI, n)}
    hfsdp = theory.comm_per_rank("hfsdp", PSI, n, m)
    assert hfsdp["dp_shard"] == inner
    half_shard = Fraction(1, 2) * 2 * Fraction(PSI, n)
    assert hfsdp["dp_outer"] == {"reduce_scatter": half_shard, "all_gather": half_shard}
    assert hfsdp.total() == hfsdp.axis_total("dp_shard") + hfsdp.axis_total("dp_outer")
    assert theory.comm_per_rank("hsdp", PSI, n, 1).axis_total("dp_outer") == 0


def test_timing():
    assert theory.ring_allreduce_time(1e9, 8, 1e9) == pytest.approx(2 * 7 / 8)
    assert theory.all_gather_time(1e9, 8, 1e9) == pytest.approx(7 / 8)
    assert theory.reduce_scatter_time(1e9, 1, 1e9) == 0
    c = theory.comm_per_rank("ddp", PSI, 8)
    assert theory.comm_time(c, {"dp_shard": 100e9}) == pytest.approx(
        theory.ring_allreduce_time(2 * PSI, 8, 100e9))
    h = theory.comm_per_rank("hsdp", PSI, 8, 2)
    expected = float(h.axis_total("dp_shard")) / 450e9 + float(h.axis_total("dp_outer")) / 50e9
    assert theory.comm_time(h) == pytest.approx(expected)


def test_alpha_beta_ring_model():
    # t = steps·α + sent/β; a ring over g ranks: g-1 steps (RS, AG), 2(g-1) (AR)
    assert [theory.ring_steps(c, 8) for c in theory.COLLECTIVES] == [14, 7, 7]
    assert theory.ring_steps("all_reduce", 1) == 0
    assert theory.ring_allreduce_time(1e9, 8, 1e9, alpha=1e-3) == pytest.approx(14e-3 + 2 * 7 / 8)
    assert theory.all_gather_time(1e9, 8, 1e9, alpha=1e-3) == pytest.approx(7e-3 + 7 / 8)
    assert theory.ring_time("reduce_scatter", 0, 4, 1e9, alpha=2e-6) == pytest.approx(3 * 2e-6)
    # bucket sizing: bandwidth share e reached at S = e/(1-e)·g·α·β (9·8·5e-6·50e9 = 18 MB)
    g, a, b = 8, 5e-6, 50e9
    s90 = theory.min_bucket_bytes(g, b, a, efficiency=0.9)
    assert s90 == pytest.approx(18e6)
    for coll in theory.COLLECTIVES:
        assert theory.bucket_time(s90, g, b, a, coll)["efficiency"] == pytest.approx(0.9)
    small = theory.bucket_time(s90 / 100, g, b, a)
    assert small["efficiency"] < 0.1 and small["latency"] == pytest.approx(14 * a)
    # a 1 GB buffer in 25 MB buckets pays 40 latencies and the bytes once
    assert theory.bucketed_time(1e9, 25e6, g, b, a) == pytest.approx(
        40 * 14 * a + theory.ring_allreduce_time(1e9, g, b))
    # comm_time: steps·α for every collective in the op list, per axis
    c = theory.comm_per_rank("hsdp", PSI, 8, 2)
    lat = theory.comm_time(c, alpha={"dp_shard": 1e-6, "dp_outer": 1e-5}) - theory.comm_time(c)
    assert lat == pytest.approx(3 * 7 * 1e-6 + 2 * 1 * 1e-5)  # AG, AG, RS over 8; AR over 2
    with pytest.raises(ValueError, match="alpha"):
        theory.ring_time("all_reduce", 1, 2, 1e9, alpha=-1)
    with pytest.raises(ValueError, match="efficiency"):
        theory.min_bucket_bytes(8, 1e9, 1e-6, efficiency=1)


# ------------------------------------------------------------------ extensions
def test_offload_and_compose_and_fits():
    # ZeRO-Offload: optimizer state, fp32 grads and the step on the host; the device keeps the
    # bf16 params (2Ψ for ZeRO-2, DeepSpeed's estimate_zero2_model_states_mem_needs with
    # cpu_offload). Host: fp32 grad partition 4Ψ/N + master, m, v 12Ψ/N.
    o = theory.offload("zero2", PSI, 8, what="optimizer")
    assert o["device"].total == 2 * PSI and o["host"].total == 16 * PSI / 8
    o = theory.offload("fsdp1", PSI, 8, what="optimizer+params")
    assert o["device"].total == 0 and o["host"].total == 18 * PSI / 8
    with pytest.raises(ValueError, match="shards params"):
        theory.offload("zero2", PSI, 8, what="optimizer+params")
    fp16 = theory.offload("zero2", PSI, 8, recipe="fp16")["host"]
    assert fp16.main_grad == 4 * PSI / 8 and fp16.grad == 0  # the fp32 main grad is the grad partition
    assert theory.compose("ddp", PSI, 8, tp=2, pp=4).total == 16 * PSI / 8
    assert not theory.fits("ddp", 7e9, 8)
    assert theory.fits("ddp", 7e9, 8, tp=2)  # 56 GB
    assert theory.fits("zero1", 7e9, 8)
    assert not theory.fits("zero1", 7e9, 8, gpu_bytes=80e9, reserve_bytes=50e9)
    assert theory.fits("zero1", 7e9, 1, offload="optimizer", gpu_bytes=28e9)  # 2Ψ + 2Ψ
    assert not theory.fits("zero1", 7e9, 1, offload="optimizer", gpu_bytes=28e9 - 1)


def test_offload_pcie_bytes_are_the_papers_4_psi_and_deepspeeds_6_psi():
    # Ren et al. 2021 (ZeRO-Offload), §3: fp16 gradients go down and fp16 parameters come up, a
    # volume of 4M for a model of M parameters on one GPU, the least an optimizer offload can move
    # while the forward and backward stay on the GPU
    paper = theory.offload_pcie_bytes("zero2", PSI, 1, down="bit16")
    assert paper == {"down": 2 * PSI, "up": 2 * PSI, "total": 4 * PSI}
    # DeepSpeed (stage_1_and_2.py) casts the gradient slice to fp32 on the device before the copy: 6Ψ/N
    assert theory.offload_pcie_bytes("zero2", PSI, 8)["total"] == 6 * PSI / 8
    assert theory.offload_pcie_bytes("zero2", PSI, 8, upload="fp32")["total"] == 8 * PSI / 8
    # each rank moves its own partition only: N GPUs move the paper's 4Ψ between them
    assert 8 * theory.offload_pcie_bytes("zero2", PSI, 8, down="bit16")["total"] == 4 * PSI
    with pytest.raises(ValueError, match="unknown down 'fp8'"):
        theory.offload_pcie_bytes("zero2", PSI, 8, down="fp8")


@pytest.mark.parametrize("call, match", [
    (lambda: theory.model_states("ddp", 0, 8), "psi"),
    (lambda: theory.model_states("ddp", -1.0, 8), "psi"),
    (lambda: theory.model_states("ddp", float("inf"), 8), "psi"),
    (lambda: theory.model_states("ddp", float("nan"), 8), "psi"),
    (lambda: theory.model_states("ddp", "7e9", 8), "psi"),
    (lambda: theory.model_states("ddp", True, 8), "psi"),
    (lambda: theory.model_states("ddp", PSI, 0), "n must be an integer >= 1"),
    (lambda: theory.model_states("ddp", PSI, 2.0), "n must"),
    (lambda: theory.model_states("hsdp", PSI, 8, m=0), "m must"),
    (lambda: theory.model_states("nope", PSI, 8), "choose one of ddp"),
    (lambda: theory.model_states("ddp", PSI, 8, recipe="bf17"), "choose one of mixed-bf16"),
    (lambda: theory.comm_per_rank("ddp", PSI, -1), "n must"),
    (lambda: theory.compose("ddp", PSI, 8, tp=0), "tp must"),
    (lambda: theory.offload("ddp", PSI, 8, what="disk"), "choose one of none"),
    (lambda: theory.offload("ddp", PSI, 8, what="optimizer"), "ZeRO stages 1-3 only"),
    (lambda: theory.fits("ddp_bucketed", PSI, 8, offload="optimizer"), "ZeRO stages 1-3 only"),
    (lambda: theory.offload("megatron_distopt", PSI, 8), "not modelled"),
    (lambda: theory.comm_per_rank("ddp", PSI, 8, reduce_dtype="fp8"), "reduce_dtype"),
    (lambda: theory.fits("ddp", PSI, 8, activation_bytes=-1), "activation_bytes"),
    (lambda: theory.fits("ddp", PSI, 8, recompute="some"), "recompute"),
    (lambda: theory.transformer_shape(PSI, hidden=4096, heads=3), "divisible"),
    (lambda: theory.transformer_shape(PSI, layers=0), "layers must be an integer >= 1"),
    (lambda: theory.transformer_shape(0), "psi"),
    (lambda: theory.exact_model_states("fsdp2", [[(4,)]], 2, rank=2), "rank"),
    (lambda: theory.exact_model_states("ddp", [[(4, -1)]], 2), "shape"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_names_and_aliases():
    assert theory.STRATEGY_NAMES == tuple(catalog.STRATEGIES)
    assert theory.model_states("zero3", PSI, 8) == theory.model_states("fsdp1", PSI, 8)


# ------------------------------------------------------------------ exact mode, by hand
def test_exact_flat_small_example():
    # 5 elements padded to 8 over N = 4: chunk 2
    ms = theory.exact_model_states("zero2", [[(3,), (2,)]], 4)
    assert (ms.param, ms.grad, ms.optim) == (8 * 2, 2 * 2, 2 * 12)
    c = theory.exact_comm("zero2", [[(3,), (2,)]], 4)
    assert c.by_collective() == {"reduce_scatter": 12, "all_gather": 12}


def test_exact_hybrid_small_example():
    # N = M = 2: 5 elements padded to 8, inner chunk 4, outer chunk 2
    ms = theory.exact_model_states("hfsdp", [[(5,)]], 2, m=2)
    assert (ms.param, ms.grad, ms.optim) == (8, 8, 24)
    c = theory.exact_comm("hfsdp", [[(5,)]], 2, m=2)
    assert c["dp_shard"] == {"all_gather": 16, "reduce_scatter": 8}
    assert c["dp_outer"] == {"reduce_scatter": 4, "all_gather": 4}


def test_exact_dim0_ranks_differ():
    # 10 rows over 4 ranks: chunks of 3 rows -> 3, 3, 3, 1; (2, 5) -> 1, 1, 0, 0 rows
    units = [[(10, 3)], [(2, 5)]]
    params = [theory.exact_model_states("fsdp2", units, 4, rank=r).param for r in range(4)]
    assert params == [(9 + 5) * 2, (9 + 5) * 2, 9 * 2, 3 * 2]
    c = theory.exact_comm("fsdp2", units, 4)
    wire = 12 * 3 + 4 * 5  # every chunk padded to full rows on the wire
    assert c.by_collective() == {"all_gather": Fraction(3, 4) * 2 * wire * 2,
                                 "reduce_scatter": Fraction(3, 4) * wire * 2}


def test_exact_replicated_ignores_units():
    one = theory.exact_model_states("ddp", [[(3, 5), (7,)]], 4)
    many = theory.exact_model_states("ddp", [[(3, 5)], [(7,)]], 4)
    assert one == many and one.total == 22 * 16
    assert theory.exact_comm("ddp", [[(3, 5)], [(7,)]], 4).total() == Fraction(3, 4) * 2 * 22 * 2


# ------------------------------------------------------------------ exact vs asymptotic
ALL = list(catalog.STRATEGIES)
shapes = st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple)
units_st = st.lists(st.lists(shapes, min_size=1, max_size=4), min_size=1, max_size=4)


def _numel(units):
    return sum(shard.numel(s) for u in units for s in u)


def _wire_numel(spec, units, n, m):
    """Elements the layout actually stores/moves: Σ padded buffers."""
    if spec.layout == "replicated":
        return _numel(units)
    if spec.layout == "flat":
        return sum(shard.padded_numel(sum(shard.numel(s) for s in u), n * m) for u in units)
    return sum(shard.dim0_padded_numel(s, n) for u in units for s in u)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("recipe", [None, "fp16", "fp32"])
def test_exact_equals_asymptotic_when_divisible(name, recipe):
    n, m = 4, 2
    units = [[(16, 8), (8,)], [(32, 4)], [(8, 8), (8, 2), (8,)]]  # every d0 and unit divisible by 8
    psi = _numel(units)
    for rank in range(n):
        assert theory.exact_model_states(name, units, n, m, rank, recipe) == \
            theory.model_states(name, psi, n, m, recipe)
    for raf in (True, False):
        ex = theory.exact_comm(name, units, n, m, recipe, raf)
        asym = theory.comm_per_rank(name, psi, n, m, recipe, raf)
        assert dict(ex) == dict(asym)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(ALL), units=units_st, n=st.integers(1, 9), m=st.integers(1, 3),
       recipe=st.sampled_from(list(recipes.RECIPES)))
def test_exact_padding_overhead_bounded(name, units, n, m, recipe):
    spec = catalog.get_spec(name)
    mm = m if spec.hybrid else 1
    psi = _numel(units)
    asym = theory.model_states(name, psi, n, m, recipe)
    per_param_bytes = asym.total / psi
    ranks = [theory.exact_model_states(name, units, n, m, r, recipe) for r in range(n)]
    if spec.layout == "dim0":
        # uneven chunks: some ranks hold more, some less, but together exactly the model
        for cat in ("param", "grad", "master", "main_grad", "m", "v"):
            assert sum(getattr(ms, cat) for ms in ranks) == n * getattr(asym, cat)
        assert ranks[0].total >= asym.total
    else:
        assert all(ms == ranks[0] for ms in ranks)
        ex = ranks[0]
        assert ex.total >= asym.total
        assert ex.total - asym.total < len(units) * n * mm * per_param_bytes
        # padded storage is the closed form applied to the padded element count
        assert ex == theory.model_states(name, _wire_numel(spec, units, n, mm), n, m, recipe)
    # communication: the closed form on the elements actually put on the wire
    ex_c = theory.exact_comm(name, units, n, m, recipe)
    wire = _wire_numel(spec, units, n, mm)
    assert dict(ex_c) == dict(theory.comm_per_rank(name, wire, n, m, recipe))
    assert ex_c.total() >= theory.comm_per_rank(name, psi, n, m, recipe).total()


# nccl-tests, doc/PERFORMANCE.md, "Summary": the factor from algorithm to bus bandwidth per collective
NCCL_TESTS_BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
                          "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                          "broadcast": lambda n: 1, "reduce": lambda n: 1}


@pytest.mark.fast
@pytest.mark.parametrize("collective", sorted(NCCL_TESTS_BUS_FACTORS))
@pytest.mark.parametrize("n", [2, 8, 64])
def test_bus_factor_is_the_one_nccl_tests_publishes(collective, n):
    assert theory.bus_factor(collective, n) == pytest.approx(NCCL_TESTS_BUS_FACTORS[collective](n), rel=1e-15)
    # 130 GB/s of algbw on an 8-GPU all-reduce is 227.5 GB/s of busbw
    assert theory.bus_bandwidth("all_reduce", 130e9, 1, 8) == pytest.approx(227.5e9)
    with pytest.raises(ValueError, match="unknown collective"):
        theory.bus_factor("gather", n)

