"""python -m zeroedu.labs list | build | publish | check | verify | class | variant

    list [--json]                               the labs: objective, notebook, time, points, command
    build [--student DIR] [--key DIR [--for ID [--course C]]] [--source DIR]
                                                student skeletons (default labs/student); the answer
                                                key only with --key, only into DIR (--for: with the
                                                predictions of student ID's variant)
    publish DIR                                 what to hand a class: DIR/labs/student (the
                                                skeletons) and DIR/labs/README.md, no source, no key
    check LAB|all [--path FILE | --dir DIR] [--hidden [K]] [--seed S] [--n N] [--student ID
                  [--course C]] [--json | --out FILE [--sign KEYFILE (with --student)]]
                                                grade on real ranks; --student: the visible cases of
                                                labs 5-8 are ID's variant; --json prints the grade for
                                                an autograder (schema in zeroedu.labs.grading), --out
                                                writes it to FILE, signed with --sign
    verify --key KEYFILE FILE... [--student ID | --roster FILE] [--course C] [--seed S] [--hidden K] [--json]
                                                the points of each signed grade file, or NOT VERIFIED:
                                                edited, unsigned, or not the expected student's
                                                (default: the file's name, ID.json), course, seed or
                                                hidden-case count
    class DIR --csv FILE [--labs 1,7] [--hidden [K]] [--seed S] [--n N] [--variants [--course C]]
                                                grade every student folder of DIR on the same cases
                                                (--variants: each on the variant of its folder's name);
                                                one CSV row per student, a column per lab and per
                                                hidden case
    variant ID [--course C] [--json]            student ID's variant: N, the MLP, the bucket size
    report (--dir DIR [--quick] | --template)   the benchmarking report's tables, measured with the
                                                labs 7 and 8 in DIR; --template: the blank report.md
    collect DIR --out FOLDER [--quick]          every student folder of DIR: measure their labs 7-8,
                                                put the tables, their report.md and the rubric into
                                                FOLDER/<student>.md

Exit status: 0 when the command ran (with --json, also when tests fail: the JSON says so); without
--json, `check` exits 1 when a lab is not fully passed; 2 on a usage error.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

from pathlib import Path

from . import checks, classroom, generate, signing, variants
from .grading import safe_text, to_json
from .registry import LABS, TOTAL_POINTS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zeroedu.labs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="the labs, with objective, notebook, time, points and command")
    ls.add_argument("--json", action="store_true")
    b = sub.add_parser("build", help="generate the student skeletons (and, with --key, the answer key)")
    b.add_argument("--student", metavar="DIR", default=None, help="student tree (default: labs/student)")
    b.add_argument("--key", metavar="DIR", default=None, help="write the answer key into DIR (instructors only)")
    b.add_argument("--source", metavar="DIR", default=None, help="lab sources (default: labs/source of the checkout)")
    b.add_argument("--for", dest="for_student", metavar="ID", default=None,
                   help="with --key: the key's predictions are student ID's variant's")
    b.add_argument("--course", default="", help="the course name the variants are drawn with (default none)")
    pub = sub.add_parser("publish", help="write the tree to hand students: skeletons and README, no solution")
    pub.add_argument("dir", metavar="DIR", help="a fresh folder, outside this repository's labs/")
    c = sub.add_parser("check", help="grade a lab (or all) on real ranks")
    c.add_argument("lab", help=f"1-{len(LABS)} or all")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--path", default=None, help="the file to grade (one lab)")
    where.add_argument("--dir", default=None, help="a folder holding the lab files (a student's submission)")
    c.add_argument("--hidden", nargs="?", type=int, const=checks.DEFAULT_HIDDEN, default=0, metavar="K",
                   help=f"add K hidden randomized cases per lab (default K={checks.DEFAULT_HIDDEN})")
    c.add_argument("--seed", type=int, default=None, help="seed of the hidden cases (default: a fresh one, "
                                                          "reported in the output)")
    c.add_argument("--n", type=int, default=checks.DEFAULT_N, help=f"ranks of the visible cases (default {checks.DEFAULT_N})")
    c.add_argument("--student", default=None, metavar="ID",
                   help="grade as student ID's variant (labs 5-8: N, the MLP, the bucket size; labs 7-8: the "
                        "prediction)")
    c.add_argument("--course", default="", help="the course name the variants are drawn with (default none)")
    c.add_argument("--json", action="store_true", help="print the grade as JSON (exit 0 even when tests fail)")
    c.add_argument("--out", default=None, metavar="FILE",
                   help="write the JSON grade to FILE (written by this process, which never runs the "
                        "submission; nothing a submission prints can reach it), exit 0 even when tests fail")
    c.add_argument("--sign", default=None, metavar="KEYFILE",
                   help="with --out: sign the grade (HMAC-SHA256) with the key in KEYFILE, kept outside "
                        "every submission folder; `verify` checks it")
    cl = sub.add_parser("class", help="grade a folder of submissions (one sub-folder per student) into one CSV")
    cl.add_argument("dir", metavar="DIR", help="the class folder: one sub-folder per student, named for them")
    cl.add_argument("--csv", required=True, metavar="FILE", help="write the grade book here (outside DIR)")
    cl.add_argument("--labs", default=None, help="which labs, e.g. 1,5,7 (default all)")
    cl.add_argument("--hidden", nargs="?", type=int, const=checks.DEFAULT_HIDDEN, default=0, metavar="K",
                    help=f"K hidden randomized cases per lab, the same for every student (default K={checks.DEFAULT_HIDDEN})")
    cl.add_argument("--seed", type=int, default=None, help="seed of the hidden cases (default: a fresh one, printed)")
    cl.add_argument("--n", type=int, default=checks.DEFAULT_N, help=f"ranks of the visible cases (default {checks.DEFAULT_N})")
    cl.add_argument("--variants", action="store_true",
                    help="grade each student on the variant of their folder's name (see `variant`)")
    cl.add_argument("--course", default="", help="with --variants: the course name the variants are drawn with")
    va = sub.add_parser("variant", help="a student's variant: what their visible cases of labs 5-8 run")
    va.add_argument("student", metavar="ID")
    va.add_argument("--course", default="")
    va.add_argument("--json", action="store_true")
    rp = sub.add_parser("report", help="the benchmarking report's measured tables (or its blank template)")
    what = rp.add_mutually_exclusive_group(required=True)
    what.add_argument("--dir", default=None, help="the folder holding your lab 7 and lab 8 files")
    what.add_argument("--template", action="store_true", help="print the blank report.md to fill in")
    rp.add_argument("--quick", action="store_true", help="two bucket sizes instead of six")
    co = sub.add_parser("collect", help="measure every student's labs 7-8 and collect their reports with the rubric")
    co.add_argument("dir", metavar="DIR", help="the class folder: one sub-folder per student")
    co.add_argument("--out", required=True, metavar="FOLDER", help="where the reports go (outside DIR)")
    co.add_argument("--quick", action="store_true", help="two bucket sizes instead of six")
    v = sub.add_parser("verify", help="check the signatures of grade files written with --sign")
    v.add_argument("--key", required=True, metavar="KEYFILE", help="the key the grades were signed with")
    v.add_argument("files", nargs="+", metavar="FILE")
    who = v.add_mutually_exclusive_group()
    who.add_argument("--student", default=None, metavar="ID",
                     help="the student every FILE must be signed for (default: each file's name, ID.json)")
    who.add_argument("--roster", default=None, metavar="FILE",
                     help="the class's ids, one per line: each grade file's name (ID.json) must be one of "
                          "them and the grade signed for it")
    v.add_argument("--course", default="", help="the course the grades must be signed for (default none)")
    v.add_argument("--seed", type=int, default=None, help="the seed the hidden cases must have been drawn with")
    v.add_argument("--hidden", type=int, default=None, metavar="K", help="the hidden cases per lab the grades must have run")
    v.add_argument("--json", action="store_true", help="one JSON object: file -> points, or null if not verified")
    return p


def _roster(path: str) -> set[str]:
    try:
        with open(path, encoding="utf-8") as f:
            ids = {ln.strip() for ln in f.read(1 << 20).splitlines()}
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--roster {path}: unreadable ({type(e).__name__})") from None
    ids = {i for i in ids if i and not i.startswith("#")}
    if not ids:
        raise ValueError(f"--roster {path} names no student (one id per line)")
    return ids


def _verify(args) -> int:
    """Each file's points when its signature holds and it is the expected student's grade on the
    expected cases; exit 1 if any is not."""
    key = signing.read_key(args.key)
    roster = _roster(args.roster) if args.roster else None
    rows = {}
    for f in args.files:
        stem = os.path.basename(f)[:-5] if f.endswith(".json") else os.path.basename(f)
        try:
            with open(f, encoding="utf-8") as fh:
                g = signing.load(fh.read(16 << 20))
        except signing.DuplicateKey as e:
            g, why = None, f"NOT VERIFIED: {e} (a grade file holds each key once)"
        except (OSError, ValueError) as e:
            g, why = None, f"unreadable ({type(e).__name__})"
        else:
            if not signing.verified(g, key):
                why = "NOT VERIFIED: edited, or not signed with this key"
            elif roster is not None and stem not in roster:
                why = f"NOT VERIFIED: {stem!r} (the file's name) is not on the roster"
            else:
                bad = signing.binding_error(g, student=args.student if args.student is not None else stem,
                                            course=args.course, seed=args.seed, hidden=args.hidden)
                why = f"NOT VERIFIED: {safe_text(bad)}" if bad else None
        rows[f] = (g, why)
    if args.json:
        print(json.dumps({f: (None if why else g["points"]) for f, (g, why) in rows.items()}, indent=2))
    else:
        for f, (g, why) in rows.items():
            name = safe_text(f)
            if why:
                print(f"{name}: {why}")
                continue
            cases = (f"seed {g['seed']}, {g['hidden']} hidden cases per lab" if g.get("hidden")
                     else "visible cases only")
            print(f"{name}: {g['points']:g}/{g['max_points']} points, verified: student "
                  f"{g['student']!r}" + (f", course {g['course']!r}" if g.get("course") else "")
                  + f", {cases}")
    return 1 if any(why for _, why in rows.values()) else 0


def _class(p, args) -> int:
    from . import classroom

    try:
        labs = None if args.labs is None else [checks.get_lab(k).number for k in args.labs.split(",")]
        _check_out(args.csv)
        root = os.path.realpath(args.dir)
        if os.path.commonpath([root, os.path.realpath(args.csv)]) == root:
            raise ValueError(f"--csv {args.csv} lies inside {args.dir}: write the grade book outside the "
                             "submissions (their ranks may read that folder)")
        classroom.students(args.dir)
    except ValueError as e:
        p.error(str(e))
    seed = args.seed if args.seed is not None or not args.hidden else checks.new_seed()
    grades = classroom.grade_class(args.dir, labs, hidden=args.hidden, seed=seed, n=args.n,
                                   variants=args.variants, course=args.course, progress=lambda who: print(f"grading {safe_text(who)} ...", file=sys.stderr, flush=True))
    _write_out(args.csv, classroom.to_csv(grades))
    print(classroom.summary(grades))
    print(f"wrote {args.csv} ({len(grades)} students" + (f"; hidden cases: {args.hidden}, seed {seed}" if args.hidden else "")
          + ")")
    return 0


def _report(p, args) -> int:
    from ..runtime import cluster
    from . import report

    if args.cmd == "report" and args.template:
        print(report.template())
        return 0
    try:
        if args.cmd == "report":
            if not os.path.isdir(args.dir):
                raise ValueError(f"--dir {args.dir} is not a folder")
            print(report.tables_markdown(report.measure(args.dir, quick=args.quick)), end="")
            return 0
        root = os.path.realpath(args.dir)
        if os.path.commonpath([root, os.path.realpath(args.out)]) == root:
            raise ValueError(f"--out {args.out} lies inside {args.dir}: write the reports outside the submissions")
        written = report.collect(args.dir, args.out, quick=args.quick,
                                 progress=lambda who: print(f"measuring {safe_text(who)} ...", file=sys.stderr, flush=True))
    except ValueError as e:
        p.error(str(e))
    finally:
        cluster.shutdown_pools()
    for path in written:
        print(f"wrote {safe_text(path)}")
    return 0


def _variant(p, args) -> int:
    try:
        v = variants.variant(args.student, args.course)
    except ValueError as e:
        p.error(str(e))
    if args.json:
        print(json.dumps({"student": v.student, "course": v.course, "n": v.n, "model": v.model.as_dict(),
                          "global_batch": v.global_batch, "bucket_bytes": v.bucket_bytes}, indent=2))
    else:
        print(v.describe()[0].upper() + v.describe()[1:])
        print(f"check with: python -m zeroedu.labs check all --student {args.student}"
              + (f" --course {args.course}" if args.course else ""))
    return 0


def _key_for(key_dir: str, student: str, course: str) -> list:
    """Rewrite the key's predicted() of labs 7 and 8 with student's variant's numbers."""

    v = variants.variant(student, course)
    out = []
    for lab in variants.PREDICTED:
        path = Path(key_dir) / LABS[lab].file
        path.write_text(variants.with_prediction(path.read_text(encoding="utf-8"), variants.predictions(lab, v)),
                        encoding="utf-8")
        out.append(f"{path} (predictions of the {v.describe()})")
    return out


