"""python -m zeroedu.notebook.exercises generate [--check]: the learner's notebooks from the solutions."""
import argparse
import sys

from .generate import generate

ap = argparse.ArgumentParser(prog="python -m zeroedu.notebook.exercises")
ap.add_argument("command", choices=["generate"])
ap.add_argument("--check", action="store_true", help="only report stale learner notebooks (exit 1 if any)")
args = ap.parse_args()
stale = generate(check=args.check)
for name in stale:
    print(("stale: " if args.check else "wrote: ") + name)
sys.exit(1 if args.check and stale else 0)
