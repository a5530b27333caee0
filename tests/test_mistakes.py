"""Known mistakes as named closed forms (`zeroedu.theory.mistakes`): each computes the figure one
misconception gives, by hand here, and an exercise that anticipates it names it when a learner
gives exactly that figure."""
from __future__ import annotations

import pytest

from zeroedu.notebook.exercises import all_exercises, check
from zeroedu.quiz import deck
from zeroedu.quiz.grading import Number

from tests.test_exercises import _context
from zeroedu.theory import mistakes as M

pytestmark = pytest.mark.fast

PSI, N = 13e9, 16
# (the mistake, its figure worked by hand, a word its message must hold)
CASES = [
    (M.other_stage_states("zero1", "ddp", PSI, N), 16 * PSI, "ddp"),  # DDP's replica for ZeRO-1
    (M.other_stage_states("zero2", "fsdp1", 30e9, 64), 16 * 30e9 / 64, "fsdp1"),
    (M.only_optimizer_shard("zero1", PSI, N), 12 * PSI / N, "optimizer state alone"),
    (M.missing_gradients("zero2", 30e9, 64), 2 * 30e9 + 12 * 30e9 / 64, "gradients are missing"),
    (M.ring_factor_dropped("ddp", 1.5e9, 16), 2 * 1.5e9 * 2, "(N-1)/N"),  # a whole all-reduce per rank
    (M.allreduce_counted_once("ddp", 1.5e9, 16), 15 / 16 * 1.5e9 * 2, "two passes"),
    (M.other_stage_comm("zero1_allreduce", "zero1", PSI, N), 2 * 15 / 16 * PSI * 2, "zero1"),
    (M.fp32_gradients("ddp", 1.5e9, 16), 2 * 15 / 16 * 1.5e9 * 4, "bf16"),
    (M.whole_buffer_sent("all_reduce", 1e9, 8), 2e9, "N-1 of the N chunks"),
    (M.whole_buffer_sent("all_gather", 1e9, 8), 1e9, "N-1 of the N chunks"),
    (M.one_pass_of_allreduce(1e9, 8), 7 / 8 * 1e9, "one half of the ring"),
    (M.allreduce_for("all_gather", 1e9, 8), 2 * 7 / 8 * 1e9, "an all-gather is one pass"),
    (M.elements_for_bytes(12e6, 4), 3e6, "4 bytes"),
    (M.optimizer_forgotten("ddp", 1.5e9, 8), 4 * 1.5e9, "optimizer state is missing"),
    (M.optimizer_forgotten("megatron_distopt", PSI, N), 6 * PSI, "optimizer state is missing"),  # fp32 grads
    (M.parameters_only("zero2", 30e9, 64), 2 * 30e9, "parameters alone"),
    (M.other_recompute("none", "selective", 2048, 1, 12288, 96), 34 * 2048 * 12288, "selective"),
    (M.other_recompute("selective", "full", 4096, 1, 4096, 32, layers=32), 32 * 2 * 4096 * 4096, "full"),
    (M.one_layer_only(4096, 1, 4096, 32, "selective", 32), 34 * 4096 * 4096, "32"),
    (M.scale_inverted(0.002), 0.002 / 448, "amax / max"),
    (M.other_fp8_format(0.002), 57344 / 0.002, "E5M2"),
    (M.block_as_reserved(5_000_000), 9766 * 512, "whole segment"),
    (M.large_rounding_everywhere(5_000_000), 3 * 2**21, "20 MiB"),
    (M.root_of_every_parameter(7e9, 8), 4 * 7e9, "Ψ/8"),  # foreach's roots for the whole model
    (M.for_loop_temporaries(7e9, 8), 2 * 4 * 7e9 / 8, "foreach makes one root"),
    (M.even_split(10, 4), 2.5, "whole rows"),  # 10 rows on 4 ranks: chunks of 3, 3, 3, 1
    (M.full_chunk_everywhere(10, 4), 3, "last rank"),
    (M.floor_rows(10, 4), 2, "no owner"),
    (M.unpadded_buffer(10, 4, per_row=4), 40, "padded"),
    (M.one_padded_chunk(10, 4, per_row=4), 12, "N of them"),
    # a figure read off a report
    (M.sign_flipped(3_000), -3_000, "the sign"),
    (M.upside_down(1.5), 2 / 3, "upside down"),
    (M.complement(0.25), 0.75, "everything else"),
    (M.part_over_rest(0.25), 1 / 3, "the rest"),
    (M.assumed_equal("difference"), 0, "not the same"),
    (M.assumed_equal("ratio"), 1, "not the same"),
    (M.framing_left_out(1_000), 1_000, "framing"),
    (M.framing_not_subtracted(1_144), 1_144, "take the payload away"),
    (M.one_part_only({"all_gather": 10, "reduce_scatter": 20}, "reduce_scatter"), 20, "reduce_scatter alone"),
    (M.own_shard_forgotten(4_000), 4_000, "1/N shard"),
    (M.not_per_parameter(17_831_462), 17_831_462, "divide by Ψ"),
    (M.kept_for_saved(640), 640, "keeps, not what it saves"),
    (M.nothing_kept(6_400), 6_400, "still keeps"),
    (M.other_mode(0, "resharding after forward"), 0, "resharding after forward"),
    (M.transient_forgotten(16 * 7e9 / 8, 2 * 7e9), 14e9 + 2 * 7e9, "transient"),
    # counting per step
    (M.once_per_micro_batch(6, 4), 24, "4 micro-batches"),
    (M.split_over_micro_batches(1, 4), 0.25, "does not shrink"),
    (M.per_step_not_per_unit(6, 6), 1, "6 units"),
    (M.per_unit_for_per_parameter(6), 18, "per unit"),
    (M.one_per_parameter(54), 54, "gathered twice"),
    (M.messages_for_collectives(162, 3), 324, "point-to-point"),
    # how bytes scale, one collective on a ring
    (M.doubles_with_n(2, 4), 2, "proportion to N"),
    (M.shrinks_with_n(2, 4), 0.5, "shard shrinks"),
    (M.one_over_m(4), 0.25, "1/M"),
    (M.naive_root_sends(1e9, 8), 7e9, "gather-then-broadcast"),
    (M.one_chunk_only(1e9, 8), 0.125e9, "one chunk"),
    # ZeRO-2 sends a bf16 reduce-scatter and a bf16 all-gather of Ψ: half each
    (M.ring_model_share("reduce_scatter", "zero2", 7e9, 8), 0.5, "ring model"),
    # Megatron's distributed optimizer: fp32 reduce-scatter (4 B) against a bf16 all-gather (2 B)
    (M.ring_model_share("reduce_scatter", "megatron_distopt", PSI, N), 2 / 3, "ring model"),
    # time on a link: 2 s busy over 100 all-reduces; α = 50 µs at N = 2; S = 10 MB, a = 4 ms, T_b = 0.25 s
    (M.bytes_time_kept(2.0, 100), 0.02, "S·r"),
    (M.latency_alone(50e-6, 2), 100e-6, "latency"),
    (M.bytes_time_ignored(10e6, 4e-3, 0.25), 160e3, "T_b - S·r"),
    # solving for N or M
    (M.off_by_one(7), 6, "one off"),
    (M.power_of_two_habit(5), 8, "power of two"),
    (M.power_of_two_habit(8), 8, "power of two"),
    (M.optimizer_over_m_only(13e9, 8, 4), 4 * 13e9 / 8 + 12 * 13e9 / 4, "N·M ways"),
    (M.elements_ratio(3, 2), 1.5, "elements"),
    (M.heads_alone(2048, 1, 12288, 96), 2048 * 12288 * (34 + 5 * 96), "s over h"),
    (M.all_sharded("megatron_distopt", PSI, N), 18 * PSI / N, "only ZeRO-3"),
    (M.large_n_limit("zero2", 7e9), 2 * 7e9, "limit of large N"),  # the bf16 weights stay whole
    (M.baseline_forgotten(4 * PSI), 4 * PSI, "already holds"),
    (M.whole_for_shard(0.875e9, 8), 7e9, "1/N shard"),
    (M.other_recipe_bytes("megatron-bf16", "mixed-bf16"), 2 + 2 + 12, "mixed-bf16"),
    (M.forward_flops_only(0.7875, 7e9, 400e12), 0.7875 * 400e12 / (2 * 7e9), "6Ψ"),
    # equal terms (e = 1/2) with one α per collective: α = 2(N-1)/N · S/β, S = N·α·β / (2(N-1))
    (M.one_latency_per_collective(8, 50e9, 5e-6, 0.5), 8 * 5e-6 * 50e9 / 14, "2(N-1) steps"),
    # mixed-bf16 without its fp32 master: 2 + 2 + 8; ZeRO-3 over DDP with gathers as all-reduces
    (M.master_forgotten("mixed-bf16"), 2 + 2 + 8, "fp32 master"),
    (M.gathers_counted_as_allreduces(7e9, 8), 2.0, "double"),
    # pipelines: p = 4 stages, m = 8 micro-batches; (p-1)/(m+p-1) = 3/11 is right
    (M.bubble_over_busy(4, 8), 3 / 8, "slots long"),
    # context parallelism: b = 1 x 8 x 16384 x 128 x 2; cp = 8 hops instead of 7
    (M.ring_hops_all(1, 8, 131072, 128, 8, 2), 16 * 8 * 16384 * 128 * 2, "never travels"),
    # the last rank (4 blocks) over the mean (1 + 2 + 3 + 4) / 4 = 2.5
    (M.imbalance_vs_mean(4), 4 / 2.5, "mean"),
    # counting kept scores only: the last rank's 3 full blocks + half its diagonal over the first's half
    (M.masked_scores_only(4), 3.5 / 0.5, "computed whole"),
    # a top-2 figure halved
    (M.top_k_forgotten(2560, 2), 1280, "k = 2"),
    # expert parallelism: rank 0 routed 96 rows, 55 to its own experts: 41 cross
    (M.home_rows_counted(96), 96, "never leave"),
    (M.home_rows_only(55), 55, "stay"),
    # tensor parallelism: 2 of 4 all-reduces; 34sbh/t where sbh(10 + 24/t) was asked
    (M.tp_forward_only(469762048), 234881024, "4 per layer"),
    (M.tp_splits_everything(4096, 1, 8192, 8), 34 * 4096 * 8192 / 8, "10sbh"),
    # 8 x 69e9 x 1000 / 989e12 counts the recomputed forward; one head's 4096^2 bf16 scores
    (M.recompute_in_mfu(1000, 69e9, 989e12), 8 * 69e9 * 1000 / 989e12, "HFU"),
    (M.one_head_scores(1, 4096, 2), 4096 ** 2 * 2, "every head"),
]


