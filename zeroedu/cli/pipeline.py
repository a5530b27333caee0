"""``zeroedu pipeline``: `zeroedu run` with pipeline parallelism by default (DDP over each of 2 stages
of one rank, 1F1B over 4 micro-batches, gpt-tiny, fp32); every `run` option applies.

    zeroedu pipeline                                  # = zeroedu run --strategy ddp --world-size 2 --pp 2 ...
    zeroedu pipeline --pp 4 --world-size 4 --model gpt-small --micro-batches 8 --schedule gpipe
    zeroedu pipeline --world-size 4 --strategy zero2  # each stage ZeRO-2 over dp 2: its bytes grow with m
    zeroedu pipeline --pp 4 --world-size 4 --model gpt-small --emulate 50,100  # the bubble, timed
"""
from __future__ import annotations

from .run import add_arguments, cmd_run


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("pipeline", help="zeroedu run with pipeline parallelism (GPipe, 1F1B) by default "
                                               "(ddp, --world-size 2 --pp 2 --micro-batches 4, gpt-tiny, fp32)")
    add_arguments(p, strategy_required=False)
    p.set_defaults(func=cmd_run, strategy="ddp", world_size=2, pp=2, micro_batches=4, model="gpt-tiny", recipe="fp32")
