"""Interview cards: the data-parallel questions interviewers ask, answered in 30 seconds.

Each card holds the question in English and Chinese, a 30-second model answer, the *checks*
that grade an answer automatically, the must-hit points the learner ticks after reading the
model answer, follow-ups, the figures, and the evidence that proves them (a notebook section,
a ``zeroedu run`` command, a module, a primary source).

Grading (`zeroedu.quiz.grading`): a card's checks are short sub-answers with one right answer:
a `Number` graded against a `zeroedu.theory` figure within 1 %, a `Choice` graded exactly, a
`Term` compared after normalization. The must-hit `Point`s are self-ticked and reported apart.
Every card has at least one check; keyword-stuffed text earns nothing (tests/test_deck_grading.py).

The cards are data: one YAML file per topic in `zeroedu/quiz/cards/` (English and 中文 side by
side; `cards/README.md` is the guide to adding one), read once when this module loads.

Figures are never free text. A template says ``{z2}`` and the card's `figures` map that name
to a `Fig`: a named function of `zeroedu.quiz.figures` (over the theory layer) and its
arguments, called when the card is rendered or graded; nothing is evaluated from a string.
Assumptions that are not outputs of the theory (a GPU's memory, an achieved FLOP rate, a PCIe
link, a latency) are `Fig`s too, ``fn: given``, marked ``input: true``, so they are shown once,
with a note, and never typed into the prose. tests/test_quiz.py checks that no template
hard-codes a figure with a unit (`HARD_CODED`) and that every rendered figure is its function's
output.

Notebook evidence points at `NOTEBOOKS`, the one list of notebook paths, in the course's order;
`notebook_sections()` lists the section headings the cards cite.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import yaml

from ..answers import LETTERS
from ..fmt import significant
from ..theory import mistakes
from .figures import FIGURES
from .grading import CardGrade, Choice, Number, Point, Term, grade_checks

CARDS_DIR = Path(__file__).with_name("cards")

fmt_number = significant  # the package's one formatter for quoted figures (`zeroedu.fmt`)


@dataclass(frozen=True)
class Fig:
    """A figure quoted in a card: the named function `fn` of `figures.FIGURES` called with
    `args`, shown divided by `scale` with `unit`. `input=True` marks an assumption (hardware, a
    library default), not a theory output; `note` says where it comes from."""

    fn: str
    args: dict = field(default_factory=dict)
    unit: str = "GB"
    scale: float = 1e9
    digits: int = 4
    input: bool = False
    note: str = ""

    def __post_init__(self):
        if self.fn not in FIGURES:
            raise ValueError(f"unknown figure function {self.fn!r}; one of {', '.join(FIGURES)}")

    def value(self):
        """The function's value (exact Fraction or int where the theory gives one)."""
        return FIGURES[self.fn](**self.args)

    def call(self) -> str:
        """How the figure is computed, as a reader would write the call."""
        return f"{self.fn}({', '.join(f'{k}={v!r}' for k, v in self.args.items())})"

    def shown(self) -> float:
        return float(self.value()) / self.scale

    def text(self) -> str:
        num = fmt_number(self.shown(), self.digits)
        if self.unit in ("×", "%", ""):
            return num + self.unit
        return f"{num} {self.unit}"


