"""Grading benchmark: ``python -m autograder.bench [--n 50] [--workers 2] [--out DIR]``.

``python -m autograder.bench --class 3`` instead grades a class (3 students x every chapter) three
ways, one after the other in one run: plain ``nbgrader autograde`` (its CLI, one assignment after
another, cold kernels, no sandbox), ``make grade`` with cold kernels (``KVREF_WARM=0``) and
``make grade`` with warm ones, checks that every score is the same, and prints a markdown table:
seconds per notebook, where a graded notebook's time goes, and the fixed cost of one call.

Builds N synthetic submissions spread over every chapter in solutions/ (the solution, the
untouched release and each wrong answer of tests/wrong_answers/, in turn), grades them like
``make grade`` (sandboxed, ``--force``) and prints the total wall time and the time per notebook
(per chapter: mean and worst; the target is at most 20 s per notebook).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.shared import notebooks
from autograder.batch import Settings, grade_batch
from autograder.record.results import read_csv
from autograder.commands import SOLUTIONS, solution_files
from autograder.grade.course import ROOT

TARGET_S = 20.0


def wrong_answers(stem: str) -> dict:
    path = ROOT / "tests" / "wrong_answers" / f"{stem}.py"
    return notebooks.load_wrong_answers(path) if path.is_file() else {}


def make_submissions(dest: Path, n: int) -> dict[str, str]:
    """{student: kind}; dest/<student>/<stem>.ipynb, one notebook each, chapters in turn."""
    sources = solution_files(SOLUTIONS)
    stems = sorted(s for s in sources if (ROOT / "notebooks" / f"{s}.ipynb").is_file())
    variants = {}
    for stem in stems:
        release = notebooks.read(ROOT / "notebooks" / f"{stem}.ipynb")
        solved = notebooks.fill_answers(release, notebooks.read(sources[stem]))
        kinds = [("solution", solved), ("release", release)]
        for name, subs in wrong_answers(stem).items():
            try:
                kinds.append((f"wrong:{name}", notebooks.apply_wrong(solved, subs, name)))
            except ValueError:
                pass
        variants[stem] = kinds
    out = {}
    for i in range(n):
        stem = stems[i % len(stems)]
        kind, nb = variants[stem][(i // len(stems)) % len(variants[stem])]
        student = f"s{i:03d}"
        (dest / student).mkdir(parents=True, exist_ok=True)
        (dest / student / f"{stem}.ipynb").write_text(nbformat.writes(nb), encoding="utf-8")
        out[student] = f"{stem} {kind}"
    return out


def make_class(dest: Path, students: int) -> list[str]:
    """dest/s<k>/<stem>.ipynb for every chapter: student 0 hands in the solution, the others a
    wrong answer each (or the untouched release when a chapter has too few). Returns the stems."""
    sources = solution_files(SOLUTIONS)
    stems = sorted(s for s in sources if (ROOT / "notebooks" / f"{s}.ipynb").is_file())
    for stem in stems:
        release = notebooks.read(ROOT / "notebooks" / f"{stem}.ipynb")
        solved = notebooks.fill_answers(release, notebooks.read(sources[stem]))
        kinds = [solved]
        for name, subs in wrong_answers(stem).items():
            try:
                kinds.append(notebooks.apply_wrong(solved, subs, name))
            except ValueError:
                pass
        for k in range(students):
            nb = kinds[k] if k < len(kinds) else release
            (dest / f"s{k}").mkdir(parents=True, exist_ok=True)
            (dest / f"s{k}" / f"{stem}.ipynb").write_text(nbformat.writes(nb), encoding="utf-8")
    return stems


def plain_nbgrader(subs: Path, root: Path, stems: list[str]) -> tuple[float, dict]:
    """``nbgrader autograde`` (the CLI) of every chapter, one after another; the assignments are
    generated first (not timed). Returns (seconds, {(student, stem): score})."""
    import subprocess

    from autograder.grade.course import Course, kernel_environment

    sources = solution_files(SOLUTIONS)
    course = Course(root, {s: sources[s] for s in stems})
    for stem in stems:
        course.generate(stem)
        for folder in sorted(subs.iterdir()):
            course.submit(stem, folder.name, folder / f"{stem}.ipynb")
    (root / "nbgrader_config.py").write_text(
        f"c = get_config()  # noqa: F821\nload_subconfig({str(ROOT / 'autograder' / 'shared' / 'nbgrader_config.py')!r})\n"
        f"c.CourseDirectory.root = {str(root)!r}\nc.CourseDirectory.db_url = 'sqlite:///{root / 'gradebook.db'}'\n")
    t0 = time.perf_counter()
    with kernel_environment():
        for stem in stems:
            subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "autograde", stem], cwd=root,
                           env=dict(os.environ, KVREF_WARM="0"), capture_output=True, check=True)
    seconds = time.perf_counter() - t0
    scores = {(student, stem): s.score for stem in stems for student, s in course.scores(stem).items()}
    return seconds, scores


def make_grade(subs: Path, out: Path, workers: int, warm: bool) -> tuple[float, dict, dict]:
    """``python -m autograder grade`` (what ``make grade`` runs). Returns (seconds, scores, grading.json)."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(ROOT), KVREF_WARM="1" if warm else "0")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder", "grade", str(subs), str(out), "--workers", str(workers),
                    "--force"], env=env, capture_output=True, check=True)
    seconds = time.perf_counter() - t0
    scores = {(r.student, r.notebook): r.score for r in read_csv(out / "grades.csv")}
    return seconds, scores, json.loads((out / "grading.json").read_text())


