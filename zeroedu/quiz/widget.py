"""Notebook versions of the quiz: a drill trainer and a flash-card viewer (ipywidgets).

Same data and grading as the terminal quiz (`drills.Drill.grade`, `deck.Card.grade`); only the
input and output differ. Kept inside zeroedu.quiz so the suite's dashboard widgets stay separate.

`CardViewer`: pick a card, write notes for your 30-second answer (not graded), answer its
checks (a text box per number or term, radio buttons or tick boxes per choice), press Check.
The auto-graded result and the model answer appear, with a tick box per must-hit point; the
ticks update the self-assessed score, shown apart. Scripted use: ``viewer.pick.value = id``,
``viewer.set_answers(card.model_responses())``, ``viewer.check()`` -> `grading.CardGrade`,
``viewer.tick([0, 2])``.
"""
from __future__ import annotations

import html
import random

import ipywidgets as W

from . import deck, drills
from ..answers import LETTERS, learner_seed
from .grading import Choice


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>"


class DrillTrainer:
    """One drill at a time: type an answer, Check shows the verdict and the worked solution."""

    def __init__(self, seed: int = 0, topic: str | None = None):
        self.rng = random.Random(seed)
        self.topic = topic
        self.right = self.done = 0
        self.prompt = W.HTML()
        # continuous_update=False: the value changes on Enter (or leaving the box), which checks
        # the answer; ipywidgets 8 deprecates Text.on_submit for this.
        self.answer = W.Text(placeholder="e.g. 26.25 GB or yes", continuous_update=False,
                             layout=W.Layout(width="320px"))
        self._setting = False  # True while the code itself sets the answer box
        self.check_btn = W.Button(description="Check", button_style="primary")
        self.next_btn = W.Button(description="Next drill")
        self.feedback = W.HTML()
        self.score = W.HTML()
        self.check_btn.on_click(lambda _: self.check())
        self.next_btn.on_click(lambda _: self.next())
        self.answer.observe(self._submitted, names="value")
        self.view = W.VBox([self.prompt, W.HBox([self.answer, self.check_btn, self.next_btn]),
                            self.feedback, self.score])
        self.next()

    def _set_answer(self, text: str) -> None:
        self._setting = True
        try:
            self.answer.value = text
        finally:
            self._setting = False

    def _submitted(self, change) -> None:
        if not self._setting and change["new"].strip():
            self.check()

    def next(self):
        strategies = drills.TOPIC_STRATEGIES.get(self.topic, drills.STRATEGIES)
        kinds = drills.TOPIC_KINDS.get(self.topic, drills.KINDS)
        self.drill = drills.make_drill(self.rng, kinds, strategies)
        self.prompt.value = f"<b>{html.escape(self.drill.prompt())}</b>"
        self._set_answer("")
        self.feedback.value, self.answered = "", False

    def check(self, text: str | None = None) -> bool:
        if text is not None:
            self._set_answer(text)
        ok, verdict = self.drill.grade(self.answer.value)
        if not self.answered:
            self.answered, self.done, self.right = True, self.done + 1, self.right + int(ok)
        self.feedback.value = ("✓ " if ok else "✗ ") + html.escape(verdict) + _pre(self.drill.worked())
        self.score.value = f"score: {self.right}/{self.done}"
        return ok

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view)


class CardPrompt:
    """One card as a rehearsal shows it: the question and its checks, and a button that reveals
    the 30-second answer, the checks' answers, the follow-ups and the proof (`Card.as_text`) only
    when asked, so the answer is not read before it is tried."""

    def __init__(self, card_id: str):
        self.card = deck.get_card(card_id)
        self.question = W.HTML(_pre(self.card.prompt_text()))
        self.button = W.Button(description="Show the answer")
        self.answer = W.HTML()
        self.button.on_click(lambda _: self.reveal())
        self.view = W.VBox([self.question, self.button, self.answer])

    def reveal(self) -> str:
        self.answer.value = _pre(self.card.as_text())
        self.button.disabled = True
        return self.answer.value

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view)


def rehearse(card_id: str) -> CardPrompt:
    """`CardPrompt` for a card of the deck (notebook 12's sections)."""
    return CardPrompt(card_id)