@dataclass(frozen=True)
class Evidence:
    """Where a figure or claim is shown: kind is notebook | run | module | lab | source."""

    kind: str
    target: str  # notebook path, CLI command, module path, lab id, or a source file / citation
    detail: str = ""  # notebook section heading, what to look at

    def text(self) -> str:
        return f"[{self.kind}] {self.target}" + (f" — {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class Card:
    id: str
    topic: str
    question: str
    question_zh: str
    answer: str  # template: {name} refers to figures[name]
    checks: tuple  # grading.Number | Choice | Term: auto-graded, at least one
    must_hit: tuple[Point, ...]  # self-ticked after the model answer is shown
    follow_ups: tuple[tuple[str, str], ...] = ()  # (question, answer template)
    evidence: tuple[Evidence, ...] = ()
    figures: dict = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    # follow-up question -> the `theory.mistakes` function a check of this card names for the
    # misconception the follow-up is about (``mistake:`` in the YAML), checked when loaded
    follow_up_mistakes: dict = field(default_factory=dict)

    def named_mistakes(self) -> dict[str, "mistakes.Mistake"]:
        """Every mistake this card's number checks name, by function name."""
        out = {}
        for c in self.checks:
            if isinstance(c, Number):
                for made in c.mistakes:
                    m = made()
                    out.setdefault(m.name, m)
        return out

    # ------------------------------------------------------------ figures and templates
    def figure(self, name: str) -> Fig:
        return self.figures[name]

    def figure_texts(self) -> dict[str, str]:
        return {k: f.text() for k, f in self.figures.items()}

    def render(self, template: str) -> str:
        return template.format_map(self.figure_texts())

    def rendered_answer(self) -> str:
        return self.render(self.answer)

    def rendered_follow_ups(self) -> list[tuple[str, str]]:
        return [(self.render(q), self.render(a)) for q, a in self.follow_ups]

    def check_templates(self) -> list[str]:
        out = []
        for c in self.checks:
            out.append(c.prompt)
            out += list(getattr(c, "options", ())) + ([c.why] if getattr(c, "why", "") else [])
        return out

    def templates(self) -> list[str]:
        """Every text with {figure} placeholders: answer, follow-ups, check prompts and options."""
        return [self.answer] + [t for qa in self.follow_ups for t in qa] + self.check_templates()

    # ------------------------------------------------------------ checks and grading
    def check_prompt(self, i: int) -> str:
        """Check i as shown to the learner: prompt, unit or answer-format hint, lettered options."""
        c = self.checks[i]
        fig = self.figures.get(c.figure) if isinstance(c, Number) else None
        lines = [f"{self.render(c.prompt)} {c.hint(fig)}"]
        if isinstance(c, Choice):
            lines += ["    " + self.render(o) for o in c.option_lines()]
        return "\n".join(lines)

    def check_answer(self, i: int) -> str:
        """The right answer of check i, as shown after grading."""
        c = self.checks[i]
        fig = self.figures.get(c.figure) if isinstance(c, Number) else None
        return self.render(c.expected_text(fig))

    def model_responses(self) -> list[str]:
        """One line per check that earns full marks (what a script pipes in for 100 %)."""
        return [c.model_response(self.figures.get(c.figure) if isinstance(c, Number) else None)
                for c in self.checks]

    def grade(self, answers: Sequence[str], ticked: Iterable[int] | None = None) -> CardGrade:
        """Auto-grade `answers` (one string per check, in order) and record the self-ticked
        must-hit points (0-based indices; None: not ticked yet)."""
        results = grade_checks(self.checks, list(answers), self.figure)
        results = [type(r)(r.ok, r.given, self.render(r.expected), self.render(r.note)) for r in results]
        t = None if ticked is None else tuple(sorted(set(int(i) for i in ticked)))
        if t is not None and any(not 0 <= i < len(self.must_hit) for i in t):
            raise ValueError(f"ticked points must be in 0..{len(self.must_hit) - 1}, got {t}")
        missed = [p.text for i, p in enumerate(self.must_hit) if t is not None and i not in t]
        return CardGrade(self.id, results, len(self.must_hit), t, missed)

    # ------------------------------------------------------------ text
    def prompt_text(self) -> str:
        """The question and what its checks ask, without an answer: what a rehearsal shows before
        the learner has answered (`as_text` holds the rest)."""
        lines = [f"Q [{self.id}] {self.question}", f"   {self.question_zh}", "", "Checks (auto-graded):"]
        for i in range(len(self.checks)):
            prompt = self.check_prompt(i).splitlines()
            lines.append(f"  {i + 1}. {prompt[0]}")
            lines += [f"     {p.strip()}" for p in prompt[1:]]
        return "\n".join(lines)

    def as_text(self, width: int = 0) -> str:
        lines = [f"Q [{self.id}] {self.question}", f"   {self.question_zh}", "",
                 "30-second answer:", "  " + self.rendered_answer(), "", "Checks (auto-graded):"]
        for i in range(len(self.checks)):
            prompt = self.check_prompt(i).splitlines()
            lines.append(f"  {i + 1}. {prompt[0]}")
            lines += [f"     {p.strip()}" for p in prompt[1:]]
            lines.append(f"     -> {self.check_answer(i)}")
        lines += ["", "Must hit (self-ticked):"]
        lines += [f"  {i + 1}. {p.text}" for i, p in enumerate(self.must_hit)]
        if self.follow_ups:
            lines += ["", "Follow-ups:"]
            for q, a in self.rendered_follow_ups():
                lines += [f"  Q: {q}", f"  A: {a}"]
        computed = {k: f for k, f in self.figures.items() if not f.input}
        inputs = {k: f for k, f in self.figures.items() if f.input}
        if computed:
            lines += ["", "Figures (zeroedu.quiz.figures, over zeroedu.theory):"]
            lines += [f"  {k} = {f.text()}  <- {f.call()}" for k, f in computed.items()]
        if inputs:
            lines += ["", "Inputs (assumed):"]
            lines += [f"  {k} = {f.text()}" + (f"  ({f.note})" if f.note else "") for k, f in inputs.items()]
        if self.evidence:
            lines += ["", "Proof:"] + [f"  {e.text()}" for e in self.evidence]
        if self.sources:
            lines += ["", "Sources: " + "; ".join(self.sources)]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- notebooks
# The one list of notebook paths the cards cite, in the course's order.
NOTEBOOKS = {
    "collectives": "notebooks/01_collectives.ipynb",
    "ddp": "notebooks/02_ddp.ipynb",
    "zero1": "notebooks/03_zero1.ipynb",
    "megatron": "notebooks/04_megatron_distopt.ipynb",
    "zero2": "notebooks/05_zero2.ipynb",
    "fsdp_linear": "notebooks/06_fsdp_linear.ipynb",
    "zero3": "notebooks/07_zero3_fsdp.ipynb",
    "fsdp1_vs_fsdp2": "notebooks/08_fsdp1_vs_fsdp2.ipynb",
    "activations": "notebooks/09_activations.ipynb",
    "hybrid": "notebooks/10_hybrid_sharding.ipynb",
    "dashboard": "notebooks/11_dashboard.ipynb",
    "rehearsal": "notebooks/12_interview_rehearsal.ipynb",
    "fact_check": "notebooks/13_fact_check.ipynb",
    "beyond": "notebooks/14_beyond_data_parallelism.ipynb",
}




# ----------------------------------------------------------------------------- the deck, from its files
_FIG_KEYS = ("unit", "scale", "digits", "input", "note")
_EVIDENCE_KINDS = ("notebook", "run", "module", "lab", "source")


# YAML 1.1 (PyYAML) reads "7e9" as a string; a figure's argument written so is the number meant
_EXPONENT = re.compile(r"[-+]?\d+(?:\.\d*)?[eE][-+]?\d+")


def _arg(v):
    if isinstance(v, list):
        return tuple(v)
    return float(v) if isinstance(v, str) and _EXPONENT.fullmatch(v) else v


def _fig(d: dict) -> Fig:
    d = dict(d)
    fn = d.pop("fn")
    shown = {k: _arg(d.pop(k)) for k in _FIG_KEYS if k in d}
    return Fig(fn, {k: _arg(v) for k, v in d.items()}, **shown)


def _letters(answer) -> tuple[int, ...]:
    return tuple(LETTERS.index(a) for a in ([answer] if isinstance(answer, str) else answer))


def _mistake(spec: dict, figures: dict):
    """A number check's anticipated mistake: a function of `theory.mistakes` and its arguments,
    each a value, ``{figure: name}`` (one of the card's figures) or a figure of its own
    (``{fn: ...}``); ``per`` divides the mistake's bytes by a figure (a bandwidth: bytes -> time);
    ``why`` words the diagnosis for this card. Called when a wrong answer is graded."""
    spec = dict(spec)
    name, why, per = spec.pop("fn"), spec.pop("why", None), spec.pop("per", None)
    fn = {f.__name__: f for f in mistakes.MISTAKES}.get(name)
    if fn is None:
        raise ValueError(f"unknown mistake {name!r}; one of the functions of zeroedu.theory.mistakes")

    def value(v):
        if isinstance(v, dict) and set(v) == {"figure"}:
            return figures[v["figure"]].value()
        return _fig(v).value() if isinstance(v, dict) else _arg(v)

    def made() -> mistakes.Mistake:
        m = fn(**{k: value(v) for k, v in spec.items()})
        if per is not None:
            m = replace(m, value=m.value / float(value(per)))
        return replace(m, why=why) if why else m
    return made


def _check(d: dict, figures: dict):
    if "number" in d:
        return Number(d["number"], d["figure"], **({"tolerance": d["tolerance"]} if "tolerance" in d else {}),
                      mistakes=tuple(_mistake(m, figures) for m in d.get("mistakes", ())))
    if "choice" in d:
        wrong = d.get("wrong", {})
        return Choice(d["choice"], tuple(d["options"]), _letters(d["answer"]), d.get("why", ""),
                      tuple((LETTERS.index(k), why) for k, why in wrong.items()))
    if "term" in d:
        return Term(d["term"], tuple(d["accepted"]), d.get("why", ""))
    raise ValueError(f"a check is a number, a choice or a term: {d}")


def _evidence(d: dict) -> Evidence:
    (kind,) = [k for k in d if k in _EVIDENCE_KINDS]
    target = d[kind]
    return Evidence(kind, NOTEBOOKS[target] if kind == "notebook" else target, d.get("detail", ""))


def _card(d: dict, topic: str, where: str) -> Card:
    known = {"id", "question", "question_zh", "answer", "checks", "must_hit", "follow_ups", "figures",
             "evidence", "sources"}
    if set(d) - known:
        raise ValueError(f"{where}: card {d.get('id')!r} has unknown keys {sorted(set(d) - known)}")
    figures = {k: _fig(v) for k, v in d.get("figures", {}).items()}
    card = Card(id=d["id"], topic=topic, question=d["question"], question_zh=d["question_zh"], answer=d["answer"],
                checks=tuple(_check(c, figures) for c in d["checks"]), must_hit=tuple(Point(t) for t in d["must_hit"]),
                follow_ups=tuple((f["q"], f["a"]) for f in d.get("follow_ups", ())),
                evidence=tuple(_evidence(e) for e in d.get("evidence", ())),
                figures=figures, sources=tuple(d.get("sources", ())),
                follow_up_mistakes={f["q"]: f["mistake"] for f in d.get("follow_ups", ()) if "mistake" in f})
    if card.follow_up_mistakes:
        named = card.named_mistakes()
        for q, name in card.follow_up_mistakes.items():
            if name.startswith("choice "):  # "choice 0 b": option b of check 0 names the misconception
                _, i, letter = name.split()
                check = card.checks[int(i)] if int(i) < len(card.checks) else None
                if not (isinstance(check, Choice) and LETTERS.index(letter) in dict(check.misconceptions)):
                    raise ValueError(f"{where}: card {card.id!r}: the follow-up {q!r} is about {name!r}, which is "
                                     "not a misconception that choice names")
                continue
            if name not in named:
                raise ValueError(f"{where}: card {card.id!r}: the follow-up {q!r} is about the mistake {name!r}, "
                                 f"which none of its number checks names ({sorted(named)})")
    return card


def load_cards(directory: Path = CARDS_DIR) -> list[Card]:
    """Every card of every topic file, in file order (``NN_topic.yaml``) and card order within."""
    out: list[Card] = []
    for path in sorted(directory.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        out += [_card(c, data["topic"], path.name) for c in data["cards"]]
    ids = [c.id for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"card ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return out


CARDS: list[Card] = load_cards()

BY_ID = {c.id: c for c in CARDS}
TOPICS = tuple(sorted({c.topic for c in CARDS}))

# The ZeRO paper's own worked example (Fig. 1): Ψ = 7.5B, N = 64, K = 12 gives 120 / 31.4 /
# 16.6 / 1.9 GB. tests/test_quiz.py checks the theory against these printed values.
PAPER_FIG1 = {"ddp": 120, "zero1": 31.4, "zero2": 16.6, "fsdp1": 1.9}

# A figure with a unit written straight into a template (e.g. "112 GB", "1.5×", "25 MiB",
# "450 GB/s") is a hard-coded figure; tests reject it. ("2 × 8 GPUs" is a shape, not a ratio.)
HARD_CODED = re.compile(
    r"\d+(?:\.\d+)?\s*(?:GB/s|TFLOP/s|GB|GiB|TB|MB|MiB|KiB|ms|µs|tokens|×(?!\s*\d))(?![\w])")


# (card id, check index) -> its number among the deck's single-answer choices, in deck order
_CHOICE_INDEX = {key: i for i, key in enumerate(
    (card.id, j) for card in CARDS for j, c in enumerate(card.checks) if isinstance(c, Choice) and not c.multi)}


def cards(topic: str | None = None) -> list[Card]:
    if topic is None or topic == "all":
        return list(CARDS)
    if topic not in TOPICS:
        raise ValueError(f"unknown topic {topic!r}; choose one of {', '.join(TOPICS)}, all")
    return [c for c in CARDS if c.topic == topic]


def get_card(card_id: str) -> Card:
    try:
        return BY_ID[card_id]
    except KeyError:
        raise ValueError(f"unknown card {card_id!r}; one of {', '.join(BY_ID)}") from None


def for_learner(card: Card, seed: int) -> Card:
    """`card` with its choices' options in this learner's order (`answers.learner_seed`).

    Balanced rather than random: the deck's single-answer choices are numbered in deck order, and
    the i-th puts its right option at position (i + seed) mod k (k options), the others in an
    order drawn from the seed; so for every learner the right answer sits at each position about
    equally often, whichever cards they are given, and neither the letter nor the order the
    options were written in gives it away. Pick-all-that-apply choices are shuffled by the seed."""
    rng = random.Random(f"{seed}:{card.id}")
    checks = []
    for j, c in enumerate(card.checks):
        if isinstance(c, Choice):
            k = len(c.options)
            rest = [i for i in range(k) if i not in c.answer]
            rng.shuffle(rest)
            if c.multi:
                order = list(c.answer) + rest
                rng.shuffle(order)
            else:
                at = (_CHOICE_INDEX[(card.id, j)] + seed) % k
                order = rest[:at] + [c.answer[0]] + rest[at:]
            c = c.reordered(order)
        checks.append(c)
    return replace(card, checks=tuple(checks))


def notebook_sections() -> dict[str, list[str]]:
    """Notebook path -> the section headings the cards cite there (for whoever writes them)."""
    out: dict[str, list[str]] = {}
    for c in CARDS:
        for e in c.evidence:
            if e.kind == "notebook" and e.detail not in out.setdefault(e.target, []):
                out[e.target].append(e.detail)
    return out


__all__ = ["for_learner", "load_cards", "Card", "Fig", "Evidence", "Point", "Number", "Choice", "Term", "CARDS", "BY_ID", "TOPICS",
           "NOTEBOOKS", "PAPER_FIG1", "HARD_CODED", "cards", "get_card", "notebook_sections", "fmt_number"]
