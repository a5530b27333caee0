"""Expert parallelism's parts (`models.moe`, `strategies.expert_parallel`): the router against a
hand count, a layer routing each group of sequences on its own, and `zeroedu experts` (`zeroedu run`
with a mixture of experts over ep ranks). Training over ep ranks beside one process, every figure
beside its closed form: tests/test_expert_spine.py."""
import pytest
import torch

from zeroedu.strategies import expert_parallel as EP


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
def test_a_layer_routes_each_group_of_sequences_on_its_own():
    torch.manual_seed(0)
    spec = EP.MoESpec(experts=4, top_k=2, capacity_factor=1.0)
    layer = EP.MoE(8, 16, spec, group_rows=2)
    x = torch.randn(4, 5, 8)
    y = layer(x)
    whole = [layer(x[2 * g:2 * g + 2]) for g in range(2)]  # each group alone gives the same rows
    torch.testing.assert_close(y, torch.cat(whole))
    assert len(layer.stats.kept) == 2 + 2 and sum(layer.stats.kept[0]) + layer.stats.dropped[0] == 2 * 10
    with pytest.raises(ValueError, match="3 sequences do not make groups of 2"):
        layer(x[:3])


def test_zeroedu_experts_is_run_with_a_mixture_of_experts():
    from .cli_inprocess import zeroedu  # on the session's warm pools

    r = zeroedu("experts", "--experts", "4", "--ep", "4", "--top-k", "2", "--steps", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "(N = 4: dp 1 x ep 4; the experts over dp 1)" in r.stdout and "top-2" in r.stdout, r.stdout
    rows = [ln.split() for ln in r.stdout.splitlines() if len(ln.split()) == 5 and ln.split()[0].isdigit()
            and "-" in ln.split()[1]]
    assert [row[1] for row in rows] == ["0-0", "1-1", "2-2", "3-3"], r.stdout  # the routing table
    assert r.stdout.rstrip().endswith("match: True")
    for argv, msg in ((("--experts", "6", "--ep", "4"), "6 experts do not split"),
                      (("--experts", "2", "--top-k", "3"), "top-k must be 1..experts"),
                      (("--strategy", "fsdp2",), "ep runs with ddp")):
        bad = zeroedu("experts", *argv)
        assert bad.returncode == 2 and msg in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
