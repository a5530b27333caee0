"""Grading a card's answer so that keywords alone earn nothing.

A spoken 30-second answer cannot be graded by a program without rewarding the wrong thing: a
keyword match gives "if ddp shard" full marks on a question about optimizer ownership, and a
wrong account of the three ZeRO stages most of them, because the wrong account uses the right
words. So a card is graded in two parts, reported separately:

* **Auto-graded checks** (`Number`, `Choice`, `Term`): short sub-answers with one right answer.

  - `Number`: a figure, graded against the card's `zeroedu.theory` expression (the same figure
    the model answer quotes) within `TOLERANCE` (1 %). The answer is one number with an optional
    unit of the same kind ("26.25", "26.25 GB", "26250 MB"); a bare number is read in the unit
    the prompt names. Text with two numbers is unreadable, so a list of guesses earns nothing.
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
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

TOLERANCE = 0.01  # relative, for Number checks
LETTERS = "abcdefghij"


# ----------------------------------------------------------------------------- units
# Each family: unit spelling (lower case) -> its size in the family's base unit. A Number's
# figure names its display unit; an answer may use any unit of the same family.
UNIT_FAMILIES: dict[str, dict[str, float]] = {
    "bytes": {"b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
              "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30, "tib": 2.0 ** 40},
    "rate": {"b/s": 1, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12},
    "time": {"s": 1, "sec": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9},
    "ratio": {"x": 1, "×": 1},
    "percent": {"%": 1e-2},
    "count": {"k": 1e3, "m": 1e6, "tokens": 1, "token": 1, "ktokens": 1e3},
    "flops": {"flop/s": 1, "tflop/s": 1e12, "pflop/s": 1e15},
}


def unit_family(unit: str) -> str:
    """The family of a figure's display unit ("GB" -> "bytes", "" -> "count")."""
    u = unit.strip().lower()
    if u == "":
        return "count"
    for fam, units in UNIT_FAMILIES.items():
        if u in units:
            return fam
    raise ValueError(f"unit {unit!r} belongs to no family in UNIT_FAMILIES")


_APPROX = re.compile(r"^(?:~|≈|about|approx\.?|approximately|around|roughly)\s*")
_NUMBER = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)\s*(.*)")


def parse_quantity(text: str, unit: str, scale: float) -> float | None:
    """One number with an optional unit of the same family as `unit`, in base units (bytes,
    seconds, a plain ratio, ...). A bare number is in `unit` (so times `scale`). None when the
    text is not exactly one number and one unit: "26.25 GB" reads, "14 26.25 38.5" does not."""
    t = unicodedata.normalize("NFKC", text).strip().lower().rstrip(".")
    t = t.replace(",", "").replace("_", "").replace("\u2009", "").replace("\u00a0", " ")
    t = _APPROX.sub("", t).strip()
    m = _NUMBER.fullmatch(t)
    if not m:
        return None
    value, u = float(m.group(1)), m.group(2).strip()
    if u == "":
        return value * scale
    units = UNIT_FAMILIES[unit_family(unit)]
    if u not in units:
        return None
    return value * units[u]


def normalize_term(text: str) -> str:
    """Case, width, spaces, hyphens, underscores and punctuation dropped; a leading article
    too. "Reduce-Scatter", "reduce_scatter" and "the reduce scatter" all give "reducescatter"."""
    t = unicodedata.normalize("NFKC", text).strip().lower()
    t = re.sub(r"^(?:the|a|an)\s+", "", t)
    return "".join(ch for ch in t if ch.isalnum())


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
    kind = "number"

    def hint(self, fig) -> str:
        return f"({fig.unit})" if fig.unit else "(a number)"

    def expected_text(self, fig) -> str:
        return fig.text()

    def model_response(self, fig) -> str:
        return fig.text()

    def grade(self, answer: str, fig) -> Result:
        got = parse_quantity(answer, fig.unit, fig.scale)
        exp = float(fig.value())
        if got is None:
            return Result(False, answer, fig.text(),
                          f"give one number{' in ' + fig.unit if fig.unit else ''}")
        ok = abs(got - exp) <= self.tolerance * abs(exp) if exp else got == 0
        note = "" if ok else f"off by {100 * (got - exp) / exp:+.0f} %" if exp else ""
        return Result(ok, answer, fig.text(), note)


@dataclass(frozen=True)
class Choice:
    """Lettered options. `answer` holds the index (or indices, for pick-all-that-apply) of the
    right option(s); `why` is shown after grading."""

    prompt: str
    options: tuple[str, ...]
    answer: tuple[int, ...]
    why: str = ""
    kind = "choice"

    def __post_init__(self):
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"a choice needs 2..{len(LETTERS)} options: {self.prompt!r}")
        if not self.answer or any(not 0 <= i < len(self.options) for i in self.answer):
            raise ValueError(f"answer indices out of range: {self.prompt!r}")
        if len(set(self.answer)) != len(self.answer):
            raise ValueError(f"repeated answer index: {self.prompt!r}")

    @property
    def multi(self) -> bool:
        return len(self.answer) > 1

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
        """The set of option indices an answer names, or None when it is not a clean pick:
        letters separated by commas, spaces, "and" or "+", or one option's full text."""
        t = unicodedata.normalize("NFKC", answer).strip().lower()
        if not t:
            return None
        whole = normalize_term(t)
        for i, o in enumerate(self.options):
            if whole == normalize_term(o):
                return frozenset({i})
        tokens = [x for x in re.split(r"(?:\s*[,;/+&]\s*|\s+and\s+|\s+)", t) if x]
        picked = set()
        for tok in tokens:
            tok = tok.strip("()[].")
            if len(tok) != 1 or tok not in LETTERS[:len(self.options)]:
                return None
            picked.add(LETTERS.index(tok))
        return frozenset(picked)

    def grade(self, answer: str, fig=None) -> Result:
        got = self.read(answer)
        if got is None:
            n = len(self.options)
            return Result(False, answer, self.expected_text(),
                          f"answer with {'letters' if self.multi else 'one letter'} a-{LETTERS[n - 1]}")
        ok = got == frozenset(self.answer)
        return Result(ok, answer, self.expected_text(), self.why)


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
        ok = bool(answer.strip()) and normalize_term(answer) in {normalize_term(a) for a in self.accepted}
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


__all__ = ["TOLERANCE", "LETTERS", "UNIT_FAMILIES", "unit_family", "parse_quantity", "normalize_term",
           "Result", "Number", "Choice", "Term", "CHECK_KINDS", "Point", "parse_ticks", "CardGrade",
           "grade_checks"]
