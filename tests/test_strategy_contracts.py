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
    assert r["replica_max_diff"] == 0.0
    assert r["match"] == {"model_states": True, "comm": True, "wire": True, "activations": True, "losses": True}


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
