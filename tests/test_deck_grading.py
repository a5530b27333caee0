"""Card grading cannot be gamed (zeroedu.quiz.grading): keyword-stuffed text and wrong accounts
that use the right words score low on the auto-graded part, right answers in any reasonable
spelling score full marks, and the self-ticked must-hit points are reported apart."""
from __future__ import annotations

import itertools

import pytest

from zeroedu.quiz import deck
from zeroedu.quiz.deck import CARDS
from zeroedu.answers import LETTERS, normalize_term, parse_quantity
from zeroedu.quiz.grading import Choice, Number, Term, parse_ticks

pytestmark = pytest.mark.fast

LOW = 0.2  # a gamed answer may earn at most this share of a card's auto-graded points

STUFFED = [
    "if ddp shard all-reduce reduce-scatter optimizer state gradient parameter",
    "all-gather reduce-scatter all-reduce zero-1 zero-2 zero-3 fsdp hsdp bucket async overlap",
    "16 bytes 112 GB 38.5 GB 26.25 GB 14 GB 1.5x 3Ψ 2Ψ",
    "a b c d e",
    "yes",
]

# Wrong accounts that use the right vocabulary, one line per check, for the cards where the
# old keyword grader gave them most of the marks.
WRONG_ACCOUNTS = {
    # "stage 2 shards the weights too", the DDP figure for ZeRO-1, ZeRO-3's for ZeRO-2
    "zero_stages": ["gradients", "a,b,c", "12 bytes", "112 GB", "14 GB"],
    # the optimizer-ownership card: the old keyword grader gave "if ddp shard" 3/3
    "own_optimizer": ["if ddp shard"],
    "zero3_comm": ["all-reduce", "2x", "c", "24.5 GB", "1.5"],
    "megatron_level": ["ZeRO-2", "38.5 GB", "12.25 GB", "a,b,c"],
    "zero1_vs_zero2_comm": ["36.75 GB", "24.5 GB", "a", "a"],
    "ddp_overlap": ["reduce-scatter", "reduce-scatter", "a", "12.25 GB"],
    "fsdp_how": ["all-reduce", "b", "all-reduce", "a,b", "112 GB"],
    "hybrid_sharding": ["7 GB", "14 GB", "b", "a"],
    "zero_pp": ["d", "a", "2"],
    "grad_accumulation": ["a,b,c", "24.5 GB", "36.75 GB"],
    "grad_clipping": ["a", "c"],
    "fsdp_comm_bound": ["778 tokens", "81.67 ms", "a"],
    "activation_memory": ["0.2852 GB", "0.9563 GB", "0.9563 GB", "c", "a"],
    "offload": ["a,b,c", "1.75 GB", "3.5 GB"],
    "pp_zero": ["3", "6.125 GB", "b"],
    "meta_init": ["cpu", "b", "14 GB", "d"],
    "debug_hang": ["b", "NCCL_DEBUG=WARN", "b"],
}


def _fig(card, check):
    return card.figures.get(check.figure) if isinstance(check, Number) else None


# ------------------------------------------------------------------ the headline property
# Per-card checks (plain functions, each asserting for one card): tests/test_quiz.py::test_card
# runs all of them, content and grading, as one item per card.
def right_answers_score_full_marks(card):
    g = card.grade(card.model_responses())
    assert g.auto_points == g.auto_total == len(card.checks) >= 1


def keyword_stuffing_scores_low(card):
    for stuffed in STUFFED:
        g = card.grade([stuffed] * len(card.checks))
        assert g.auto_points <= LOW * g.auto_total, (stuffed, [r.line() for r in g.results if r.ok])


def the_model_answer_itself_is_not_an_answer_to_a_check(card):
    """Pasting the whole 30-second answer (every keyword and figure in it) into each check
    earns nothing: a check wants one number, letter or term."""
    g = card.grade([card.rendered_answer()] * len(card.checks))
    assert g.auto_points <= LOW * g.auto_total


@pytest.mark.parametrize("card_id", list(WRONG_ACCOUNTS))
def test_wrong_but_keyworded_accounts_score_low(card_id):
    card = deck.get_card(card_id)
    answers = WRONG_ACCOUNTS[card_id]
    assert len(answers) == len(card.checks)
    g = card.grade(answers)
    assert g.auto_points <= LOW * g.auto_total, [r.line() for r in g.results]


