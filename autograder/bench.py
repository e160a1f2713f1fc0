"""Grading benchmark: ``python -m autograder.bench [--n 50] [--workers 2] [--out DIR]``.

``python -m autograder.bench --class 3 [--before DIR] [--repeat R] [--cold]`` instead grades a class
(3 students x every chapter), one run after the other: plain ``nbgrader autograde`` (its CLI, one
assignment after another, cold kernels, no sandbox) and ``make grade`` (warm kernels): its
first run grades the canary (the instructor solutions), the next ones find it remembered, as a
re-run with unchanged solutions does; ``--repeat R`` rounds of plain nbgrader and ``make grade``
interleaved (speed-ups from the best of each). ``--before DIR`` also grades with the checkout in
DIR (an older commit) in each round. It checks that every score equals
nbgrader's and prints markdown tables: the wall times and speed-ups, and where the seconds go,
stage by stage (the call's set-up, canary and export; per notebook: the submission's preparation,
the job's start, nbgrader's own work, the kernel's start, the cells, the kernel's stop, the
gradebook, the feedback page), from the timers every run writes into grading.json.

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


def make_grade(subs: Path, out: Path, workers: int, warm: bool, root: Path = ROOT,
               canary_cache: Path | None = None) -> tuple[float, dict, dict]:
    """``python -m autograder grade`` (what ``make grade`` runs) of the checkout at ``root``.
    Returns (seconds, scores, grading.json)."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(root), KVREF_WARM="1" if warm else "0")
    if canary_cache is not None:
        env["KVREF_CANARY_CACHE"] = str(canary_cache)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder", "grade", str(subs), str(out), "--workers", str(workers),
                    "--force"], env=env, cwd=str(root), capture_output=True, check=True)
    seconds = time.perf_counter() - t0
    scores = {(r.student, r.notebook): r.score for r in read_csv(out / "grades.csv")}
    return seconds, scores, json.loads((out / "grading.json").read_text())


PARTS = ["job_start", "setup", "to_first_cell", "cells", "after_cells", "result"]  # the coarse split (older runs)
# Where one notebook's seconds go (grading.json's per_notebook_timing, written by grade/job.py and
# grade/grading.py); "other" is what is left of the job's wall time (waiting on the child, result files).
STAGES = [("prepare", "read, repaired, job folder made"), ("job_start", "grading process forked"),
          ("setup", "job's course object"), ("nbgrader", "nbgrader's own work"),
          ("kernel_start", "kernel start (fork, sandbox, IPython)"), ("cells", "the student's cells"),
          ("kernel_stop", "kernel shutdown"), ("database", "gradebook writes and reads"),
          ("feedback", "feedback page"), ("other", "the rest")]


def stage_means(meta: dict) -> dict[str, float]:
    """Mean seconds per notebook of every stage of STAGES (one worker's view), plus ``outside``:
    everything but the cells."""
    timing = list(meta["per_notebook_timing"].values())
    out = {}
    for key, _ in STAGES[:-1]:
        out[key] = statistics.mean(t.get(key, 0.0) for t in timing) if timing else 0.0
    whole = statistics.mean(t.get("total", 0.0) + t.get("prepare", 0.0) for t in timing) if timing else 0.0
    out["other"] = max(0.0, whole - sum(out.values()))
    out["whole"], out["outside"] = whole, whole - out["cells"]
    return out


