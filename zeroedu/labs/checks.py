"""The grader: run a student's lab file on real ranks and grade it, without any answer key.

`check(lab, path)` draws the lab's cases (the visible ones, plus ``hidden`` randomized ones from
``seed``), runs the student's file on N ranks of `zeroedu.runtime.cluster` (lab 4 is a pure function
and runs here), and grades every criterion of the lab against independent oracles (`basic` for
labs 1-4, `training` for labs 5-6): plain torch on the same inputs, `zeroedu.theory`'s closed forms,
single-process training, the ledger's measured bytes and memory. It returns a `LabResult` (points,
per-test per-case diagnoses; `str()` for people, `as_dict()` for JSON).

Before anything runs, a file that is not UTF-8, does not parse, or is refused by `guard` (it
imports what the lab asks the student to write, the answer key or the grader, or reads frames)
is that lab's error. Every rank that loads a submission limits its own CPU time and memory
(`LIMITS`); lab 4 runs in a process of its own, with a time limit; `grade` (the autograder's
path) gives every lab fresh ranks.

It never lets a raw traceback escape: "not implemented yet: write ...", "rank 2, element 5: expected
12, got 4", "looks like the SUM: divide by N", the line of the student's file that raised, or that
the ranks hung. Cases that share N run in one rank job; when every case of a job failed (a
skeleton, a crash, a hang), the remaining jobs are not started: their cases fail with "not run".
"""
from __future__ import annotations

import dataclasses
import os
import random
import stat
from pathlib import Path

from ..runtime import cluster, strays
from ..runtime.rank import Limits
from . import basic, guard, paths, training, variants
from .generate import repo_labs
from .grading import Case, Diagnosis, LabResult, grade_dict
from .registry import LABS, get_lab  # noqa: F401 (get_lab: re-exported)

DEFAULT_N = 4
DEFAULT_HIDDEN = 2  # hidden cases per lab when hidden cases are asked for without a count
TIMEOUT = 30.0  # seconds per case before a silent rank counts as hung (a recv nobody sends to)
BACKEND = "gloo"
# What a rank that runs a submission may use (`rank.Limits`, set by the rank on itself before
# the submission loads): a reference solution's rank uses about 2 s of CPU and 380 MB of data
# per lab (labs 1-6, hidden cases included), so these leave 60x and 5x headroom, and a file
# that allocates without end or burns CPU on threads is stopped by the kernel. Each rank is
# also confined (`runtime.confine`, per submission in `limits_for`): it reads only the
# interpreter's files and the submission's own folder, and writes nothing but its log.
LIMITS = Limits(cpu_seconds=120, memory_bytes=2 << 30)
MAX_HIDDEN = 50  # hidden cases per lab a check accepts: each is a run on real ranks


def limits_for(path: Path) -> Limits:
    """The ranks' limits for the submission at `path`: `LIMITS`, confined to its folder."""
    return dataclasses.replace(LIMITS, confine=(str(path.resolve().parent),))


def lab_path(lab, directory: str | Path | None = None) -> Path:
    """`directory`/<lab file> (a student's submission folder), else ./labs/student/<file> when it
    exists, else the repository's labs/student/<file>."""
    info = get_lab(lab)
    if directory is not None:
        return Path(directory) / info.file
    local = Path.cwd() / "labs" / "student" / info.file
    return local if local.exists() else repo_labs() / "student" / info.file


def new_seed() -> int:
    """A fresh seed for the hidden cases: 128 random bits, so no submission can search the seeds
    for the one that reproduces the inputs it was given (32 bits could be enumerated)."""
    return int.from_bytes(os.urandom(16), "little")


def cases_for(lab: int, n: int = DEFAULT_N, hidden: int = 0, seed: int | None = None,
              variant: variants.Variant | None = None) -> list[Case]:
    """The cases a check runs: visible ones (the training labs': a student's `variant`, when
    given), then `hidden` drawn from `seed` (same seed, same cases)."""
    rng = random.Random(f"zeroedu-labs/{seed}/{lab}")
    if lab in training.GRADE:
        return training.cases(lab, n, hidden, rng, variant)
    return basic.cases(lab, n, hidden, rng)


# ------------------------------------------------------------------ running on ranks
def _hung_hint(lab: int) -> str:
    if lab == 1:
        return (": the ranks hung, most likely in recv() waiting for a message nobody sent. Each step, "
                "every rank must send exactly once to (rank + 1) % world and receive once from "
                "(rank - 1) % world.")
    return (": the ranks hung, most likely in a collective that not every rank called, or waiting for "
            "a handle whose collective was never launched on the other ranks.")


