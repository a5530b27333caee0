"""Reading answers: the one place where a learner's text becomes a number, a set of options or a
term, for the interview deck's checks (`quiz.grading`), the notebooks' exercises
(`notebook.exercises`) and the labs.

Numbers (`read_number`, `parse_quantity`). An answer is one quantity, written as a person would:

    26.25          26.25 GB        36.75 GB per rank     ~26.25gb      2.625e10 bytes
    14e9 B         3/2             1.5×                  1.5x DDP's bytes
    787.5 ms       7,500 tokens    25 MiB                50 %
    1.5 times      50 % more       35.86 GiB             38,500,000,000 (bytes, for a size in GB)
    150 % (of DDP's, for a ratio)  24.5 gigabytes        0.85 milliseconds     nine times
    one and a half times           twenty-four and a half GB

that is, an optional "about", a number (decimal, with thousands commas, an exponent, a
fraction a/b, or in words), an optional unit (symbol or spelled out), and optional words after it that hold no digit ("per rank",
"DDP's bytes"). A unit is read in its family (`UNIT_FAMILIES`: bytes, rate, time, ratio,
percent, count, flops) and the answer returned in the family's base unit (bytes, seconds, a
plain ratio: "50 %" is 0.5); when the question names a unit, another family is refused ("26.25
ms" for a size in GB) and a bare number is read in the question's unit. Text with two numbers
("14 26.25 38.5") is unreadable: a list of guesses earns nothing.

Choices (`read_choice`): one option's key (a letter, or a name), keys separated by commas,
spaces, "and" or "+", a collection of keys, one option's full text, or the option said in words
(`match_option`: most of the answer's content words in one option and no other named whole;
"optimizer state and gradients" picks two). Terms (`normalize_term`, `term_forms`): case, width,
spaces, hyphens, underscores, punctuation and a leading article dropped, small numbers and
ordinals in words as digits ("ZeRO stage one"), and code unwrapped (`device="meta"` reads "meta").
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
              "kib": 2.0 ** 10, "mib": 2.0 ** 20, "gib": 2.0 ** 30, "tib": 2.0 ** 40,
              # spelled out, singular and plural
              **{f"{name}{plural}": size for name, size in (
                  ("kilobyte", 1e3), ("megabyte", 1e6), ("gigabyte", 1e9), ("terabyte", 1e12),
                  ("kibibyte", 2.0 ** 10), ("mebibyte", 2.0 ** 20), ("gibibyte", 2.0 ** 30),
                  ("tebibyte", 2.0 ** 40)) for plural in ("", "s")}},
    "rate": {"b/s": 1, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12},
    "time": {"s": 1, "sec": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9,
             **{f"{name}{plural}": size for name, size in (
                 ("second", 1), ("millisecond", 1e-3), ("microsecond", 1e-6), ("nanosecond", 1e-9))
                for plural in ("", "s")}, "secs": 1, "msec": 1e-3},
    "ratio": {"x": 1, "×": 1, "times": 1, "fold": 1, "-fold": 1},
    "percent": {"%": 1e-2, "percent": 1e-2, "pct": 1e-2},
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
    read = _read(text)
    return None if read is None else read[:2]


MORE = {"more", "larger", "bigger", "higher", "extra"}
LESS = {"less", "fewer", "smaller", "lower"}


_SMALL = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)}
_SCALES = {"hundred": 100, "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}
_FRACTIONS = {"and a half": 0.5, "and a quarter": 0.25, "and three quarters": 0.75}


def _spelled(t: str) -> str:
    """A number written in words at the start of `t` as digits: "nine times" -> "9 times",
    "one and a half times" -> "1.5 times", "twenty-four and a half gigabytes" -> "24.5
    gigabytes", "seven billion" -> "7000000000". Anything else is returned as it is ("twice"
    stays a word: it is not a number the reader should guess at)."""
    words = t.replace("-", " ").split()
    total, group, used = 0.0, 0.0, 0
    for w in words:
        if w in _SMALL:
            group += _SMALL[w]
        elif w in _TENS:
            group += _TENS[w]
        elif w in _SCALES and (group or total):
            if w == "hundred":
                group *= 100
            else:
                total, group = total + group * _SCALES[w], 0.0
        else:
            break
        used += 1
    if not used:
        return t
    value, rest = total + group, " ".join(words[used:])
    for phrase, part in _FRACTIONS.items():
        if rest == phrase or rest.startswith(phrase + " "):
            value, rest = value + part, rest[len(phrase):].strip()
            break
    return f"{value:g} {rest}".strip() if value != int(value) else f"{int(value)} {rest}".strip()


def _read(text: str) -> tuple[float, str, str] | None:
    """`read_quantity`, with the words after the unit ("more", "per rank")."""
    t = unicodedata.normalize("NFKC", str(text)).strip().lower().rstrip(".")
    t = t.replace(",", "").replace("_", "").replace("\u2009", "").replace("\u00a0", " ")
    t = _spelled(_APPROX.sub("", t).strip())
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
    return value, u, rest


def parse_quantity(text: str, unit: str | None = None, scale: float = 1.0) -> float | None:
    """One quantity in base units (module docstring), or None when `text` is not one. `unit`:
    the question's unit, whose family the answer must use (a bare number is in it, so times
    `scale`); None accepts any known unit and reads a bare number as it is."""
    read = _read(text)
    if read is None:
        return None
    value, u, rest = read
    if u == "":
        return value * (scale if unit is not None else 1.0)
    family = None if unit is None else unit_family(unit)
    if u in UNIT_FAMILIES["percent"] and family == "ratio":  # "50 % more" is 1.5 times, "25 % less" 0.75
        words = set(rest.split())
        if words & MORE:
            return 1 + value / 100
        if words & LESS:
            return 1 - value / 100
        return value / 100  # a percentage of the base: "150 %" (of DDP's bytes) is 1.5 times
    units = _ANY_UNIT if unit is None else UNIT_FAMILIES[family]
    if u not in units:
        return None
    return value * units[u]


def readings(text: str, unit: str | None = None, scale: float = 1.0) -> list[float]:
    """Every value `text` may mean for a question in `unit`: `parse_quantity`'s, and, for a
    bare number asked in a unit of bytes, the number as bytes ("38,500,000,000" for 38.5 GB:
    a person who writes every digit means bytes). Empty when `text` is not one quantity."""
    first = parse_quantity(text, unit, scale)
    if first is None:
        return []
    out = [first]
    read = _read(text)
    if unit is not None and read[1] == "" and unit_family(unit) == "bytes" and scale != 1:
        out.append(read[0])
    return out


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


_NUMBER_WORDS = {"one": "1", "two": "2", "three": "3", "four": "4", "first": "1", "second": "2", "third": "3",
                 "fourth": "4", "1st": "1", "2nd": "2", "3rd": "3", "4th": "4"}


def normalize_term(text: str) -> str:
    """Case, width, spaces, hyphens, underscores and punctuation dropped; a leading article
    too; small numbers and ordinals in words as digits ("stage one", "the third stage").
    "Reduce-Scatter", "reduce_scatter" and "the reduce scatter" all give "reducescatter"."""
    t = unicodedata.normalize("NFKC", str(text)).strip().lower()
    t = re.sub(r"^(?:the|a|an)\s+", "", t)
    t = re.sub(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", lambda m: _NUMBER_WORDS[m.group(1)], t)
    return "".join(ch for ch in t if ch.isalnum())


_KEYWORD = re.compile(r"^[a-z_][\w.]*\s*=\s*(.+)$", re.I)      # device="meta"
_CALL = re.compile(r"^[a-z_][\w.]*\((.*)\)$", re.I)              # torch.device("meta")
_QUOTED = re.compile(r"""^(["'`])(.*)\1$""")                     # "meta"


def term_forms(text: str) -> list[str]:
    """The answer, and what it says when written as code: the value of a keyword argument,
    the argument of a call, the inside of quotes (`device="meta"` also reads "meta"). Only a
    whole answer in one of those forms is unwrapped, never a term inside a sentence."""
    t = unicodedata.normalize("NFKC", str(text)).strip().rstrip(".")
    out = [t]
    for _ in range(4):
        m = _KEYWORD.match(t) or _CALL.match(t) or _QUOTED.match(t)
        if not m:
            break
        t = m.group(m.lastindex).strip()
        out.append(t)
    return out


_STOP = {"a", "an", "the", "of", "in", "on", "at", "to", "as", "is", "are", "its", "it", "and", "or", "for",
         "each", "every", "be", "by", "with", "while", "when", "then", "that", "this", "their", "so"}


# Words that say "the same" (an option "they stay the same" is meant by "unchanged", "all four the
# same" by "all equal"), and small numbers in words: one content word each, on both sides.
_SAME = {"equal", "equally", "identical", "unchanged", "constant", "same"}
_WORD_NUMBERS = {"two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8"}


def _content_words(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+", unicodedata.normalize("NFKC", str(text)).lower())
    words = ["same" if w in _SAME else _WORD_NUMBERS.get(w, w) for w in words]
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words if w not in _STOP}


def match_option(text: str, options) -> int | None:
    """The option an answer written in words means: the one holding most of the answer's
    content words (at least 60 % of them, plural or singular), and strictly more than any
    other; None when no option stands out (an answer naming two options means neither)."""
    words = _content_words(text)
    if not words:
        return None
    scores = sorted(((len(words & _content_words(o)) / len(words), i) for i, o in enumerate(options)), reverse=True)
    best, i = scores[0]
    if best < 0.6 or (len(scores) > 1 and scores[1][0] >= best):
        return None
    # Another option named whole besides it ("reduce-scatter all-gather"): two answers, none.
    mine = _content_words(options[i])
    if any(j != i and (w := _content_words(o)) and w <= words and not w <= mine for j, o in enumerate(options)):
        return None
    return i


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
            return _in_words(t, options) if isinstance(answer, str) else None
        picked.add(by_key[k])
    return frozenset(picked)


def _in_words(text: str, options) -> frozenset[int] | None:
    """Options named in words: the whole answer matched to one option, else each part of a
    list ("optimizer state and gradients") matched to its own."""
    parts = [p for p in re.split(r"\s*[,;]\s*|\s+and\s+|\s*\+\s*", text) if p.strip()]
    if len(parts) >= 2:
        picked = [match_option(p, options) for p in parts]
        if None not in picked and len(set(picked)) == len(picked):
            return frozenset(picked)
    one = match_option(text, options)
    return None if one is None else frozenset({one})


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


_PLAN_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                 "ten": 10, "twelve": 12, "sixteen": 16, "thirty-two": 32, "thirty two": 32, "sixty-four": 64,
                 "sixty four": 64, "first": 1, "second": 2, "third": 3}
