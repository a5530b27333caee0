"""Notebook versions of the quiz: a drill trainer and a flash-card viewer (ipywidgets).

Same data and grading as the terminal quiz (`drills.Drill.grade`, `deck.Card.score`); only the
input and output differ. Kept inside zeroedu.quiz so the suite's dashboard widgets stay separate.
"""
from __future__ import annotations

import html
import random

import ipywidgets as W

from . import deck, drills


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>"


class DrillTrainer:
    """One drill at a time: type an answer, Check shows the verdict and the worked solution."""

    def __init__(self, seed: int = 0, topic: str | None = None):
        self.rng = random.Random(seed)
        self.topic = topic
        self.right = self.done = 0
        self.prompt = W.HTML()
        self.answer = W.Text(placeholder="e.g. 26.25 GB or yes", layout=W.Layout(width="320px"))
        self.check_btn = W.Button(description="Check", button_style="primary")
        self.next_btn = W.Button(description="Next drill")
        self.feedback = W.HTML()
        self.score = W.HTML()
        self.check_btn.on_click(lambda _: self.check())
        self.next_btn.on_click(lambda _: self.next())
        self.answer.on_submit(lambda _: self.check())
        self.view = W.VBox([self.prompt, W.HBox([self.answer, self.check_btn, self.next_btn]),
                            self.feedback, self.score])
        self.next()

    def next(self):
        strategies = drills.TOPIC_STRATEGIES.get(self.topic, drills.STRATEGIES)
        self.drill = drills.make_drill(self.rng, drills.KINDS, strategies)
        self.prompt.value = f"<b>{html.escape(self.drill.prompt())}</b>"
        self.answer.value, self.feedback.value, self.answered = "", "", False

    def check(self, text: str | None = None) -> bool:
        if text is not None:
            self.answer.value = text
        ok, verdict = self.drill.grade(self.answer.value)
        if not self.answered:
            self.answered, self.done, self.right = True, self.done + 1, self.right + int(ok)
        self.feedback.value = ("✓ " if ok else "✗ ") + html.escape(verdict) + _pre(self.drill.worked())
        self.score.value = f"score: {self.right}/{self.done}"
        return ok

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view)


class CardViewer:
    """Pick a card, write your answer, Reveal shows the must-hit points you missed and the answer."""

    def __init__(self, topic: str | None = None):
        cards = deck.cards(topic)
        self.pick = W.Dropdown(options=[(c.question, c.id) for c in cards], layout=W.Layout(width="720px"))
        self.answer = W.Textarea(placeholder="your 30-second answer", layout=W.Layout(width="720px", height="90px"))
        self.reveal_btn = W.Button(description="Reveal", button_style="primary")
        self.out = W.HTML()
        self.reveal_btn.on_click(lambda _: self.reveal())
        self.pick.observe(lambda _: setattr(self.out, "value", ""), names="value")
        self.view = W.VBox([self.pick, self.answer, self.reveal_btn, self.out])

    def reveal(self) -> tuple[int, int]:
        card = deck.get_card(self.pick.value)
        hit, total, missed = card.score(self.answer.value)
        head = f"<b>{hit}/{total} must-hit points</b>" + "".join(
            f"<br>missed: {html.escape(p.text)}" for p in missed)
        self.out.value = head + _pre(card.as_text())
        return hit, total

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view)


__all__ = ["DrillTrainer", "CardViewer"]