def every_wrong_option_and_every_superset_is_wrong(card):
    for i, c in enumerate(card.checks):
        if not isinstance(c, Choice):
            continue
        right = frozenset(c.answer)
        for k in range(1, len(c.options) + 1):
            for pick in itertools.combinations(range(len(c.options)), k):
                if frozenset(pick) != right:
                    assert not c.grade(c.letters(pick)).ok, (card.id, i, pick)
        assert not c.grade(" ".join(LETTERS[:len(c.options)])).ok


def wrong_numbers_are_wrong(card):
    """Off by a factor, or another figure of the deck (the classic mix-up: DDP's bytes for
    ZeRO-2's), is wrong; within 1 % is right."""
    others = {f.text() for c in CARDS for f in c.figures.values()}
    for c in card.checks:
        if not isinstance(c, Number):
            continue
        f = card.figures[c.figure]
        v = float(f.value()) / f.scale
        assert c.grade(f"{v * 1.009:.6g} {f.unit}".strip(), f).ok
        for wrong in (v * 2, v / 2, v * 1.5, v * 1.02, 0.0):
            assert not c.grade(f"{wrong:.6g}", f).ok, (card.id, c.figure, wrong)
        for text in others:
            parsed = parse_quantity(text, f.unit, f.scale)
            if parsed is not None and abs(parsed - float(f.value())) > 0.01 * abs(float(f.value())):
                assert not c.grade(text, f).ok, (card.id, c.figure, text)


def terms_need_the_whole_answer(card):
    for c in card.checks:
        if not isinstance(c, Term):
            continue
        for a in c.accepted:
            assert c.grade(a).ok and c.grade(a.upper()).ok and c.grade(f"  {a}. ").ok
            assert not c.grade(f"I think it is {a}").ok
            assert not c.grade(f"{a} or something else").ok
            assert not c.grade(f"x{a}x").ok


# Run on every card by tests/test_quiz.py::test_card (one item per card, every check of it).
GRADING_CHECKS = (right_answers_score_full_marks, keyword_stuffing_scores_low,
                  the_model_answer_itself_is_not_an_answer_to_a_check,
                  every_wrong_option_and_every_superset_is_wrong, wrong_numbers_are_wrong,
                  terms_need_the_whole_answer)


def test_every_card_has_an_auto_graded_check_of_each_available_kind_once_at_least():
    kinds = {type(c) for card in CARDS for c in card.checks}
    assert kinds == {Number, Choice, Term}
    assert sum(isinstance(c, Number) for card in CARDS for c in card.checks) >= 30


# ------------------------------------------------------------------ self-ticked, apart
def test_self_ticks_do_not_change_the_auto_score():
    card = deck.get_card("zero_stages")
    stuffed = card.grade([STUFFED[0]] * len(card.checks), ticked=range(len(card.must_hit)))
    assert stuffed.auto_points == 0 and stuffed.self_points == stuffed.tick_total == len(card.must_hit)
    right = card.grade(card.model_responses(), ticked=[])
    assert right.full_marks and right.self_points == 0
    assert right.missed_points == [p.text for p in card.must_hit]
    assert "auto-graded 5/5" in right.summary() and "self-ticked 0/5 (reported separately)" in right.summary()
    assert "self-ticked" not in card.grade(card.model_responses()).summary()  # not ticked yet
    with pytest.raises(ValueError):
        card.grade(card.model_responses(), ticked=[len(card.must_hit)])


@pytest.mark.parametrize("text,n,want", [("1,3", 4, (0, 2)), ("3 1", 4, (0, 2)), ("all", 3, (0, 1, 2)),
                                         ("none", 3, ()), ("", 3, ()), ("1, 1", 2, (0,)),
                                         ("5", 4, None), ("one", 4, None), ("1,x", 4, None)])
def test_parse_ticks(text, n, want):
    assert parse_ticks(text, n) == want


