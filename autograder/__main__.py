"""Command line:

    python -m autograder release [--check]
    python -m autograder grade SUBMISSIONS OUT [--workers N] [--shard K/N] [--force] ...
    python -m autograder merge SHARD_OUT ... -o FOLDER     # everything `grade` writes, for the whole class
    python -m autograder merge SHARD_OUT_OR_CSV ... -o grades.csv   # the sheet alone
    python -m autograder review OUT                  # free-text answers: pages + review.csv
    python -m autograder feedback-zip OUT            # OUT/feedback.zip for the LMS
    python -m autograder report OUT                  # OUT/report/index.html + tests.csv: what the class got wrong
    python -m autograder check notebooks/NN_topic.ipynb   # a student's self-check (visible tests)
    python -m autograder gradescope NN_topic -o autograder.zip
    python -m autograder student [--dest _build/student]  # the student edition
    python -m autograder mutants [NN_topic ...] [--check N] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.batch import Settings
from autograder.record.results import STATUSES, merge
from autograder.commands import COURSE_COMMANDS, NOTEBOOKS, SOLUTIONS, add_course_commands, grade, release
from autograder.export.merging import merge_into
from autograder.intake.platforms import FORMATS
from autograder.report.report import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="regenerate the student notebooks from the instructor sources")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the notebooks are out of date")
    p.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    p.add_argument("--dest", type=Path, default=NOTEBOOKS, help=f"where the student notebooks go (default {NOTEBOOKS})")

    statuses = "; ".join(f"{k}: {v}" for k, v in STATUSES.items())
    g = sub.add_parser("grade", help="autograde SUBMISSIONS/<student>/<NN_topic>.ipynb into OUT",
                       description=f"Writes OUT/grades.csv (student, notebook, score, max_score, status, reason), "
                                   f"OUT/feedback/<student>/<NN_topic>.html and OUT/grading.json. Statuses: {statuses}.")
    g.add_argument("submissions", type=Path, help="folder or .zip of <student>/<NN_topic>.ipynb")
    g.add_argument("out", type=Path)
    g.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    g.add_argument("--workers", type=int, default=None, help="notebooks graded in parallel (default: CPU cores)")
    g.add_argument("--shard", default=None, metavar="K/N", help="grade only the K-th of N deterministic shares of the students")
    g.add_argument("--force", action="store_true", help="grade again what is unchanged since the last run in OUT")
    g.add_argument("--notebooks", default=None, help="comma-separated NN_topic names every student must hand in "
                                                     "(default: every notebook somebody handed in)")
    g.add_argument("--cell-timeout", type=float, default=0, help="seconds per cell (default: nbgrader_config.py)")
    g.add_argument("--notebook-timeout", type=float, default=600, help="wall-clock seconds per notebook (default 600)")
    g.add_argument("--memory", type=int, default=4096, help="address-space limit of each kernel, MB (default 4096)")
    g.add_argument("--no-sandbox", action="store_true", help="run kernels with resource limits only (no namespaces)")
    g.add_argument("--format", default="auto", choices=FORMATS, help="export layout (default: recognised)")
    g.add_argument("--roster", type=Path, default=None, help="roster.csv: id,name,email,lms_id,section")
    g.add_argument("--manual", type=Path, default=None, help="a filled-in review.csv (see `review`)")
    g.add_argument("--no-canary", action="store_true", help="skip grading the instructor solution first")

    m = sub.add_parser("merge", help="join the OUT folders of several shards into one (or their grades.csv)")
    m.add_argument("inputs", type=Path, nargs="+", help="the OUT folders of the shards (or the grades.csv in them)")
    m.add_argument("-o", "--output", type=Path, required=True,
                   help="a folder: everything `grade` writes (sheets, gradebook, LMS import files, feedback pages, "
                        "grading.json); a name ending in .csv: the grade sheet alone")

    rp = sub.add_parser("report", help="the class report: OUT/report/index.html and OUT/report/tests.csv")
    rp.add_argument("out", type=Path, help="a graded (or merged) OUT folder")

    mu = sub.add_parser("mutants", help="mutation score of each chapter's tests (see autograder/mutation.py)")
    mu.add_argument("stems", nargs="*", help="chapters, e.g. 04_gqa (default: all)")
    mu.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    mu.add_argument("--check", type=int, default=0, metavar="N", help="also grade N mutants per chapter through nbgrader")
    mu.add_argument("--timeout", type=float, default=300, help="seconds per mutant run (default 300)")
    mu.add_argument("--json", type=Path, default=None, help="write every verdict to this file")
    add_course_commands(sub)
    args = parser.parse_args(argv)
    if args.command in COURSE_COMMANDS:
        return COURSE_COMMANDS[args.command](args)
    if args.command == "mutants":
        from autograder.mutation import run as run_mutants
        return run_mutants(args.stems, args.solutions, check=args.check, timeout=args.timeout, json_out=args.json)
    if args.command == "release":
        return release(args.solutions, args.dest, check=args.check)
    if args.command == "report":
        return report(args.out)
    if args.command == "merge" and args.output.suffix.lower() == ".csv":
        return merge(args.inputs, args.output)
    if args.command == "merge":
        return merge_into(args.inputs, args.output)
    settings = Settings(cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                        memory_mb=args.memory, isolate=not args.no_sandbox)
    names = [s for s in (args.notebooks or "").split(",") if s] or None
    return grade(args.submissions, args.out, solutions=args.solutions, workers=args.workers, settings=settings,
                 shard=args.shard, force=args.force, notebook_names=names, fmt=args.format, roster=args.roster,
                 manual=args.manual, canary=not args.no_canary)


if __name__ == "__main__":
    sys.exit(main())
