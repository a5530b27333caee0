"""Tensor and sequence parallelism from scratch (`zeroedu.strategies.tensor_parallel`), held against
the unsplit block in one process and, for the MLP, against torch's own `parallelize_module`
(ColwiseParallel / RowwiseParallel, and Shard(1) inputs and outputs with sequence parallelism) on
the same CPU mesh over gloo. Bytes: the ring model against a count by hand, and the kernel's count
of the sockets against it plus gloo's framing."""
from __future__ import annotations

import pytest
import torch

from zeroedu.models.gpt import Block, GPTConfig
from zeroedu.references.torch_tp import tp_block_job
from zeroedu.runtime import cluster
from zeroedu.runtime.comm import Axis, Comm
from zeroedu.runtime.ledger import Ledger
from zeroedu.runtime.wire import FRAMING_PER_MESSAGE
from zeroedu.strategies.tensor_parallel import TPBlock, _Ctx
from zeroedu.theory.tensor_parallel import block_bytes as block_tp_bytes

TOL = 1e-5  # fp32: the split sums differ from one process's by round-off only
BATCH, SEQ, D = 2, 8, 32  # tp_block_job's defaults


@pytest.mark.fast
def test_block_bytes_by_hand():
    # t = 2, b·s·h = 2·8·32 fp32 = 2048 B: 4 all-reduces of 2·(1/2)·2048 = 8192 B; with SP 8 × (1/2)·2048
    assert block_tp_bytes(2, 8, 32, 2, 4) == 8192
    # with SP the same 8192, the qkv and fc inputs gathered again in backward, 2 × (1/2)·2048, and the
    # all-reduce of six replicated 32-vectors: 2·(1/2)·6·32·4 = 768
    assert block_tp_bytes(2, 8, 32, 2, 4, sp=True) == 8192 + 2048 + 768
    # t = 4: 4 × 2·(3/4)·2048 = 12288
    assert block_tp_bytes(2, 8, 32, 4, 4) == 12288
    assert block_tp_bytes(2, 8, 32, 4, 4, sp=True) == 12288 + 2 * 3 * 2048 / 4 + 2 * 3 * 6 * 32 * 4 / 4
    assert block_tp_bytes(1, 128, 256, 1, 2) == 0  # t = 1: nothing to send


@pytest.mark.fast
def test_heads_that_do_not_split_are_refused():
    block = Block(GPTConfig(vocab=97, seq_len=8, d_model=24, n_layers=1, n_heads=3))
    axis = Axis("tp", None, 2, 0, (0, 1))
    with pytest.raises(ValueError, match="3 heads are not divisible by t = 2"):
        TPBlock(block, axis, Comm(Ledger(0)))


@pytest.mark.fast
def test_a_sequence_that_does_not_split_is_refused():
    c = _Ctx(Axis("tp", None, 3, 0, (0, 1, 2)), Comm(Ledger(0)), "block")
    with pytest.raises(ValueError, match="sequence parallelism needs the sequence"):
        c.scatter_seq(torch.zeros(1, 8, 4), "g")


@pytest.mark.parametrize("t,sp", [(2, False), (2, True), (4, True)])
def test_tp_block_equals_one_process_and_torch(t, sp):
    ranks = cluster.run(tp_block_job, t, {"sp": sp})
    for r in ranks:
        assert max(r["vs_single"].values()) <= TOL, r["vs_single"]
        assert set(r["vs_single"]) >= {"output", "input_grad", "attn.qkv.weight", "mlp.fc2.weight", "ln1.weight"}
        assert max(r["vs_torch"].values()) <= TOL, r["vs_torch"]
        # by hand: 4 all-reduces (f and g in attention and MLP, forward and backward) of the
        # b·s·h fp32 activations, 2(t-1)/t of them each; with SP the same bytes in 8 halves, the
        # qkv and fc inputs all-gathered again in backward ((t-1)/t each), and the gradients of
        # the 6 replicated D-vectors (LayerNorms, row-parallel biases) all-reduced
        sp_extra = 2 * (t - 1) * BATCH * SEQ * D * 4 / t + 2 * (t - 1) * 6 * D * 4 / t if sp else 0
        assert r["sent"] == 4 * 2 * (t - 1) * BATCH * SEQ * D * 4 / t + sp_extra
        assert r["collectives"] == (["all_gather", "all_reduce", "reduce_scatter"] if sp else ["all_reduce"])
        if r["wire"] is not None:  # the kernel's count: the payload plus gloo's framing, exactly
            assert r["wire"] == r["sent"] + FRAMING_PER_MESSAGE * r["messages"]


