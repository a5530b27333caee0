"""The terminal quiz loop: interview cards, then numeric drills, then a session score.

Reads one answer per line from `inp` and writes to `out` (stdin/stdout by default), so it works
interactively and from a script (``printf 'answer\\n112\\n' | zeroedu quiz``). End of input ends
the session early but gracefully: the questions not reached are not counted, and the score of
the ones answered is printed.

Scoring: a card is worth one point per must-hit point the answer mentions (keyword match, see
`deck.Point`), a drill one point when within 1 % of the theory (`drills.Drill.grade`). After each
answer the session shows the model answer (cards) or the worked solution (drills).
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from typing import TextIO

from . import deck as deck_mod
from . import drills as drills_mod


@dataclass
class Score:
    points: int = 0
    total: int = 0
    answered: int = 0
    log: list[dict] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.points / self.total if self.total else 0.0

    def line(self) -> str:
        return (f"Session score: {self.points}/{self.total} "
                f"({100 * self.fraction:.0f}%) over {self.answered} question(s)")


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
        ans = self.ask("your answer (one line)> ")
        if ans is None:
            return False
        hit, total, missed = card.score(ans)
        self.score.points += hit
        self.score.total += total
        self.score.answered += 1
        self.score.log.append({"card": card.id, "points": hit, "of": total})
        self.say(f"  {hit}/{total} must-hit points.")
        for p in missed:
            self.say(f"  missed: {p.text}")
        self.say("  30-second answer: " + card.rendered_answer())
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


def build(topic: str | None = None, seed: int = 0, n_drills: int = 3, n_cards: int | None = 3) -> Session:
    """Pick `n_cards` cards of `topic` (all when None) and `n_drills` drills, both by `seed`."""
    if n_drills < 0 or (n_cards is not None and n_cards < 0):
        raise ValueError("--drills and --cards must be >= 0")
    pool = deck_mod.cards(topic)
    rng = random.Random(seed)
    chosen = pool if n_cards is None or n_cards >= len(pool) else rng.sample(pool, n_cards)
    return Session(chosen, drills_mod.draw_drills(n_drills, seed=seed, topic=topic))


__all__ = ["Session", "Score", "build"]