@pytest.mark.parametrize("mistake,want,word", CASES, ids=[c[0].name + str(i) for i, c in enumerate(CASES)])
def test_each_mistake_computes_its_figure(mistake, want, word):
    assert mistake.value == pytest.approx(want, rel=1e-12)
    assert word in mistake.why


def _deck_mistakes():
    """(card, number check, its figure, the mistake made) over the interview deck."""
    for card in deck.CARDS:
        for c in card.checks:
            if isinstance(c, Number):
                for made in c.mistakes:
                    yield card, c, card.figures[c.figure], made()


def test_every_named_mistake_is_anticipated_somewhere_and_named_there():
    """Each named mistake is an anticipated wrong answer of at least one exercise or card, and
    giving its figure there (computed on the exercise's example run) gets the diagnosis, not "off
    by a factor"."""
    used = {}
    for ex in all_exercises():
        for w in ex.wrong:
            if w.mistake:
                used.setdefault(w.mistake, []).append((ex, w))
    in_deck = {m.name for *_, m in _deck_mistakes()}
    assert set(used) | in_deck == {f.__name__ for f in M.MISTAKES}
    for name, pairs in used.items():
        for ex, w in pairs:
            ctx = _context(ex)
            with pytest.raises(AssertionError) as ei:
                check(ex.id, w.resolve(ctx), **ctx)
            assert w.why in str(ei.value) and "off by a factor" not in str(ei.value), (name, ex.id)


