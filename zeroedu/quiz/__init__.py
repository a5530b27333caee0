"""Interview rehearsal: cards (`deck`) graded by structured checks (`grading`), numeric drills
graded by the theory (`drills`), and the terminal loop behind ``zeroedu quiz`` (`session`).
`widget` holds the notebook version."""
from .deck import CARDS, NOTEBOOKS, TOPICS, Card, cards, get_card
from .drills import Drill, draw_drills
from .grading import CardGrade, Choice, Number, Point, Term
from .session import Score, Session, build

__all__ = ["CARDS", "NOTEBOOKS", "TOPICS", "Card", "cards", "get_card", "CardGrade", "Choice", "Number",
           "Point", "Term", "Drill", "draw_drills", "Score", "Session", "build"]
