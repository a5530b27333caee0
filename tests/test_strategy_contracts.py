"""Contracts every strategy keeps, beyond equalling the reference on rank 0."""
import pytest
import torch

from zeroedu.catalog import STRATEGIES
from zeroedu.runtime.ledger import Ledger
from zeroedu.models import MLPConfig, make_batch, make_model
from zeroedu.optim import AdamConfig
from zeroedu.recipes import get_recipe
from zeroedu.strategies import build
from zeroedu.strategies.base import DistState
from zeroedu.train import RunConfig

from .shared_runs import RUNS


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_every_rank_ends_with_the_same_parameters(name):
    hybrid = STRATEGIES[name].hybrid
    # The run the equivalence tests of each strategy make (N = 3, or 2 x 2): shared, not repeated.
    r = RUNS(RunConfig(name, 4 if hybrid else 3, steps=5, recipe="fp32", m=2 if hybrid else 1,
                       return_params=True, model="mlp"))
    assert r.replica_max_diff == 0.0
    assert r.match.plain() == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}


def _local(name, recipe="fp32"):
    dist = DistState.single(Ledger())
    return build(name, make_model(MLPConfig()), dist, get_recipe(recipe), AdamConfig())


@pytest.mark.fast
@pytest.mark.parametrize("name", ["fsdp1", "fsdp2"])
def test_fsdp_unit_without_gradient_gets_zeros_not_last_steps(name):
    """A step whose backward produced no gradient must use zeros (torch semantics with
    zero grads), not re-apply the previous step's reduced shards."""
    cfg = MLPConfig()
    strat = _local(name)
    ref = make_model(cfg)
    opt = torch.optim.Adam(ref.parameters(), lr=AdamConfig().lr, foreach=False)
    x, y = make_batch(0, 24, cfg)
    strat.forward_backward(x, y)
    strat.step()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    opt.step()
    strat.step()  # no backward at all this time
    for p in ref.parameters():
        p.grad.zero_()
    opt.step()
    for a, b in zip(strat.full_parameters(), ref.parameters()):
        assert (a - b.detach()).abs().max().item() <= 1e-6 * b.abs().max().item()


@pytest.mark.fast
@pytest.mark.parametrize("name", ["megatron_distopt", "ddp_bucketed"])
def test_second_backward_before_step_is_refused(name):
    recipe = "megatron-bf16" if name == "megatron_distopt" else "fp32"
    strat = _local(name, recipe)
    x, y = make_batch(0, 24, MLPConfig())
    strat.forward_backward(x, y)
    with pytest.raises(RuntimeError, match="step"):
        strat.forward_backward(x, y)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_units_collectives_are_its_closed_form(name):
    """Every collective's record names the unit whose buffer moved (a field, from the tag's
    `UnitName`, never read back from the text): per unit and kind of collective, the bytes a
    rank sent in the last step equal `theory.exact_comm`'s ops for that unit."""
    from fractions import Fraction

    from zeroedu import theory
    from zeroedu.models import unit_shapes

    hybrid = STRATEGIES[name].hybrid
    n, m = (4, 2) if hybrid else (3, 1)
    r = RUNS(RunConfig(name, n, steps=5, recipe="fp32", m=m, return_params=True, model="mlp"))
    want: dict = {}
    for op in theory.exact_comm(name, unit_shapes(make_model(MLPConfig())), n // m, m=m, recipe="fp32").ops:
        want[(op.unit, op.collective)] = want.get((op.unit, op.collective), Fraction(0)) + op.sent
    for rank in r.ranks:
        got: dict = {}
        for c in rank.timeline.comm:
            if c.step == r.steps - 1:
                assert c.moves in ("grads", "params", "data"), c
                got[(c.unit, c.op)] = got.get((c.unit, c.op), 0) + Fraction(c.sent)
        assert {k: float(v) for k, v in got.items() if v} == {k: float(v) for k, v in want.items() if v}
        if STRATEGIES[name].layout != "replicated":
            assert {u for u, _ in got} >= set(range(len(unit_shapes(make_model(MLPConfig())))))


@pytest.mark.fast
def test_no_strategy_writes_its_own_step():
    """The optimizer step is written once (`Strategy.step`: finish the gradient sync, record the
    model states, update, `after_update`, step end); strategies fill in the hooks. Read from the
    source (an AST walk of every strategy module and the notebooks' buggy strategies)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "zeroedu"
    found = []
    for path in sorted([*(root / "strategies").glob("*.py"), *(root / "notebook" / "bugs").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name not in ("Strategy", "AdamState"):
                found += [f"{path.name}:{f.lineno} {node.name}.step" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name == "step"]
    assert not found, found


@pytest.mark.fast
@pytest.mark.parametrize("name", [n for n, s in STRATEGIES.items() if not s.hybrid])  # one rank: no 2-D mesh
def test_a_step_with_no_micro_batch_steps_on_zero_gradients(name):
    """One rank: step() before any forward_backward() updates from zero gradients as
    torch.optim.Adam does (m = v = 0: the parameters stay), where one strategy used to raise
    and another to reduce zeros."""
    strat = _local(name)
    before = [p.clone() for p in strat.full_parameters()]
    strat.step()
    assert all(torch.equal(a, b) for a, b in zip(before, strat.full_parameters()))


@pytest.mark.fast
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_catalog_says_which_strategies_scale_gradients_in_place(name):
    """`theory.memory.update_bytes` reads the catalog's flag; the step reads the class's."""
    from zeroedu.strategies import strategy_class

    assert strategy_class(name).SCALES_GRADS_IN_PLACE == STRATEGIES[name].scales_grads_in_place
