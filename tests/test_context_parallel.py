"""Context parallelism (`strategies.context_parallel`, `train.context`): the split and the work
against hand counts, ring attention in one process against softmax attention, and GPT training
over cp = 2 and 4 ranks (plain and zig-zag) equal to one process, with the bytes each rank sends,
the activations it saves and the score elements it computes equal to their closed forms; and
cp = 2 beside dp = 2 on four ranks."""
import pytest
import torch

from zeroedu.models import GPTConfig
from zeroedu.runtime.comm import Axis
from zeroedu.strategies import context_parallel as CP
from zeroedu.theory.activations import gpt_activation_bytes
from zeroedu.train import context as train_cp
from zeroedu.train.pipeline import parameter_error

MODEL = GPTConfig(vocab=67, seq_len=32, d_model=32, n_layers=2, n_heads=2, lr=1e-2, preset="")
STEPS, BATCH = 3, 4


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


_REF = {}


def _reference():
    if not _REF:
        losses, params, grads = train_cp.reference(MODEL, STEPS, BATCH)
        _REF.update(losses=losses, params=params, grads=grads)
    return _REF


@pytest.mark.parametrize("cp,zigzag,dp", [(2, False, 1), (2, True, 1), (4, False, 1), (4, True, 1), (2, False, 2), (2, True, 2)])
def test_context_parallel_gpt_equals_one_process_and_its_closed_forms(cp, zigzag, dp):
    ref = _reference()
    report = train_cp.run_cp(MODEL, cp, zigzag=zigzag, steps=STEPS, global_batch=BATCH, dp=dp)
    # losses: the mean of the ranks' means is the whole batch's mean
    for got, want in zip(report.losses, ref["losses"]):
        assert abs(got - want) <= 1e-5 * abs(want)
    names = [n for n, _ in MODEL.build().named_parameters()]
    rank0 = report.ranks[0]
    for g, w in zip(rank0.grads, ref["grads"]):
        assert (g - w).norm() <= 1e-5 * w.norm() + 1e-12
    assert parameter_error(dict(zip(names, rank0.params)), dict(zip(names, ref["params"])), MODEL.d_model) <= 1e-5

    L, H, Dh = MODEL.n_layers, MODEL.n_heads, MODEL.d_model // MODEL.n_heads
    b = BATCH // dp  # sequences per replica
    per_layer = CP.theory_bytes(b, H, MODEL.seq_len, Dh, cp)
    block = b * H * (MODEL.seq_len // cp) * Dh * 4
    psi_bytes = 4 * sum(p.numel() for p in MODEL.build().parameters())
    for r in report.ranks:
        sent = r.sent_by_tag
        assert sent["cp/kv"] == L * per_layer["forward"]
        assert sent["cp/kv_grads"] + sent["cp/dkv_home"] == L * per_layer["backward"]
        assert sent["cp/dkv_home"] == L * 2 * block  # dK and dV, one hop home
        assert sent["cp/grads"] == psi_bytes * 2 * (cp - 1) / cp  # ring all-reduce of the gradients
        assert sent.get("dp/grads", 0) == psi_bytes * 2 * (dp - 1) / dp
        assert set(sent) <= {"cp/kv", "cp/kv_grads", "cp/dkv_home", "cp/grads", "dp/grads"}
        # activations: FlashAttention's saved set over this rank's S/cp tokens, no score matrix
        assert r.activation_bytes == gpt_activation_bytes(MODEL, b, MODEL.seq_len // cp, 4, attention="fused")
        assert r.forward_elements == L * CP.work_elements(b, H, MODEL.seq_len, cp, r.cp_rank, zigzag)
        # overlap, from the timeline: each hop's K/V sends are issued before the block computed
        # meanwhile starts and waited for after it ends (cp - 1 hops per layer)
        assert len(r.overlap) == L * (cp - 1)
        assert all(sent <= c0 < c1 <= waited for sent, waited, c0, c1 in r.overlap), r.overlap


def test_context_parallel_refuses_a_shape_that_cannot_exist():
    with pytest.raises(ValueError, match="not divisible by 3"):
        train_cp.run_cp(GPTConfig(vocab=67, seq_len=32, d_model=32, n_layers=2, n_heads=2, preset=""), 3)
    with pytest.raises(ValueError, match="attention='eager'"):
        train_cp.run_cp(GPTConfig(vocab=67, seq_len=32, d_model=32, n_layers=2, n_heads=2, preset="",
                                  attention="fused"), 2)


def test_the_command_line_prints_every_rank_beside_its_closed_forms():
    from .cli_inprocess import zeroedu  # on the session's warm pools

    r = zeroedu("context", "--cp", "4", "--zigzag")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = [ln.split() for ln in lines if ln.split() and ln.split()[0].isdigit()]
    assert [row[3] for row in rows] == ["0-3,28-31", "4-7,24-27", "8-11,20-23", "12-15,16-19"]
    assert all(row[-1] == "yes" for row in rows) and len(rows) == 4
    assert "most / least loaded rank: 1.00" in r.stdout and "match: True" in r.stdout
    bad = zeroedu("context", "--cp", "3", "--zigzag")
    assert bad.returncode == 2 and "not divisible by 6" in bad.stderr and "Traceback" not in bad.stderr
