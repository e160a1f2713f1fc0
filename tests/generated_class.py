"""A generated class with known results (tests only): no kernel starts, so the tests that use it take seconds.

``make_rows()`` gives the rows `grade` would make: every test's result, free-text answers, the statuses below.
``write_out(out, rows, shard)`` writes them the way `grade` writes OUT (``gradebook.write_outputs``, the code
`grade` calls, plus one made-up feedback page per graded notebook); ``write_review_sheet`` fills in points.
"""

from __future__ import annotations

import csv
from pathlib import Path

from autograder.export.gradebook import write_outputs
from autograder.record.results import Row

STUDENTS = [f"s{i:02d}" for i in range(10)]
# notebook -> test -> (points, how many of the graded students pass it)
TESTS = {"03_memory": {"test_shape": (2, 8), "test_values": (3, 3), "test_hidden": (1, 6)},
         "05_paging": {"test_alloc": (1, 5), "test_free": (2, 9)}}
FREE_TEXT = ("05_paging", "q_explain", 2.0)  # answered by the first ANSWERED graded students
ANSWERED, REVIEWED = 6, 2
NOT_GRADED = {("s09", "03_memory"): "missing", ("s08", "05_paging"): "timeout"}
LATE = "s03"
TRACEBACK = ("---------------------------------------------------------------------------\n"
             "AssertionError                            Traceback (most recent call last)\n"
             "Cell In[7], line 3\n      1 out = attention(q, k, v)\n----> 3 assert torch.allclose(out, ref)\n\n"
             "AssertionError: values differ")
NAME_ERROR = "NameError: name 'cache' is not defined"
HIDDEN = "AssertionError: wrong cache size  (a hidden test failed; its code is not shown)"


def graded(stem: str) -> list[str]:
    return [s for s in STUDENTS if (s, stem) not in NOT_GRADED]


def expected() -> dict[tuple[str, str], tuple[float, int, int]]:
    """(notebook, test) -> (points, students, passed): what a report must find."""
    return {(stem, t): (p, len(graded(stem)), k) for stem, tests in TESTS.items() for t, (p, k) in tests.items()}


def output_of(test: str, i: int) -> str:
    """What a failing student saw: the test_values failures split 2:1 between two messages."""
    if test == "test_values":
        return TRACEBACK if i % 3 != 2 else NAME_ERROR
    return HIDDEN if test == "test_hidden" else "wrote to stderr: UserWarning: slow path"


def make_rows() -> list[Row]:
    rows = []
    for stem, tests in TESTS.items():
        top = sum(p for p, _ in tests.values()) + (FREE_TEXT[2] if stem == FREE_TEXT[0] else 0)
        ok = graded(stem)
        for s in STUDENTS:
            late = s == LATE
            if (s, stem) in NOT_GRADED:
                rows.append(Row(s, stem, 0.0, top, NOT_GRADED[s, stem], "made up", late))
                continue
            i = ok.index(s)  # the first k graded students pass a test that k students pass
            results = [{"name": t, "score": float(p if i < k else 0), "max_score": float(p),
                        "output": "" if i < k else output_of(t, i)} for t, (p, k) in tests.items()]
            manual = {}
            if stem == FREE_TEXT[0]:
                given = i < ANSWERED
                results.append({"name": FREE_TEXT[1], "score": 0.0, "max_score": FREE_TEXT[2], "manual": True,
                                "output": "waits for review" if given else "answer not given"})
                if given:
                    manual = {FREE_TEXT[1]: {"max_score": FREE_TEXT[2], "answer": f"answer of {s}"}}
            rows.append(Row(s, stem, sum(t["score"] for t in results), top, "needs_review" if manual else "ok",
                            "", late, seconds=3.0 + i + len(stem), tests=results, manual=manual))
    return rows


def write_out(out: Path, rows: list[Row], shard: str = "1/1") -> None:
    """OUT as `grade --shard SHARD` writes it for these rows (the class: every student of STUDENTS)."""
    out.mkdir(parents=True)
    mine = sorted({r.student for r in rows})
    info = {s: {"id": s, "name": f"Student {s[1:]}", "email": "", "lms_id": f"u{s[1:]}", "section": ""} for s in mine}
    meta = {"shard": shard, "class": {"students": STUDENTS, "notebooks": sorted(TESTS)}, "format": "folders",
            "settings": {"memory_mb": 4096}, "rows": len(rows), "seconds": 1.0,
            "per_notebook_seconds": {f"{r.student}/{r.notebook}": r.seconds for r in rows if r.seconds}}
    write_outputs(out, rows, info, meta, say=lambda m: None)
    for r in rows:
        if r.tests:
            page = out / "feedback" / r.student / f"{r.notebook}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(f"<html><body><h1>{r.notebook}: {r.score:g} / {r.max_score:g}</h1></body></html>")


def write_review_sheet(out: Path) -> None:
    """OUT/review/review.csv with points for the first REVIEWED of the ANSWERED free-text answers."""
    (out / "review").mkdir(exist_ok=True)
    with open(out / "review" / "review.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "question", "max_points", "points", "comment"])
        for s in graded(FREE_TEXT[0])[:ANSWERED]:
            points = "1" if s in graded(FREE_TEXT[0])[:REVIEWED] else ""
            w.writerow([s, FREE_TEXT[0], FREE_TEXT[1], "2", points, ""])


def make_class(out: Path) -> list[Row]:
    rows = make_rows()
    write_out(out, rows)
    write_review_sheet(out)
    return rows
