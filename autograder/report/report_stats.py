"""The numbers of the class report (``report.py`` draws the page): what a graded class got wrong.

Reads what ``grade`` (or ``merge ... -o FOLDER``) wrote into OUT: rows.json (every row with its
per-test results; grades.csv alone when an older run left no rows.json), students.json (names),
grading.json (the class), answers.json and review/review.csv (free-text answers and their points).

tests.csv has one line per notebook and automatically graded test: points, students (those whose
notebook was graded, so the test ran), passed (full points), pass_rate, and the message that failing
students saw most often with how many saw it.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import re
from pathlib import Path

from autograder.record.results import ROWS_JSON, STATUSES, Row, read_csv, read_rows
from autograder.record.review import ANSWERS, read_review

TESTS_FIELDS = ["notebook", "test", "points", "students", "passed", "pass_rate", "most_common_failure",
                "failure_count"]
HELP_LOWEST = 5  # the students with the lowest totals are named, besides anyone with a missing notebook
TROUBLE = ("missing", "invalid", "timeout", "error")  # statuses that name a student among those who need help
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(:(\s|$)|$)")  # "AssertionError: ...", "KeyError"
NO_MESSAGE = "no error shown (the test gave fewer points)"


@dataclasses.dataclass
class TestStat:
    notebook: str
    test: str
    points: float
    students: int = 0
    passed: int = 0
    failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.students if self.students else 0.0

    def top_failure(self) -> tuple[str, int]:
        return self.failures.most_common(1)[0] if self.failures else ("", 0)


@dataclasses.dataclass
class Question:
    notebook: str
    question: str
    answers: int
    reviewed: int


@dataclasses.dataclass
class Helped:
    student: str
    name: str
    total: float
    max_total: float
    problems: list[str]

    @property
    def percent(self) -> float:
        return 100 * self.total / self.max_total if self.max_total else 0.0


@dataclasses.dataclass
class ClassData:
    out: Path
    rows: list[Row]
    per_test: bool  # rows carry per-test results (rows.json was there)
    info: dict[str, dict]
    meta: dict

    @property
    def notebooks(self) -> list[str]:
        return sorted({r.notebook for r in self.rows})


def load(out: Path) -> ClassData:
    """The graded class in OUT; ValueError when OUT holds no grades."""
    out = Path(out)
    if (out / ROWS_JSON).is_file():
        rows, per_test = read_rows(out / ROWS_JSON), True
    elif (out / "grades.csv").is_file():
        rows, per_test = read_csv(out / "grades.csv"), False
    else:
        raise ValueError(f"no grades in {out} (neither {ROWS_JSON} nor grades.csv): run "
                         f"`python -m autograder grade SUBMISSIONS {out}` or `merge SHARD_OUT... -o {out}` first")

    def read_json(name: str) -> dict:
        p = out / name
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}

    return ClassData(out, rows, per_test, read_json("students.json"), read_json("grading.json"))


def failure_message(output: str, limit: int = 160) -> str:
    """The line a failing student saw that says what went wrong: the exception line of the traceback
    (with the visible assert it points at, when the feedback shows one), or the stderr text."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    if not lines:
        return NO_MESSAGE
    if lines[0].startswith("wrote to stderr"):
        return lines[0][:limit]
    found = [i for i, l in enumerate(lines) if EXCEPTION_LINE.match(l) and not l.startswith("Cell In")]
    if not found:
        return lines[-1][:limit]
    i = found[-1]
    text = lines[i]
    if i + 1 < len(lines) and lines[i + 1].startswith("(a visible test failed"):
        text += " " + lines[i + 1]
    return text[:limit]


def test_stats(rows: list[Row]) -> list[TestStat]:
    """One entry per notebook and automatically graded test, per notebook hardest first."""
    stats: dict[tuple[str, str], TestStat] = {}
    for r in rows:
        for t in r.tests:
            if t.get("manual"):
                continue  # a free-text answer: its points come from a person (see review_progress)
            s = stats.setdefault((r.notebook, t["name"]), TestStat(r.notebook, t["name"], float(t["max_score"])))
            s.students += 1
            if t["score"] >= t["max_score"]:
                s.passed += 1
            else:
                s.failures[failure_message(t.get("output") or "")] += 1
    return sorted(stats.values(), key=lambda s: (s.notebook, s.pass_rate, s.test))


def write_tests_csv(stats: list[TestStat], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(TESTS_FIELDS)
        for s in stats:
            message, count = s.top_failure()
            w.writerow([s.notebook, s.test, f"{s.points:g}", s.students, s.passed, f"{s.pass_rate:.4f}",
                        message, count])


def status_counts(rows: list[Row]) -> dict[str, dict[str, int]]:
    """{notebook: {status or "late": count}}, every status of ``results.STATUSES`` present."""
    out = {}
    for stem in sorted({r.notebook for r in rows}):
        rs = [r for r in rows if r.notebook == stem]
        out[stem] = {s: sum(r.status == s for r in rs) for s in STATUSES} | {"late": sum(r.late for r in rs)}
    return out


def needs_help(data: ClassData, lowest: int = HELP_LOWEST) -> list[Helped]:
    """The students with the ``lowest`` totals (ties included) and anyone with a notebook missing,
    invalid, timed out or failed to grade; lowest total first."""
    by_student: dict[str, list[Row]] = collections.defaultdict(list)
    for r in data.rows:
        by_student[r.student].append(r)
    maxima = {r.notebook: r.max_score for r in data.rows}
    people = []
    for sid, rs in by_student.items():
        problems = [f"{r.notebook} {r.status}" for r in sorted(rs, key=lambda r: r.notebook) if r.status in TROUBLE]
        people.append(Helped(sid, data.info.get(sid, {}).get("name", ""), sum(r.score for r in rs),
                             sum(maxima.values()), problems))
    people.sort(key=lambda h: (h.percent, h.student))
    cut = people[min(lowest, len(people)) - 1].percent if people and lowest else -1.0
    return [h for h in people if h.percent <= cut or h.problems]


def review_progress(out: Path) -> list[Question]:
    """Per free-text question: how many answers wait for a person and how many have points in
    OUT/review/review.csv. Empty when nobody answered a free-text question."""
    answers_file = out / ANSWERS
    if not answers_file.is_file():
        return []
    answers = json.loads(answers_file.read_text(encoding="utf-8"))
    sheet = out / "review" / "review.csv"
    marks = read_review(sheet) if sheet.is_file() else {}
    counts: dict[tuple[str, str], list[int]] = {}
    for key, questions in answers.items():
        student, stem = key.split("/", 1)
        for gid in questions:
            c = counts.setdefault((stem, gid), [0, 0])
            c[0] += 1
            c[1] += (student, stem, gid) in marks
    return [Question(stem, gid, n, done) for (stem, gid), (n, done) in sorted(counts.items())]