@pytest.mark.parametrize("sp", [False, True])
def test_tp_gpt_trains_as_one_process(sp):
    """gpt-tiny with both blocks tensor-parallel over 2 ranks, 3 steps, against the unsplit model in
    one process. SGD first: its update is proportional to the gradient, so a gradient counted twice
    (a reduce-scatter where every rank already holds the whole gradient) shows in the parameters;
    Adam divides that factor out, which is why it cannot be the only check."""
    from zeroedu.references.torch_tp import tp_train_job

    for optimizer, lr in (("sgd", 0.1), ("adam", 1e-2)):
        for r in cluster.run(tp_train_job, 2, {"sp": sp, "optimizer": optimizer, "lr": lr}):
            for a, b in zip(r["losses"], r["losses_ref"]):
                assert abs(a - b) <= TOL * abs(b), (optimizer, r["losses"], r["losses_ref"])
            if optimizer == "sgd":
                assert max(r["params"].values()) <= TOL, r["params"]


@pytest.mark.parametrize("sp", [False, True])
def test_fsdp2_over_a_tensor_parallel_model_on_a_2d_mesh(sp):
    """FSDP2 on dp = 2 over blocks tensor-parallel on tp = 2 (4 ranks, tp inner), as torchtitan
    composes fully_shard with TP: the mean of the dp ranks' losses is the one-process loss, and every
    parameter gathered over dp is this tp rank's slice of the one-process model, after 3 Adam steps."""
    from zeroedu.references.torch_tp import fsdp2_tp_job

    ranks = cluster.run(fsdp2_tp_job, 4, {"tp": 2, "sp": sp})
    assert sorted((r["dp_rank"], r["tp_rank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    ref = ranks[0]["losses_ref"]
    for k, want in enumerate(ref):
        got = sum(r["losses"][k] for r in ranks if r["tp_rank"] == 0) / 2
        assert abs(got - want) <= TOL * abs(want)
    for r in ranks:
        assert max(r["params"].values()) <= TOL, r["params"]
        # memory and bytes per axis, measured (the ledger's tensors, its collectives' payloads) ==
        # the closed forms over each rank's TP-local shapes (theory.tensor_parallel)
        assert r["states_ledger"] == r["states_theory"]
        assert r["axes_ledger"] == r["axes_theory"]
        assert r["activations_ledger"] == r["activations_theory"]
        if r["wire_by_axis"] is not None:  # the kernel's count of each axis's sockets: payload + framing
            ring = {"dp_shard": sum(r["axes_ledger"]["dp_shard"].values()), "tp": r["axes_ledger"]["tp"]}
            assert r["wire_by_axis"] == {ax: ring[ax] + FRAMING_PER_MESSAGE * r["messages_by_axis"][ax]
                                         for ax in ("dp_shard", "tp")}
    # TP halves what each rank holds of the split matrices: fewer model-state bytes than tp = 1
    # (247,328 on rank 0 of dp = 2 alone, 147,232 here) and fewer activations (332,036 -> 217,348,
    # 183,556 with SP, which also splits the LayerNorms' inputs and the saved qkv and fc inputs
    # along the sequence)
    assert ranks[0]["states_ledger"] == 147_232
    assert ranks[0]["activations_ledger"] == (183_556 if sp else 217_348)


def test_tp_1_is_plain_fsdp2_to_the_bit():
    from zeroedu.references.torch_tp import fsdp2_tp_job

    for r in cluster.run(fsdp2_tp_job, 2, {"tp": 1}):
        assert r["losses"] == r["plain_losses"]
        assert r["same_as_plain"]
        assert r["axes_ledger"]["tp"] == 0 and r["axes_ledger"] == r["axes_theory"]
        assert r["activations_ledger"] == r["activations_theory"] == 332_036


@pytest.mark.fast
def test_activation_closed_form_at_t_1_is_the_unsplit_models():
    from zeroedu.models.gpt import PRESETS
    from zeroedu.theory.activations import gpt_activation_bytes
    from zeroedu.theory.tensor_parallel import gpt_activation_bytes as tp_bytes

    for preset in ("gpt-tiny", "gpt-small"):
        cfg = PRESETS[preset]
        assert tp_bytes(cfg, 2, cfg.seq_len, 2, 1) == gpt_activation_bytes(cfg, 2, cfg.seq_len, 2)


# ---------------------------------------------------------------------------- `zeroedu run --tp`
def _tp_run(strategy="fsdp2", sp=False, recipe="fp32", steps=3, global_batch=None):
    from zeroedu.optim import AdamConfig
    from zeroedu.train import RunConfig, run

    # eps = 1e-3: Adam's update then follows the gradient's size (a gradient counted twice shows)
    # and the attention key bias, whose gradient is exactly zero, does not turn round-off into
    # lr-sized steps (see `fsdp2_tp_job`)
    return run(RunConfig(strategy, 4, steps=steps, recipe=recipe, model="gpt-tiny", tp=2, sequence_parallel=sp,
                         global_batch=global_batch, adam=AdamConfig(lr=1e-2, eps=1e-3), return_params=True))


@pytest.mark.parametrize("sp", [False, True])
def test_run_with_tp_equals_one_process_and_its_closed_forms(sp):
    """`run(RunConfig(..., tp=2))`, what `zeroedu run --tp 2` runs: FSDP2 over dp = 2 on gpt-tiny's
    blocks split over tp = 2. Every rank's model states, activations and ring-model bytes per axis
    equal the closed forms over its tp-local shapes; the kernel's count per axis is the ring model
    plus gloo's framing exactly; the tp ranks' slices put back together are single-process
    training's parameters, and the dp replicas agree."""
    from zeroedu.theory import tensor_parallel as tp_theory

    r = _tp_run(sp=sp)
    assert (r.tp, r.sequence_parallel, r.n) == (2, sp, 2)
    assert all(v for v in vars(r.match).values()), r.match
    for a, b in zip(r.losses, r.reference_losses):
        assert abs(a - b) <= TOL * abs(b)
    for p, q in zip(r.params, r.reference_params, strict=True):
        assert p.shape == q.shape and float((p - q).abs().max()) <= TOL * float(q.abs().max())
    assert r.replica_max_diff == 0.0
    for rk in r.ranks:
        by_axis = rk.measured.comm_by_axis
        assert by_axis == rk.predicted.comm_by_axis
        # tp's bytes by hand from the per-block form: dp splits the global batch of 8 in 4 sequences
        assert sum(by_axis["tp"].values()) == tp_theory.gpt_tp_bytes(4, 32, 32, 2, 2, 4, sp)
        assert rk.wire.sent == rk.predicted.wire + FRAMING_PER_MESSAGE * rk.wire.messages
        assert set(rk.wire.by_axis) == {"dp_shard", "tp"}
    # rank 0 holds 1/2 of the split matrices and 1/2 of its replica's dp shard: 147,232 B (fsdp2_tp_job's
    # figure at global batch 4: states do not depend on the batch)
    assert r.ranks[0].measured.total == 147_232


def test_run_with_tp_composes_with_every_data_parallel_strategy():
    """TP keeps gradients whole per tp rank (with SP too), so a data-parallel strategy over dp needs
    to know nothing of it: ZeRO-2 and bucketed DDP in mixed-bf16, bytes per axis == closed form."""
    for strategy in ("zero2", "ddp_bucketed"):
        r = _tp_run(strategy, sp=True, recipe="mixed-bf16", steps=2)
        assert all(v for v in vars(r.match).values()), (strategy, r.match)
        assert {rk.rank: set(rk.measured.comm_by_axis) for rk in r.ranks} == {k: {"dp_shard", "tp"} for k in range(4)}


def test_a_tp_runs_axes_are_named_for_what_they_carry():
    """The mesh (`kinds.Mesh`) names its axes dp_shard and tp, so its groups, its sockets (labelled
    when the groups open) and every record carry those names from the start: no socket carries
    another axis's name, and the world group's sockets count as `world` (no axis of a (dp, tp)
    mesh runs on it). dp is strided, tp contiguous: rank r's tp group is {2⌊r/2⌋, 2⌊r/2⌋+1}."""
    from zeroedu.train import RunConfig, config_to_dict

    cfg = config_to_dict(RunConfig("fsdp2", 4, tp=2, steps=1, model="gpt-tiny", recipe="fp32").resolved())
    for rank, r in enumerate(cluster.run("tests.rank_jobs:tp_axis_names", 4, {"cfg": cfg})):
        assert (r["dp"], r["tp"], r["outer"], r["world_group_axis"]) == ("dp_shard", "tp", None, "world")
        assert r["axes"] == {"dp_shard": [rank % 2, rank % 2 + 2], "tp": [rank // 2 * 2, rank // 2 * 2 + 1]}
        assert r["labels"] is None or set(r["labels"]) <= {"world", "dp_shard", "tp", *r["earlier"]}, r["labels"]


@pytest.mark.fast
@pytest.mark.parametrize("kw, msg", [
    (dict(world_size=3, tp=2), "tp = 2 must divide the world size 3"),
    (dict(model="mlp", tp=2), "not a gpt-\\* model"),
    (dict(strategy="hsdp", m=2, tp=2), "two data-parallel axes"),
    (dict(sequence_parallel=True), "give tp >= 2"),
    (dict(tp=2, clip_grad_norm=1.0), "gradient norm"),
    (dict(tp=2, recompute="full"), "recompute"),
    (dict(tp=2, attention="fused"), "eager"),
    (dict(tp=2, links="200MB/s,50us"), "links"),
    (dict(tp=4, model="gpt-tiny"), "must divide the heads"),
    (dict(tp=0), "tp must be an integer >= 1"),
])
def test_tp_configurations_refused_in_the_parent(kw, msg):
    from zeroedu.train import RunConfig

    args = {"strategy": "fsdp2", "world_size": 4, **kw}
    with pytest.raises(ValueError, match=msg):
        RunConfig(**args).resolved()


@pytest.mark.fast
def test_tp_ops_by_collective_by_hand():
    from zeroedu.theory.tensor_parallel import gpt_tp_ops

    def by(ops):
        out = {}
        for o in ops:
            out[o.collective] = out.get(o.collective, 0) + o.sent
        return out

    # b·s·h·a = 2·8·32·4 = 2048 B, t = 2, 3 blocks, 2 micro-batches
    assert by(gpt_tp_ops(2, 8, 32, 3, 2, 4, micro_batches=2)) == {"all_reduce": 2 * 3 * 4 * 2048}
    assert by(gpt_tp_ops(2, 8, 32, 3, 2, 4, sp=True)) == {
        "all_gather": (3 * (4 + 2) + 1) * 1024, "reduce_scatter": 3 * 4 * 1024,
        "all_reduce": 3 * 6 * 32 * 4 + 2048}  # replicated vectors' gradients, the embedding's f
    assert {o.axis for o in gpt_tp_ops(2, 8, 32, 3, 2, 4, sp=True)} == {"tp"}


@pytest.mark.fast
def test_the_tp_flags_reach_the_configuration():
    from zeroedu.cli import build_parser
    from zeroedu.cli.run import config_from_args

    args = build_parser().parse_args(["run", "--strategy", "fsdp2", "--world-size", "4", "--tp", "2",
                                      "--sequence-parallel", "--model", "gpt-tiny"])
    cfg = config_from_args(args, 4)
    assert (cfg.tp, cfg.sequence_parallel, cfg.dp, cfg.n, cfg.micro_batch_size) == (2, True, 2, 2, 4)
    assert [cfg.shard_rank(k) for k in range(4)] == [0, 0, 1, 1]


def test_zeroedu_run_tp_prints_both_axes():
    from tests.cli_inprocess import zeroedu

    res = zeroedu("run", "--strategy", "fsdp2", "--world-size", "4", "--tp", "2", "--sequence-parallel",
                  "--model", "gpt-tiny", "--steps", "2", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "(dp N = 2 x tp 2, sequence parallel)" in res.stdout
    assert "ring model: tp reduce_scatter" in res.stdout and "ring model: dp_shard all_gather" in res.stdout
    assert "rank 0 per axis, ring model -> wire: dp_shard" in res.stdout
    assert res.stdout.rstrip().endswith("match: True")


def test_run_with_tp_equals_torchs_fully_shard_over_parallelize_module():
    """The composition against torch's own (`torch_fsdp2_tp_job`: `parallelize_module` on every
    MLP over tp, then `fully_shard` over dp, on a (2, 2) CPU mesh): the same losses step by step
    and the same parameters after 3 Adam steps, gathered with `full_tensor()` on torch's side and
    put back together from the tp slices on zeroedu's."""
    from zeroedu.references.torch_tp import torch_fsdp2_tp_job

    theirs = cluster.run(torch_fsdp2_tp_job, 4, {"tp": 2, "global_batch": 4})
    ours = _tp_run(global_batch=4)
    # torch places a TP-split weight FSDP shards again as (_StridedShard(0, sf=2), Shard(0)) on (dp, tp)
    assert theirs[0]["placements"]["blocks.0.mlp.fc.weight"] == ["_S(0, 2)", "S(0)"]
    assert theirs[0]["placements"]["blocks.0.mlp.fc2.weight"] == ["S(0)", "S(1)"]
    for k, got in enumerate(ours.losses):
        want = sum(r["losses"][k] for r in theirs) / 4  # each dp slice's loss, once per tp rank
        assert abs(got - want) <= TOL * abs(want)
    for p, q in zip(ours.params, theirs[0]["params"], strict=True):
        assert p.shape == q.shape and float((p - q).abs().max()) <= TOL * float(q.abs().max())
