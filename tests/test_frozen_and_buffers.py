"""Models a user brings that no strategy here trains like single-process training: frozen
parameters, norm layers with running statistics, buffers changed by forward. Each is refused
with the names, before any rank starts (`run`, checkpoint jobs) and when a strategy is built
(the rank side), never trained into a silent `match: True`."""
import pytest
import torch

from zeroedu.catalog import STRATEGIES, get_spec
from zeroedu.checkpoint import train_and_save
from zeroedu.models import CustomModel
from zeroedu.recipes import get_recipe
from zeroedu.strategies import strategy_class
from zeroedu.strategies.base import DistState
from zeroedu.train import RunConfig, run

from tests.custom_models import vector_batch

FROZEN = CustomModel("tests.custom_models:frozen_model", "tests.custom_models:token_batch")
BATCHNORM = CustomModel("tests.custom_models:batchnorm_model", "tests.custom_models:vector_batch")
COUNTER = CustomModel("tests.custom_models:counter_model", "tests.custom_models:vector_batch")
FROZEN_SAYS = r"frozen parameters \(requires_grad=False\) are not supported: \['tok.weight', 'scale.weight'\]"
NORM_SAYS = r"running statistics are not supported: \['norm \(BatchNorm1d\)'\].*nn.LayerNorm"


def _cfg(strategy, model):
    hybrid = get_spec(strategy).hybrid
    return RunConfig(strategy, 4 if hybrid else 2, m=2 if hybrid else 1, steps=2, recipe="fp32", model=model)


@pytest.mark.fast  # refused before a rank starts (conftest checks)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("model, says", [(FROZEN, FROZEN_SAYS), (BATCHNORM, NORM_SAYS)],
                         ids=["frozen", "batchnorm"])
def test_refused_before_any_rank_starts(strategy, model, says, tmp_path):
    with pytest.raises(ValueError, match=says):
        run(_cfg(strategy, model))
    with pytest.raises(ValueError, match=says):
        train_and_save(_cfg(strategy, model), str(tmp_path), [1])


@pytest.mark.fast
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if not get_spec(s).hybrid])
@pytest.mark.parametrize("model, says", [(FROZEN, FROZEN_SAYS), (BATCHNORM, NORM_SAYS)],
                         ids=["frozen", "batchnorm"])
def test_refused_when_the_strategy_is_built(strategy, model, says):
    """The rank side refuses too (the API without `run`): in the constructor, before any tensor
    is allocated or moved."""
    with pytest.raises(ValueError, match=says):
        strategy_class(strategy)(model.build(), DistState.single(), get_recipe("fp32"))


@pytest.mark.fast
@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if not get_spec(s).hybrid])
def test_a_buffer_changed_by_forward_is_refused_at_the_first_forward(strategy):
    model = COUNTER.build()
    s = strategy_class(strategy)(model, DistState.single(), get_recipe("fp32"))
    x, y = vector_batch(0, 4)
    with pytest.raises(ValueError, match=r"forward changed the model's buffers \['seen'\]"):
        s.forward_backward(x, y)


@pytest.mark.fast
def test_eval_mode_norms_and_fixed_buffers_still_train():
    """Not everything with a buffer is refused: a BatchNorm in eval mode keeps its statistics."""
    model = BATCHNORM.build().eval()
    s = strategy_class("ddp")(model, DistState.single(), get_recipe("fp32"))
    x, y = vector_batch(0, 4)
    before = model.norm.running_mean.clone()
    assert torch.isfinite(torch.tensor(s.forward_backward(x, y)))
    assert torch.equal(model.norm.running_mean, before)


def test_on_real_ranks_a_changed_buffer_is_named_by_the_rank():
    """Past the parent's checks (no norm type, nothing frozen), the ranks' first forward sees it."""
    from zeroedu.runtime.cluster import RankError

    with pytest.raises(RankError, match=r"forward changed the model's buffers \['seen'\]") as e:
        run(_cfg("fsdp2", COUNTER))
    assert e.value.rank == 0
