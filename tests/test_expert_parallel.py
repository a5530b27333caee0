"""Expert parallelism (`strategies.expert_parallel`, `train.experts`): the router against a hand
count, and a mixture-of-experts GPT over ep = 2 and 4 ranks (top-1 and top-2) equal to the same
MoE in one process (same routing), with each rank's expert parameters and the bytes of every
all-to-all equal to their closed forms from the router's actual assignment; and ep = 2 beside
dp = 2 (experts replicated over dp) on four ranks."""
import pytest
import torch

from zeroedu.models import GPTConfig
from zeroedu.strategies import expert_parallel as EP
from zeroedu.train import experts as train_ep
from zeroedu.train.pipeline import parameter_error

MODEL = GPTConfig(vocab=67, seq_len=32, d_model=32, n_layers=2, n_heads=2, lr=1e-2, preset="")
STEPS, BATCH, EXPERTS = 3, 4, 4


@pytest.mark.fast
def test_the_router_keeps_first_choices_first_up_to_capacity():
    spec = EP.MoESpec(experts=2, top_k=2, capacity_factor=1.0)  # C = ceil(1 * 2 * 3 / 2) = 3
    assert spec.capacity(3) == 3 and EP.MoESpec(4, 1, 1.25).capacity(32) == 10
    # three tokens, all preferring expert 0: their first choices fill it, the second choices fill 1
    logits = torch.tensor([[2.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    r = EP.route(logits, spec)
    assert r.chosen == [3, 3] and r.kept == [3, 3] and r.dropped == 0
    spec1 = EP.MoESpec(experts=2, top_k=1, capacity_factor=1.0)  # C = ceil(3 / 2) = 2
    r = EP.route(logits, spec1)
    assert r.chosen == [3, 0] and r.kept == [2, 0] and r.dropped == 1
    assert r.token.tolist() == [0, 1]  # in token order: the third is dropped
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(r.weight, p[:2, 0])
    # aux: E * sum_e f_e P_e with f = (1, 0)
    torch.testing.assert_close(r.aux, 2 * p[:, 0].mean())
    with pytest.raises(ValueError, match="top-k must be 1..experts"):
        EP.MoESpec(experts=2, top_k=3)


@pytest.mark.fast
def test_one_process_moe_in_groups_routes_each_group_on_its_own():
    torch.manual_seed(0)
    spec = EP.MoESpec(experts=4, top_k=2, capacity_factor=1.0)
    layer = EP.MoE(8, 16, spec, groups=2)
    x = torch.randn(4, 5, 8)
    y = layer(x)
    whole = [EP.MoE.forward(_one_group(layer), x[2 * g:2 * g + 2]) for g in range(2)]
    torch.testing.assert_close(y, torch.cat(whole))
    assert sum(layer.stats.kept[0]) + layer.stats.dropped[0] == 2 * 10


def _one_group(layer):
    single = EP.MoE(8, 16, layer.spec, groups=1)
    single.load_state_dict(layer.state_dict())
    return single


_REF = {}


@pytest.mark.parametrize("ep,k,dp", [(2, 1, 1), (2, 2, 1), (4, 1, 1), (4, 2, 1), (2, 1, 2), (2, 2, 2)])
def test_expert_parallel_gpt_equals_one_process_and_its_closed_forms(ep, k, dp):
    spec = EP.MoESpec(experts=EXPERTS, top_k=k, capacity_factor=1.0)
    losses, params, layers = train_ep.reference(MODEL, spec, ep * dp, STEPS, BATCH, replicas=dp)
    report = train_ep.run_ep(MODEL, spec, ep, steps=STEPS, global_batch=BATCH, dp=dp)
    for got, want in zip(report.losses, losses):
        assert abs(got - want) <= 1e-5 * abs(want)
    per = EXPERTS // ep
    counts = EP.param_count(MODEL, spec.experts, ep)
    for r in report.ranks:
        # the same routing: each rank's first forward == its group in one process, layer by layer
        for i, lay in enumerate(layers):
            assert (r.chosen[i], r.kept[i], r.dropped[i]) == (lay.stats.chosen[r.rank], lay.stats.kept[r.rank],
                                                             lay.stats.dropped[r.rank])
        assert parameter_error(r.params, {n: params[n] for n in r.params}, MODEL.d_model) <= train_ep.PARAM_TOL
        held = {int(n.split(".experts.")[1].split(".")[0]) for n in r.params if ".experts." in n}
        assert held == set(range(r.ep_rank * per, (r.ep_rank + 1) * per))
        assert r.param_bytes == 4 * (counts["shared"] + counts["experts"])
    assert sum(report.ranks[0].dropped) > 0  # capacity 1.0 drops some: the count is exercised
    # bytes: every all-to-all from the router's actual assignment, summed over the layers
    for r in report.ranks:
        want = {}
        for i in range(MODEL.n_layers):
            for tag, b in EP.theory_bytes(report.routed(i, r.dp_rank), r.ep_rank, MODEL.d_model, EXPERTS).items():
                want[f"ep/{tag}"] = want.get(f"ep/{tag}", 0) + b
        want["ep/grads"] = 4 * counts["shared"] * 2 * (ep - 1) / ep  # ring all-reduce of what every rank holds
        if dp > 1:  # and over the replicas: everything, the experts too
            want["dp/grads"] = 4 * counts["shared"] * 2 * (dp - 1) / dp
            want["dp/expert_grads"] = 4 * counts["experts"] * 2 * (dp - 1) / dp
        assert r.sent_by_tag == want
    balanced = EP.balanced_bytes(BATCH // (ep * dp) * MODEL.seq_len, k, MODEL.d_model, ep)
    total = sum(r.sent_by_tag["ep/dispatch"] for r in report.ranks)
    assert 0 < total <= MODEL.n_layers * ep * dp * balanced  # dropped tokens travel nowhere


def test_expert_parallelism_refuses_shapes_that_cannot_exist():
    with pytest.raises(ValueError, match="4 experts do not split over ep = 3"):
        train_ep.run_ep(MODEL, EP.MoESpec(experts=4), 3)
    with pytest.raises(ValueError, match="ep x dp = 4 ranks .* global batch 6 does not split"):
        train_ep.run_ep(MODEL, EP.MoESpec(experts=4), 4, global_batch=6)


def test_the_command_line_prints_every_rank_beside_its_closed_forms():
    from .cli_inprocess import zeroedu  # on the session's warm pools

    r = zeroedu("experts", "--experts", "4", "--ep", "4", "--top-k", "2")
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [row[3] for row in rows] == ["0-0", "1-1", "2-2", "3-3"] and all(row[-1] == "yes" for row in rows)
    assert "C = 20 per expert" in r.stdout and "match: True" in r.stdout  # ceil(1.25 * 2 * 32 / 4)
    for argv, msg in ((("--experts", "6", "--ep", "4"), "6 experts do not split over ep = 4"),
                      (("--experts", "2", "--top-k", "3"), "top-k must be 1..experts")):
        bad = zeroedu("experts", *argv)
        assert bad.returncode == 2 and msg in bad.stderr and "Traceback" not in bad.stderr