def test_every_anticipated_wrong_number_is_a_named_mistake():
    """A numeric exercise's anticipated wrong answers are all computed by a named mistake (a
    function of `theory.mistakes`), never a bare figure with a message."""
    names = {f.__name__ for f in M.MISTAKES}
    bare = [(ex.id, w.why[:50]) for ex in all_exercises() if ex.kind == "number"
            for w in ex.wrong if w.mistake not in names]
    assert not bare


def test_every_mistake_function_has_a_case_here():
    assert {m.name for m, _, _ in CASES} == {f.__name__ for f in M.MISTAKES}


def test_every_number_check_of_the_deck_names_a_misconception():
    """Each card's number checks anticipate at least one known mistake, and an answer equal to
    the mistake's figure, written in the check's unit, is told that mistake, not "off by 40 %"."""
    numbers = [(card.id, c) for card in deck.CARDS for c in card.checks if isinstance(c, Number)]
    assert len(numbers) >= 40 and all(c.mistakes for _, c in numbers), [i for i, c in numbers if not c.mistakes]
    for card, check, fig, made in _deck_mistakes():
        r = check.grade(f"{made.value / fig.scale:.12g} {fig.unit}", fig)
        assert not r.ok and r.note == made.why, (card.id, check.figure, made.name, r)
        assert made.name in {f.__name__ for f in M.MISTAKES}
