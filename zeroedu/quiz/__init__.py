"""Interview rehearsal: cards (`deck`) graded by structured checks (`grading`), numeric drills
graded by the theory (`drills`), and the terminal loop behind ``zeroedu quiz`` (`session`, with
the one-hour refresher plan). `widget` holds the notebook version; `proof` sets a card's figures
beside their closed forms worked by hand (notebook 12)."""
from .deck import CARDS, NOTEBOOKS, TOPICS, Card, cards, get_card
from .drills import Drill, draw_drills
from .grading import CardGrade, Choice, Number, Point, Term
from .session import REFRESHER, Score, Session, build, refresher_plan

__all__ = ["CARDS", "NOTEBOOKS", "TOPICS", "Card", "cards", "get_card", "CardGrade", "Choice", "Number",
           "Point", "Term", "Drill", "draw_drills", "Score", "Session", "build", "REFRESHER", "refresher_plan"]
