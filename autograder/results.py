"""The grade sheet: one ``Row`` per student and notebook, ``grades.csv``, the summary table, and
``merge`` for the sheets of several shards."""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
from pathlib import Path
from typing import Callable

STATUSES = {
    "ok": "graded; the score is what the tests gave (the reason lists lost points and repairs)",
    "missing": "the student handed in no notebook of this name",
    "invalid": "the file is not a notebook nbgrader can read (not JSON, not nbformat, too large)",
    "timeout": "stopped: a cell ignored the interrupt after the per-cell limit, or the notebook ran past the "
               "per-notebook wall-clock limit",
    "error": "nbgrader could not grade it (for example the kernel died); see the reason",
    "needs_review": "graded automatically; free-text answers wait for a person (`review`, then `grade --manual`): "
                    "the score holds the automatic points so far",
}
CSV_FIELDS = ["student", "notebook", "score", "max_score", "status", "reason", "late"]

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Row:
    student: str
    notebook: str
    score: float
    max_score: float
    status: str = "ok"
    reason: str = ""
    late: bool = False
    seconds: float = 0.0  # not in the CSV
    tests: list = dataclasses.field(default_factory=list)  # [{name, score, max_score, output}], not in the CSV
    manual: dict = dataclasses.field(default_factory=dict)  # {grade_id: {max_score, answer}}, not in the CSV



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


def merge(inputs: list[Path], output: Path, say: Say = _stderr) -> int:
    """Join the grades.csv of several shards (files or OUT folders) into one."""
    rows: dict[tuple[str, str], Row] = {}
    for p in inputs:
        p = Path(p)
        p = p / "grades.csv" if p.is_dir() else p
        for r in read_csv(p):
            key = (r.student, r.notebook)
            if key in rows:
                say(f"error: {r.student}/{r.notebook} is in two inputs (the shards overlap); the second is {p}")
                return 1
            rows[key] = r
    output.parent.mkdir(parents=True, exist_ok=True)
    write_csv(list(rows.values()), output)
    say(summary(list(rows.values())) if rows else "no rows")
    say(f"merged {len(rows)} row(s) from {len(inputs)} file(s) into {output}")
    return 0
