"""Grading benchmark: ``python -m autograder.bench [--n 50] [--workers 2] [--out DIR]``.

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

from . import notebooks
from .batch import Settings, grade_batch
from .results import read_csv
from .commands import SOLUTIONS, solution_files
from .course import ROOT

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50, help="number of submissions (default 50)")
    p.add_argument("--workers", type=int, default=2, help="parallel workers (default 2)")
    p.add_argument("--out", type=Path, default=None, help="keep the graded output here (default: a temp dir)")
    args = p.parse_args(argv)
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
