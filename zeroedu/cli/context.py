"""``zeroedu context``: `zeroedu run` with context parallelism by default (DDP over cp 2, gpt-tiny
with eager attention, fp32); every `run` option applies.

    zeroedu context                                   # = zeroedu run --strategy ddp --cp 2 ...
    zeroedu context --cp 4 --zigzag --global-batch 4
"""
from __future__ import annotations

from .run import add_arguments, cmd_run


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("context", help="zeroedu run with context parallelism (ring attention) by default "
                                              "(ddp, --cp 2, gpt-tiny, eager attention, fp32)")
    add_arguments(p, strategy_required=False)
    p.set_defaults(func=cmd_run, strategy="ddp", cp=2, model="gpt-tiny", attention="eager", recipe="fp32")
