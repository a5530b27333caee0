"""Context parallelism (`strategies.context_parallel`, `zeroedu run --cp`): the split and the work
against hand counts, ring attention in one process against softmax attention, and GPT training
over cp = 2 and 4 ranks (plain and zig-zag) equal to one process, with the bytes each rank sends,
the activations it saves and the score elements it computes equal to their closed forms; and
cp = 2 beside dp = 2 on four ranks."""
import pytest
import torch

from zeroedu.models import GPTConfig, get_model
from zeroedu.runtime.comm import Axis
from zeroedu.strategies import context_parallel as CP
from zeroedu.theory.activations import gpt_activation_bytes
from zeroedu.train.reference import parameter_error

MODEL = get_model("gpt-tiny")  # 2 layers, 2 heads, S = 32, D = 32
STEPS, BATCH = 3, 4
PARAM_TOL = 1e-4  # per tensor, relative: Adam turns round-off on near-zero gradients into ~lr steps


@pytest.mark.fast
def test_the_split_is_the_one_written_out_by_hand():
    assert CP.chunks(8, 2, 0) == [range(0, 4)] and CP.chunks(8, 2, 1) == [range(4, 8)]
    # zig-zag, cp = 2: 4 chunks of 2; rank 0 holds the first and the last
    assert CP.positions(8, 2, 0, zigzag=True).tolist() == [0, 1, 6, 7]
    assert CP.positions(8, 2, 1, zigzag=True).tolist() == [2, 3, 4, 5]
    for cp in (1, 2, 4):
        for zz in (False, True):
            every = sorted(p for r in range(cp) for p in CP.positions(32, cp, r, zz).tolist())
            assert every == list(range(32))
    with pytest.raises(ValueError, match="not divisible by 8"):
        CP.chunks(36, 4, 0, zigzag=True)


@pytest.mark.fast
def test_work_and_bytes_against_hand_counts():
    B, H, S = 4, 2, 32
    for cp in (2, 4):
        n = S // cp
        # plain: rank r computes r + 1 blocks of n x n (the diagonal one whole, masked)
        assert [CP.work_elements(B, H, S, cp, r) for r in range(cp)] == [B * H * n * n * (r + 1) for r in range(cp)]
        # zig-zag: 2cp + 1 pairs of c x c on every rank, c = S / 2cp
        c = S // (2 * cp)
        assert {CP.work_elements(B, H, S, cp, r, zigzag=True) for r in range(cp)} == {B * H * c * c * (2 * cp + 1)}
    # one K block at B = 4, H = 2, S/cp = 16, D_h = 16, fp32: 8192 bytes
    assert CP.theory_bytes(4, 2, 32, 16, 2) == {"forward": 2 * 8192, "backward": 2 * 8192 + 4 * 8192}
    assert CP.theory_bytes(4, 2, 32, 16, 1) == {"forward": 0, "backward": 0}


@pytest.mark.fast
def test_one_rank_ring_attention_is_softmax_attention_forward_and_backward():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ring = CP.RingContext(comm=None, axis=Axis("cp", None, 1, 0), seq_len=16, zigzag=False)
    out = CP.ring_attention(q, k, v, ring)
    want = CP.reference_attention(q, k, v)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cp,zigzag,dp", [(2, False, 1), (4, False, 1), (4, True, 1), (2, True, 2)])
