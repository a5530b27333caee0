"""The terminal quiz loop: interview cards, then numeric drills, then a session score.

Reads one answer per line from `inp` and writes to `out` (stdin/stdout by default), so it works
interactively and from a script (``zeroedu quiz --list`` shows every check's answer). End of
input ends the session early but gracefully: a card or drill whose lines did not all arrive is
not counted, and the score of the ones answered is printed.

A card takes, one line each:

1. an answer for each of its checks (`Card.checks`: a number, a letter or letters, a short
   term), graded automatically (`grading`); then the model answer is shown;
2. the must-hit points the learner's own spoken answer made, ticked by number ("1,3", "all",
   "none" or an empty line). These are self-assessed and kept apart from the auto score.

A drill takes one line, graded by `drills.Drill.grade` (the theory within 1 %); the worked
solution follows.

`Score` keeps the auto-graded points (card checks and drills) and the self-ticked points
separately, and `Score.line()` prints both.
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from typing import TextIO

from . import deck as deck_mod
from . import drills as drills_mod
from ..answers import learner_seed
from .grading import parse_ticks


@dataclass
class Score:
    points: int = 0  # auto-graded: card checks + drills
    total: int = 0
    self_points: int = 0  # self-ticked must-hit points, reported apart
    self_total: int = 0
    answered: int = 0
    log: list[dict] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.points / self.total if self.total else 0.0

    def line(self) -> str:
        s = (f"Session score: {self.points}/{self.total} auto-graded "
             f"({100 * self.fraction:.0f}%) over {self.answered} question(s)")
        if self.self_total:
            s += f"; self-ticked {self.self_points}/{self.self_total} must-hit points (not in the score)"
        return s


class Session:
    def __init__(self, cards: list, drills: list, inp: TextIO | None = None, out: TextIO | None = None):
        self.cards, self.drills = list(cards), list(drills)
        self.inp = inp if inp is not None else sys.stdin
        self.out = out if out is not None else sys.stdout
        self.score = Score()

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def ask(self, prompt: str) -> str | None:
        """One line of answer, or None at end of input."""
        self.out.write(prompt)
        self.out.flush()
        line = self.inp.readline()
        if line == "":
            return None
        if not getattr(self.inp, "isatty", lambda: False)():
            self.say(line.rstrip("\n"))  # echo scripted answers so a transcript reads naturally
        return line.rstrip("\n")

    def run_card(self, i: int, card) -> bool:
        self.say(f"\n[{i}] {card.question}\n    {card.question_zh}")
        n = len(card.checks)
        self.say(f"  Give your 30-second answer (aloud or on paper), then {n} check(s), one line each.")
        answers = []
        for j in range(n):
            lines = card.check_prompt(j).splitlines()
            self.say(f"  ({j + 1}/{n}) {lines[0]}")
            for extra in lines[1:]:
                self.say("    " + extra.strip())
            a = self.ask("  > ")
            if a is None:
                return False
            answers.append(a)
        g = card.grade(answers)
        self.say(f"  {g.summary()}")
        for r in g.results:
            self.say("    " + r.line())
        self.say("  30-second answer: " + card.rendered_answer())
        self.say("  Must hit (tick the ones your answer made):")
        for k, p in enumerate(card.must_hit):
            self.say(f"    {k + 1}. {p.text}")
        t = self.ask("  points you made (e.g. 1,3; all; none)> ")
        if t is None:
            return False
        ticked = parse_ticks(t, len(card.must_hit))
        if ticked is None:
            self.say(f"  could not read {t.strip()!r} as point numbers; counted as none")
            ticked = ()
        g = card.grade(answers, ticked)
        self.score.points += g.auto_points
        self.score.total += g.auto_total
        self.score.self_points += g.self_points
        self.score.self_total += g.tick_total
        self.score.answered += 1
        self.score.log.append({"card": card.id, "points": g.auto_points, "of": g.auto_total,
                               "ticked": g.self_points, "of_ticks": g.tick_total})
        self.say(f"  {g.summary()}")
        for e in card.evidence:
            self.say("  proof: " + e.text())
        return True

    def run_drill(self, i: int, drill) -> bool:
        self.say(f"\n[{i}] {drill.prompt()}")
        ans = self.ask("> ")
        if ans is None:
            return False
        ok, verdict = drill.grade(ans)
        self.score.points += int(ok)
        self.score.total += 1
        self.score.answered += 1
        self.score.log.append({"drill": drill.kind, "strategy": drill.strategy, "ok": ok})
        self.say(("  ✓ " if ok else "  ✗ ") + verdict)
        self.say("  worked solution:\n" + "\n".join("    " + l for l in drill.worked().splitlines()))
        return True

    def run(self) -> Score:
        self.say(f"zeroedu quiz: {len(self.cards)} interview card(s), {len(self.drills)} drill(s). "
                 "One line per answer; end of input (Ctrl-D) stops.")
        i = 1
        items = [(self.run_card, c) for c in self.cards] + [(self.run_drill, d) for d in self.drills]
        for fn, item in items:
            if not fn(i, item):
                self.say("\n(end of input: stopping)")
                break
            i += 1
        self.say("\n" + self.score.line())
        return self.score


# The one-hour refresher: every card once, topic by topic, from the collectives up to composing
# with TP/PP, with one sizing drill per topic. Minutes per topic, in that order (sum: 60).
REFRESHER = (("comm", 6), ("ddp", 4), ("zero", 10), ("fsdp", 11), ("megatron", 4), ("hybrid", 6),
             ("memory", 8), ("training", 7), ("composition", 4))


def refresher_plan() -> list[dict]:
    """The one-hour refresher as rows: minutes, topic, the topic's card ids (deck order) and the
    ``zeroedu quiz`` command that rehearses exactly those cards plus one drill."""
    rows = []
    for topic, minutes in REFRESHER:
        ids = [c.id for c in deck_mod.cards(topic)]
        rows.append({"minutes": minutes, "topic": topic, "cards": ids,
                     "command": f"zeroedu quiz --topic {topic} --cards {len(ids)} --drills 1"})
    return rows


def scripted_answers(s: Session, ticks: str = "all") -> str:
    """The stdin that answers every question of `s` right (and ticks `ticks`): for scripts/tests."""
    lines = []
    for c in s.cards:
        lines += c.model_responses() + [ticks]
    lines += [d.expected_text() for d in s.drills]
    return "\n".join(lines) + "\n"


MAX_DRILLS = 1000  # drills in one session: a person answers them one by one


def build(topic: str | None = None, seed: int = 0, n_drills: int = 3, n_cards: int | None = 3,
          card_ids: list[str] | None = None, learner: str | None = None) -> Session:
    """Pick `n_cards` cards of `topic` (all when None) and `n_drills` drills, both by `seed`;
    or exactly the cards `card_ids`, in that order. Each card's options in the order of
    `learner` (`deck.for_learner`; default: ZEROEDU_LEARNER, else the login name)."""
    if n_drills < 0 or (n_cards is not None and n_cards < 0):
        raise ValueError("--drills and --cards must be >= 0")
    if n_drills > MAX_DRILLS:
        raise ValueError(f"--drills {n_drills}: at most {MAX_DRILLS} in one session (each is a question you "
                         "answer; run the quiz again for more)")
    if card_ids:
        chosen = [deck_mod.get_card(c) for c in card_ids]
    else:
        pool = deck_mod.cards(topic)
        rng = random.Random(seed)
        chosen = pool if n_cards is None or n_cards >= len(pool) else rng.sample(pool, n_cards)
    own = learner_seed(learner)
    return Session([deck_mod.for_learner(c, own) for c in chosen],
                   drills_mod.draw_drills(n_drills, seed=seed, topic=topic))


__all__ = ["Session", "Score", "build", "scripted_answers", "REFRESHER", "refresher_plan"]
