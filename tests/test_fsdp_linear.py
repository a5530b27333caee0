"""The hand-written FSDP (and DDP) linear layer vs nn.Linear trained on the global batch.

Independent expectations: torch's nn.Linear + torch.optim.SGD in one process on the whole
batch (values), `zeroedu.shard.dim0_rows` (which rows each rank keeps) and the closed forms
`theory.exact_comm("fsdp2" | "ddp", ...)` for one unit holding W and b (bytes sent).
"""
import pytest
import torch

from zeroedu import shard, theory
from zeroedu.runtime import cluster
from zeroedu.strategies.fsdp_linear import linear_job, make_linear, make_linear_batch

STEPS, BATCH, LR, TOL = 5, 24, 0.1, 1e-6


def reference(d_in, d_out):
    lin = make_linear(d_in, d_out)
    opt = torch.optim.SGD(lin.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = make_linear_batch(step, BATCH, d_in, d_out)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(lin(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [lin.weight.detach(), lin.bias.detach()]


@pytest.mark.parametrize("kind", ["fsdp", "ddp"])
@pytest.mark.parametrize("n,d_out", [(1, 7), (2, 7), (3, 7), (4, 7), (3, 2), (4, 8)])
def test_linear_equals_nn_linear_on_global_batch(kind, n, d_out):
    d_in = 5
    ranks = cluster.run(linear_job, n, {"kind": kind, "in_features": d_in, "out_features": d_out,
                                        "global_batch": BATCH, "steps": STEPS, "lr": LR})
    ref_losses, ref_params = reference(d_in, d_out)
    losses = [sum(r["losses"][k] for r in ranks) / n for k in range(STEPS)]
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= TOL * abs(b)
    for r in ranks:
        for p, q in zip(r["params"], ref_params):
            assert p.shape == q.shape
            assert float((p - q).abs().max()) <= TOL * float(q.abs().max())
    unit = [[(d_out, d_in), (d_out,)]]
    want = theory.exact_comm("fsdp2" if kind == "fsdp" else "ddp", unit, n, recipe="fp32").by_collective()
    if kind == "fsdp":  # backward re-gathers W only: dX = dY W does not need b
        bias_once = theory.exact_comm("fsdp2", [[(d_out,)]], n, recipe="fp32", reshard_after_forward=False)
        want["all_gather"] -= bias_once.by_collective()["all_gather"]
    want = {k: float(v) for k, v in want.items() if v}
    for r in ranks:
        assert {k: v for k, v in r["sent"].items() if v} == want
        if kind == "fsdp":  # each rank keeps only its own rows of W and b (maybe none)
            rows = shard.dim0_rows(d_out, n, r["rank"]).size
            assert r["shard_rows"] == [(rows, d_in), (rows,)]