def test_context_parallel_gpt_equals_one_process_its_closed_forms_and_hand_counts(cp, zigzag, dp):
    """`zeroedu run --cp`: the losses and parameters are one process's; each rank's ring bytes by
    hand, its activations FlashAttention's saved set over S/cp tokens, the score elements its ring
    computed (counted from the tensors multiplied) `work_elements`'s, and each hop's K/V sends,
    from the timeline, issued before the block computed meanwhile starts and waited for after it
    ends (cp - 1 hops per layer)."""
    r = _cp_run("ddp", world=cp * dp, cp=cp, zigzag=zigzag)
    assert all(v is True for v in vars(r.match).values()), r.match
    names = [n for n, _ in MODEL.build().named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL
    L, H, b = MODEL.n_layers, MODEL.n_heads, BATCH // dp
    psi_bytes = 4 * sum(p.numel() for p in MODEL.build().parameters())
    for rk in r.ranks:
        assert rk.measured.comm_by_axis["cp"] == {"send": _ring_bytes_by_hand(b, cp)}
        n = cp * dp  # the gradients' all-reduce over dp x cp, each parameter on its own
        assert rk.measured.comm_by_axis["dp_shard"]["all_reduce"] == pytest.approx(psi_bytes * 2 * (n - 1) / n)
        assert rk.measured.activations == gpt_activation_bytes(MODEL, b, MODEL.seq_len // cp, 4, attention="fused")
        c = rk.rank % cp
        assert rk.ring.positions == [[x.start, x.stop] for x in CP.chunks(MODEL.seq_len, cp, c, zigzag)]
        assert rk.ring.score_elements == STEPS * L * CP.work_elements(b, H, MODEL.seq_len, cp, c, zigzag)
        assert len(rk.ring.hops) == L * (cp - 1)
        assert all(sent <= c0 < c1 <= waited for sent, waited, c0, c1 in rk.ring.hops), rk.ring.hops


def test_the_command_line_prints_every_rank_beside_its_closed_forms():
    from .cli_inprocess import zeroedu  # on the session's warm pools

    r = zeroedu("context", "--cp", "4", "--zigzag", "--global-batch", "4", "--steps", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.split("ring attention's work")[1].splitlines()[3:7]]
    assert [row[1] for row in rows] == ["0-3,28-31", "4-7,24-27", "8-11,20-23", "12-15,16-19"], r.stdout
    assert all(row[-1] == "yes" for row in rows) and len({row[2] for row in rows}) == 1  # zig-zag: equal work
    assert r.stdout.rstrip().endswith("match: True")
    bad = zeroedu("context", "--cp", "3", "--world-size", "3", "--zigzag")
    assert bad.returncode == 2 and "not divisible by 6" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ cp on the spine (`zeroedu run --cp`)
def _cp_run(strategy="ddp", world=2, cp=2, zigzag=False, recipe="fp32", **kw):
    from tests.shared_runs import RUNS
    from zeroedu.train import RunConfig

    return RUNS(RunConfig(strategy, world, steps=3, recipe=recipe, model="gpt-tiny", attention="eager",
                          global_batch=4, cp=cp, zigzag=zigzag, **kw))


def _ring_bytes_by_hand(batch, cp, elem=4):
    """One rank's sends on the cp axis per step for gpt-tiny (2 layers, 2 heads, S = 32, D = 32):
    per layer, K and V forward and again backward in the compute dtype (cp - 1 hops each), dK and
    dV summed in fp32 (cp hops, the last one home)."""
    from zeroedu.models import get_model

    c = get_model("gpt-tiny")
    block = batch * c.n_heads * (c.seq_len // cp) * (c.d_model // c.n_heads)
    return c.n_layers * (2 * 2 * (cp - 1) * block * elem + 2 * cp * block * 4)


def test_run_with_cp_equals_one_process_and_its_closed_forms():
    """`zeroedu run --strategy ddp --world-size 2 --cp 2`: both ranks train the same 4 sequences,
    each its half of every sequence's positions. Losses and parameters are single-process
    training's; every rank's model states, activations (S/cp positions) and bytes per axis equal
    the closed forms, the ring's by hand."""
    from zeroedu.train.reference import parameter_error

    r = _cp_run()
    assert (r.cp, r.zigzag, r.n, r.world_size) == (2, False, 2, 2)
    assert all(v for v in vars(r.match).values()), r.match
    for a, b in zip(r.losses, r.reference_losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    names = [n for n, _ in get_model("gpt-tiny").build().named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL
    for rk in r.ranks:
        assert rk.measured.comm_by_axis == rk.predicted.comm_by_axis
        assert rk.measured.comm_by_axis["cp"] == {"send": _ring_bytes_by_hand(4, 2)}
        assert rk.measured.activations == rk.predicted.activations


def test_fsdp2_over_dp_x_cp_shards_over_all_four_ranks():
    """FSDP2 over dp 2 x cp 2 (zig-zag): the parameters are sharded over all four ranks (torchtitan's
    dp_shard_cp), so each rank's model states are `theory.exact_model_states('fsdp2', N = 4)`'s,
    computed here from the model's shapes; the result is single-process training's."""
    from zeroedu.models import unit_shapes
    from zeroedu.theory import exact_model_states

    r = _cp_run("fsdp2", world=4, zigzag=True)
    assert (r.n, r.cp, r.zigzag) == (4, 2, True) and all(v for v in vars(r.match).values()), r.match
    shapes = unit_shapes(get_model("gpt-tiny").build())
    for rk in r.ranks:
        want = exact_model_states("fsdp2", shapes, 4, rank=rk.rank, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        assert rk.measured.comm_by_axis["cp"] == {"send": _ring_bytes_by_hand(2, 2)}  # dp 2: 2 sequences each
    assert sum(rk.measured.param for rk in r.ranks) >= 4 * r.psi  # Ψ fp32 bytes, padded, over four ranks


def test_cp_composes_with_zero2_in_mixed_precision_and_micro_batches():
    """ZeRO-2 over dp 2 x cp 2, mixed-bf16, two micro-batches: K and V travel in bf16, their
    gradients in fp32; every figure == its closed form and the losses within the recipe's bound."""
    r = _cp_run("zero2", world=4, recipe="mixed-bf16", micro_batches=2)
    assert all(v for v in vars(r.match).values()), r.match
    for rk in r.ranks:  # per micro-batch of 1 sequence, twice
        assert rk.measured.comm_by_axis["cp"] == {"send": 2 * _ring_bytes_by_hand(1, 2, elem=2)}


@pytest.mark.fast
@pytest.mark.parametrize("kw, msg", [
    (dict(world_size=3, cp=2), "cp = 2 must divide the world size 3"),
    (dict(model="mlp", cp=2), "not a gpt-\\* model"),
    (dict(cp=2, attention="fused"), "eager"),
    (dict(cp=2, tp=2, sequence_parallel=True, attention="eager"), "split the positions a second time"),
    (dict(cp=2, recompute="full", attention="eager"), "recompute"),
    (dict(strategy="hsdp", m=2, world_size=8, cp=2, pp=2, attention="eager", clip_grad_norm=1.0), "count the stages twice"),
    (dict(zigzag=True), "give cp >= 2"),
    (dict(cp=0), "cp must be an integer >= 1"),
    (dict(world_size=3, cp=3, attention="eager"), "not divisible by 3"),
    (dict(cp=2, attention="eager", ring_class="zeroedu.strategies.zero1:ZeRO1"), "not a subclass of RingContext"),
    (dict(ring_class="zeroedu.notebook.bugs.nb14:MysteryRing"), "give cp >= 2"),
])
def test_cp_configurations_refused_in_the_parent(kw, msg):
    from zeroedu.train import RunConfig

    args = {"strategy": "fsdp2", "world_size": 4, "model": "gpt-tiny", **kw}
    with pytest.raises(ValueError, match=msg):
        RunConfig(**args).resolved()


@pytest.mark.fast
def test_the_cp_flags_reach_the_configuration():
    from zeroedu.cli import build_parser
    from zeroedu.cli.run import config_from_args

    args = build_parser().parse_args(["run", "--strategy", "fsdp2", "--world-size", "4", "--cp", "2", "--zigzag",
                                      "--model", "gpt-tiny", "--attention", "eager", "--global-batch", "4"])
    cfg = config_from_args(args, 4)
    assert (cfg.cp, cfg.zigzag, cfg.dp, cfg.n, cfg.micro_batch_size) == (2, True, 2, 4, 2)
    assert [cfg.shard_rank(k) for k in range(4)] == [0, 1, 2, 3]
    assert [cfg.mesh.data_rank(k) for k in range(4)] == [0, 0, 1, 1]  # the cp pair shares its sequences


def test_zeroedu_run_cp_prints_the_axes_and_matches():
    from tests.cli_inprocess import zeroedu

    res = zeroedu("run", "--strategy", "zero1", "--world-size", "2", "--cp", "2", "--zigzag", "--model", "gpt-tiny",
                  "--attention", "eager", "--recipe", "fp32", "--global-batch", "2", "--steps", "2", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "(N = 2: dp 1 x cp 2, zig-zag)" in res.stdout, res.stdout
    assert "ring model: cp send" in res.stdout and "ring model: dp_shard reduce_scatter" in res.stdout
    assert res.stdout.rstrip().endswith("match: True"), res.stdout


def test_cp_beside_tp_equals_one_process_on_a_2d_and_a_3d_mesh():
    """cp outside tp (Megatron's order): FSDP2 over cp 2 x tp 2 (its group: the two ranks of one tp
    coordinate, flattened dp_shard x cp), and DDP over dp 2 x cp 2 x tp 2 on eight ranks. Each tp
    rank passes its H/tp heads' K and V around its cp ring; tp's all-reduces move S/cp positions;
    every figure == its closed form, the ring's by hand, and the tp slices of the first cp rank put
    back together are single-process training's parameters."""
    from zeroedu.train.reference import parameter_error

    names = [n for n, _ in get_model("gpt-tiny").build().named_parameters()]
    for strategy, world, batch in (("fsdp2", 4, 4), ("ddp", 8, 2)):
        r = _cp_run(strategy, world=world, tp=2)
        assert (r.cp, r.tp, r.n) == (2, 2, world // 2) and all(v for v in vars(r.match).values()), (strategy, r.match)
        for rk in r.ranks:
            assert rk.measured.comm_by_axis == rk.predicted.comm_by_axis
            assert rk.measured.comm_by_axis["cp"] == {"send": _ring_bytes_by_hand(batch, 2) // 2}  # H/tp heads
        assert r.replica_max_diff == 0.0
        assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL


@pytest.mark.fast
def test_tp_activations_with_a_core_that_keeps_no_scores_at_t_1_are_the_fused_models():
    """At t = 1 the tp closed form with attention="fused" is the unsplit GPT's fused form
    (`theory.activations`), independent of how it was derived."""
    from zeroedu.theory import tensor_parallel as tp_theory

    c = get_model("gpt-tiny")
    for b, s in ((1, 32), (4, 16)):
        assert tp_theory.gpt_activation_bytes(c, b, s, 4, 1, attention="fused") == \
            gpt_activation_bytes(c, b, s, 4, attention="fused")


def test_cp_inside_a_hybrid_shards_over_dp_shard_x_cp_in_each_domain():
    """HFSDP on eight ranks, dp_outer 2 x dp_shard 2 x cp 2 (zig-zag): inside each domain the
    strategy's inner group is the four ranks of dp_shard x cp, across domains the outer group
    pairs the ranks at the same place; every figure == its closed form at N = 4, M = 2, and the
    replicas end identical to one process."""
    from zeroedu.models import unit_shapes
    from zeroedu.theory import exact_model_states

    r = _cp_run("hfsdp", world=8, zigzag=True, m=2)
    assert (r.n, r.m, r.cp) == (4, 2, 2) and all(v for v in vars(r.match).values()), r.match
    shapes = unit_shapes(get_model("gpt-tiny").build())
    for rk in r.ranks:
        want = exact_model_states("hfsdp", shapes, 4, 2, rank=rk.rank % 4, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        assert rk.measured.comm_by_axis["cp"] == {"send": _ring_bytes_by_hand(1, 2)}  # 4 sequences over dp 4
    assert r.replica_max_diff == 0.0


@pytest.mark.parametrize("strategy", ["zero2", "fsdp2"])
def test_cp_clips_the_global_gradient_norm_as_one_process(strategy):
    """The replicas' gradients are averaged over dp x cp, and the strategy's shards are disjoint over
    that group, so its norm (one all-reduce of a square sum) is the whole model's: clipped at 0.05
    the losses are torch's clip_grad_norm_ in one process (within 1e-5; Adam divides most of a
    uniform scale away, yet the unclipped run's leave them by more than that), and the norm's 4
    bytes are in the closed form."""
    r = _cp_run(strategy, world=4, clip_grad_norm=0.05)
    assert all(v is True for v in vars(r.match).values()), r.match
    plain = _cp_run(strategy, world=4)
    assert all(abs(a - b) <= 1e-5 * b for a, b in zip(r.losses, r.reference_losses))
    assert max(abs(a - b) / b for a, b in zip(r.losses, plain.losses)) > 1e-5  # clipping changed the run
    for rk in r.ranks:
        assert rk.measured.comm_by_axis["dp_shard"]["all_reduce"] == 2 * 3 * 4 // 4  # one fp32 square sum
