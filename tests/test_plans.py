"""The suite's planner (`train.plans`, `zeroedu plan --model gpt-small`): the shapes it ranks are
the ones `zeroedu run` builds, and what its three best plans hold and send is what their ranks
measure (tensor storages, the ledger's record of every send), every rank, byte for byte."""
import pytest

from zeroedu.train import plans, run


@pytest.fixture(scope="module")
def gpt_small_on_8():
    return plans.plan("gpt-small", 8)


def test_the_three_best_plans_run_and_every_rank_holds_and_sends_what_the_plan_says(gpt_small_on_8):
    """gpt-small on 8 ranks: each of the planner's top three, run for real (one step), has every
    rank's model states, one micro-batch's activations and bytes sent per axis and collective
    equal to the plan's figures, and trains as one process does."""
    assert len(gpt_small_on_8.ranked) >= 3
    for p in gpt_small_on_8.ranked[:3]:
        rep = run(p.run_config(steps=1))
        assert len(rep.ranks) == len(p.ranks) == 8
        for r, f in zip(rep.ranks, p.ranks):
            assert r.rank == f.rank
            assert r.measured.total == f.model_states, (str(p), r.rank)
            assert r.measured.activations == f.activations, (str(p), r.rank)
            assert r.measured.comm_by_axis == f.comm_by_axis, (str(p), r.rank)
        assert rep.match.losses, str(p)


def test_every_candidate_is_a_shape_run_builds_or_is_counted_with_runs_reason(gpt_small_on_8):
    """Every ZeRO level x tp x pp x cp x k x sp candidate on 8 ranks is either ranked (a
    configuration `RunConfig.resolved()` accepts) or counted under the reason it refuses."""
    ranked = {(p.zero, p.config.tp, p.config.pp, p.config.cp, p.config.micro_batches, p.config.sequence_parallel)
              for p in gpt_small_on_8.ranked}
    candidates = plans._candidates(8, (1, 2, 4))
    assert ranked <= set(candidates)
    assert len(ranked) + sum(gpt_small_on_8.refused.values()) == len(candidates)
    # gpt-small has 4 heads and 4 blocks: tp 8 and pp 8 are never a plan
    assert not any(p.config.tp == 8 or p.config.pp == 8 for p in gpt_small_on_8.ranked)
    steps = [p.step for p in gpt_small_on_8.ranked]
    assert steps == sorted(steps)


def test_on_an_emulated_link_only_data_parallel_shapes_are_plans_and_their_messages_and_bytes_cost_time():
    """With --link the plans are those whose every axis the link paces (data parallel only); an
    axis's time is the slowest rank's: every call the closed forms list, one after another, each
    ring step the longer of the link's α + its bytes over β and this machine's measured seconds
    per step (a probe through the same links)."""
    from zeroedu.runtime.links import DOMAIN
    from zeroedu.theory.timing import ring_steps
    from zeroedu.train.launch import predicted_comm

    rep = plans.plan("gpt-tiny", 4, links="domain")
    assert rep.ranked and all(p.config.tp == p.config.pp == p.config.cp == 1 for p in rep.ranked)
    assert rep.ring_step > 0
    for p in rep.ranked:
        worst = 0.0
        for r in p.ranks:
            ops = predicted_comm(p.config, r.rank).ops
            steps = sum(ring_steps(op.collective, op.group) for op in ops)
            assert r.messages == {"dp_shard": steps}
            assert sum(sent for _, sent in r.calls["dp_shard"]) == pytest.approx(sum(r.comm_by_axis["dp_shard"].values()))
            worst = max(worst, sum(ring_steps(op.collective, op.group)
                                   * max(DOMAIN.alpha + float(op.sent) / ring_steps(op.collective, op.group) / DOMAIN.beta,
                                         rep.ring_step) for op in ops))
        assert p.comm == {"dp_shard": pytest.approx(worst)}


def test_naive_ddp_is_planned_with_a_call_per_parameter():
    """Naive DDP all-reduces each gradient in its own call (`strategies.ddp`), so its plan counts
    a call per trainable parameter, each its 2(N - 1) ring steps, and the same bytes as one
    all-reduce of them all; the other strategies' calls are per unit."""
    from zeroedu import theory
    from zeroedu.models import get_model, unit_shapes

    rep = plans.plan("gpt-tiny", 4, links="domain")
    ddp = next(p for p in rep.ranked if p.config.strategy == "ddp")
    n_params = len(list(get_model("gpt-tiny").build().parameters()))
    assert len(ddp.ranks[0].calls["dp_shard"]) == n_params
    assert ddp.ranks[0].messages["dp_shard"] == n_params * 2 * (4 - 1)
    shapes = unit_shapes(get_model("gpt-tiny").build())
    one = theory.exact_comm("ddp_bucketed", shapes, 4, recipe="mixed-bf16")
    each = theory.exact_comm("ddp", shapes, 4, recipe="mixed-bf16")
    assert len(one.ops) == 1 and len(each.ops) == n_params
    assert sum(op.sent for op in each.ops) == one.ops[0].sent


def test_zeroedu_plan_prints_the_suites_shapes_and_the_command_of_the_best():
    from .cli_inprocess import zeroedu

    r = zeroedu("plan", "--model", "gpt-tiny", "--gpus", "4", "--top", "3")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "gpt-tiny on 4 local ranks" in out and "shapes zeroedu run builds" in out
    assert "run #1: zeroedu run --strategy " in out and "--world-size 4 --model gpt-tiny" in out


@pytest.mark.parametrize("argv,says", [
    (["--gpus", "32"], "at most 16"),
    (["--gpus", "4", "--check", "4,1,1,1,1"], "--check is the cluster planner's"),
])
def test_zeroedu_plan_refuses_what_local_ranks_cannot_plan(argv, says):
    from .cli_inprocess import zeroedu

    r = zeroedu("plan", "--model", "gpt-tiny", *argv)
    assert r.returncode == 2 and says in r.stderr, r.stderr
