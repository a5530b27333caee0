"""Expert parallelism on the spine (`zeroedu run --experts E --top-k K --ep P`, `strategies.splits
.ExpertSplit`): a mixture-of-experts GPT trained by the data-parallel strategies with its experts
placed over ep ranks equals single-process training of the same model, and every rank's model
states and bytes equal closed forms computed here by hand: the experts' units reduced and sharded
over dp only, everything else over dp x ep, the all-to-alls' rows from the routers' own counts
(checked against each other across the ranks); the activations the ledger counts equal
`theory.experts.moe_layer_activation_bytes` from the same counts (the report's match)."""
import pytest
import torch

from zeroedu.models import get_model
from zeroedu.models.moe import MoEGPTConfig
from zeroedu.theory import exact_model_states
from zeroedu.train import RunConfig
from zeroedu.train.launch import run
from zeroedu.train.reference import parameter_error

PARAM_TOL = 1e-4  # per tensor, relative (`train.experts.PARAM_TOL`: Adam turns round-off near zero gradients into ~lr steps)


def _run(strategy, world, ep, recipe="fp32", micro_batches=1, top_k=2, experts=4, steps=3, batch=8):
    return run(RunConfig(strategy, world_size=world, steps=steps, model="gpt-tiny", recipe=recipe, experts=experts,
                         top_k=top_k, ep=ep, global_batch=batch, micro_batches=micro_batches, return_params=True))


def _units_by_hand(model: MoEGPTConfig, held: range):
    """[embed], per block (LayerNorms, attention, router) and (its experts `held`), [head]: shapes."""
    m = model.build()
    shared, experts = [[tuple(p.shape) for p in m.embed.parameters()]], []
    for b in m.blocks:
        shared.append([tuple(p.shape) for mod in (b.ln1, b.attn, b.ln2, b.mlp.router) for p in mod.parameters()])
        experts.append([tuple(p.shape) for e in held for p in b.mlp.experts[str(e)].parameters()])
    shared.append([tuple(p.shape) for p in m.head.parameters()])
    return shared, experts


