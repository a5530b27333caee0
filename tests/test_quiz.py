"""Interview deck, drills and `zeroedu quiz`. Figures are checked against zeroedu.theory and the
ZeRO paper's own worked example; the CLI is driven through stdin in a subprocess."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from zeroedu import catalog, theory
from zeroedu.cli import build_parser
from zeroedu.quiz import deck, drills, session
from zeroedu.quiz.deck import CARDS, HARD_CODED, PAPER_FIG1

ROOT = Path(__file__).resolve().parents[1]

# The questions of the two seed interview cards (000 and 004), by card id.
SEED_QUESTIONS = {
    "ddp_overlap": "DDP overlap", "zero_stages": "ZeRO stages", "fsdp_how": "torch FSDP",
    "zero3_comm": "ZeRO-3 vs DDP", "megatron_level": "distributed optimizer level",
    "zero1_vs_zero2_comm": "ZeRO-1 vs ZeRO-2 + gap", "fsdp_hide_comm": "FSDP hides comm",
    "fsdp1_vs_fsdp2": "FSDP1 vs FSDP2", "hybrid_sharding": "hybrid across nodes",
    "fsdp_linear": "hand-written FSDP linear", "mfsdp_v2": "Megatron-FSDP v2",
    "nvlink_levels": "levels inside/across NVLink", "own_optimizer": "its own optimizer",
}


def test_deck_covers_seed_questions():
    assert set(SEED_QUESTIONS) <= set(deck.BY_ID)


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.id)
def test_card_is_complete(card):
    assert card.question.strip() and card.answer.strip() and card.must_hit
    assert re.search(r"[\u4e00-\u9fff]", card.question_zh), "Chinese question"
    assert card.evidence, "every card says where it is proved"
    assert card.topic in deck.TOPICS


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.id)
def test_no_hard_coded_figures(card):
    for t in card.templates():
        assert not HARD_CODED.findall(t), f"{card.id}: write figures as {{name}} -> theory call"
    card.rendered_answer()  # every placeholder resolves
    card.rendered_follow_ups()
    used = set(re.findall(r"{(\w+)}", " ".join(card.templates())))
    assert used == set(card.figures), "no unused or undefined figures"


@pytest.mark.parametrize("card", [c for c in CARDS if c.figures], ids=lambda c: c.id)
def test_every_quoted_figure_is_theory_output(card):
    """Each 'N GB' / 'N×' / 'N ms' in the rendered text is one of the card's figures, and that
    figure's shown value equals the theory's output."""
    text = " ".join([card.rendered_answer()] + [t for qa in card.rendered_follow_ups() for t in qa])
    shown = {f.text() for f in card.figures.values()}
    for m in re.finditer(r"\d+(?:\.\d+)?\s*(?:GB|ms|×(?!\s*\d)|bytes)(?![\w])", text):
        assert m.group(0) in shown or m.group(0).endswith("bytes"), m.group(0)
    for name, f in card.figures.items():
        assert f.expr.split("(")[0].split(".")[0] in deck.NAMESPACE or f.expr == "80e9", f.expr
        assert abs(float(f.text().split()[0].rstrip("×")) - float(f.value()) / f.scale) \
            <= 1e-3 * abs(float(f.value()) / f.scale), name


def test_headline_figures_against_the_closed_forms():
    """The figures interviews quote, written out from ZeRO §5.1 by hand, against the cards."""
    psi, n, gb = 7e9, 8, 1e9
    z = deck.get_card("zero_stages").figures
    assert z["ddp"].shown() == 16 * psi / gb == 112
    assert z["z1"].shown() == (4 * psi + 12 * psi / n) / gb == 38.5
    assert z["z2"].shown() == (2 * psi + 14 * psi / n) / gb == 26.25
    assert z["z3"].shown() == 16 * psi / n / gb == 14
    assert deck.get_card("megatron_level").figures["dist"].shown() == (6 * psi + 12 * psi / n) / gb == 52.5
    assert deck.get_card("zero3_comm").figures["ratio"].shown() == 1.5
    assert deck.get_card("mfsdp_v2").figures["hfsdp"].shown() == (4 * psi / 8 + 12 * psi / 16) / gb == 8.75


def test_theory_reproduces_zero_paper_figure_1():
    # ZeRO paper Fig. 1: Ψ = 7.5B, N = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB (rounded to 0.1)
    for strategy, printed in PAPER_FIG1.items():
        got = float(theory.model_states(strategy, 7.5e9, 64).total) / 1e9
        assert round(got, 1) == printed, (strategy, got)


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.id)
def test_own_answer_hits_every_point(card):
    hit, total, missed = card.score(card.rendered_answer())
    assert hit == total, [p.text for p in missed]
    assert card.score("")[0] == 0


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.id)
def test_evidence_targets_exist(card):
    for e in card.evidence:
        if e.kind in ("module", "notebook"):
            assert (ROOT / e.target).exists() or e.target.startswith("notebooks/"), e.target
        if e.kind == "notebook" and (ROOT / e.target).exists():
            assert e.detail in (ROOT / e.target).read_text(), f"{e.target} has no section {e.detail!r}"
        if e.kind == "run":
            args = build_parser().parse_args(e.target.split()[1:])
            catalog.get_spec(args.strategy)
        if e.kind == "lab":
            from zeroedu.labs import LABS
            assert any(e.target == lab.file[:-3] for lab in LABS.values()), e.target


# ------------------------------------------------------------------ drills
def test_drills_are_reproducible_and_vary():
    a, b = drills.draw_drills(20, seed=5), drills.draw_drills(20, seed=5)
    assert a == b and a != drills.draw_drills(20, seed=6)
    assert {d.kind for d in a} == set(drills.KINDS)
    assert all(d.strategy in drills.TOPIC_STRATEGIES["hybrid"] for d in drills.draw_drills(10, 1, "hybrid"))


@pytest.mark.parametrize("seed", range(40))
def test_drill_grading_uses_theory(seed):
    d = drills.draw_drills(1, seed=seed)[0]
    if d.kind == "fits":
        total = theory.model_states(d.strategy, d.psi, d.n, d.m, d.recipe).total
        assert d.expected() == (total <= drills.GPU_BYTES)
        assert d.grade("yes" if d.expected() else "no")[0]
        assert not d.grade("no" if d.expected() else "yes")[0]
        return
    exp = float(d.expected())
    assert d.grade(f"{exp / 1e9 * 1.005} GB")[0]  # within 1 %
    assert d.grade(f"{exp:.6e}")[0]  # bytes
    assert not d.grade(f"{exp / 1e9 * 1.03}")[0]
    assert d.worked().splitlines()[-1].endswith(drills.gb(exp))


def test_worked_solution_substitutes_numbers():
    d = drills.Drill("bytes", "zero2", 7e9, 8, 1, "mixed-bf16")
    w = d.worked()
    assert "2 × 7e9 = 14 GB" in w and "2 × 7e9 / 8 = 1.75 GB" in w and "12 × 7e9 / 8 = 10.5 GB" in w
    assert w.endswith("total = 26.25 GB")
    c = drills.Drill("comm", "fsdp1", 7e9, 8, 1, "mixed-bf16").worked()
    assert c.count("(8-1)/8 × 14 GB = 12.25 GB") == 3 and c.endswith("total = 36.75 GB")


@pytest.mark.parametrize("text,value", [("38.5", 38.5e9), ("38.5 GB", 38.5e9), ("38500 MB", 38.5e9),
                                        ("3.85e10", 3.85e10), ("1,000,000", 1e6), ("abc", None), ("", None)])
def test_parse_bytes(text, value):
    assert drills.parse_bytes(text) == value


# ------------------------------------------------------------------ the session and the CLI
def _answers(s) -> str:
    lines = [c.rendered_answer() for c in s.cards] + [d.expected_text() for d in s.drills]
    return "\n".join(lines) + "\n"


def _quiz(args, stdin):
    return subprocess.run([sys.executable, "-m", "zeroedu", "quiz", *args], input=stdin, text=True,
                          capture_output=True, timeout=60, cwd=ROOT)


def test_cli_full_score_with_correct_answers():
    s = session.build(None, seed=3, n_drills=4, n_cards=2)
    total = sum(len(c.must_hit) for c in s.cards) + len(s.drills)
    p = _quiz(["--seed", "3", "--drills", "4", "--cards", "2"], _answers(s))
    assert p.returncode == 0, p.stderr
    assert f"Session score: {total}/{total} (100%)" in p.stdout
    assert "✗" not in p.stdout


def test_cli_wrong_answers_show_worked_solution():
    s = session.build("zero", seed=1, n_drills=3, n_cards=1)
    p = _quiz(["--topic", "zero", "--seed", "1", "--drills", "3", "--cards", "1"], "no idea\n0\n0\n0\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("✗") == 3 and p.stdout.count("worked solution:") == 3
    for d in s.drills:
        assert d.worked().splitlines()[-1].strip() in p.stdout
    assert "missed:" in p.stdout and "30-second answer:" in p.stdout
    assert "Session score: 0/" in p.stdout


def test_cli_eof_ends_gracefully():
    p = _quiz(["--seed", "0"], "")
    assert p.returncode == 0 and "end of input" in p.stdout and "Session score: 0/0" in p.stdout
    assert "Traceback" not in p.stderr


def test_cli_list_and_bad_topic():
    p = _quiz(["--list", "--topic", "hybrid"], "")
    assert p.returncode == 0 and "mfsdp_v2" in p.stdout and "theory.model_states('hfsdp'" in p.stdout
    p = _quiz(["--topic", "nope"], "")
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_session_in_process():
    import io

    s = session.build("megatron", seed=0, n_drills=1, n_cards=1)
    s.inp, s.out = io.StringIO(_answers(s)), io.StringIO()
    score = s.run()
    assert score.points == score.total > 0


def test_widgets_grade_like_the_terminal():
    from zeroedu.quiz.widget import CardViewer, DrillTrainer

    t = DrillTrainer(seed=2)
    assert t.check(t.drill.expected_text())
    assert t.drill.worked().splitlines()[-1].strip()[:10] in t.feedback.value
    assert not DrillTrainer(seed=2).check("nonsense")
    v = CardViewer(topic="fsdp")
    v.answer.value = ""
    assert v.reveal()[0] == 0 and "missed:" in v.out.value
