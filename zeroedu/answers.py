"""Reading answers: the one place where a learner's text becomes a number, a set of options or a
term, for the interview deck's checks (`quiz.grading`), the notebooks' exercises
(`notebook.exercises`) and the labs.

Numbers (`read_number`, `parse_quantity`). An answer is one quantity, written as a person would:

    26.25          26.25 GB        36.75 GB per rank     ~26.25gb      2.625e10 bytes
    14e9 B         3/2             1.5×                  1.5x DDP's bytes
    787.5 ms       7,500 tokens    25 MiB                50 %

that is, an optional "about", a number (decimal, with thousands commas, an exponent, or a
fraction a/b), an optional unit, and optional words after it that hold no digit ("per rank",
"DDP's bytes"). A unit is read in its family (`UNIT_FAMILIES`: bytes, rate, time, ratio,
percent, count, flops) and the answer returned in the family's base unit (bytes, seconds, a
plain ratio: "50 %" is 0.5); when the question names a unit, another family is refused ("26.25
ms" for a size in GB) and a bare number is read in the question's unit. Text with two numbers
("14 26.25 38.5") is unreadable: a list of guesses earns nothing.

Choices (`read_choice`): one option's key (a letter, or a name), keys separated by commas,
spaces, "and" or "+", a collection of keys, or one option's full text. Terms (`normalize_term`): case, width, spaces, hyphens, underscores,
punctuation and a leading article dropped.
"""
from __future__ import annotations

import re
import unicodedata
from fractions import Fraction
from numbers import Number

LETTERS = "abcdefghij"

# Each family: unit spelling (lower case) -> its size in the family's base unit.
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
_VALUE = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"
_QUANTITY = re.compile(rf"(?P<num>{_VALUE})(?:\s*/\s*(?P<den>{_VALUE}))?\s*(?P<unit>[^\s\d]*)(?P<rest>[^\d]*)")
_ANY_UNIT = {u: s for units in UNIT_FAMILIES.values() for u, s in units.items()}


def read_quantity(text: str) -> tuple[float, str] | None:
    """The number an answer gives and the unit it names ("" for none), before any conversion;
    None when the text is not one quantity (module docstring)."""
    t = unicodedata.normalize("NFKC", str(text)).strip().lower().rstrip(".")
    t = t.replace(",", "").replace("_", "").replace("\u2009", "").replace("\u00a0", " ")
    t = _APPROX.sub("", t).strip()
    m = _QUANTITY.fullmatch(t)
    if not m:
        return None
    value = float(m.group("num"))
    if m.group("den") is not None:
        den = float(m.group("den"))
        if den == 0:
            return None
        value /= den
    u, rest = m.group("unit"), m.group("rest").strip()
    if u.endswith("'s") or (rest and not u):  # "1.5 DDP's bytes": words, not a unit
        return None
    return value, u


def parse_quantity(text: str, unit: str | None = None, scale: float = 1.0) -> float | None:
    """One quantity in base units (module docstring), or None when `text` is not one. `unit`:
    the question's unit, whose family the answer must use (a bare number is in it, so times
    `scale`); None accepts any known unit and reads a bare number as it is."""
    read = read_quantity(text)
    if read is None:
        return None
    value, u = read
    if u == "":
        return value * (scale if unit is not None else 1.0)
    units = _ANY_UNIT if unit is None else UNIT_FAMILIES[unit_family(unit)]
    if u not in units:
        return None
    return value * units[u]


def is_number(x) -> bool:
    return isinstance(x, (Number, Fraction)) and not isinstance(x, bool)


def read_number(answer, unit: str | None = None, scale: float = 1.0) -> float | None:
    """A number as it is (int, float, Fraction), or text read by `parse_quantity`; else None."""
    if is_number(answer):
        return float(answer)
    if isinstance(answer, str):
        return parse_quantity(answer, unit, scale)
    return None


def close(got: float, want: float, rel: float) -> bool:
    """Within `rel` of `want` (relative); an expected zero needs |got| <= rel."""
    return abs(got - want) <= rel * abs(want) if want else abs(got) <= rel


def normalize_term(text: str) -> str:
    """Case, width, spaces, hyphens, underscores and punctuation dropped; a leading article
    too. "Reduce-Scatter", "reduce_scatter" and "the reduce scatter" all give "reducescatter"."""
    t = unicodedata.normalize("NFKC", str(text)).strip().lower()
    t = re.sub(r"^(?:the|a|an)\s+", "", t)
    return "".join(ch for ch in t if ch.isalnum())


def read_choice(answer, options, keys=None) -> frozenset[int] | None:
    """The option indices an answer names, or None when it is not a clean pick. `keys` name the
    options (letters a, b, c, ... by default; a strategy's name, a number). The answer is one
    option's full text, or keys separated by commas, spaces, "and" or "+", or a collection of
    keys (an empty one picks nothing)."""
    keys = [str(k) for k in (keys if keys is not None else LETTERS[:len(options)])]
    by_key = {normalize_term(k): i for i, k in enumerate(keys)}
    if isinstance(answer, (list, tuple, set, frozenset)):
        tokens = [str(a) for a in answer]
    elif isinstance(answer, (str, int)) and not isinstance(answer, bool):
        t = unicodedata.normalize("NFKC", str(answer)).strip().lower()
        if not t:
            return None
        whole = normalize_term(t)
        for i, o in enumerate(options):
            if whole == normalize_term(o):
                return frozenset({i})
        tokens = [x for x in re.split(r"(?:\s*[,;/+&]\s*|\s+and\s+|\s+)", t) if x]
    else:
        return None
    picked = set()
    for tok in tokens:
        k = normalize_term(tok.strip("()[]."))
        if k not in by_key:
            return None
        picked.add(by_key[k])
    return frozenset(picked)


def learner_seed(learner: str | None = None) -> int:
    """A learner's own seed, the same on every run: from `learner`, else the ZEROEDU_LEARNER
    environment variable, else the login name. It orders the options of the choices the
    learner is asked (`quiz.deck.for_learner`), so that a letter learnt by heart from someone
    else's deck, or from the order the options were written in, says nothing."""
    import getpass
    import hashlib
    import os

    name = learner or os.environ.get("ZEROEDU_LEARNER") or getpass.getuser()
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


__all__ = ["LETTERS", "learner_seed", "UNIT_FAMILIES", "unit_family", "read_quantity", "parse_quantity", "is_number", "read_number", "close",
           "normalize_term", "read_choice"]
