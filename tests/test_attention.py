"""Fused attention on real ranks (`RunConfig(attention=...)`, `zeroedu run --attention`): on every
strategy, gpt-small's activations measured on each rank equal the closed form for eager and for
fused attention (`theory.activations`), and training equals single-process training with the
same attention."""
from __future__ import annotations

import pytest

from zeroedu import catalog
from zeroedu.models import PRESETS
from zeroedu.recipes import get_recipe
from zeroedu.train import RunConfig

SMALL = PRESETS["gpt-small"]


def _run(runs, strategy, attention):
    m = 2 if catalog.get_spec(strategy).hybrid else 1
    # 2 ranks, one sequence each, one step: the activations of a micro-batch are what is checked
    return runs(RunConfig(strategy, 2, m=m, steps=1, global_batch=2, attention=attention, timeline="minimal"))


@pytest.mark.parametrize("strategy", list(catalog.STRATEGIES))
def test_activations_equal_the_closed_form_for_both_attentions(runs, strategy):
    eager, fused = (_run(runs, strategy, a) for a in ("eager", "fused"))
    B, S, D, H, L = 1, SMALL.seq_len, SMALL.d_model, SMALL.n_heads, SMALL.n_layers
    for rep in (eager, fused):
        assert rep.match.activations and rep.match.losses, rep.match
        assert all(r.measured.activations == r.predicted.activations for r in rep.ranks)
    a = get_recipe(eager.recipe).param_bytes  # the model computes in the recipe's parameter dtype
    for e, f in zip(eager.ranks, fused.ranks):
        # per layer the fused kernel drops the a·B·H·S² probabilities, keeps its output and an fp32 log-sum-exp
        assert e.measured.activations - f.measured.activations == L * (a * B * H * S * S - a * B * S * D - 4 * B * H * S)


def test_attention_is_a_gpt_option():
    with pytest.raises(ValueError, match="has no attention"):
        RunConfig("ddp", 2, model="mlp", attention="fused").resolved()
    with pytest.raises(ValueError, match="attention must be one of"):
        RunConfig("ddp", 2, attention="flash").resolved()
    assert RunConfig("ddp", 2, attention="fused").resolved().model.attention == "fused"
    assert RunConfig("ddp", 2).resolved().model.attention == "eager"


@pytest.mark.fast
def test_the_cli_flag_reaches_the_model():
    from zeroedu.cli import build_parser
    from zeroedu.cli.run import config_from_args

    for flag, want in (([], "eager"), (["--attention", "fused"], "fused"), (["--attention", "eager"], "eager")):
        args = build_parser().parse_args(["run", "--strategy", "fsdp2", "--world-size", "2", *flag])
        assert config_from_args(args, 2).model.attention == want
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--attention", "flash"])
