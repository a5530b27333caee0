"""The planner's closed forms (`theory.planner`) against numbers their sources publish, its
refusals, and `zeroedu plan` itself."""
import pytest

from zeroedu.theory import pipeline as pipeline_theory
from zeroedu.theory import planner as P

pytestmark = pytest.mark.fast
GB = 1e9


def test_llama2_70b_has_the_parameter_count_of_its_published_weights():
    # Llama-2-70b's released checkpoint: 68,976,648,192 parameters ("70B")
    assert P.LLAMA2_70B.params() == 68_976_648_192


def test_zero_states_are_the_zero_papers_figure_1():
    # Rajbhandari et al. 2019, Fig. 1: Ψ = 7.5B, N = 64: 120, 31.4, 16.6 and 1.9 GB per GPU
    got = [round(float(P.states_bytes(7.5e9, 64, z)) / GB, 1) for z in (0, 1, 2, 3)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_training_time_is_narayanans_34_and_84_days():
    # Narayanan et al. 2021, §5.1: GPT-3 (175B) on 300B tokens, 1024 A100s at 140 TFLOP/s: 34 days;
    # the 1T model on 450B tokens, 3072 GPUs at 163 TFLOP/s: about 84 days
    assert round(P.training_days(300e9, 175e9, 1024, 140e12)) == 34
    assert round(P.training_days(450e9, 1e12, 3072, 163e12)) in (83, 84)


def test_model_flops_are_6_flops_per_parameter_and_token_plus_attention_and_logits():
    # 72·B·s·L·h² = 6 · (12·L·h²) · B·s: Kaplan et al. 2020's 6N per token for a layer's 12h² weights
    B, s, L, h, V = 8, 2048, 96, 12288, 51200
    body = 72 * B * s * L * h * h
    assert body == 6 * (12 * L * h * h) * B * s
    assert P.model_flops(B, s, L, h, V) == body + body * s / (6 * h) + body * V / (12 * L * h)


def test_the_bubble_is_narayanans_p_minus_1_over_m_of_the_ideal_step():
    # Narayanan et al. 2021 §2.2.1: bubble time / ideal time = (p-1)/m; as a share of the step
    for p, m in ((4, 8), (8, 32), (2, 1)):
        ratio = (p - 1) / m
        assert pipeline_theory.bubble_fraction(p, m) == pytest.approx(ratio / (1 + ratio))


@pytest.mark.parametrize("gpus,plan,why", [
    (256, P.Plan(16, 16, 1, 1, 1), "tp = 16 must divide the 64 heads and the 8 KV heads"),
    (128, P.Plan(64, 4, 1, 1, 1), "dp x tp x pp x cp = 256, not the 128 GPUs"),
    (256, P.Plan(32, 1, 8, 1, 4), "ZeRO levels are 0..3"),
    (256, P.Plan(8, 1, 32, 1, 1), "pp = 32 must divide the 80 layers"),
    (96, P.Plan(3, 8, 4, 1, 1), "global batch of 1024 sequences does not split over dp = 3"),
])
def test_plans_that_cannot_exist_are_refused_with_the_condition(gpus, plan, why):
    cluster = P.Cluster(gpus)
    got = P.refusal(P.LLAMA2_70B, cluster, plan, 1024)
    assert got is not None and why in got, got
    with pytest.raises(ValueError, match="must|levels|GPUs|split"):
        P.estimate(P.LLAMA2_70B, cluster, plan, 1024)
    # 80 layers do split over 16 stages of 5: that plan exists
    assert P.refusal(P.LLAMA2_70B, P.Cluster(256), P.Plan(2, 8, 16, 1, 1), 1024) is None


def test_tp_across_nodes_is_refused():
    assert "spans nodes" in P.refusal(P.LLAMA2_70B, P.Cluster(256, per_node=4), P.Plan(32, 8, 1, 1, 1), 1024)


def test_the_70b_plan_on_256_gpus_fits_and_is_ranked_by_its_terms():
    rep = P.plan()
    assert rep.ranked and rep.too_big > 0
    assert all(e.fits and e.memory <= 80e9 for e in rep.ranked)
    steps = [e.step for e in rep.ranked]
    assert steps == sorted(steps)
    best = rep.ranked[0]
    assert best.plan.tp <= 8 and best.plan.dp * best.plan.tp * best.plan.pp * best.plan.cp == 256
    # the step is its terms: compute at full occupancy, the bubble's idle time, exposed comm
    assert best.step == pytest.approx(sum(best.terms().values()))
    # DDP (ZeRO-0) of all 70B on one GPU's 80 GB cannot fit: 16 bytes per parameter
    ddp = P.estimate(P.LLAMA2_70B, P.Cluster(256), P.Plan(256, 1, 1, 1, 0), 1024)
    assert not ddp.fits and ddp.states == 16 * P.LLAMA2_70B.params()
    line = P.why_better(rep.ranked[0], rep.ranked[1])
    assert str(rep.ranked[1].plan) in line


def test_zero3_pays_its_gathers_every_micro_batch():
    # the same 256 GPUs as dp only: ZeRO-3 sends 3m·r, ZeRO-1 2r; with m = 4 micro-batches per rank
    e1 = P.estimate(P.LLAMA2_70B, P.Cluster(256), P.Plan(256, 1, 1, 1, 1), 1024)
    e3 = P.estimate(P.LLAMA2_70B, P.Cluster(256), P.Plan(256, 1, 1, 1, 3), 1024)
    assert e3.microbatches == 4 and e3.dp > e1.dp


def test_the_command_line_prints_the_ranking_and_refuses_a_plan():
    from .cli_inprocess import zeroedu

    r = zeroedu("plan", "--top", "3")
    assert r.returncode == 0 and "68,976,648,192 parameters" in r.stdout and "#1 dp" in r.stdout
    bad = zeroedu("plan", "--check", "16,16,1,1,1")
    assert bad.returncode == 2 and "must divide the 64 heads" in bad.stderr
    ok = zeroedu("plan", "--check", "8,8,4,1,1")
    assert ok.returncode == 0 and "fits" in ok.stdout


@pytest.mark.parametrize("answer,broken", [
    ("DP=256 TP=1 PP=1 stage 0", "fits in memory"),  # 16 bytes per parameter of all 70B on each GPU
    ("dp 16 tp 16 pp 1 zero 1", "tp inside a node"),
    ("tp=8 pp=16 dp=2 zero 1", "small bubble"),  # 15/143 = 10.5 % of the step
    ("dp 8 tp 8 pp 5 zero 1", "exists"),  # 320 GPUs
    ("tp 8 and pp 4", "a plan"),
])
def test_the_design_exercise_names_the_condition_a_wrong_plan_breaks(answer, broken):
    g = P.grade_design(answer)
    assert not g.ok and [c.name for c in g.broken()] == [broken], [(c.name, c.detail) for c in g.broken()]


@pytest.mark.parametrize("answer,plan", [
    ("dp 8, tp 8, pp 4, ZeRO-1", P.Plan(8, 8, 4, 1, 1)),
    ("dp=32 tp=8 pp=1 zero-1", P.Plan(32, 8, 1, 1, 1)),
    ("ZeRO stage 1 with tp 8, pp 4, dp 8", P.Plan(8, 8, 4, 1, 1)),
])
def test_good_designs_pass_however_they_are_written(answer, plan):
    g = P.grade_design(answer)
    assert g.ok and g.plan == plan


def test_the_design_command_says_which_condition_breaks():
    from .cli_inprocess import zeroedu

    r = zeroedu("plan", "--design", "tp=8 pp=16 dp=2 zero 1")
    assert r.returncode == 1 and "NO  small bubble: (pp - 1)/(m + pp - 1) = 15/143 = 10.5%" in r.stdout


def test_the_planner_widget_reranks_and_grades_the_design_as_typed():
    from zeroedu.notebook import widgets

    w = widgets.planner_widget()
    first = w.report.ranked[0]
    assert first == P.plan().ranked[0] and "<td>" in w.table.value and "#1 dp" in w.why.value
    w.gpus.value = 512  # re-ranked on the change: every plan now uses 512 GPUs
    assert all(e.plan.dp * e.plan.tp * e.plan.pp * e.plan.cp == 512 for e in w.report.ranked)
    w.hbm.value = 40  # less memory: fewer plans fit
    assert len(w.report.ranked) < len(P.plan(P.LLAMA2_70B, P.Cluster(512), 1024).ranked)
    w.answer.value = "tp=8 pp=16 dp=2 zero 1"
    g = w.grade()
    assert not g.ok and "small bubble" in w.verdict.value and "10.5%" in w.verdict.value
    w.answer.value = "dp 8, tp 8, pp 4, ZeRO-1"
    assert w.grade().ok and "a good plan" in w.verdict.value


# ------------------------------------------------------------------ optimizer offload and FP8
def test_offloaded_states_are_theory_offloads_and_offload_is_refused_without_zero():
    from zeroedu import theory

    psi, g = 8 * 10**9, 8
    for zero, strategy in ((1, "zero1"), (2, "zero2"), (3, "fsdp1")):
        device, host = P.offloaded_states_bytes(psi, g, zero)
        o = theory.offload(strategy, psi, g)  # checked against DeepSpeed's estimators
        assert (device, host) == (o["device"].total, o["host"].total), strategy
    assert "ZeRO-0 has none" in P.refusal(P.LLAMA2_70B, P.Cluster(256), P.Plan(32, 8, 1, 1, 0, offload=True), 1024)
    assert not any(e.plan.offload and e.plan.zero == 0 for e in P.plan(offload=(False, True)).ranked)


def test_offload_pays_where_memory_is_short_and_its_term_is_the_pcie_bytes_and_the_cpu_step():
    from zeroedu import theory

    cluster, batch = P.Cluster(16), 64
    plain = P.plan(P.LLAMA2_70B, cluster, batch)
    both = P.plan(P.LLAMA2_70B, cluster, batch, offload=(False, True))
    # 70B on 16 GPUs: without offload only ZeRO-3 plans with gathers every micro-batch fit
    assert all(e.plan.zero == 3 for e in plain.ranked) and plain.ranked[0].step > 30
    best = both.ranked[0]
    assert best.plan.offload and best.step < plain.ranked[0].step / 2
    # its term: the fp32 gradient partition down (behind backward), the CPU's Adam, the bf16 weights up
    pl = best.plan
    psi_r = P.LLAMA2_70B.params() / (pl.tp * pl.pp)
    g = pl.dp * pl.cp
    pcie = theory.offload_pcie_bytes("zero2", psi_r, g)
    expected = (max(0.0, pcie["down"] / cluster.pcie - 2 / 3 * best.compute)
                + P.CPU_ADAM_BYTES * psi_r / g / cluster.host_memory + pcie["up"] / cluster.pcie)
    assert best.offload == pytest.approx(expected) and best.host == pytest.approx(16 * psi_r / g)
    assert best.step == pytest.approx(sum(best.terms().values()))
    # the README quotes the pair
    from pathlib import Path

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert f"70B steps in {best.step:.0f} s with it and {plain.ranked[0].step:.0f} s without" in readme


def test_fp8_moves_the_linear_flops_to_the_fp8_peak_and_halves_what_it_stores_and_gathers():
    # NVIDIA's H100 SXM datasheet: dense FP8 1979 TFLOP/s, twice dense BF16's 989 (rounded)
    c = P.Cluster(256)
    assert round(c.fp8_flops / c.peak_flops) == 2
    model, batch = P.LLAMA2_70B, 1024
    bf16 = P.estimate(model, c, P.Plan(8, 8, 4, 1, 3), batch)
    fp8 = P.estimate(model, c, P.Plan(8, 8, 4, 1, 3, fp8=True), batch)
    L, h, s, V = model.layers, model.hidden, model.seq, model.vocab
    linear = 72 * batch * s * L * h * h
    rest = P.model_flops(batch, s, L, h, V) - linear
    rate = c.gpus * c.efficiency
    assert fp8.compute == pytest.approx(linear / (rate * c.fp8_flops) + float(rest) / (rate * c.peak_flops))
    assert fp8.compute < bf16.compute < 2 * fp8.compute
    # the saved linear inputs: 27 of Korthikanti's 34 sbh; ZeRO-3's two gathered layers, 1 byte not 2
    assert fp8.activations / bf16.activations == pytest.approx(27 / 34)
    assert bf16.states - fp8.states == pytest.approx(2 * model.layer_params() / 8)


def test_the_command_line_ranks_offload_and_fp8_plans():
    from .cli_inprocess import zeroedu

    r = zeroedu("plan", "--gpus", "16", "--global-batch", "64", "--offload", "--top", "3")
    assert r.returncode == 0 and "host GB" in r.stdout and "+ offload:" in r.stdout, r.stdout
    f = zeroedu("plan", "--fp8", "--top", "2")
    assert f.returncode == 0 and "FP8 linear layers at 1979 TFLOP/s" in f.stdout and ", FP8:" in f.stdout
    bad = zeroedu("plan", "--check", "32,8,1,1,0", "--offload")
    assert bad.returncode == 2 and "ZeRO-0 has none" in bad.stderr


def test_the_planner_widget_switches_offload_and_fp8():
    from zeroedu.notebook import widgets

    w = widgets.planner_widget(gpus=16, global_batch=256)
    plain = w.report
    assert not any(e.plan.offload for e in plain.ranked)
    w.offload.value = True  # re-ranked with the offloaded plans beside the others
    assert w.report == P.plan(P.LLAMA2_70B, w.cluster(), 256, offload=(False, True))
    assert w.report.ranked[0].plan.offload and "+ offload" in w.table.value and "offload ms" in w.table.value
    w.fp8.value = True
    assert all(e.plan.fp8 for e in w.report.ranked) and ", FP8" in w.why.value