def compare(students: int, workers: int, before: Path | None = None, repeat: int = 1, cold: bool = False) -> str:
    """The class graded by plain nbgrader and by ``make grade`` (see the module docstring): one
    ``make grade`` run that grades the canary, then ``repeat`` rounds of plain nbgrader, the
    checkout at ``before`` (when given) and this one, interleaved; speed-ups from the best of each."""
    with tempfile.TemporaryDirectory(prefix="kvclass-") as tmp:
        tmp = Path(tmp)
        stems = make_class(tmp / "class", students)
        n = students * len(stems)
        runs: dict[str, list] = {}
        cache = tmp / "canary-cache"
        runs["first"] = [make_grade(tmp / "class", tmp / "out-first", workers, True, canary_cache=cache)]
        plains = []
        for i in range(repeat):
            plains.append(plain_nbgrader(tmp / "class", tmp / f"plain-{i}", stems))
            if before is not None:
                runs.setdefault("before", []).append(
                    make_grade(tmp / "class", tmp / f"out-before-{i}", workers, True, root=before))
            runs.setdefault("now", []).append(
                make_grade(tmp / "class", tmp / f"out-now-{i}", workers, True, canary_cache=cache))
        if cold:
            runs["cold"] = [make_grade(tmp / "class", tmp / "out-cold", workers, False, canary_cache=cache)]
    plain_s, plain = min(x[0] for x in plains), plains[0][1]
    names = {"before": f"`make grade` before ({before})", "first": "`make grade`, canary graded (first run)",
             "now": "`make grade`, canary remembered", "cold": "`make grade`, cold kernels (KVREF_WARM=0)"}
    order = [k for k in ("before", "first", "now", "cold") if k in runs]
    meta0 = runs["now"][0][2]
    lines = [f"Class: {students} students x {len(stems)} notebooks = {n} notebooks; {os.cpu_count()} cores; "
             f"make grade with {workers} workers, isolation {meta0['isolation'].split(' (')[0]}; "
             f"{repeat} interleaved repeat(s).", "",
             "| run | wall s (each repeat) | s per notebook | speed-up vs nbgrader | scores equal to nbgrader's |",
             "|---|---|---|---|---|",
             f"| `nbgrader autograde` (sequential, cold, no sandbox) | {', '.join(f'{x[0]:.0f}' for x in plains)} | "
             f"{plain_s / n:.2f} | 1.00x | {'-' if all(x[1] == plain for x in plains) else 'NO: its repeats differ'} |"]
    for key in order:
        secs = [r[0] for r in runs[key]]
        best = min(secs)
        same = all(r[1] == plain for r in runs[key])
        differ = sum(runs[key][0][1].get(k) != v for k, v in plain.items())
        lines.append(f"| {names[key]} | {', '.join(f'{x:.0f}' for x in secs)} | {best / n:.2f} | "
                     f"{plain_s / best:.2f}x | {'yes' if same else f'NO ({differ} differ)'} |")
    lines += ["", "Where the time goes in `make grade` (seconds; the calls are wall time, the stages the mean per "
              "notebook of one worker's view, best repeat):", "",
              "| stage | " + " | ".join(names[k].replace("`make grade`, ", "").replace("`make grade` ", "")
                                       for k in order) + " |",
              "|---" * (len(order) + 1) + "|"]
    best = {k: min(runs[k], key=lambda r: r[0]) for k in order}
    ph = {k: best[k][2]["phases"] for k in order}
    lines.append("| call: set-up (course, releases, sandbox probe, warm servers) | "
                 + " | ".join(f"{ph[k]['setup']:.1f}" for k in order) + " |")
    lines.append("| call: canary (instructor solutions) | " + " | ".join(f"{ph[k]['canary']:.1f}" for k in order) + " |")
    lines.append("| call: the students | " + " | ".join(f"{ph[k]['students']:.1f}" for k in order) + " |")
    lines.append("| call: outside (interpreter, imports, sheets and gradebook export) | "
                 + " | ".join(f"{best[k][0] - best[k][2]['seconds']:.1f}" for k in order) + " |")
    means = {k: stage_means(best[k][2]) for k in order}
    for key, label in STAGES:
        lines.append(f"| notebook: {label} | " + " | ".join(f"{means[k][key]:.2f}" for k in order) + " |")
    lines.append("| **notebook: all but the cells** | " + " | ".join(f"**{means[k]['outside']:.2f}**" for k in order)
                 + " |")
    lines.append("| notebook: whole | " + " | ".join(f"{means[k]['whole']:.2f}" for k in order) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50, help="number of submissions (default 50)")
    p.add_argument("--workers", type=int, default=2, help="parallel workers (default 2)")
    p.add_argument("--out", type=Path, default=None, help="keep the graded output here (default: a temp dir)")
    p.add_argument("--class", dest="students", type=int, default=0,
                   help="grade a class of this many students x every chapter (see above)")
    p.add_argument("--before", type=Path, default=None,
                   help="with --class: also grade with the checkout in this folder (an older commit), interleaved")
    p.add_argument("--repeat", type=int, default=1, help="with --class: interleaved repeats (default 1)")
    p.add_argument("--cold", action="store_true", help="with --class: also grade with cold kernels")
    args = p.parse_args(argv)
    if args.students:
        print(compare(args.students, args.workers, args.before, args.repeat, args.cold))
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
