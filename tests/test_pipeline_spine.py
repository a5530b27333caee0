"""Pipeline parallelism on the run's spine: `zeroedu run --pp P --schedule {gpipe,1f1b}` with a
data-parallel strategy over each stage's ranks (`strategies.splits.PipelineSplit`). Every run is
single-process training's; every rank's model states, activations and bytes per axis equal the
closed forms, the stage's sends by hand."""
from __future__ import annotations

import pytest

from tests.shared_runs import RUNS
from zeroedu.models import get_model, unit_shapes
from zeroedu.strategies.pipeline import Stage
from zeroedu.theory import exact_model_states
from zeroedu.train import RunConfig
from zeroedu.train.reference import parameter_error

PARAM_TOL = 1e-4  # as the pipeline's own tests (tests/test_pipeline.py)


def _pp_run(strategy, world, pp=2, schedule="1f1b", k=4, recipe="fp32"):
    return RUNS(RunConfig(strategy, world, steps=3, recipe=recipe, model="gpt-tiny", global_batch=8, pp=pp,
                          schedule=schedule, micro_batches=k))


def _sent_by_hand(batch, k, stage, p, elem=4):
    """Micro-batch activations (B, S, D) forward unless last, their gradients back unless first."""
    c = get_model("gpt-tiny")
    one = batch * c.seq_len * c.d_model * elem
    return k * one * ((stage < p - 1) + (stage > 0))