PARTS = ["job_start", "setup", "to_first_cell", "cells", "after_cells", "result"]


def compare(students: int, workers: int) -> str:
    with tempfile.TemporaryDirectory(prefix="kvclass-") as tmp:
        tmp = Path(tmp)
        stems = make_class(tmp / "class", students)
        n = students * len(stems)
        one = tmp / "one" / "s0"
        one.mkdir(parents=True)
        (one / f"{stems[0]}.ipynb").write_bytes((tmp / "class" / "s0" / f"{stems[0]}.ipynb").read_bytes())
        plain_s, plain = plain_nbgrader(tmp / "class", tmp / "plain", stems)
        runs = {}
        for warm in (False, True):
            runs[warm] = make_grade(tmp / "class", tmp / f"out-{warm}", workers, warm)
            runs[warm, "one"] = make_grade(tmp / "one", tmp / f"one-{warm}", workers, warm)
    lines = [f"Class: {students} students x {len(stems)} notebooks = {n} notebooks; {os.cpu_count()} cores; "
             f"make grade with {workers} workers, isolation {runs[True][2]['isolation'].split(' (')[0]}.", "",
             "| run | wall s | s per notebook | speed-up vs nbgrader | scores equal to nbgrader's |", "|---|---|---|---|---|",
             f"| `nbgrader autograde` (sequential, cold, no sandbox) | {plain_s:.0f} | {plain_s / n:.2f} | 1.00x | - |"]
    for warm in (False, True):
        sec, scores, _ = runs[warm]
        same = "yes" if scores == plain else f"NO ({sum(scores.get(k) != v for k, v in plain.items())} differ)"
        lines.append(f"| `make grade`, {'warm' if warm else 'cold'} kernels | {sec:.0f} | {sec / n:.2f} | "
                     f"{plain_s / sec:.2f}x | {same} |")
    lines += ["", "Where a graded notebook's time goes in `make grade` (mean seconds per notebook, one worker's view; "
              "job start = Python and imports of the grading process, to first cell = nbgrader's bookkeeping and the "
              "kernel's start, imports and sandbox set-up):", "",
              "| kernels | " + " | ".join(PARTS) + " | total |", "|---" * (len(PARTS) + 2) + "|"]
    for warm in (False, True):
        timing = list(runs[warm][2]["per_notebook_timing"].values())
        mean = {k: statistics.mean(t.get(k, 0.0) for t in timing) for k in PARTS + ["total"]}
        lines.append(f"| {'warm' if warm else 'cold'} | " + " | ".join(f"{mean[k]:.2f}" for k in PARTS)
                     + f" | {mean['total']:.2f} |")
    lines += ["", "Fixed cost of one `make grade` call (one notebook, phases from grading.json, seconds):", "",
              "| kernels | wall | set-up (course, sandbox probe, servers) | canary | the notebook |", "|---|---|---|---|---|"]
    for warm in (False, True):
        sec, _, meta = runs[warm, "one"]
        ph = meta["phases"]
        lines.append(f"| {'warm' if warm else 'cold'} | {sec:.1f} | {ph['setup']:.1f} | {ph['canary']:.1f} | "
                     f"{ph['students']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50, help="number of submissions (default 50)")
    p.add_argument("--workers", type=int, default=2, help="parallel workers (default 2)")
    p.add_argument("--out", type=Path, default=None, help="keep the graded output here (default: a temp dir)")
    p.add_argument("--class", dest="students", type=int, default=0,
                   help="grade a class of this many students x every chapter three ways (see above)")
    args = p.parse_args(argv)
    if args.students:
        print(compare(args.students, args.workers))
        return 0
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        subs = Path(tmp) / "submissions"
        make_submissions(subs, args.n)
        out = args.out or Path(tmp) / "out"
        t0 = time.perf_counter()
        status = grade_batch(subs, out, SOLUTIONS, workers=args.workers, settings=Settings(), force=True,
                             say=lambda m: None)
        total = time.perf_counter() - t0
        meta = json.loads((out / "grading.json").read_text())
        rows = read_csv(out / "grades.csv")
    per = meta["per_notebook_seconds"]
    graded = [r for r in rows if r.status != "missing"]
    lines = [f"grading benchmark: {len(graded)} submissions, {args.workers} workers, {os.cpu_count()} cores, "
             f"isolation {meta['isolation'].split(' (')[0]}",
             f"total wall time {total:.0f} s = {total / max(1, len(graded)):.1f} s of wall time per notebook "
             f"(throughput); per-notebook latency below (one worker, start to finish)",
             f"{'notebook':<22} {'n':>3} {'mean s':>7} {'max s':>7}  statuses"]
    for stem in sorted({r.notebook for r in graded}):
        times = [per[f"{r.student}/{r.notebook}"] for r in graded if r.notebook == stem and f"{r.student}/{r.notebook}" in per]
        statuses = {}
        for r in graded:
            if r.notebook == stem:
                statuses[r.status] = statuses.get(r.status, 0) + 1
        lines.append(f"{stem:<22} {len(times):>3} {statistics.mean(times) if times else 0:>7.1f} "
                     f"{max(times) if times else 0:>7.1f}  " + ", ".join(f"{k} {v}" for k, v in statuses.items()))
    worst = max(per.values()) if per else 0.0
    lines.append(f"worst notebook {worst:.1f} s (target <= {TARGET_S:g} s): {'met' if worst <= TARGET_S else 'NOT met'}")
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