_AXES = {"dp": r"dp|data[- ]parallel(?:ism)?", "tp": r"tp|tensor[- ]parallel(?:ism)?|tensor",
         "pp": r"pp|pipeline[- ]parallel(?:ism)?|pipeline(?: stages)?", "cp": r"cp|context[- ]parallel(?:ism)?"}


def read_plan(text: str) -> dict[str, int] | None:
    """A parallel plan written as a person would: each axis's size and the ZeRO level, as
    {"dp", "tp", "pp", "zero"[, "cp"]}; None when one of dp, tp, pp or the ZeRO level is missing
    or an axis is given two sizes. Read: "dp 8, tp 8, pp 4, ZeRO-1", "tp=8 pp=4 dp=8 zero 1",
    "DP=8 TP=8 PP=4 stage 1", "8-way data parallel, 8-way tensor parallel, 4 pipeline stages,
    ZeRO stage one", numbers in words; FSDP alone names ZeRO-3 and DDP ZeRO-0. The design
    exercise's grader (`theory.planner.grade_design`) reads answers here."""
    t = unicodedata.normalize("NFKC", str(text)).lower()
    t = re.sub(r"\b(" + "|".join(sorted(_PLAN_NUMBERS, key=len, reverse=True)) + r")\b",
               lambda m: str(_PLAN_NUMBERS[m.group(1)]), t)
    got: dict[str, set[int]] = {}
    for key, axis in _AXES.items():
        for pat in (rf"\b(?:{axis})\s*(?:=|:|-|\bof\b|\bsize\b|\bdegree\b)?\s*(\d+)\b",
                    rf"\b(\d+)\s*-?\s*(?:way\s+)(?:{axis})\b", rf"\b(\d+)\s+(?:{axis})\b(?=\s*(?:stages|ranks|gpus))"):
            got.setdefault(key, set()).update(int(v) for v in re.findall(pat, t))
    zero = {int(v) for v in re.findall(r"\bzero\s*(?:-|_)?\s*(?:stage|level)?\s*(?:=|:|-)?\s*(\d)\b", t)}
    zero |= {int(v) for v in re.findall(r"\bstage\s*(\d)\b", t)}
    if not zero and re.search(r"\bfsdp\b", t):
        zero = {3}
    if not zero and re.search(r"\bddp\b", t):
        zero = {0}
    got["zero"] = zero
    if any(len(v) > 1 for v in got.values()) or not all(got[k] for k in ("dp", "tp", "pp", "zero")):
        return None
    return {k: next(iter(v)) for k, v in got.items() if v}


__all__ = ["LETTERS", "learner_seed", "read_plan", "UNIT_FAMILIES", "unit_family", "read_quantity", "parse_quantity", "readings",
           "is_number", "read_number", "close", "normalize_term", "term_forms", "match_option", "read_choice"]
