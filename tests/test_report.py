"""`python -m autograder report OUT`: the class report, on a generated class whose pass rates are known.

The class (tests/generated_class.py) is written the way `grade` writes OUT (rows.json with per-test results,
grades.csv, students.json, grading.json, answers.json) with made-up results, so no kernel starts.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.grade.course import ROOT
from autograder.report.report import report
from autograder.report.report_stats import failure_message
from autograder.record.results import ROWS_JSON
from generated_class import ANSWERED, FREE_TEXT, HIDDEN, REVIEWED, STUDENTS, TESTS, TRACEBACK, expected, make_class

@pytest.fixture
def cls(tmp_path):
    out = tmp_path / "out"
    make_class(out)
    said: list[str] = []
    assert report(out, say=said.append) == 0, said
    page = (out / "report" / "index.html").read_text(encoding="utf-8")
    return out, page, said


def table_rows(page: str) -> list[str]:
    """Each table row as "|cell|cell|...|", the cells' text without tags."""
    cells = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr) for tr in re.findall(r"<tr.*?</tr>", page)]
    return ["|" + "|".join(re.sub(r"<[^>]+>", "", c) for c in row) + "|" for row in cells]


def test_tests_csv_holds_the_known_pass_rates(cls):
    out, _, _ = cls
    with open(out / "report" / "tests.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    found = {(r["notebook"], r["test"]): (float(r["points"]), int(r["students"]), int(r["passed"])) for r in lines}
    assert found == expected()
    for r in lines:
        assert float(r["pass_rate"]) == pytest.approx(int(r["passed"]) / int(r["students"]), abs=1e-4)
    for stem in TESTS:  # hardest first within each notebook
        rates = [float(r["pass_rate"]) for r in lines if r["notebook"] == stem]
        assert rates == sorted(rates), lines
    top = {(r["notebook"], r["test"]): (r["most_common_failure"], int(r["failure_count"])) for r in lines}
    assert top["03_memory", "test_values"] == ("AssertionError: values differ", 4)  # 4 of the 6 failing
    assert top["03_memory", "test_hidden"] == (HIDDEN, 3)
    assert top["05_paging", "test_free"] == ("", 0)  # everybody graded passed it
    assert not any(r["test"] == FREE_TEXT[1] for r in lines)  # a person scores free text, not a test


def test_page_shows_the_known_rates_hardest_first(cls):
    _, page, _ = cls
    rows = table_rows(page)
    for (stem, test), (_, students, passed) in expected().items():
        row = next(r for r in rows if f"|{test}|" in r)
        assert f"|{passed}/{students}|" in row and f"|{100 * passed / students:.0f}%|" in row, row
    section = page[page.index('id="nb-03_memory"'):page.index('id="nb-05_paging"')]
    order = sorted(TESTS["03_memory"], key=lambda t: TESTS["03_memory"][t][1])
    assert [section.index(f"<code>{t}</code>") for t in order] == sorted(section.index(f"<code>{t}</code>")
                                                                         for t in order)
    values = next(r for r in rows if "|test_values|" in r)
    assert "AssertionError: values differ (4 of 6)" in values


def test_statuses_help_and_review(cls):
    _, page, _ = cls
    rows = table_rows(page)
    header = next(r for r in rows if "|notebook|graded|" in r).strip("|").split("|")
    total = dict(zip(header, next(r for r in rows if r.startswith("|all|")).strip("|").split("|")))
    assert total["missing"] == "1" and total["timeout"] == "1" and total["late"] == "2"
    assert total["manual pending"] == str(ANSWERED) and total["graded"] == str(2 * len(STUDENTS) - 2 - ANSWERED)
    helped = page[page.index('id="help"'):page.index('id="time"')]
    assert "|s09|Student 09|" in "".join(table_rows(helped)) and "03_memory missing" in helped
    assert "05_paging timeout" in helped
    review = next(r for r in rows if f"|{FREE_TEXT[1]}|" in r and "%" not in r)
    assert f"|{ANSWERED}|{REVIEWED}|{ANSWERED - REVIEWED}|" in review, review


def test_page_opens_offline(cls):
    out, page, _ = cls
    assert "<script" not in page and "http" not in page and "@import" not in page
    links = re.findall(r'(?:src|href)="([^"#]+)"', page)
    assert "tests.csv" in links and len([l for l in links if l.endswith(".png")]) == 2 * len(TESTS) + 1
    for link in links:
        path = out / "report" / link
        assert path.is_file(), link
        if link.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_rows_json_the_report_says_so(tmp_path):
    out = tmp_path / "out"
    make_class(out)
    (out / ROWS_JSON).unlink()  # graded before per-test results were kept
    said: list[str] = []
    assert report(out, say=said.append) == 0
    assert any("no per-test results" in s for s in said), said
    assert (out / "report" / "tests.csv").read_text().count("\n") == 1  # the header
    assert "per-test results: no" in (out / "report" / "index.html").read_text()


def test_failure_message_picks_what_the_student_saw():
    assert failure_message(TRACEBACK) == "AssertionError: values differ"
    visible = "AssertionError: \n(a visible test failed at line 4: assert out.shape == (2, 8))"
    assert failure_message(visible) == "AssertionError: (a visible test failed at line 4: assert out.shape == (2, 8))"
    assert failure_message("wrote to stderr: careful\nmore") == "wrote to stderr: careful"
    assert failure_message("") == "no error shown (the test gave fewer points)"


def test_cli_report(tmp_path):
    make_class(tmp_path / "out")
    proc = subprocess.run([sys.executable, "-m", "autograder", "report", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and (tmp_path / "out" / "report" / "index.html").is_file(), proc.stderr
    proc = subprocess.run([sys.executable, "-m", "autograder", "report", str(tmp_path / "empty")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no grades in" in proc.stderr, proc.stderr