# ------------------------------------------------------------------ the readers
@pytest.mark.parametrize("text,unit,scale,want", [
    ("26.25", "GB", 1e9, 26.25e9), ("26.25 GB", "GB", 1e9, 26.25e9), ("26250 MB", "GB", 1e9, 26.25e9),
    ("~26.25gb", "GB", 1e9, 26.25e9), ("about 26.25 GB.", "GB", 1e9, 26.25e9), ("2.625e10 bytes", "GB", 1e9, 2.625e10),
    ("25 MiB", "MB", 1e6, 25 * 2 ** 20), ("1.5", "×", 1, 1.5), ("1.5x", "×", 1, 1.5), ("1.5×", "×", 1, 1.5),
    ("787.5", "ms", 1e-3, 0.7875), ("0.7875 s", "ms", 1e-3, 0.7875), ("7.5k", "tokens", 1, 7500),
    ("7,500 tokens", "tokens", 1, 7500), ("16", "bytes", 1, 16),
    ("26.25 ms", "GB", 1e9, None), ("14 26.25", "GB", 1e9, None), ("GB", "GB", 1e9, None),
    ("twenty", "GB", 1e9, 20e9), ("plenty", "GB", 1e9, None), ("", "GB", 1e9, None), ("1.5 GB", "×", 1, None),
])
def test_parse_quantity(text, unit, scale, want):
    got = parse_quantity(text, unit, scale)
    assert got == (pytest.approx(want) if want is not None else None)


def test_normalize_term_and_choice_reading():
    assert normalize_term("Reduce-Scatter") == normalize_term("reduce_scatter") == normalize_term(
        "the reduce scatter") == "reducescatter"
    c = Choice("q", ("all-reduce", "reduce-scatter", "all-gather"), (1,))
    for right in ("b", "B", "(b)", "b)", "reduce-scatter", "Reduce Scatter"):
        assert c.grade(right).ok, right
    for wrong in ("a", "b c", "b,c", "reduce-scatter all-gather", "bb", "d", ""):
        assert not c.grade(wrong).ok, wrong
    m = Choice("q", ("w", "x", "y", "z"), (0, 2))
    for right in ("a,c", "c,a", "a c", "a and c", "A + C"):
        assert m.grade(right).ok, right
    for wrong in ("a", "a,b,c", "a,c,d", "a b c d"):
        assert not m.grade(wrong).ok, wrong
    with pytest.raises(ValueError):
        Choice("q", ("only",), (0,))
    with pytest.raises(ValueError):
        Term("q", ("",))


# ------------------------------------------------------------------ options in each learner's order
def _positions(cards, k):
    """Positions of the right option among the single-answer choices with k options."""
    return [c.answer[0] for card in cards for c in card.checks
            if isinstance(c, Choice) and not c.multi and len(c.options) == k]


@pytest.mark.parametrize("learner", ["ada", "grace", "root", "a learner", "学生"])
def test_right_answers_sit_at_every_position_for_every_learner(learner):
    """For any learner, over the deck, the right option sits at each position within ±10
    points of 1/k (the deck's choices have four options but for a few), and the learner's own
    model responses still earn full marks."""
    from zeroedu.answers import learner_seed
    from zeroedu.quiz.deck import for_learner

    mine = [for_learner(c, learner_seed(learner)) for c in CARDS]
    pos = _positions(mine, 4)
    assert len(pos) >= 40
    for p in range(4):
        assert abs(pos.count(p) / len(pos) - 0.25) <= 0.10, (learner, p, pos.count(p), len(pos))
    for card, own in zip(CARDS, mine):
        assert own.grade(own.model_responses()).full_marks
        for c, o in zip(card.checks, own.checks):
            if isinstance(c, Choice):  # the same options and the same right ones, in another order
                assert sorted(c.options) == sorted(o.options)
                assert {c.options[i] for i in c.answer} == {o.options[i] for i in o.answer}


def test_learners_get_their_own_orders_and_keep_them():
    from zeroedu.answers import learner_seed
    from zeroedu.quiz.deck import for_learner

    a1 = [for_learner(c, learner_seed("ada")) for c in CARDS]
    a2 = [for_learner(c, learner_seed("ada")) for c in CARDS]
    b = [for_learner(c, learner_seed("grace")) for c in CARDS]
    assert _positions(a1, 4) == _positions(a2, 4) != _positions(b, 4)


def _longest_is_right(options, right) -> bool:
    """The right option is the one longest option (ties give nothing away)."""
    lengths = [len(o) for o in options]
    return lengths[right] == max(lengths) and lengths.count(max(lengths)) == 1


def test_the_longest_option_is_not_the_tell():
    """Over the deck's single-answer choices the right option is the longest no more often than
    1/k + 10 points (before: 32 of 50)."""
    choices = [(card, c) for card in CARDS for c in card.checks if isinstance(c, Choice) and not c.multi]
    longest = sum(_longest_is_right([card.render(o) for o in c.options], c.answer[0]) for card, c in choices)
    k = sum(len(c.options) for _, c in choices) / len(choices)
    assert longest / len(choices) <= 1 / k + 0.10, (longest, len(choices))
