"""The Python half of scripts/slurm_check.sh: make the class, then check what the Slurm array job left.

    python scripts/slurm_check.py class DEST N               a class of a few students x two notebooks
    python scripts/slurm_check.py shards CLASS GRADED N      every student graded exactly once, shards disjoint
    python scripts/slurm_check.py same MERGED SINGLE         the merged sheet equals the single-machine one
    python scripts/slurm_check.py folders MERGED SINGLE SHARD...   `merge -o FOLDER` equals the single-machine OUT
    python scripts/slurm_check.py states JOBCOMP SACCT JOBID K=STATE ...
                                                             sacct's state of each array task of JOBID
    python scripts/slurm_check.py named MESSAGE CLASS N K    the merge's error names exactly shard K's students

Each prints one line saying what it checked, or "FAILED: ..." and exits 1.
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.shared import notebooks  # noqa: E402
from autograder.batch import shard_of  # noqa: E402
from autograder.bench import wrong_answers  # noqa: E402
from autograder.commands import SOLUTIONS  # noqa: E402
from autograder.export.gradebook import feedback_zip  # noqa: E402
from autograder.report.report import report  # noqa: E402
from autograder.record.results import read_csv  # noqa: E402
from autograder.record.review import review  # noqa: E402

# The two cheapest chapters to grade (docs/benchmarks.md: about 5 s per notebook each).
STEMS = ("03_memory", "05_paging")
# What each student hands in, per notebook: full marks, the untouched release, a wrong answer, a file that
# is not a notebook, nothing. Students take these in turn, so scores and statuses differ; only 5 of the 8
# notebooks start a kernel, to keep the check short.
KINDS = [("solution", "solution"), ("release", "invalid"), ("wrong", None), ("invalid", "wrong")]
CANDIDATES = ["ada", "bo", "cy", "di", "ed", "flo", "gus", "hal", "ida", "jo", "kim", "lu", "mo", "ned", "ola"]


def fail(msg: str) -> None:
    print(f"FAILED: {msg}")
    sys.exit(1)


def roster(n: int) -> list[str]:
    """One student per kind, each of the n shards holding at least one (an empty shard would test nothing)."""
    picked: list[str] = []
    for k in range(1, n + 1):  # first one student for every shard ...
        picked.append(next(c for c in CANDIDATES if shard_of(c, n) == k and c not in picked))
    picked += [c for c in CANDIDATES if c not in picked][: len(KINDS) - n]  # ... then the rest
    return sorted(picked)


def make_class(dest: Path, n: int) -> None:
    variants = {}
    for stem in STEMS:
        release = notebooks.read(ROOT / "notebooks" / f"{stem}.ipynb")
        solved = notebooks.fill_answers(release, notebooks.read(SOLUTIONS / f"{stem}.ipynb"))
        name, subs = next(iter(wrong_answers(stem).items()))
        variants[stem] = {"solution": nbformat.writes(solved), "release": nbformat.writes(release),
                          "wrong": nbformat.writes(notebooks.apply_wrong(solved, subs, name)),
                          "invalid": "this is not a notebook\n"}
    students = roster(n)
    for student, kinds in zip(students, KINDS):
        for stem, kind in zip(STEMS, kinds):
            if kind:
                (dest / student).mkdir(parents=True, exist_ok=True)
                (dest / student / f"{stem}.ipynb").write_text(variants[stem][kind], encoding="utf-8")
    shards = {k: [s for s in students if shard_of(s, n) == k] for k in range(1, n + 1)}
    print(f"class: {len(students)} students x {len(STEMS)} notebooks in {dest}; shards " +
          "; ".join(f"{k}/{n}: {', '.join(v)}" for k, v in shards.items()))


def check_shards(cls: Path, graded: Path, n: int) -> None:
    students = sorted(p.name for p in cls.iterdir() if p.is_dir())
    seen: dict[tuple[str, str], int] = {}
    for k in range(1, n + 1):
        sheet = graded / f"shard-{k}" / "grades.csv"
        if not sheet.is_file():
            fail(f"{sheet} is missing")
        for r in read_csv(sheet):
            if shard_of(r.student, n) != k:
                fail(f"{r.student} is in shard {k}/{n}'s sheet but belongs to shard {shard_of(r.student, n)}")
            if (r.student, r.notebook) in seen:
                fail(f"{r.student}/{r.notebook} is graded in shard {seen[r.student, r.notebook]} and in shard {k}")
            seen[r.student, r.notebook] = k
    expected = {(s, stem) for s in students for stem in STEMS}
    if set(seen) != expected:
        fail(f"graded {sorted(seen)}, expected every student x notebook: {sorted(expected)}")
    print(f"shards: {n} disjoint sheets, {len(students)} students x {len(STEMS)} notebooks, each graded exactly once")


def check_same(merged: Path, single: Path) -> None:
    a, b = merged.read_text(encoding="utf-8"), single.read_text(encoding="utf-8")
    if a != b:
        diff = [f"merged: {x!r} | single: {y!r}" for x, y in zip(a.splitlines(), b.splitlines()) if x != y]
        fail(f"{merged} differs from {single}: " + "; ".join(diff[:5] or ["different number of rows"]))
    rows = read_csv(merged)
    statuses = sorted({r.status for r in rows})
    print(f"merged == single machine: {len(rows)} rows, byte for byte (statuses {', '.join(statuses)}; "
          f"scores {', '.join(sorted({f'{r.score:g}' for r in rows}))})")


SAME_FILES = ["grades.csv", "students.json", "answers.json", "gradebook.csv", "canvas_import.csv",
              "moodle_import.csv", "review/review.csv", "report/tests.csv"]
SAME_META = ["class", "shard", "format", "settings", "isolated", "canary", "graded", "rows"]


def check_folders(merged: Path, single: Path, shards: list[Path]) -> None:
    """Everything `grade` wrote into SINGLE is in MERGED (from SHARDS) with the same contents, apart from times and
    paths; `review`, `feedback-zip` and `report` give the same on both."""
    for out in (merged, single):
        quiet = [].append
        if review(out, SOLUTIONS, say=quiet) or feedback_zip(out, say=quiet) or report(out, say=quiet):
            fail(f"review, feedback-zip or report failed on {out}")
    for name in SAME_FILES:
        if (merged / name).read_bytes() != (single / name).read_bytes():
            fail(f"{merged / name} differs from {single / name}")

    def rows(out: Path) -> str:  # every field but the times, object addresses taken out
        return re.sub(r"0x[0-9a-f]+", "0x", json.dumps([{k: v for k, v in r.items() if k not in ("seconds", "timing")}
                                                       for r in json.loads((out / "rows.json").read_text())]))

    if rows(merged) != rows(single):
        fail("rows.json: the rows (per-test results included) differ beyond their times")
    meta = [json.loads((out / "grading.json").read_text()) for out in (merged, single)]
    differ = [k for k in SAME_META if meta[0].get(k) != meta[1].get(k)]
    if differ or set(meta[0]["per_notebook_seconds"]) != set(meta[1]["per_notebook_seconds"]):
        fail(f"grading.json differs in {differ or 'per_notebook_seconds'}")

    # A feedback page holds what the kernel sent, so two gradings of one notebook differ in widget ids and in how
    # printed text was cut into messages: the merged pages are the shards' own, byte for byte, and they give the
    # single machine's scores (the title's total and every graded cell's).
    shard_pages = {p.relative_to(d).as_posix(): p.read_bytes() for d in shards for p in (d / "feedback").rglob("*.html")}
    merged_pages = {p.relative_to(merged).as_posix(): p.read_bytes() for p in (merged / "feedback").rglob("*.html")}
    if merged_pages != shard_pages:
        fail(f"the merged feedback pages are not the shards': {sorted(merged_pages)} vs {sorted(shard_pages)}")

    def scores(out: Path) -> dict[str, list[str]]:
        return {p.relative_to(out).as_posix(): re.findall(r"score: [\d.]+ / [\d.]+|: [\d.]+ / [\d.]+</h1>", p.read_text())
                for p in sorted((out / "feedback").rglob("*.html"))}

    if scores(merged) != scores(single):
        fail(f"feedback pages: {scores(merged)} vs the single machine's {scores(single)}")
    with zipfile.ZipFile(merged / "feedback.zip") as a, zipfile.ZipFile(single / "feedback.zip") as b:
        if a.namelist() != b.namelist():
            fail(f"feedback.zip: {a.namelist()} vs {b.namelist()}")
    tests = (merged / "report" / "tests.csv").read_text().count("\n") - 1
    print(f"merged folder == single machine folder: {', '.join(SAME_FILES)}, rows.json apart from times, "
          f"grading.json ({', '.join(SAME_META)}), {len(merged_pages)} feedback page(s) (scores) and feedback.zip; "
          f"the report's {tests} test(s) the same")


def check_states(jobcomp: Path, sacct: Path, jobid: str, expected: list[str]) -> None:
    # sacct -c (job completion data, as there is no slurmdbd) shows each array task under its own raw job
    # id; Slurm 22.05's reader drops the ArrayJobId/ArrayTaskId fields that jobcomp/filetxt writes, so the
    # task of each raw id is read from that file.
    task_of = {}
    for line in jobcomp.read_text().splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if f.get("ArrayJobId") == jobid:
            task_of[f["JobId"]] = f["ArrayTaskId"]
    states = {}
    for line in sacct.read_text().splitlines():
        raw, state, *_ = line.split("|")
        if raw in task_of:
            states[task_of[raw]] = state
    want = dict(e.split("=") for e in expected)
    if states != want:
        fail(f"sacct: array job {jobid}'s tasks are {states or 'not there'}, expected {want}")
    print(f"sacct: array job {jobid}: " + ", ".join(f"task {k} {v}" for k, v in sorted(states.items())))


def check_named(message: Path, cls: Path, n: int, k: int) -> None:
    text = message.read_text()
    students = sorted(p.name for p in cls.iterdir() if p.is_dir())
    lost = [s for s in students if shard_of(s, n) == k]
    named = sorted(s for m in re.findall(r"no grades for \d+ student\(s\): ([^;]+);", text) for s in m.split(", "))
    if named != lost or f"shard {k}/{n}" not in text:
        fail(f"the merge should name shard {k}/{n}'s students {lost}, it named {named}:\n{text}")
    print(f"merge refused the incomplete class and named shard {k}/{n}'s students: {', '.join(lost)}")


def main(argv: list[str]) -> None:
    cmd, args = argv[0], argv[1:]
    if cmd == "class":
        make_class(Path(args[0]), int(args[1]))
    elif cmd == "shards":
        check_shards(Path(args[0]), Path(args[1]), int(args[2]))
    elif cmd == "same":
        check_same(Path(args[0]), Path(args[1]))
    elif cmd == "folders":
        check_folders(Path(args[0]), Path(args[1]), [Path(a) for a in args[2:]])
    elif cmd == "states":
        check_states(Path(args[0]), Path(args[1]), args[2], args[3:])
    elif cmd == "named":
        check_named(Path(args[0]), Path(args[1]), int(args[2]), int(args[3]))
    else:
        fail(f"unknown command {cmd!r}: see {__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
