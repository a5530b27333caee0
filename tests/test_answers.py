"""One reader of answers (`zeroedu.answers`) for the deck, the notebooks' exercises and the drills:
the natural forms a person writes are read, a list of guesses is not, and every grader uses it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zeroedu.answers import normalize_term, parse_quantity, read_choice, read_number
from zeroedu.notebook.exercises import check, get

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("text,unit,want", [
    ("3/2", None, 1.5), ("1.5×", None, 1.5), ("1.5x DDP's bytes", None, 1.5), ("1.5× DDP's bytes", None, 1.5),
    ("36.75 GB per rank", None, 36.75e9), ("36.75 GB per rank", "GB", 36.75e9), ("14e9 B", None, 14e9),
    ("about 14e9 bytes", None, 14e9), ("50 %", None, 0.5), ("3 / 2", "×", 1.5), ("7,500 tokens", "tokens", 7500),
])
def test_natural_forms_are_read(text, unit, want):
    assert parse_quantity(text, unit, 1e9 if unit == "GB" else 1) == pytest.approx(want)


@pytest.mark.parametrize("text", ["14 26.25", "1.5 DDP's bytes", "3/0", "twice", "GB", "36.75 GB 2"])
def test_guesses_and_words_are_not_numbers(text):
    assert parse_quantity(text) is None


def test_read_number_and_choice():
    assert read_number(3) == 3.0 and read_number("3/2") == 1.5 and read_number(True) is None
    assert read_choice("b", ["x", "y"]) == {1} and read_choice("Y", ["x", "y"]) == {1}
    assert read_choice(["zero1", "fsdp2"], ["ZeRO-1", "FSDP2", "DDP"], keys=["zero1", "fsdp2", "ddp"]) == {0, 1}
    assert read_choice([], ["x"]) == frozenset() and read_choice("b c", ["x", "y"]) is None
    assert normalize_term("The All-Gather") == "allgather"


def test_exercises_take_the_natural_forms():
    """A notebook exercise whose answer is in bytes accepts it with its unit; one whose answer is
    a ratio accepts a fraction."""
    check("02.4", "24 GB per GPU")  # 16 bytes x 1.5e9
    check("02.4", "24e9 B")
    with pytest.raises(AssertionError):
        check("02.4", "24 ms")
    with pytest.raises(AssertionError, match="off by a factor 0.5"):  # a wrong figure in words: by how much
        check("02.4", "12 GB per GPU")
    want = get("02.6").expected()
    check("02.6", get("02.6").options[want])  # the option's own text


@pytest.mark.parametrize("ex,answer", [("14.1", "all equal"), ("14.1", "they are all equal"),
                                       ("14.1", "all 4 the same"), ("02.6", "unchanged"),
                                       ("02.6", "they remain identical")])
def test_a_right_option_in_other_words_is_right(ex, answer):
    """'The same' said as equal, identical, unchanged or constant, and a small number in digits or
    in words, picks the option that says it."""
    check(ex, answer)


@pytest.mark.parametrize("ex,answer", [("14.1", "rank 3 is not equal to the others"), ("02.6", "unchanged or shrink")])
def test_sameness_words_do_not_pick_an_option_the_answer_contradicts(ex, answer):
    with pytest.raises(AssertionError):
        check(ex, answer)


def test_no_grader_reads_answers_its_own_way():
    """The deck, the exercises and the drills import `zeroedu.answers`; none of them defines
    its own number, term or choice reader."""
    root = Path(__file__).resolve().parents[1] / "zeroedu"
    for rel in ("quiz/grading.py", "notebook/exercises/__init__.py", "quiz/drills.py"):
        tree = ast.parse((root / rel).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("answers")
                    for a in n.names}
        assert imported, rel
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert not defined & {"parse_quantity", "normalize_term", "_norm", "unit_family", "read_choice"}, rel


# ------------------------------------------------------------------ natural forms of right answers
def _grade(card_id: str, i: int, answer: str):
    from zeroedu.quiz import deck
    from zeroedu.quiz.grading import Number

    card = deck.get_card(card_id)
    check = card.checks[i]
    return check.grade(answer, card.figure(check.figure) if isinstance(check, Number) else None)


# Right answers as a person says them (the ten an interview rehearsal tried; four passed before).
NATURAL = [
    ("zero3_comm", 1, "1.5 times"), ("zero3_comm", 1, "1.5x"), ("zero3_comm", 1, "50 % more"),
    ("zero3_comm", 1, "3/2"),
    ("megatron_level", 0, "ZeRO stage one"), ("megatron_level", 0, "stage 1"),
    ("meta_init", 0, 'device="meta"'), ("meta_init", 0, "torch.device('meta')"),
    ("zero_stages", 3, "38,500,000,000"), ("zero_stages", 3, "35.86 GiB"),
    ("ddp_overlap", 2, "as soon as its gradients are ready"),
    ("zero_stages", 1, "optimizer state and gradients"),
    # numbers in words, a ratio as a percentage of its base, units spelled out: each on three cards
    ("nvlink_levels", 0, "nine times"), ("zero3_comm", 1, "one and a half times"), ("zero_pp", 2, "four"),
    ("ring_allreduce", 0, "twenty-four and a half GB"),
    ("zero3_comm", 1, "150 %"), ("nccl_busbw", 0, "175% of the algorithm bandwidth"), ("cp_zigzag", 0, "400 percent"),
    ("zero_stages", 3, "38.5 gigabytes"), ("fsdp_comm_bound", 1, "787.5 milliseconds"),
    ("alpha_beta", 0, "2 megabytes"), ("pp_bubble", 0, "27.27 percent"),
]


@pytest.mark.parametrize("card_id,i,answer", NATURAL)
def test_right_answers_in_natural_form_are_accepted(card_id, i, answer):
    r = _grade(card_id, i, answer)
    assert r.ok, (answer, r.line())


# Wrong answers: rejected, and named where a misconception produces them.
WRONG = [
    ("zero3_comm", 1, "2", "double"),                  # the "2x" myth the card's follow-up is about
    ("zero_stages", 2, "12", "fp32 master"),           # mixed-precision Adam without its master copy
    ("zero_stages", 3, "38", "off by"),                # 38 GB, not 38.5: within no tolerance
    ("zero_stages", 3, "385,000,000", "off by"),       # bytes, a factor 100 off
    ("megatron_level", 0, "ZeRO stage two", ""),
    ("meta_init", 0, 'device="cuda"', ""),
    ("ddp_overlap", 2, "after the whole backward pass", ""),
    ("zero_stages", 1, "optimizer state", ""),          # pick-all: one of the two
    ("zero_stages", 1, "optimizer state, gradients and weights", ""),
    ("zero3_comm", 1, "200 %", "double"),              # the myth, as a percentage of DDP's bytes
    ("zero3_comm", 1, "two times", "double"),          # and in words
    ("zero_stages", 2, "twelve bytes", "fp32 master"),
    ("zero_stages", 3, "38 gigabytes", "off by"),
]


@pytest.mark.parametrize("card_id,i,answer,named", WRONG)
def test_wrong_answers_are_rejected_and_named(card_id, i, answer, named):
    r = _grade(card_id, i, answer)
    assert not r.ok and named in r.note, (answer, r.line())


MISCONCEPTION_FOLLOW_UPS = {"zero_stages", "zero3_comm", "megatron_level", "ring_allreduce", "grad_accumulation",
                            "zero_equivalence", "fsdp_linear"}


def test_each_follow_up_about_a_misconception_is_a_named_mistake_of_its_checks():
    """A follow-up that asks about a misconception (the "double", the 12 bytes, ...) names the
    mistake; answering a check of the card with that mistake's figure gets its diagnosis."""
    from zeroedu.quiz import deck
    from zeroedu.quiz.grading import Number

    annotated = {c.id for c in deck.cards() if c.follow_up_mistakes}
    assert MISCONCEPTION_FOLLOW_UPS <= annotated
    from zeroedu.answers import LETTERS

    for card in deck.cards():
        for q, name in card.follow_up_mistakes.items():
            if name.startswith("choice "):  # a choice's option that the misconception picks
                _, i, letter = name.split()
                check = card.checks[int(i)]
                why = dict(check.misconceptions)[LETTERS.index(letter)]
                r = check.grade(letter)
                assert not r.ok and why in r.note, (card.id, q, r.line())
                continue
            hits = []
            for check in card.checks:
                if not isinstance(check, Number):
                    continue
                fig = card.figure(check.figure)
                for made in check.mistakes:
                    m = made()
                    if m.name == name:
                        answer = f"{m.value / fig.scale:.10g} {fig.unit}".strip()
                        r = check.grade(answer, fig)
                        hits.append(not r.ok and m.why in r.note)
            assert hits and all(hits), (card.id, q, name)
