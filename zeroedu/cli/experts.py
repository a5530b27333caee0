"""``zeroedu experts``: `zeroedu run` with a mixture of experts over ep ranks by default (ZeRO-2 over
dp 2 x ep 2, 4 experts, top-1, gpt-tiny, fp32); every `run` option applies.

    zeroedu experts                                   # = zeroedu run --strategy zero2 --experts 4 --ep 2 ...
    zeroedu experts --experts 8 --ep 4 --top-k 2 --capacity-factor 1.0
"""
from __future__ import annotations

from .run import add_arguments, cmd_run


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("experts", help="zeroedu run with a mixture of experts over ep ranks (defaults: zero2, "
                                              "--experts 4 --ep 2, gpt-tiny, fp32)")
    add_arguments(p, strategy_required=False)
    p.set_defaults(func=cmd_run, strategy="zero2", experts=4, ep=2, model="gpt-tiny", recipe="fp32")
