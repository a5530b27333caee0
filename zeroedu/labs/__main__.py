"""python -m zeroedu.labs build | check N|all [--path FILE] [--instructor] [--n N]"""
from __future__ import annotations

import argparse
import sys

from . import checks, generate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zeroedu.labs", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write labs/student and labs/instructor from the sources")
    b.add_argument("--out", default=None, help="output folder (default: the repository's labs/)")
    c = sub.add_parser("check", help="check a lab on real ranks")
    c.add_argument("lab", help="1-4 or all")
    c.add_argument("--path", default=None, help="the file to check (default labs/student/<lab file>)")
    c.add_argument("--instructor", action="store_true", help="check the instructor version")
    c.add_argument("--n", type=int, default=checks.DEFAULT_N, help="ranks (default 4)")
    args = p.parse_args(argv)
    if args.cmd == "build":
        for path in generate.build(args.out):
            print(f"wrote {path}")
        return 0
    version = "instructor" if args.instructor else "student"
    try:
        labs = list(checks.LABS) if args.lab == "all" else [int(args.lab)]
        if args.path and len(labs) != 1:
            raise ValueError("--path needs a single lab number")
        results = [checks.check(k, args.path, version=version, n=args.n) for k in labs]
    except ValueError as e:
        p.error(str(e))
    finally:
        from ..runtime import cluster

        cluster.shutdown_pools()
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
