"""The work `make grade` no longer does per run or per notebook, checked without grading anything:
the canary remembered under a key that every input changes, the feedback page's faster rendering
(same text, source still escaped), and the job's stage timers adding up to its wall time.

The graded results themselves (scores equal to nbgrader's) are checked by tests/test_pipeline.py,
tests/test_autograder_hostile.py and `python -m autograder.bench --class 3`.
"""

from __future__ import annotations

import copy
import html
import re
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder import batch
from autograder.grade import remember
from autograder.grade import feedback
from autograder.grade.grading import Grader, Settings
from autograder.grade.job import DATABASE_STEPS, stage_times
from autograder.shared import notebooks
from autograder.shared.rows import Row

STEM = "01_demo"


class Counting(Grader):
    """A Grader whose ``grade`` only counts its calls and returns a preset row (no nbgrader)."""

    def grade(self, item, progress=None):
        self.calls.append(item[1])
        return Row(item[0], item[1], self.score, 2.0, "ok")


def make_grader(tmp_path: Path, score: float = 2.0, **changes) -> Counting:
    release = notebooks.course_notebook([notebooks.nbgrader_cell("answer", "f", "def f():\n    raise NotImplementedError()"),
                                         notebooks.nbgrader_cell("test", "test_f", "assert f() == 1", points=2)])
    source = notebooks.course_notebook([notebooks.nbgrader_cell("answer", "f", "def f():\n    return 1"),
                                        notebooks.nbgrader_cell("test", "test_f", "assert f() == 1", points=2)])
    fields = dict(base=tmp_path / "course", work=tmp_path / "work", out=tmp_path / "out", releases={STEM: release},
                  sources={STEM: source}, max_points={STEM: 2.0}, settings=Settings(cell_timeout=60), threads=1,
                  isolation="on (test)")
    fields.update(changes)
    g = Counting(**fields)
    g.calls, g.score = [], score
    return g


@pytest.fixture
def solution(tmp_path) -> dict:
    path = tmp_path / f"{STEM}.ipynb"
    path.write_text("solution v1")
    return {STEM: path}


def test_canary_key_changes_with_every_input(tmp_path, solution):
    g = make_grader(tmp_path)
    key = batch.canary_key(g, STEM, solution[STEM])
    assert key == batch.canary_key(make_grader(tmp_path), STEM, solution[STEM])  # same inputs, same key
    changed = [make_grader(tmp_path, settings=Settings(cell_timeout=61)),
               make_grader(tmp_path, settings=Settings(cell_timeout=60, memory_mb=10)),
               make_grader(tmp_path, threads=2), make_grader(tmp_path, isolation="OFF"),
               make_grader(tmp_path, releases={STEM: notebooks.course_notebook([])})]
    keys = {batch.canary_key(c, STEM, solution[STEM]) for c in changed}
    assert key not in keys and len(keys) == len(changed)
    solution[STEM].write_text("solution v2")
    assert batch.canary_key(g, STEM, solution[STEM]) != key


def test_canary_is_graded_once_then_remembered(tmp_path, solution, monkeypatch):
    monkeypatch.setenv(batch.CANARY_CACHE, str(tmp_path / "cache"))
    lines: list[str] = []
    first = make_grader(tmp_path)
    batch.run_canary(first, [STEM], solution, 1, lines.append)
    assert first.calls == [STEM] and "remembered" not in lines[-1]
    again = make_grader(tmp_path)
    batch.run_canary(again, [STEM], solution, 1, lines.append)
    assert again.calls == [] and f"{STEM} remembered" in lines[-1], lines
    monkeypatch.setenv(batch.CANARY_CACHE, "off")  # off: graded every run
    off = make_grader(tmp_path)
    batch.run_canary(off, [STEM], solution, 1, lines.append)
    assert off.calls == [STEM]


def test_failing_canary_stops_and_is_not_remembered(tmp_path, solution, monkeypatch):
    monkeypatch.setenv(batch.CANARY_CACHE, str(tmp_path / "cache"))
    for _ in range(2):  # the second run grades it again: a failure is never remembered
        failing = make_grader(tmp_path, score=1.0)
        with pytest.raises(batch.Stop, match="instructor solution of 01_demo got 1/2"):
            batch.run_canary(failing, [STEM], solution, 1, lambda m: None)
        assert failing.calls == [STEM]
    assert not list((tmp_path / "cache").glob("*.json"))


def page_text(page: str) -> str:
    page = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", page)  # widget ids
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]*>", "", page)))


