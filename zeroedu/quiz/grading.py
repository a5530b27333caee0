"""Grading a card's answer so that keywords alone earn nothing.

A spoken 30-second answer cannot be graded by a program without rewarding the wrong thing: a
keyword match gives "if ddp shard" full marks on a question about optimizer ownership, and a
wrong account of the three ZeRO stages most of them, because the wrong account uses the right
words. So a card is graded in two parts, reported separately:

* **Auto-graded checks** (`Number`, `Choice`, `Term`): short sub-answers with one right answer.

  - `Number`: a figure, graded against the card's `zeroedu.theory` expression (the same figure
    the model answer quotes) within `TOLERANCE` (1 %). The answer is one quantity read by
    `zeroedu.answers.parse_quantity` ("26.25", "26.25 GB per rank", "26250 MB", "3/2"), in a
    unit of the prompt's kind; a bare number is read in the unit the prompt names. Text with two
    numbers is unreadable, so a list of guesses earns nothing.
  - `Choice`: lettered options, graded exactly. A single-answer choice takes one letter (or the
    option's text); a pick-all-that-apply choice takes the exact set of letters, so ticking
    every option is wrong (tests check that no choice has every option correct).
  - `Term`: a short term compared after normalization (case, spaces, hyphens, underscores and
    punctuation dropped) with a small set of accepted spellings. The whole answer must *be* one
    of them; a term inside a sentence, or inside another word, does not count.

* **Self-ticked points** (`Point`): the must-hit points of the spoken answer. After the model
  answer is shown, the learner ticks the points their own answer made. They are honest
  rehearsal, not proof, so they never enter the auto-graded score.

`CardGrade` holds both; the terminal session (`session.py`) and the widget (`widget.py`) show
the same grade for the same answers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from ..answers import LETTERS, close, normalize_term, read_choice, readings, term_forms

TOLERANCE = 0.01  # relative, for Number checks


# ----------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Result:
    """The grade of one auto-graded check."""

    ok: bool
    given: str
    expected: str  # the right answer as shown to the learner
    note: str = ""  # why it is wrong, or why the right answer is right

    def line(self) -> str:
        mark = "✓" if self.ok else "✗"
        tail = f" — {self.note}" if self.note else ""
        if self.ok:
            return f"{mark} {self.expected}{tail}"
        return f"{mark} you said {self.given.strip()!r}; the answer is {self.expected}{tail}"


# ----------------------------------------------------------------------------- the checks
@dataclass(frozen=True)
class Number:
    """A figure the learner computes. `figure` names an entry of the card's `figures` (a
    `zeroedu.theory` expression), so the grade and the model answer quote the same value."""

    prompt: str
    figure: str
    tolerance: float = TOLERANCE
    # the wrong figures known misconceptions give: functions returning a `theory.mistakes.Mistake`
    # (in the figure's own unit, before `scale`); an answer equal to one is told which mistake it is
    mistakes: tuple = field(default=(), compare=False)
    kind = "number"

    def hint(self, fig) -> str:
        return f"({fig.unit})" if fig.unit else "(a number)"

    def expected_text(self, fig) -> str:
        return fig.text()

    def model_response(self, fig) -> str:
        return fig.text()

    def grade(self, answer: str, fig) -> Result:
        values = readings(answer, fig.unit, fig.scale)
        exp = float(fig.value())
        if not values:
            return Result(False, answer, fig.text(),
                          f"give one number{' in ' + fig.unit if fig.unit else ''}")
        right = [v for v in values if (close(v, exp, self.tolerance) if exp else v == 0)]
        got = right[0] if right else values[0]
        ok = bool(right)
        note = "" if ok else self.diagnose(got) or (f"off by {100 * (got - exp) / exp:+.0f} %" if exp else "")
        return Result(ok, answer, fig.text(), note)

    def diagnose(self, got: float) -> str:
        """The misconception a wrong figure comes from, when it is one the check anticipates."""
        for m in self.mistakes:
            wrong = m()
            if close(got, wrong.value, self.tolerance) if wrong.value else got == 0:
                return wrong.why
        return ""


@dataclass(frozen=True)
class Choice:
    """Lettered options. `answer` holds the index (or indices, for pick-all-that-apply) of the
    right option(s); `why` is shown after grading."""

    prompt: str
    options: tuple[str, ...]
    answer: tuple[int, ...]
    why: str = ""
    # (option index, the misconception that picks it): a wrong single pick of that option is told it
    misconceptions: tuple[tuple[int, str], ...] = ()
    kind = "choice"

    def __post_init__(self):
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"a choice needs 2..{len(LETTERS)} options: {self.prompt!r}")
        if not self.answer or any(not 0 <= i < len(self.options) for i in self.answer):
            raise ValueError(f"answer indices out of range: {self.prompt!r}")
        if len(set(self.answer)) != len(self.answer):
            raise ValueError(f"repeated answer index: {self.prompt!r}")
        if any(i in self.answer or not 0 <= i < len(self.options) for i, _ in self.misconceptions):
            raise ValueError(f"a misconception names a wrong option: {self.prompt!r}")

    @property
    def multi(self) -> bool:
        return len(self.answer) > 1

    def reordered(self, order: Sequence[int]) -> "Choice":
        """The same choice with its options shown in `order` (order[j]: the option shown j-th)."""
        if sorted(order) != list(range(len(self.options))):
            raise ValueError(f"not an order of {len(self.options)} options: {order}")
        at = list(order).index
        return Choice(self.prompt, tuple(self.options[i] for i in order), tuple(sorted(at(i) for i in self.answer)),
                      self.why, tuple((at(i), why) for i, why in self.misconceptions))

    def hint(self, fig=None) -> str:
        return "(letters, all that apply)" if self.multi else "(one letter)"

    def option_lines(self) -> list[str]:
        return [f"{LETTERS[i]}) {o}" for i, o in enumerate(self.options)]

    def letters(self, indices=None) -> str:
        return ",".join(LETTERS[i] for i in sorted(self.answer if indices is None else indices))

    def expected_text(self, fig=None) -> str:
        return "; ".join(f"{LETTERS[i]}) {self.options[i]}" for i in sorted(self.answer))

    def model_response(self, fig=None) -> str:
        return self.letters()

    def read(self, answer: str) -> frozenset[int] | None:
        """The set of option indices an answer names, or None (`answers.read_choice`)."""
        return read_choice(answer, self.options)

    def grade(self, answer: str, fig=None) -> Result:
        got = self.read(answer)
        if got is None:
            n = len(self.options)
            return Result(False, answer, self.expected_text(),
                          f"answer with {'letters' if self.multi else 'one letter'} a-{LETTERS[n - 1]}")
        ok = got == frozenset(self.answer)
        named = dict(self.misconceptions).get(next(iter(got))) if not ok and len(got) == 1 else None
        return Result(ok, answer, self.expected_text(), " ".join(t for t in (named, self.why) if t))


@dataclass(frozen=True)
class Term:
    """A short term with a few accepted spellings (compared after `normalize_term`)."""

    prompt: str
    accepted: tuple[str, ...]
    why: str = ""
    kind = "term"

    def __post_init__(self):
        if not self.accepted or any(not normalize_term(a) for a in self.accepted):
            raise ValueError(f"a term needs non-empty accepted spellings: {self.prompt!r}")

    def hint(self, fig=None) -> str:
        return "(a short term)"

    def expected_text(self, fig=None) -> str:
        return self.accepted[0]

    def model_response(self, fig=None) -> str:
        return self.accepted[0]

    def grade(self, answer: str, fig=None) -> Result:
        accepted = {normalize_term(a) for a in self.accepted}
        ok = bool(answer.strip()) and any(normalize_term(f) in accepted for f in term_forms(answer))
        return Result(ok, answer, self.accepted[0], self.why)


CHECK_KINDS = (Number, Choice, Term)


@dataclass(frozen=True)
class Point:
    """A must-hit point of the spoken answer; the learner ticks it (self-assessed)."""

    text: str


def parse_ticks(text: str, n: int) -> tuple[int, ...] | None:
    """Which of n points (numbered from 1) the learner says they hit: "1,3", "1 3", "all",
    "none" or an empty line. Returns 0-based indices, or None when unreadable."""
    t = text.strip().lower()
    if t in ("", "none", "no", "-", "0", "无"):
        return ()
    if t in ("all", "全部"):
        return tuple(range(n))
    out = set()
    for tok in re.split(r"[\s,;]+", t):
        if not tok:
            continue
        if not tok.isdigit() or not 1 <= int(tok) <= n:
            return None
        out.add(int(tok) - 1)
    return tuple(sorted(out))


# ----------------------------------------------------------------------------- a card's grade
@dataclass
class CardGrade:
    """Auto-graded results, and the self-ticked points (None until the learner ticks)."""

    card_id: str
    results: list[Result]
    tick_total: int
    ticked: tuple[int, ...] | None = None
    missed_points: list[str] = field(default_factory=list)

    @property
    def auto_points(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def auto_total(self) -> int:
        return len(self.results)

    @property
    def auto_fraction(self) -> float:
        return self.auto_points / self.auto_total if self.auto_total else 0.0

    @property
    def self_points(self) -> int:
        return len(self.ticked or ())

    @property
    def full_marks(self) -> bool:
        return self.auto_points == self.auto_total

    def summary(self) -> str:
        s = f"auto-graded {self.auto_points}/{self.auto_total}"
        if self.ticked is not None:
            s += f" · self-ticked {self.self_points}/{self.tick_total} (reported separately)"
        return s


def grade_checks(checks: Sequence, answers: Sequence[str], figure) -> list[Result]:
    """Grade each check against its answer; `figure(name)` returns the card's Fig. A missing
    answer is graded as an empty one (wrong)."""
    out = []
    for i, c in enumerate(checks):
        a = answers[i] if i < len(answers) else ""
        out.append(c.grade(a, figure(c.figure) if isinstance(c, Number) else None))
    return out


__all__ = ["TOLERANCE", "Result", "Number", "Choice", "Term", "CHECK_KINDS", "Point", "parse_ticks", "CardGrade",
           "grade_checks"]
