"""Interview rehearsal: cards (`deck`), numeric drills graded by the theory (`drills`), and the
terminal loop behind ``zeroedu quiz`` (`session`). `widget` holds the notebook version."""
from .deck import CARDS, TOPICS, Card, cards, get_card
from .drills import Drill, draw_drills
from .session import Score, Session, build

__all__ = ["CARDS", "TOPICS", "Card", "cards", "get_card", "Drill", "draw_drills", "Score", "Session", "build"]
