"""Proving a card's figures in a notebook: each figure beside the closed form written out by hand.

A card's figures are `zeroedu.theory` expressions (`deck.Fig`); the rehearsal notebook sets each
beside the formula worked by hand from the paper (ZeRO §5.1, §7; the ring model; Korthikanti et
al.), so a reader sees the number and where it comes from, and the cell asserts they agree.
Measured figures are proved against real runs in the notebook itself (`nbtools.assert_match`).
"""
from __future__ import annotations

import math

from ..fmt import significant
from .deck import get_card


def figures_vs_by_hand(card_id: str, by_hand: dict[str, float], rel: float = 1e-9) -> None:
    """Print each named figure of card `card_id` beside `by_hand[name]` (a closed form evaluated
    by the caller, in base units: bytes, seconds, a plain ratio) and assert that they agree
    within `rel`. Ends with the line "card <id>: every figure equals its closed form (k of k)"; a
    figure that disagrees is marked ✗ and raises."""
    card = get_card(card_id)
    unknown = sorted(set(by_hand) - set(card.figures))
    if unknown:
        raise ValueError(f"card {card_id} has no figure(s) {unknown}; it has {sorted(card.figures)}")
    ok_all = True
    width = max(len(n) for n in by_hand) if by_hand else 0
    for name, value in by_hand.items():
        fig = card.figures[name]
        got = float(fig.value())
        ok = math.isclose(got, float(value), rel_tol=rel, abs_tol=0.0 if value else rel)
        ok_all &= ok
        hand = significant(float(value) / fig.scale, fig.digits)
        hand = hand + fig.unit if fig.unit in ("×", "%", "") else f"{hand} {fig.unit}"
        print(f"  {name:<{width}}  card {fig.text():>14}   by hand {hand:>14}   {'✓' if ok else '✗'}")
    if not ok_all:
        raise AssertionError(f"card {card_id}: a figure disagrees with its closed form (✗ above)")
    print(f"card {card_id}: every figure equals its closed form ({len(by_hand)} of {len(by_hand)})")


__all__ = ["figures_vs_by_hand"]
