"""Classroom labs: write a piece of the real algorithm, check it on real ranks.

1. ring reduce-scatter from send/recv;  2. ZeRO-2 gradient sharding of a flat unit;
3. the FSDP linear layer's backward;   4. an HFSDP memory estimate (pure function).

Each lab has ONE source, `zeroedu/labs/sources/labN_*.py`, with its solution between
``# BEGIN SOLUTION`` / ``# END SOLUTION``; `generate` turns it into ``labs/student/`` (the
solution replaced by ``raise NotImplementedError("write ...")``) and ``labs/instructor/``.
`checks.check(n)` runs a file on real ranks against an independent reference and says what is
wrong. Command line::

    python -m zeroedu.labs build              # regenerate labs/student and labs/instructor
    python -m zeroedu.labs check 2            # check labs/student/lab2_*.py
    python -m zeroedu.labs check 2 --path my_lab2.py
    python -m zeroedu.labs check all --instructor
"""
from .checks import LABS, CheckResult, check, check_all, lab_path
from .generate import build, stale

__all__ = ["LABS", "CheckResult", "check", "check_all", "lab_path", "build", "stale"]