def test_feedback_page_has_the_stock_pages_text_and_escapes_code(monkeypatch):
    hostile = "x = '</pre><script>alert(1)</script>' & \"<b>bold</b>\""
    nb = new_notebook(cells=[
        new_markdown_cell("# Title\n\nSome *markdown* with $x^2$ and <b>html</b>."),
        new_code_cell(hostile, outputs=[new_output("stream", name="stdout", text="printed <i>x</i>\n")]),
        new_code_cell("assert False, 'no'", outputs=[new_output(
            "error", ename="AssertionError", evalue="no", traceback=["\x1b[0;31mAssertionError\x1b[0m: no"])]),
        new_code_cell("show()", outputs=[new_output("display_data", data={"image/png": "iVBORw0KGgo=",
                                                                          "text/plain": "<Figure>"})])],
        metadata={"language_info": {"name": "python", "pygments_lexer": "ipython3"}})
    cells = {"test_x": (1.0, 2.0)}
    fast = feedback.feedback_html(copy.deepcopy(nb), cells, "t")
    from nbconvert import HTMLExporter

    stock = HTMLExporter(template_name="classic")
    stock.exclude_input_prompt = stock.exclude_output_prompt = True
    monkeypatch.setattr(feedback, "_EXPORTER", stock)
    slow = feedback.feedback_html(copy.deepcopy(nb), cells, "t")
    assert page_text(fast) == page_text(slow)  # what a student reads is unchanged
    assert "<script>alert" not in fast and "</pre><script>" not in fast  # the student's source stays text
    assert "alert(1)" in page_text(fast)
    assert re.search(r"<img(?![^>]*\balt=)", fast) is None and "<img" in fast  # every image has alt text


def test_stage_times_add_up_to_the_jobs_seconds():
    # Made-up clock readings (epoch seconds) of one job: queued 100, entered 101, nbgrader's autograde
    # 102-110 with Execute 103-109 (first cell 104, last reply 108), the result written until `now`.
    spent = {"execute_start": 103.0, "execute_end": 109.0, "Execute": 6.0, "SaveAutoGrades": 0.5,
             "OverwriteCells": 0.25, "ClearOutput": 0.1}
    t = stage_times(spent, entered=101.0, queued=100.0, started=102.0, ended=110.0, span=(104.0, 108.0),
                    marks={"scores": 0.2, "feedback": 0.3})
    assert (t["kernel_start"], t["cells"], t["kernel_stop"]) == (1.0, 4.0, 1.0)
    pre = sum(spent[k] for k in DATABASE_STEPS if k in spent)
    assert t["database"] == pytest.approx(pre + 0.2)
    # nbgrader's own work + kernel start + cells + kernel stop + its database steps = the autograde call (8 s)
    assert t["nbgrader"] + t["kernel_start"] + t["cells"] + t["kernel_stop"] + pre == pytest.approx(8.0)
    assert (t["job_start"], t["setup"]) == (1.0, 1.0)


def test_course_set_up_is_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv(batch.CANARY_CACHE, str(tmp_path / "cache"))
    source = tmp_path / "src" / f"{STEM}.ipynb"
    source.parent.mkdir()
    notebooks.write(notebooks.course_notebook([
        notebooks.nbgrader_cell("answer", "f", "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        notebooks.nbgrader_cell("test", "test_f", "assert f() == 1", points=2)]), source)
    first = batch.build_course(tmp_path / "one", {STEM: source})
    assert "return 1" not in first[STEM].cells[0].source  # nbgrader made the release

    def no_nbgrader(*a, **k):
        raise AssertionError("generated again")

    monkeypatch.setattr(remember, "Course", no_nbgrader)
    again = batch.build_course(tmp_path / "two", {STEM: source})
    assert notebooks.normalized(again[STEM]) == notebooks.normalized(first[STEM])
    for name in ("gradebook.db", f"release/{STEM}/{STEM}.ipynb", f"source/{STEM}/{STEM}.ipynb"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    source.write_text(source.read_text().replace("return 1", "return 1  # changed"))
    with pytest.raises(AssertionError, match="generated again"):  # a changed solution is generated again
        batch.build_course(tmp_path / "three", {STEM: source})


def test_a_new_gradebook_is_stamped_without_an_alembic_subprocess(tmp_path, monkeypatch):
    """nbgrader asks `alembic heads` (a subprocess, about 4 s of CPU) for each new gradebook's stamp; once a
    Course exists, this process reads the same head from nbgrader's migration scripts. The revision must be
    the one alembic itself reports, and making a gradebook must start no subprocess."""
    import sqlite3
    import subprocess
    import sys

    from nbgrader import api
    from nbgrader.dbutil import _temp_alembic_ini

    from autograder.grade.course import Course

    monkeypatch.setattr(api, "get_alembic_version", api.get_alembic_version)  # put back after the test
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'probe.db'}") as ini:  # what nbgrader would ask
        heads = subprocess.run([str(Path(sys.executable).parent / "alembic"), "-c", ini, "heads"],
                               capture_output=True, text=True, check=True).stdout
    expected = heads.split("\n")[0].split(" ")[0]
    assert expected

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"nbgrader started a subprocess: {args}")

    Course(tmp_path / "course")
    monkeypatch.setattr(api.sp, "check_output", no_subprocess)
    with api.Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}"):
        pass
    stamp = sqlite3.connect(tmp_path / "gradebook.db").execute("SELECT version_num FROM alembic_version").fetchall()
    assert stamp == [(expected,)]
