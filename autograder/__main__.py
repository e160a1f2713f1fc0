"""Command line: ``python -m autograder release [--check]`` and ``python -m autograder grade SUBMISSIONS OUT``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .commands import NOTEBOOKS, SOLUTIONS, grade, release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="regenerate the student notebooks from the instructor sources")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the notebooks are out of date")
    p.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    p.add_argument("--dest", type=Path, default=NOTEBOOKS, help=f"where the student notebooks go (default {NOTEBOOKS})")

    g = sub.add_parser("grade", help="autograde SUBMISSIONS/<student>/<NN_topic>.ipynb into OUT")
    g.add_argument("submissions", type=Path)
    g.add_argument("out", type=Path)
    g.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    g.add_argument("--workers", type=int, default=None, help="submissions graded in parallel (default: CPU cores)")

    args = parser.parse_args(argv)
    if args.command == "release":
        return release(args.solutions, args.dest, check=args.check)
    return grade(args.submissions, args.out, solutions=args.solutions, workers=args.workers)


if __name__ == "__main__":
    sys.exit(main())