def _case_error(res: LabResult, case: Case, errs: list[tuple[int, dict]]) -> None:
    kinds = [x["error"] for _, x in errs]
    if "not_implemented" in kinds:
        x = next(x for _, x in errs if x["error"] == "not_implemented")
        res.fail_case(case, Diagnosis(f"not implemented yet: {x['message']}"), "not_implemented")
    elif "violation" in kinds:
        r, x = next((r, x) for r, x in errs if x["error"] == "violation")
        w = x.get("where") or {}
        res.fail_case(case, Diagnosis(f"not evaluated: the run stopped at the error reported under "
                                      f"'{x['test']}'", rank=r, unit=w.get("unit")))
        res.record(case, x["test"], Diagnosis(f"rank {r}: {x['message']}", rank=r, unit=w.get("unit")))
    elif "raised" in kinds:
        r, x = next((r, x) for r, x in errs if x["error"] == "raised")
        res.fail_case(case, Diagnosis(f"rank {r} raised {x['message']}{x.get('where', '')}", rank=r))
    else:
        res.fail_case(case, Diagnosis("not run: an earlier case failed on some rank"))


def _run_ranks(res: LabResult, path: Path, cases: list[Case], limits: Limits) -> None:
    lab = res.lab.number
    job = training.train_lab_job if lab in training.GRADE else basic.lab_job
    grade = training.GRADE.get(lab) or basic.GRADE[lab]
    groups: dict[int, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.n, []).append(c)
    stop = None
    for n, group in groups.items():
        if stop:
            for c in group:
                res.fail_case(c, Diagnosis(f"not run: {stop}"))
            continue
        try:
            # gloo on CPU always: the labs' tensors live on the CPU, and NCCL would need one GPU per rank.
            per_rank = cluster.get_pool(n, BACKEND, limits=limits).run(
                job, {"lab": lab, "path": str(path), "cases": [
                    training.rank_case(lab, c.params, n) if lab in training.GRADE else c.params for c in group]}, timeout=TIMEOUT * len(group))
        except cluster.RankError as e:
            hung = "did not finish" in e.kind
            last = (e.detail.strip().splitlines() or [""])[-1]
            msg = f"rank {e.rank if e.rank is not None else '?'} {e.kind}" + (_hung_hint(lab) if hung else f": {last}")
            for c in group:
                res.fail_case(c, Diagnosis(msg, rank=e.rank))
            stop = "an earlier case hung or crashed"
            continue
        all_failed = True
        for i, c in enumerate(group):
            ranks = [rr[i] for rr in per_rank]
            errs = [(r, x) for r, x in enumerate(ranks) if "error" in x]
            if errs:
                _case_error(res, c, errs)
                continue
            all_failed = False
            try:
                grade(res, c, ranks)
            except Exception as e:  # noqa: BLE001 - a checker bug must not look like the student's crash
                res.fail_case(c, Diagnosis(f"the checker itself failed ({type(e).__name__}: {e}); please report it"),
                              "error")
        if all_failed:
            stop = "the case(s) before failed first (see above)"


def _run_lab4(res: LabResult, path: Path, cases: list[Case], limits: Limits) -> None:
    """Lab 4 is a pure function, but it runs in a process of its own (a one-rank pool, closed
    after): a submission can neither patch the grader nor print into its output, and one that
    loops or exits is cut at the time limit and reported."""
    pool = cluster.Pool(1, BACKEND, limits=limits)
    try:
        results = pool.run(basic.lab4_job, {"path": str(path), "cases": [
            {"psi": c.params["psi"], "n": c.n, "m": c.params["m"], "recipe": c.params["recipe"]} for c in cases]},
            timeout=TIMEOUT)[0]
    except cluster.RankError as e:
        hung = "did not finish" in e.kind
        res.fail_all("your function did not return within the time limit (an endless loop?)" if hung
                     else f"your file stopped the process that ran it ({e.kind})", "error")
        return
    finally:
        pool.close()
    load_error = next((r["load_error"] for r in results if "load_error" in r), None)
    if load_error is not None:
        res.fail_all(f"your file does not load: {load_error['message']}{load_error.get('where', '')}", "error")
        return
    basic.grade_lab4(res, results, cases)


MAX_SUBMISSION_BYTES = 256 * 1024