@pytest.mark.parametrize("strategy, schedule", [("zero1", "1f1b"), ("fsdp2", "1f1b"), ("zero2", "gpipe")])
def test_pp_2_over_dp_2_equals_one_process_and_its_closed_forms(strategy, schedule):
    """Four ranks, pp 2 (outermost: ranks 0-1 stage 0, 2-3 stage 1) x dp 2, four micro-batches of
    one sequence per replica: each rank's states are the strategy's closed form over its stage's
    units alone at N = 2, computed here; the losses and the stages put back together are one
    process's."""
    r = _pp_run(strategy, 4, schedule=schedule)
    assert (r.pp, r.schedule, r.n) == (2, schedule, 2) and all(v for v in vars(r.match).values()), r.match
    model = get_model("gpt-tiny").build()
    for rk in r.ranks:
        stage = rk.rank // 2
        shapes = unit_shapes(Stage(get_model("gpt-tiny").build(), 2, stage))
        want = exact_model_states(strategy, shapes, 2, rank=rk.rank % 2, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        assert rk.measured.comm_by_axis["pp"] == {"send": _sent_by_hand(1, 4, stage, 2)}
        assert rk.measured.comm_by_axis == rk.predicted.comm_by_axis
        assert (rk.losses[0] is None) == (stage == 0)  # the loss is the last stage's
    names = [n for n, _ in model.named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL
    for a, b in zip(r.losses, r.reference_losses):
        assert abs(a - b) <= 1e-5 * abs(b)


def test_dp_2_x_tp_2_x_pp_2_zero1_on_eight_ranks_equals_one_process():
    """The plan published large runs use, at small scale: ZeRO-1 over dp 2 of gpt-tiny's blocks
    split over tp 2 and cut into pp 2 stages (pp outermost, tp innermost: Megatron-LM's order),
    1F1B over four micro-batches. Each rank's states are ZeRO-1's closed form over its stage's
    tp-split units (`theory.tensor_parallel.gpt_units`, cut to the stage) at N = 2; tp's
    all-reduces cover the stage's one block; the sends are the pipeline's, by hand; the replicas
    agree and the reassembled model is one process's."""
    from zeroedu.theory import tensor_parallel as tp_theory

    r = RUNS(RunConfig("zero1", 8, steps=3, recipe="fp32", model="gpt-tiny", global_batch=8, pp=2, tp=2,
                       schedule="1f1b", micro_batches=4))
    assert (r.pp, r.tp, r.n, r.world_size) == (2, 2, 2, 8) and all(v for v in vars(r.match).values()), r.match
    c = get_model("gpt-tiny")
    units = tp_theory.gpt_units(c.vocab, c.seq_len, c.d_model, c.n_layers, c.n_heads, c.mlp_ratio, 2)
    for rk in r.ranks:
        stage, dp = rk.rank // 4, rk.rank // 2 % 2  # (pp, dp_shard, tp), row-major
        mine = [units[0], units[1]] if stage == 0 else [units[2], units[3]]
        want = exact_model_states("zero1", mine, 2, rank=dp, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        # one replica's micro-batch is one sequence: 4 x (1, 32, 32) fp32 activations each way
        assert rk.measured.comm_by_axis["pp"] == {"send": _sent_by_hand(1, 4, stage, 2)}
        assert rk.measured.comm_by_axis["tp"] == {"all_reduce": 4 * 4 * 2 * (2 - 1) / 2 * 32 * 32 * 4}
    assert r.replica_max_diff == 0.0
    names = [n for n, _ in get_model("gpt-tiny").build().named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL


def test_1f1b_holds_fewer_micro_batches_than_gpipe_at_the_last_forward():
    """Stage 0 of two, four micro-batches: at its last forward GPipe holds all four micro-batches'
    activations, 1F1B two (the schedule's warm-up), on measurement and in the closed form."""
    gpipe, one_f = (_pp_run("ddp", 2, schedule=s) for s in ("gpipe", "1f1b"))
    for r in (gpipe, one_f):
        assert all(v for v in vars(r.match).values()), r.match
    assert gpipe.ranks[0].measured.activations == 2 * one_f.ranks[0].measured.activations


@pytest.mark.fast
@pytest.mark.parametrize("kw, msg", [
    (dict(world_size=3, pp=2), "pp = 2 must divide the world size 3"),
    (dict(model="mlp", pp=2), "not a gpt-\\* model"),
    (dict(pp=2, cp=2, tp=2, world_size=8, attention="eager"), "cp and tp beside it together"),
    (dict(pp=2, tp=2, sequence_parallel=True), "sequence parallelism inside tp"),
    (dict(pp=4, world_size=4), "blocks do not split"),
    (dict(pp=2, schedule="zb"), "schedule must be one of"),
    (dict(strategy="hsdp", m=2, world_size=8, pp=2, clip_grad_norm=1.0), "count the stages twice"),
    (dict(pp=0), "pp must be an integer >= 1"),
    (dict(emulate=(0.01, 0.02)), "give pp >= 2"),
    (dict(pp=2, emulate=(0.01, 0)), "an emulated action lasts > 0 s"),
])
def test_pp_configurations_refused_in_the_parent(kw, msg):
    args = {"strategy": "zero1", "world_size": 4, "model": "gpt-tiny", **kw}
    with pytest.raises(ValueError, match=msg):
        RunConfig(**args).resolved()


def test_zeroedu_run_pp_prints_the_axes_and_matches():
    from tests.cli_inprocess import zeroedu

    res = zeroedu("run", "--strategy", "zero1", "--world-size", "4", "--pp", "2", "--schedule", "1f1b",
                  "--micro-batches", "2", "--model", "gpt-tiny", "--recipe", "fp32", "--global-batch", "4",
                  "--steps", "2", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "(pp 2 x dp N = 2, 1f1b)" in res.stdout, res.stdout
    assert "ring model: pp send" in res.stdout and res.stdout.rstrip().endswith("match: True"), res.stdout


def test_pp_with_a_hybrid_over_each_stage():
    """HFSDP over dp_outer 2 x dp_shard 2 of each of pp 2 stages (eight ranks; pp outermost): the
    stage's units sharded inside each domain and across domains, two micro-batches through 1F1B;
    every rank's states == exact_model_states('hfsdp') over its stage's units at N = 2, M = 2."""
    r = RUNS(RunConfig("hfsdp", 8, m=2, steps=3, recipe="fp32", model="gpt-tiny", global_batch=8, pp=2,
                       micro_batches=2))
    assert (r.pp, r.n, r.m) == (2, 2, 2) and all(v for v in vars(r.match).values()), r.match
    for rk in r.ranks:
        stage = rk.rank // 4
        shapes = unit_shapes(Stage(get_model("gpt-tiny").build(), 2, stage))
        want = exact_model_states("hfsdp", shapes, 2, 2, rank=rk.rank % 2, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        assert rk.measured.comm_by_axis["pp"] == {"send": _sent_by_hand(1, 2, stage, 2)}  # 2 sequences per replica
    assert r.replica_max_diff == 0.0


def test_pp_x_dp_x_cp_fsdp2_on_eight_ranks():
    """FSDP2 over dp 2 x cp 2 of each of pp 2 stages (zig-zag, two micro-batches): ring attention
    inside each stage, a stage sending the S/cp positions its cp rank holds; every figure == its
    closed form (the pipeline's at S/cp positions, the ring's for the stage's one block), and one
    process's training."""
    from zeroedu.theory.context import ring_bytes

    r = RUNS(RunConfig("fsdp2", 8, steps=3, recipe="fp32", model="gpt-tiny", attention="eager", global_batch=4,
                       pp=2, cp=2, zigzag=True, micro_batches=2))
    assert (r.pp, r.cp, r.n) == (2, 2, 4) and all(v for v in vars(r.match).values()), r.match
    c = get_model("gpt-tiny")
    kv = ring_bytes(1, c.n_heads, c.seq_len, c.d_model // c.n_heads, 2, 4)  # per block and micro-batch
    for rk in r.ranks:
        stage = rk.rank // 4
        shapes = unit_shapes(Stage(get_model("gpt-tiny").build(), 2, stage))
        want = exact_model_states("fsdp2", shapes, 4, rank=rk.rank % 4, recipe="fp32")
        assert (rk.measured.param, rk.measured.grad, rk.measured.optim) == (want.param, want.grad, want.optim)
        assert rk.measured.comm_by_axis["cp"] == {"send": 2 * (2 * kv["forward"] + kv["backward"] - kv["forward"])}
        assert rk.measured.comm_by_axis["pp"] == {"send": _sent_by_hand(1, 2, stage, 2) // 2}  # S/cp positions
    assert r.replica_max_diff == 0.0
    names = [n for n, _ in get_model("gpt-tiny").build().named_parameters()]
    assert parameter_error(dict(zip(names, r.params)), dict(zip(names, r.reference_params)), 32) <= PARAM_TOL


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "fsdp2"])
def test_pp_clips_the_global_gradient_norm_as_one_process(strategy):
    """The stages hold disjoint layers, so the gradient norm's square sum is summed over pp too (one
    more fp32 all-reduce, on the pp axis): clipped at 0.05 over dp 2 x pp 2, the losses are torch's
    clip_grad_norm_ in one process, and every byte is in the closed form."""
    from zeroedu.train import RunConfig
    from zeroedu.train.launch import run

    cfg = dict(world_size=4, steps=3, model="gpt-tiny", recipe="fp32", pp=2, micro_batches=2, global_batch=8)
    r = run(RunConfig(strategy, clip_grad_norm=0.05, **cfg))
    assert all(v is True for v in vars(r.match).values()), r.match
    assert all(abs(a - b) <= 1e-5 * b for a, b in zip(r.losses, r.reference_losses))
    plain = run(RunConfig(strategy, **cfg))
    assert max(abs(a - b) / b for a, b in zip(r.losses, plain.losses)) > 1e-5  # clipping changed the run
    for rk in r.ranks:
        assert rk.measured.comm_by_axis["pp"]["all_reduce"] == 2 * 1 * 4 // 2  # one fp32 square sum over 2 stages


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_stage_reports_its_schedule_as_it_ran(schedule):
    """`RankReport.pipeline`, read from a stage's marks: its actions in the order the schedule gives
    (`theory.pipeline.schedule`), each forward before its backward, and the most micro-batches it
    held at once == `theory.pipeline.in_flight` (GPipe: all m; 1F1B: p - stage). With an emulated
    device (--emulate) every action lasts at least its length (the idle share is timed in
    benchmarks/bench_pipeline.py, not asserted)."""
    from zeroedu.theory.pipeline import in_flight, schedule as plan
    from zeroedu.train.launch import run

    p, m = 2, 4
    r = run(RunConfig("zero1", p, steps=2, model="gpt-tiny", recipe="fp32", pp=p, micro_batches=m, schedule=schedule,
                      emulate=(0.02, 0.04)))
    assert r.match.all() and r.emulate == [0.02, 0.04]
    for rk in r.ranks:
        w = rk.pipeline
        assert w.stage == rk.rank and w.layers == [rk.rank, rk.rank + 1]
        assert [(what, micro) for what, micro, _, _ in sorted(w.work, key=lambda a: a[2])] == plan(schedule, p, m, w.stage)
        assert w.in_flight == w.predicted_in_flight == in_flight(schedule, p, m, w.stage)
        assert all(end - start >= (0.02 if what == "F" else 0.04) for what, _, start, end in w.work)