class CardViewer:
    """Pick a card, answer its checks, Check grades them and reveals the model answer; tick the
    must-hit points your own answer made (self-assessed, reported apart)."""

    def __init__(self, topic: str | None = None):
        cards = deck.cards(topic)
        self.pick = W.Dropdown(options=[(f"[{c.id}] {c.question}", c.id) for c in cards],
                               layout=W.Layout(width="760px"))
        self.question = W.HTML()
        self.notes = W.Textarea(placeholder="your 30-second answer (notes, not graded)",
                                layout=W.Layout(width="760px", height="80px"))
        self.checks_box = W.VBox()
        self.check_btn = W.Button(description="Check", button_style="primary")
        self.result = W.HTML()
        self.ticks_box = W.VBox()
        self.self_score = W.HTML()
        self.details = W.HTML()
        self.grade = None
        self.check_btn.on_click(lambda _: self.check())
        self.pick.observe(lambda _: self._load(), names="value")
        self.view = W.VBox([self.pick, self.question, self.notes, self.checks_box, self.check_btn,
                            self.result, self.ticks_box, self.self_score, self.details])
        self._load()

    @property
    def card(self):
        # the options in this learner's order (answers.learner_seed), as the terminal quiz shows them
        return deck.for_learner(deck.get_card(self.pick.value), learner_seed())

    def _load(self) -> None:
        """Build the input widgets for the picked card; clear any previous grade."""
        card = self.card
        self.question.value = (f"<b>{html.escape(card.question)}</b><br>{html.escape(card.question_zh)}")
        self.inputs = []
        rows = []
        for i, c in enumerate(card.checks):
            label = W.HTML(f"{i + 1}. {html.escape(card.check_prompt(i).splitlines()[0])}")
            if isinstance(c, Choice):
                opts = [(f"{LETTERS[k]}) {card.render(o)}", LETTERS[k]) for k, o in enumerate(c.options)]
                if c.multi:
                    w = W.VBox([W.Checkbox(value=False, description=t, indent=False,
                                           layout=W.Layout(width="740px")) for t, _ in opts])
                else:
                    w = W.RadioButtons(options=opts, value=None, layout=W.Layout(width="740px"))
            else:
                w = W.Text(placeholder=c.hint(card.figures.get(getattr(c, "figure", ""), None)),
                           layout=W.Layout(width="320px"))
            self.inputs.append(w)
            rows.append(W.VBox([label, w]))
        self.checks_box.children = rows
        self.result.value = self.self_score.value = self.details.value = ""
        self.ticks_box.children = ()
        self.tick_boxes = []
        self.grade = None

    def answers(self) -> list[str]:
        """The current inputs as the strings the terminal quiz would read."""
        out = []
        for c, w in zip(self.card.checks, self.inputs):
            if isinstance(c, Choice) and c.multi:
                out.append(",".join(LETTERS[k] for k, b in enumerate(w.children) if b.value))
            elif isinstance(c, Choice):
                out.append(w.value or "")
            else:
                out.append(w.value)
        return out

    def set_answers(self, answers: list[str]) -> None:
        """Fill the inputs from terminal-style answers ("b", "a,c", "26.25 GB", "reduce-scatter")."""
        for c, w, a in zip(self.card.checks, self.inputs, answers):
            if isinstance(c, Choice):
                picked = c.read(a) or frozenset()
                if c.multi:
                    for k, b in enumerate(w.children):
                        b.value = k in picked
                else:
                    w.value = LETTERS[min(picked)] if len(picked) == 1 else None
            else:
                w.value = a

    def check(self):
        """Grade the checks, reveal the model answer and the must-hit tick boxes."""
        card = self.card
        self.grade = card.grade(self.answers(), ticked=())
        self.result.value = (f"<b>auto-graded {self.grade.auto_points}/{self.grade.auto_total}</b>" +
                             "".join(f"<br>{html.escape(r.line())}" for r in self.grade.results))
        self.tick_boxes = [W.Checkbox(value=False, description=p.text, indent=False,
                                      layout=W.Layout(width="740px")) for p in card.must_hit]
        for b in self.tick_boxes:
            b.observe(lambda _: self._update_ticks(), names="value")
        self.ticks_box.children = [W.HTML("<b>Must hit: tick the points your answer made</b>"), *self.tick_boxes]
        self.details.value = _pre(card.as_text())
        self._update_ticks()
        return self.grade

    reveal = check  # the old name of the button's action

    def tick(self, indices) -> None:
        """Tick must-hit points (0-based) as the learner would."""
        for i in indices:
            self.tick_boxes[i].value = True

    def _update_ticks(self) -> None:
        if self.grade is None:
            return
        ticked = [i for i, b in enumerate(self.tick_boxes) if b.value]
        self.grade = self.card.grade(self.answers(), ticked)
        self.self_score.value = (f"self-ticked {self.grade.self_points}/{self.grade.tick_total} "
                                 "(self-assessed, not part of the auto-graded score)")

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view)


__all__ = ["CardPrompt", "CardViewer", "DrillTrainer", "rehearse"]
