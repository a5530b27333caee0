"""``zeroedu quiz``: rehearse interview questions and sizing drills in the terminal.

Answers come one per line from stdin, so a script can pipe them in: per card one line per
check (a number, a letter or letters, a short term), then one line of self-ticked must-hit
points ("1,3", "all", "none"); per drill one line. End of input ends the session and prints the
score: auto-graded points, and the self-ticked points apart. ``--list`` prints every card with
its model answer, checks and their answers, figures and proofs.
"""
from __future__ import annotations

from ..quiz import deck, session


def cmd_quiz(args) -> int:
    if args.list:
        chosen = [deck.get_card(c) for c in args.card] if args.card else deck.cards(args.topic)
        for c in chosen:
            print(c.as_text())
            print("\n" + "-" * 72)
        return 0
    s = session.build(args.topic, seed=args.seed, n_drills=args.drills, n_cards=args.cards,
                      card_ids=args.card, learner=args.learner)
    s.run()
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("quiz", help="interview cards and numeric drills (answers from stdin)")
    p.add_argument("--topic", default=None, choices=list(deck.TOPICS) + ["all"],
                   help="only cards/drills on this topic")
    p.add_argument("--card", action="append", default=None, choices=list(deck.BY_ID), metavar="ID",
                   help="rehearse this card (repeatable); overrides --topic/--cards for the cards")
    p.add_argument("--seed", type=int, default=0, help="which cards and drills (default 0)")
    p.add_argument("--learner", default=None, metavar="NAME",
                   help="whose order of the options (default: $ZEROEDU_LEARNER, else the login name)")
    p.add_argument("--drills", type=int, default=3, help="number of numeric drills (default 3)")
    p.add_argument("--cards", type=int, default=3, help="number of interview cards (default 3)")
    p.add_argument("--list", action="store_true",
                   help="print the cards (answers, checks, figures, proofs) and exit")
    p.set_defaults(func=cmd_quiz)