def _readable(lab: int, p: Path) -> tuple[str | None, str]:
    """Why the file at `p` cannot be run (missing, not UTF-8, a syntax error, refused by
    `guard`), with the lab's status; (None, "") when it can."""
    if not p.exists():
        return f"no file at {p}; generate the student tree with `python -m zeroedu.labs build`", "missing"
    try:
        st = p.stat()
    except OSError as e:
        return f"cannot read {p}: {e.strerror}", "error"
    # A device (/dev/zero), a FIFO or a socket would be read forever or block: only a regular file,
    # and no larger than a lab file could sensibly be, checked before a byte of it is read.
    if not stat.S_ISREG(st.st_mode):
        return f"{p} is not a regular file: hand in the lab's .py file", "error"
    if st.st_size > MAX_SUBMISSION_BYTES:
        return (f"your file is {st.st_size:,} bytes; a lab file is at most {MAX_SUBMISSION_BYTES:,} "
                "(the skeleton is under 6 kB)"), "error"
    try:
        # never through a link swapped in since the check (O_NOFOLLOW)
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_SUBMISSION_BYTES + 1)  # the file may have grown since stat
        if len(raw) > MAX_SUBMISSION_BYTES:
            return f"your file is over {MAX_SUBMISSION_BYTES:,} bytes", "error"
        text = raw.decode("utf-8")
    except OSError as e:
        return f"cannot read {p}: {e.strerror}", "error"
    except UnicodeDecodeError as e:
        return (f"your file is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                "save it as UTF-8"), "error"
    try:
        compile(text, str(p), "exec")
    except SyntaxError as e:
        return f"your file has a syntax error, line {e.lineno}: {e.msg}", "error"
    refused = guard.refusal(lab, text)
    return (refused, "error") if refused else (None, "")


# ------------------------------------------------------------------ public API
def check(lab, path: str | Path | None = None, *, n: int = DEFAULT_N, hidden: int = 0, seed: int | None = None,
          directory: str | Path | None = None, quiet: bool = False, student: str | None = None,
          course: str = "", root: str | Path | None = None) -> LabResult:
    """Grade lab `lab` (1-8) in `path` (default: `lab_path(lab, directory)`); print unless `quiet`.

    The file, and every folder from `root` (a class's student folder, itself included), else
    `directory`, else the file's own folder, down to it, must not be a link, nor resolve outside
    it (`paths.link_refusal`): a refused file scores 0 with one line naming the link.

    `hidden` randomized cases per lab are added (drawn from `seed`; a fresh seed when None).
    `student`: the training labs' visible cases are that student's variant (`variants`, with
    `course`), and labs 7 and 8 grade the file's prediction against it."""
    info = get_lab(lab)
    if not isinstance(n, int) or not 2 <= n <= cluster.MAX_LOCAL_RANKS:
        raise ValueError(f"n must be an integer in [2, {cluster.MAX_LOCAL_RANKS}], got {n!r}")
    if not isinstance(hidden, int) or hidden < 0:
        raise ValueError(f"hidden must be an integer >= 0, got {hidden!r}")
    if hidden and seed is None:
        seed = new_seed()
    p = Path(path) if path is not None else lab_path(info.number, directory)
    res = LabResult(info, str(p))
    variant = variants.variant(student, course) if student is not None else None
    cases = cases_for(info.number, n, hidden, seed, variant)
    for c in cases:
        res.add_case(c)
    if variant is not None and info.number in training.GRADE:
        res.notes.append(f"visible cases: the {variant.describe()}")
    if root is not None:
        linked = paths.link_refusal(root, p, root_too=True)
    else:
        linked = paths.link_refusal(directory if directory is not None else p.parent, p)
    if linked is None and p.is_dir():
        raise ValueError(f"{p} is a folder: --path names one lab's file (e.g. labs/student/{info.file}); "
                         "for a folder of labs use --dir")
    problem, status = (linked, "error") if linked is not None else _readable(info.number, p)
    if problem is not None:
        res.fail_all(problem, status)
    else:
        limits = limits_for(p)
        # One submission folder's ranks at a time: warm pools confined to another folder end.
        cluster.shutdown_pools(lambda lim: lim is not None and lim.confine is not None and lim != limits)
        try:
            # Whatever the submission started (a forked child, a detached daemon) ends with
            # the check, before any grade is printed or written.
            with strays.no_strays():
                (_run_lab4 if info.number == 4 else _run_ranks)(res, p, cases, limits)
        except Exception as e:  # noqa: BLE001
            res.fail_all(f"the checker itself failed ({type(e).__name__}: {e}); please report it", "error")
    res.finish()
    if hidden:
        res.notes.append(f"{hidden} hidden case(s), seed {seed}")
    if not quiet:
        print(res)
    return res


def check_all(directory: str | Path | None = None, *, n: int = DEFAULT_N, hidden: int = 0,
              seed: int | None = None, quiet: bool = False, labs=None) -> list[LabResult]:
    if hidden and seed is None:
        seed = new_seed()
    return [check(k, n=n, hidden=hidden, seed=seed, directory=directory, quiet=quiet) for k in (labs or LABS)]


def grade(labs=None, *, path: str | Path | None = None, directory: str | Path | None = None, n: int = DEFAULT_N,
          hidden: int = 0, seed: int | None = None, student: str | None = None, course: str = "",
          root: str | Path | None = None) -> dict:
    """The machine-readable grade (`grading.SCHEMA`) of `labs` (default all)."""
    if hidden and seed is None:
        seed = new_seed()
    labs = list(labs or LABS)
    if path is not None and len(labs) != 1:
        raise ValueError("a path names one lab's file; use directory= for several labs")
    results = []
    for k in labs:
        results.append(check(k, path, n=n, hidden=hidden, seed=seed, directory=directory, quiet=True,
                             student=student, course=course, root=root))
        # Fresh ranks for the next lab: nothing one lab's file did to a rank process (a patched
        # function, a leaked thread) reaches the next lab's run.
        cluster.shutdown_pools()
    return grade_dict(results, seed=seed, hidden=hidden, n=n, student=student, course=course)


__all__ = ["DEFAULT_HIDDEN", "DEFAULT_N", "LABS", "TIMEOUT", "cases_for", "check", "check_all", "grade",
           "lab_path", "new_seed"]