def _padded(numel, n):
    return -(-numel // n) * n


def _check_run(r, strategy, dp, ep, elem=4):
    model = MoEGPTConfig.of(get_model("gpt-tiny"), 4, 2)
    per = model.experts // ep
    D = model.d_model
    assert r.ep == ep and r.n == dp * ep and r.model == model.name
    by_rank = {rk.rank: rk for rk in r.ranks}
    for rk in r.ranks:
        d, e = divmod(rk.rank, ep)  # mesh (dp_shard, ep), ep innermost
        shared, experts = _units_by_hand(model, range(e * per, (e + 1) * per))
        want = exact_model_states(strategy, shared, dp * ep, rank=rk.rank, recipe=r.recipe) \
            + exact_model_states(strategy, experts, dp, rank=d, recipe=r.recipe)
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        assert rk.routing.held == list(range(e * per, (e + 1) * per))
        # each unit's gradient reduce-scattered and its parameters all-gathered, ring shares, padded
        ring = lambda units, n: sum((n - 1) * _padded(sum(torch.Size(s).numel() for s in u), n) // n  # noqa: E731
                                    for u in units) * elem
        if strategy == "zero2":
            grads = r.micro_batches * (ring(shared, dp * ep) + ring(experts, dp))
            assert rk.measured.comm_by_axis["dp_shard"] == {"reduce_scatter": grads,
                                                           "all_gather": ring(shared, dp * ep) + ring(experts, dp)}
        # the all-to-alls: rows to the other ranks' experts and back, forward and backward, D-wide,
        # and the counts (ep - 1) x E/ep int64 per layer and micro-batch
        g = rk.routing
        off_sent = sum(sum(n for x, n in enumerate(micro) if x // per != e) for layer in g.sent for micro in layer)
        off_received = sum(sum(n for s, n in enumerate(micro) if s != e) for layer in g.received for micro in layer)
        counts = model.n_layers * r.micro_batches * (ep - 1) * per * 8
        assert rk.measured.comm_by_axis["ep"] == {"all_to_all": 2 * (off_sent + off_received) * D * elem + counts}
        # what this rank received from an ep peer is what that peer's router sent to its experts
        for s in range(ep):
            peer = by_rank[d * ep + s].routing
            for i in range(model.n_layers):
                for k in range(r.micro_batches):
                    assert g.received[i][k][s] == sum(peer.sent[i][k][e * per:(e + 1) * per])


def test_zero2_over_dp2_x_ep2_top2_equals_one_process_and_closed_forms():
    """The issue's composed run: ZeRO-2 over dp 2 x ep 2 (N = 4), top-2 of 4 experts."""
    r = _run("zero2", 4, 2)
    assert all(v is True for v in vars(r.match).values()), r.match  # activations from the routers' counts too
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(r.losses, r.reference_losses)), (r.losses, r.reference_losses)
    names = [n for n, _ in MoEGPTConfig.of(get_model("gpt-tiny"), 4, 2).build().named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL
    assert r.replica_max_diff == 0.0  # the two dp replicas of the experts ended identical
    _check_run(r, "zero2", 2, 2)


def test_ep_alone_with_ddp_and_micro_batches_and_zero1_in_mixed_precision():
    r = _run("ddp", 4, 4, micro_batches=2, recipe="mixed-bf16")
    assert all(v is True for v in vars(r.match).values()), r.match
    _check_run(r, "ddp", 1, 4, elem=2)  # the rows travel in bf16
    r = _run("zero1", 4, 2, recipe="mixed-bf16")
    assert all(v is True for v in vars(r.match).values()), r.match
    _check_run(r, "zero1", 2, 2, elem=2)  # the rows travel in bf16


@pytest.mark.fast
@pytest.mark.parametrize("kw, msg", [
    (dict(strategy="fsdp2", ep=2, experts=4), "ep runs with ddp, zero1, zero1_allreduce, zero2"),
    (dict(ep=2), "has none"),
    (dict(ep=2, experts=3), "3 experts do not split"),
    (dict(ep=2, experts=4, cp=2, attention="eager"), "not composed yet"),
    (dict(ep=2, experts=4, tp=2, sequence_parallel=True), "sequence parallelism"),
    (dict(experts=4, recompute="full"), "recompute"),
    (dict(ep=2, experts=4, clip_grad_norm=1.0), "gradient norm"),
    (dict(experts=4, top_k=5), "top-k must be 1..experts"),
    (dict(model="mlp", experts=4), "not a dense gpt"),
])
def test_ep_configurations_refused_in_the_parent(kw, msg):
    args = {"strategy": "zero2", "world_size": 4, "model": "gpt-tiny", **kw}
    with pytest.raises(ValueError, match=msg):
        RunConfig(**args).resolved()


@pytest.mark.fast
def test_the_ep_flags_reach_the_configuration():
    from zeroedu.cli import build_parser
    from zeroedu.cli.run import config_from_args

    args = build_parser().parse_args(["run", "--strategy", "zero2", "--world-size", "4", "--ep", "2", "--experts", "4",
                                      "--top-k", "2", "--model", "gpt-tiny", "--global-batch", "8"])
    cfg = config_from_args(args, 4)
    assert (cfg.ep, cfg.model.experts, cfg.model.top_k, cfg.dp, cfg.n, cfg.micro_batch_size) == (2, 4, 2, 4, 4, 2)
    assert [cfg.mesh.data_rank(k) for k in range(4)] == [0, 1, 2, 3]  # every ep rank its own share
    assert cfg.mesh.replica_groups() == [(0, 1), (2, 3)]  # an ep pair holds one replica's experts


def test_a_mixture_of_experts_trains_with_a_sharding_strategy_without_ep():
    """ep = 1: the MoE GPT is a model like any other (FSDP2 gathers its blocks, experts and all)."""
    r = _run("fsdp2", 2, 1, steps=2, batch=4)
    assert (r.match.model_states, r.match.comm, r.match.losses) == (True, True, True), r.match
    assert all(rk.routing is None for rk in r.ranks)


def test_zeroedu_run_ep_prints_the_axes_and_the_routing():
    from tests.cli_inprocess import zeroedu

    res = zeroedu("run", "--strategy", "zero2", "--world-size", "4", "--ep", "2", "--experts", "4", "--top-k", "2",
                  "--model", "gpt-tiny", "--recipe", "fp32", "--global-batch", "8", "--steps", "2", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "(N = 4: dp 2 x ep 2; the experts over dp 2)" in res.stdout, res.stdout
    assert "ring model: ep all_to_all" in res.stdout and "rows received" in res.stdout
    assert res.stdout.rstrip().endswith("match: True"), res.stdout


def test_ep_beside_tp_equals_one_process_and_closed_forms():
    """ZeRO-2 over ep 2 x tp 2 (N = 4): every block's attention split over tp, its mixture of
    experts whole on both tp ranks and its experts over ep. Model states by hand (the attention's tp
    slices; the rest of a block, the router and the embedding and head over ep, the experts on their
    owner), the tp axis two all-reduces of b·S·D per block (the experts add none), and the whole
    report's activations and bytes == predicted."""
    r = run(RunConfig("zero2", world_size=4, steps=3, model="gpt-tiny", recipe="fp32", experts=4, top_k=2, ep=2,
                      tp=2, global_batch=8, return_params=True))
    assert all(v is True for v in vars(r.match).values()), r.match
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(r.losses, r.reference_losses))
    model = MoEGPTConfig.of(get_model("gpt-tiny"), 4, 2)
    names = [n for n, _ in model.build().named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL
    h, t, S = model.d_model, 2, model.seq_len
    for rk in r.ranks:
        e = rk.rank // t  # mesh (dp_shard 1, ep 2, tp 2), tp innermost
        shared, experts = _units_by_hand(model, range(2 * e, 2 * e + 2))
        for u in shared[1:-1]:  # qkv and proj as one tp rank holds them
            u[2:6] = [(3 * h // t, h), (3 * h // t,), (h, h // t), (h,)]
        want = exact_model_states("zero2", shared, 2, rank=e, recipe="fp32") \
            + exact_model_states("zero2", experts, 1, rank=0, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        act = 4 * S * h * 4  # 4 sequences a rank, fp32
        assert rk.measured.comm_by_axis["tp"] == {"all_reduce": model.n_layers * 2 * act * 2 * (t - 1) // t}
