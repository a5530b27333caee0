"""Classroom labs: write a piece of the real algorithm, graded on real ranks without an answer key.

1. ring reduce-scatter from send/recv;      2. ZeRO-2 gradient sharding of a flat unit;
3. the FSDP linear layer's backward;        4. an HFSDP memory estimate (pure function);
5. ZeRO-2's backward hooks, inside the real ZeRO-2 (allocate, reduce-scatter in backward, free);
6. FSDP's unit lifecycle, inside the real FSDP1 (unshard, reshard, prefetch).

Three separate artefacts (see labs/README.md):

* the **student tree**, ``labs/student/``: skeletons whose solutions are ``raise NotImplementedError``;
* the **grader**, this package: `check` / `grade` run a student's file on N ranks and score each
  criterion against independent oracles (plain torch, `zeroedu.theory`, single-process training,
  the ledger's bytes and memory), on visible and hidden randomized cases;
* the **answer key**, generated only on request (``build --key DIR``) from the single sources in
  the repository's ``labs/source/``, which are not part of the installed package.

Command line::

    python -m zeroedu.labs list
    python -m zeroedu.labs check 5                        # labs/student/lab5_zero2_hooks.py
    python -m zeroedu.labs check all --dir alice/ --hidden --seed 7 --json
    python -m zeroedu.labs build [--key DIR]
"""
from .checks import DEFAULT_N, cases_for, check, check_all, grade, lab_path
from .generate import build_key, build_student, stale
from .grading import SCHEMA, LabResult
from .registry import LABS, TOTAL_POINTS, Lab, get_lab

__all__ = ["DEFAULT_N", "LABS", "SCHEMA", "TOTAL_POINTS", "Lab", "LabResult", "build_key", "build_student",
           "cases_for", "check", "check_all", "get_lab", "grade", "lab_path", "stale"]
