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
    # with SP the same 8192 plus the all-reduce of six replicated 32-vectors: 2·(1/2)·6·32·4 = 768
    assert block_tp_bytes(2, 8, 32, 2, 4, sp=True) == 8192 + 768
    # t = 4: 4 × 2·(3/4)·2048 = 12288
    assert block_tp_bytes(2, 8, 32, 4, 4) == 12288
    assert block_tp_bytes(2, 8, 32, 4, 4, sp=True) == 12288 + 2 * 3 * 6 * 32 * 4 / 4
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
        # b·s·h fp32 activations, 2(t-1)/t of them each; with SP the same bytes in 8 halves, and
        # the gradients of the 6 replicated D-vectors (LayerNorms, row-parallel biases) all-reduced
        replicated = 2 * (t - 1) * 6 * D * 4 / t if sp else 0
        assert r["sent"] == 4 * 2 * (t - 1) * BATCH * SEQ * D * 4 / t + replicated
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
    # 199,940 with SP, which also splits the LayerNorms' inputs along the sequence)
    assert ranks[0]["states_ledger"] == 147_232
    assert ranks[0]["activations_ledger"] == (199_940 if sp else 217_348)


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
