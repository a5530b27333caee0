"""``zeroedu quiz``: rehearse interview questions and sizing drills in the terminal.

Answers come one per line from stdin, so a script can pipe them in; end of input ends the
session and prints the score. ``--list`` prints every card with its figures and proofs.
"""
from __future__ import annotations

from ..quiz import deck, session


def cmd_quiz(args) -> int:
    if args.list:
        for c in deck.cards(args.topic):
            print(c.as_text())
            print("\n" + "-" * 72)
        return 0
    s = session.build(args.topic, seed=args.seed, n_drills=args.drills, n_cards=args.cards)
    s.run()
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("quiz", help="interview cards and numeric drills (answers from stdin)")
    p.add_argument("--topic", default=None, choices=list(deck.TOPICS) + ["all"],
                   help="only cards/drills on this topic")
    p.add_argument("--seed", type=int, default=0, help="which cards and drills (default 0)")
    p.add_argument("--drills", type=int, default=3, help="number of numeric drills (default 3)")
    p.add_argument("--cards", type=int, default=3, help="number of interview cards (default 3)")
    p.add_argument("--list", action="store_true", help="print the cards (answers, figures, proofs) and exit")
    p.set_defaults(func=cmd_quiz)