def _list(as_json: bool) -> int:
    rows = [{"lab": lab.number, "name": lab.name, "title": lab.title, "objective": lab.objective,
             "notebook": lab.notebook, "minutes": lab.minutes, "points": lab.points, "command": lab.command,
             "tests": [{"id": t.id, "title": t.title, "points": t.points} for t in lab.tests]}
            for lab in LABS.values()]
    if as_json:
        print(json.dumps({"labs": rows, "max_points": TOTAL_POINTS}, indent=2, ensure_ascii=False))
        return 0
    for r in rows:
        print(f"lab {r['lab']}: {r['title']} ({r['points']} points, ~{r['minutes']} min, after {r['notebook']})")
        print(f"    {r['objective']}")
        print(f"    {r['command']}")
    print(f"total: {TOTAL_POINTS} points")
    return 0


def _check_out(path: str) -> None:
    """ValueError unless `path` can take the grade: its folder exists and is writable, and it is
    not itself a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--out {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"--out {path} is a folder; name the grade file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: the folder {folder} is not writable")


def _sign_key(key_file: str, path: str | None, directory: str | None) -> bytes:
    """The signing key, refused when it lies inside the folder being graded (its ranks may read
    that folder)."""
    graded = os.path.dirname(os.path.realpath(path)) if path else os.path.realpath(directory or ".")
    if os.path.commonpath([graded, os.path.realpath(key_file)]) == graded:
        raise ValueError(f"--sign {key_file} lies inside {graded}, the folder being graded: keep the key "
                         "outside every submission folder")
    return signing.read_key(key_file)


def _write_out(path: str, text: str) -> None:
    """Written whole or not at all: a temporary file in the same folder, then renamed over
    `path`, so a reader never sees half a grade."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".grade-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.cmd == "list":
        return _list(args.json)
    if args.cmd == "verify":
        try:
            return _verify(args)
        except ValueError as e:
            p.error(str(e))
    if args.cmd == "publish":
        try:
            written = generate.publish(args.dir)
        except ValueError as e:
            p.error(str(e))
        for path in written:
            print(f"wrote {path}")
        return 0
    if args.cmd == "class":
        return _class(p, args)
    if args.cmd == "variant":
        return _variant(p, args)
    if args.cmd in ("report", "collect"):
        return _report(p, args)
    if args.cmd == "build":
        try:
            if args.key is not None:
                generate.check_key_dir(args.key, args.source)  # before anything is written
            written = generate.build_student(args.student, args.source)
            if args.key is not None:
                written += generate.build_key(args.key, args.source)
                if args.for_student is not None:
                    written = [*written, *_key_for(args.key, args.for_student, args.course)]
            elif args.for_student is not None:
                raise ValueError("--for writes a variant's predictions into the key: give --key DIR too")
        except ValueError as e:
            p.error(str(e))
        for path in written:
            print(f"wrote {path}")
        return 0
    from ..runtime import cluster

    try:
        labs = list(LABS) if args.lab == "all" else [checks.get_lab(args.lab).number]
        if args.path and len(labs) != 1:
            raise ValueError("--path names one lab's file; use --dir for a folder of labs")
        if args.hidden < 0:
            raise ValueError("--hidden must be >= 0")
        if args.hidden > checks.MAX_HIDDEN:
            raise ValueError(f"--hidden {args.hidden}: at most {checks.MAX_HIDDEN} hidden cases per lab (each is a "
                             "run on real ranks, seconds apiece; a criterion must hold on every one)")
        seed = args.seed if args.seed is not None or not args.hidden else checks.new_seed()
        if args.sign and not args.out:
            raise ValueError("--sign signs the grade file: give --out FILE too")
        if args.sign and not args.student:
            raise ValueError("--sign binds the grade to its student: give --student ID too (verify expects the "
                             "file to be named ID.json, or --student ID)")
        key = _sign_key(args.sign, args.path, args.dir) if args.sign else None
        if args.out:
            _check_out(args.out)  # before grading: a grade is never lost to its output path
        # --dir: a student's folder, in the published layout (labs/student/) or with the files at
        # its top; every folder from it down to a lab file is checked for links (`paths`)
        directory = classroom._lab_dir(Path(args.dir)) if args.dir else None
        if args.json or args.out:
            grade = checks.grade(labs, path=args.path, directory=directory, n=args.n, hidden=args.hidden, seed=seed,
                                 student=args.student, course=args.course, root=args.dir)
            if args.out:
                _write_out(args.out, to_json(signing.sign(grade, key) if key else grade) + "\n")
                print(f"wrote {args.out}: {grade['points']:g}/{grade['max_points']} points")
            else:
                print(to_json(grade))
            return 0
        results = [checks.check(k, args.path, n=args.n, hidden=args.hidden, seed=seed, directory=directory,
                                student=args.student, course=args.course, root=args.dir) for k in labs]
    except ValueError as e:
        p.error(str(e))
    finally:
        cluster.shutdown_pools()
    if len(results) > 1:
        print(f"total: {sum(r.points for r in results):g}/{sum(r.max_points for r in results)} points")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
