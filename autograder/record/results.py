"""The grade sheet: one ``Row`` per student and notebook, ``grades.csv``, rows.json, the summary table,
the shard of a student, and ``merge`` for the sheets of several shards."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
from pathlib import Path

from autograder.shared.rows import STATUSES, Row, Say, _stderr

__all__ = ["STATUSES", "Row", "Say", "Shards", "gather", "merge", "read_csv", "read_rows", "shard_of", "summary",
           "write_csv", "write_rows"]  # STATUSES, Row, Say: imported here from rows.py

CSV_FIELDS = ["student", "notebook", "score", "max_score", "status", "reason", "late"]
ROWS_JSON = "rows.json"  # OUT/rows.json: every row in full (per-test results, seconds), for `report` and `merge`


def write_rows(rows: list[Row], path: Path) -> None:
    """Every field of every row (the CSV keeps only the sheet's columns), sorted like grades.csv."""
    data = [dataclasses.asdict(r) for r in sorted(rows, key=lambda r: (r.student, r.notebook))]
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def read_rows(path: Path) -> list[Row]:
    return [Row(**r) for r in json.loads(path.read_text(encoding="utf-8"))]


def write_csv(rows: list[Row], path: Path) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in sorted(rows, key=lambda r: (r.student, r.notebook)):
            w.writerow([r.student, r.notebook, f"{r.score:g}", f"{r.max_score:g}", r.status,
                        " ".join(r.reason.split()), "late" if r.late else ""])
    os.replace(tmp, path)


def read_csv(path: Path) -> list[Row]:
    with open(path, newline="", encoding="utf-8") as f:
        return [Row(r["student"], r["notebook"], float(r["score"]), float(r["max_score"]), r.get("status") or "ok",
                    r.get("reason") or "", (r.get("late") or "") == "late") for r in csv.DictReader(f)]


def summary(rows: list[Row]) -> str:
    """The terminal table: per notebook, how many, mean score, and the count of each status."""
    lines = [f"{'notebook':<22} {'graded':>6} {'mean':>7} {'max':>5}  statuses"]
    for stem in sorted({r.notebook for r in rows}):
        rs = [r for r in rows if r.notebook == stem]
        counts = {s: sum(r.status == s for r in rs) for s in STATUSES}
        mean = sum(r.score for r in rs) / len(rs)
        lines.append(f"{stem:<22} {len(rs):>6} {mean:>7.2f} {rs[0].max_score:>5g}  "
                     + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    return "\n".join(lines)


def shard_of(student: str, n: int) -> int:
    """1..n: a student's shard, stable across machines, runs and the order of the folder."""
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % n + 1


def _shard_files(p: Path) -> tuple[Path, Path]:
    """(grades.csv, grading.json) of one shard: its OUT folder, or the grades.csv in that folder."""
    return (p / "grades.csv", p / "grading.json") if p.is_dir() else (p, p.parent / "grading.json")


@dataclasses.dataclass
class Shards:
    """The checked rows of a whole class, gathered from the OUT folders of its shards."""
    rows: dict[tuple[str, str], Row]
    folders: dict[int, Path]  # shard K -> its OUT folder
    metas: dict[int, dict]  # shard K -> its grading.json
    n: int
    students: list[str]
    stems: list[str]


def gather(inputs: list[Path]) -> tuple[Shards | None, list[str]]:
    """The rows of every shard in ``inputs`` (their OUT folders, or the grades.csv in them), or the
    problems that keep them from being the whole class exactly once.

    Every shard's grading.json names its shard K/N and the whole class (students, notebooks), so
    this knows what a complete sheet holds: a shard whose task failed (no grades.csv) has its
    students named; overlapping shards, a shard given twice and shards of different classes are
    problems too.
    """
    problems: list[str] = []
    rows: dict[tuple[str, str], Row] = {}
    overlaps: list[str] = []
    given: dict[int, Path] = {}  # shard K -> input
    metas: dict[int, dict] = {}
    classes: dict[str, Path] = {}  # the class as JSON -> first input cut from it
    for p in map(Path, inputs):
        csv_path, meta_path = _shard_files(p)
        if not csv_path.is_file():
            problems.append(f"{p}: no grades.csv (did the task that grades this shard fail? see its log)")
            continue
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            k, n = (int(x) for x in meta["shard"].split("/"))
            students, stems = sorted(meta["class"]["students"]), sorted(meta["class"]["notebooks"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            problems.append(f"{p}: no readable grading.json beside {csv_path.name} saying which shard of which "
                            f"class it holds ({type(e).__name__}: {e}); merge the OUT folders that "
                            f"`make grade` wrote")
            continue
        classes.setdefault(json.dumps([n, students, stems]), p)
        if k in given:
            problems.append(f"shard {k}/{n} is given twice: {given[k]} and {p}")
            continue
        given[k], metas[k] = p, meta
        for r in read_csv(csv_path):
            key = (r.student, r.notebook)
            if key in rows:
                overlaps.append(f"{r.student}/{r.notebook} is in two inputs (the shards overlap); the second is {p}")
            rows[key] = r
    problems += overlaps[:5] + ([f"... and {len(overlaps) - 5} more overlapping rows"] if len(overlaps) > 5 else [])
    if len(classes) > 1:
        problems.append("the shards come from different classes (other students, notebooks or number of "
                        "shards): " + ", ".join(str(p) for p in classes.values()))
    elif classes:
        n, students, stems = json.loads(next(iter(classes)))
        expected = {(s, stem) for s in students for stem in stems}
        for s, stem in sorted(set(rows) - expected):
            problems.append(f"{s}/{stem} is not in the class its shard's grading.json names")
        missing = expected - set(rows)
        for k in range(1, n + 1):
            lost = sorted({s for s, _ in missing if shard_of(s, n) == k})
            if lost:
                why = "no results for this shard" if k not in given else f"rows missing in {given[k]}"
                problems.append(f"shard {k}/{n} ({why}): no grades for {len(lost)} student(s): {', '.join(lost)}; "
                                f"grade that shard again (SHARD={k}/{n}, or `sbatch --array={k}` with the array "
                                f"script) and merge again")
    elif not problems:
        problems.append("no inputs")
    if problems:
        return None, problems
    folders = {k: p if p.is_dir() else p.parent for k, p in given.items()}
    return Shards(rows, folders, metas, n, students, stems), []


def refuse(problems: list[str], output: Path, say: Say) -> int:
    for msg in problems:
        say(f"error: {msg}")
    say(f"nothing written to {output}: the merged sheet would not hold the whole class")
    return 1


def merged_line(shards: Shards, inputs: list[Path], output: Path) -> str:
    return (f"merged {len(shards.rows)} row(s) from {len(inputs)} input(s) into {output}: {len(shards.students)} "
            f"student(s) x {len(shards.stems)} notebook(s), {len(shards.folders)} shard(s) of {shards.n}")


def merge(inputs: list[Path], output: Path, say: Say = _stderr) -> int:
    """Join the grades.csv of several shards (their OUT folders, or the grades.csv in them) into one
    sheet, ``output``. Anything short of every student and notebook exactly once (see ``gather``) is
    refused with exit status 1 and nothing written. ``merge.merge_into`` writes a whole OUT folder."""
    shards, problems = gather(inputs)
    if shards is None:
        return refuse(problems, output, say)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_csv(list(shards.rows.values()), output)
    say(summary(list(shards.rows.values())) if shards.rows else "no rows")
    say(merged_line(shards, inputs, output))
    return 0
