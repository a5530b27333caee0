"""The interview deck is data: every card lives in a YAML file of `zeroedu/quiz/cards/`, its figures
are named functions (`zeroedu.quiz.figures`) called with the file's arguments, and nothing in
`zeroedu/quiz` evaluates a string."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from zeroedu.quiz import deck, figures

pytestmark = pytest.mark.fast

QUIZ = Path(deck.__file__).parent


def test_every_card_lives_in_a_data_file():
    in_files = [c["id"] for p in sorted(deck.CARDS_DIR.glob("*.yaml"))
                for c in yaml.safe_load(p.read_text(encoding="utf-8"))["cards"]]
    assert in_files == [c.id for c in deck.CARDS] and len(in_files) >= 31
    # each topic's file names its topic, and its cards carry it
    for p in deck.CARDS_DIR.glob("*.yaml"):
        topic = yaml.safe_load(p.read_text(encoding="utf-8"))["topic"]
        assert p.stem.split("_", 1)[1] == topic
    assert set(deck.TOPICS) == {c.topic for c in deck.CARDS}


def test_nothing_in_the_quiz_evaluates_a_string():
    for path in QUIZ.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec", "compile"), f"{path.name}: {node.func.id}"


def test_every_figure_is_a_named_function_and_the_computed_ones_use_the_theory():
    for card in deck.CARDS:
        for name, f in card.figures.items():
            assert f.fn in figures.FIGURES, (card.id, name)
            assert (f.fn == "given") == f.input, (card.id, name)  # typed values are assumptions, marked


def test_a_card_written_as_the_guide_says_loads_and_grades(tmp_path):
    (tmp_path / "01_zero.yaml").write_text("""
topic: zero
cards:
- id: my_card
  question: ZeRO-1 at 7B on 8 GPUs?
  question_zh: 7B 模型 8 卡 ZeRO-1 每卡多少?
  answer: "{z1} per GPU."
  checks:
  - number: Model-state bytes per GPU with ZeRO-1, 7B, N = 8
    figure: z1
  - choice: What does ZeRO-1 shard?
    options: [the optimizer state, the activations]
    answer: a
  must_hit: [optimizer state sharded]
  follow_ups:
  - q: And ZeRO-2?
    a: The gradients too.
  figures:
    z1: {fn: model_states, strategy: zero1, psi: 7e9, n: 8}
  evidence: [{notebook: zero1, detail: The formula}]
""", encoding="utf-8")
    (card,) = deck.load_cards(tmp_path)
    assert card.rendered_answer() == "38.5 GB per GPU."  # "7e9" read as the number
    assert card.evidence[0].target == deck.NOTEBOOKS["zero1"]
    assert card.grade(["38.5 GB", "a"]).auto_points == 2


def test_a_card_with_an_unknown_key_or_figure_function_is_refused(tmp_path):
    base = {"id": "x", "question": "q", "question_zh": "问", "answer": "a",
            "checks": [{"term": "t", "accepted": ["t"]}], "must_hit": ["p"]}
    for bad, match in (({**base, "answr": "typo"}, "unknown keys"),
                       ({**base, "figures": {"f": {"fn": "open", "value": 1}}}, "unknown figure function")):
        (tmp_path / "01_t.yaml").write_text(yaml.safe_dump({"topic": "t", "cards": [bad]}), encoding="utf-8")
        with pytest.raises(ValueError, match=match):
            deck.load_cards(tmp_path)


def test_every_card_has_a_follow_up_and_a_check():
    """An interviewer's follow-up is where a candidate is found out: every card has one."""
    assert all(c.follow_ups and c.checks for c in deck.CARDS), [c.id for c in deck.CARDS if not c.follow_ups]


def test_every_card_names_a_misconception_and_a_wrong_pick_is_told_it():
    """A card's number checks anticipate named mistakes (`tests/test_mistakes.py` grades each);
    its choices may name the misconception behind a wrong option, and a learner who picks that
    option, in their own order of the options, is told it."""
    from zeroedu.answers import LETTERS
    from zeroedu.quiz.grading import Choice, Number

    for card in deck.CARDS:
        named = [c for c in card.checks if (isinstance(c, Number) and c.mistakes)
                 or (isinstance(c, Choice) and c.misconceptions)]
        assert named, f"{card.id} names no misconception"
        for seed in (0, 1, 7):
            mine = deck.for_learner(card, seed)
            for c in mine.checks:
                if isinstance(c, Choice):
                    for i, why in c.misconceptions:
                        r = c.grade(LETTERS[i])
                        assert not r.ok and why in r.note, (card.id, seed, i)
