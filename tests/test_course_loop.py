"""One week of a course, on generated fixtures: a Canvas export graded with a roster, the
gradebook and LMS files, manual review merged back, the feedback zip, Gradescope, the student's
self-check, the canary and the exit codes.

The assignment is a tiny dedicated one (91_course: one function with a visible and a hidden test,
and a free-text question) so that each graded notebook costs a few seconds; the class is graded
once (module fixture) and re-graded only from the cache.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell

from autograder.shared import notebooks as nbs
from autograder.batch import Settings, grade_batch
from autograder.commands import build_releases
from autograder.grade.course import Course
from autograder.record.results import read_csv

ROOT = Path(__file__).resolve().parents[1]
STEM = "91_course"
HIDDEN_LINE = "assert double(-3) == -6, 'negative input'"
SETTINGS = dict(cell_timeout=15, notebook_timeout=90, memory_mb=1536)
pytestmark = pytest.mark.slow  # about 4 graded notebooks plus cached re-runs


def fixture_source() -> nbformat.NotebookNode:
    free = new_markdown_cell("Model answer: one K row and one V row per token and layer.", metadata={"nbgrader": {
        "grade": True, "grade_id": "explain", "locked": False, "points": 2, "schema_version": 3,
        "solution": True, "task": False}})
    return nbs.course_notebook([
        new_markdown_cell("# Course-loop fixture"),
        nbs.nbgrader_cell("setup", "setup", "from kvref import grading"),
        nbs.nbgrader_cell("answer", "double", "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbs.nbgrader_cell("test", "test_double", (
            "with grading.checked(seconds=10):\n"
            "    assert double(2) == 4, f'double(2) gave {double(2)}, expected 4'\n"
            "    ### BEGIN HIDDEN TESTS\n"
            f"    {HIDDEN_LINE}\n"
            "    ### END HIDDEN TESTS"), points=2),
        new_markdown_cell("Why does the cache grow with T? (free text)"),
        free,
    ])


def with_cell(nb, gid: str, text: str):
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for c in nb.cells:
        if nbs.grade_id(c) == gid:
            c.source = text
    return nb


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("week")
    solutions = tmp / "solutions"
    solutions.mkdir()
    src = fixture_source()
    nbformat.write(src, str(solutions / f"{STEM}.ipynb"))
    release = build_releases(Course(tmp / "rc", {STEM: solutions / f"{STEM}.ipynb"}),
                             {STEM: solutions / f"{STEM}.ipynb"})[STEM]
    solved = with_cell(nbs.fill_answers(release, src), "explain", "Each new token adds a K and a V row in every layer.")
    visible_fail = with_cell(solved, "double", "def double(x):\n    return 3 * x")
    hidden_fail = with_cell(solved, "double", "def double(x):\n    return x + 2")  # right at 2 only
    archive = tmp / "submissions.zip"  # Canvas "Download Submissions"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"doejane_1001_5001_{STEM}.ipynb", nbformat.writes(solved))
        z.writestr(f"roesmith_LATE_1002_5002_{STEM}-1.ipynb", nbformat.writes(visible_fail))
        z.writestr(f"leekim_1003_5003_{STEM}.ipynb", nbformat.writes(release))  # untouched
    roster = tmp / "roster.csv"
    roster.write_text("id,name,email,lms_id,section\ns1,Jane Doe,jane@uni.example,1001,A\n"
                      "s2,Rob Roe,rob@uni.example,1002,A\ns3,Kim Lee,kim@uni.example,1003,B\n"
                      "s4,Ann Other,ann@uni.example,1004,B\n")
    out, lines = tmp / "out", []
    status = grade_batch(archive, out, solutions, workers=2, settings=Settings(**SETTINGS), roster=roster,
                         say=lines.append)
    return dict(tmp=tmp, solutions=solutions, src=src, release=release, solved=solved, hidden_fail=hidden_fail,
                visible_fail=visible_fail, archive=archive, roster=roster, out=out, status=status,
                log="\n".join(lines), rows={r.student: r for r in read_csv(out / "grades.csv")})


def page_text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]*>", "", path.read_text(encoding="utf-8")))


def test_canvas_class_is_graded_with_roster(week):
    assert week["status"] == 0, week["log"][-3000:]
    assert "format: canvas" in week["log"] and "canary:" in week["log"]
    rows = week["rows"]
    assert sorted(rows) == ["s1", "s2", "s3", "s4"], week["log"][-2000:]
    assert (rows["s1"].status, rows["s1"].score, rows["s1"].max_score) == ("needs_review", 2, 4)
    assert rows["s2"].late and not rows["s1"].late
    assert rows["s2"].score == 0 and "re-submitted" in rows["s2"].reason
    assert (rows["s3"].status, rows["s3"].score) == ("ok", 0)  # nothing written: no review needed
    assert (rows["s4"].status, rows["s4"].score) == ("missing", 0)


def test_visible_assert_in_a_hidden_test_cell_shows_its_message(week):
    text = page_text(week["out"] / "feedback" / "s2" / f"{STEM}.html")
    assert "double(2) gave 6, expected 4" in text and "a visible test failed at line 2" in text, text[-2000:]
    assert "double(-3)" not in text and "BEGIN HIDDEN" not in text


def test_gradebook_and_lms_files(week):
    out = week["out"]
    with open(out / "gradebook.csv", newline="") as f:
        book = {r["student"]: r for r in csv.DictReader(f)}
    assert sorted(book) == ["s1", "s2", "s3", "s4"]
    assert book["s1"][STEM] == "2" and book["s1"]["max_total"] == "4" and book["s1"]["percent"] == "50.0"
    assert "late" in book["s2"]["flags"] and f"{STEM}:missing" in book["s4"]["flags"]
    assert book["s3"]["section"] == "B" and book["s1"]["email"] == "jane@uni.example"
    with open(out / "canvas_import.csv", newline="") as f:
        canvas = list(csv.reader(f))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", STEM]
    assert canvas[1][0] == "Points Possible" and canvas[1][-1] == "4"
    assert ["Jane Doe", "1001", "s1", "jane@uni.example", "A", "2"] in canvas
    with open(out / "moodle_import.csv", newline="") as f:
        moodle = list(csv.reader(f))
    assert moodle[0] == ["Email address", STEM] and ["rob@uni.example", "0"] in moodle


def test_review_then_manual_merge(week, tmp_path):
    from autograder.record.review import review

    out = tmp_path / "out"
    shutil.copytree(week["out"], out)
    assert review(out, week["solutions"], say=lambda m: None) == 0
    page = page_text(out / "review" / f"{STEM}-explain.html")
    assert "Each new token adds a K and a V row" in page and "Model answer" in page  # answer + rubric
    with open(out / "review" / "review.csv", newline="") as f:
        sheet = list(csv.DictReader(f))
    assert [(r["student"], r["question"], r["max_points"], r["points"]) for r in sheet] == [
        ("s1", "explain", "2", ""), ("s2", "explain", "2", "")]  # s3 wrote nothing: 0, no review
    sheet[0].update(points="1.5", comment="layers named, no formula")
    with open(out / "review" / "review.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(sheet[0]))
        w.writeheader()
        w.writerows(sheet)
    lines: list[str] = []
    assert grade_batch(week["archive"], out, week["solutions"], workers=2, settings=Settings(**SETTINGS),
                       roster=week["roster"], manual=out / "review" / "review.csv", say=lines.append) == 0
    assert "(cached)" in "\n".join(lines)
    rows = {r.student: r for r in read_csv(out / "grades.csv")}
    assert (rows["s1"].status, rows["s1"].score) == ("ok", 3.5) and "layers named" in rows["s1"].reason
    assert rows["s2"].status == "needs_review"  # not reviewed yet
    with open(out / "gradebook.csv", newline="") as f:
        assert next(r for r in csv.DictReader(f) if r["student"] == "s1")["total"] == "3.5"
    assert "layers named, no formula" in page_text(out / "feedback" / "s1" / f"{STEM}.html")
    # The review sheet keeps what was filled in when it is written again.
    assert review(out, week["solutions"], say=lambda m: None) == 0
    assert "1.5" in (out / "review" / "review.csv").read_text()
    # Points out of range are refused, not added.
    (out / "bad.csv").write_text("student,notebook,question,max_points,points,comment\ns1,91_course,explain,2,9,\n")
    lines.clear()
    grade_batch(week["archive"], out, week["solutions"], workers=2, settings=Settings(**SETTINGS),
                roster=week["roster"], manual=out / "bad.csv", say=lines.append)
    assert any("not between 0 and 2" in l for l in lines), lines[-5:]
    assert {r.student: r for r in read_csv(out / "grades.csv")}["s1"].status == "needs_review"


def test_feedback_zip(week, tmp_path):
    from autograder.export.gradebook import feedback_zip

    assert feedback_zip(week["out"], tmp_path / "fb.zip", say=lambda m: None) == 0
    names = zipfile.ZipFile(tmp_path / "fb.zip").namelist()
    assert sorted(names) == [f"s1/{STEM}.html", f"s2/{STEM}.html", f"s3/{STEM}.html"], names


def test_gradescope_autograder(week, tmp_path):
    """The zip, laid out as Gradescope's documented /autograder tree under a temporary root."""
    from autograder.gradescope import build

    archive = tmp_path / "autograder.zip"
    assert build(STEM, archive, week["solutions"], say=lambda m: None) == 0
    root = tmp_path / "autograder"
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        z.extractall(root / "source")
    assert {"setup.sh", "run_autograder", f"solutions/{STEM}.ipynb", "autograder/gradescope.py"} <= set(names)
    (root / "submission").mkdir()
    (root / "submission" / f"{STEM}.ipynb").write_text(nbformat.writes(week["hidden_fail"]))
    env = dict(os.environ, AUTOGRADER_ROOT=str(root),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)  # the zip's own packages, not this checkout's
    p = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and isinstance(results["execution_time"], float)
    tests = {t["name"]: t for t in results["tests"]}
    assert set(tests) == {"test_double", "explain"}
    for t in results["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output", "visibility"}
    assert (tests["test_double"]["score"], tests["test_double"]["max_score"]) == (0, 2)
    assert "negative input" in tests["test_double"]["output"]  # the hidden test's message ...
    text = json.dumps(results)
    assert "double(-3)" not in text and "BEGIN HIDDEN" not in text  # ... never its code
    assert "isolation:" in results["output"]


def test_self_check_visible_tests(week, tmp_path):
    """`check` runs the released notebook's visible tests: the hidden-test mistake passes it, the
    visible one fails it with the full message and exit status 1."""
    from autograder.check import check

    release = tmp_path / f"{STEM}.ipynb"
    release.write_text(nbformat.writes(week["release"]))
    mine = tmp_path / "work" / f"{STEM}.ipynb"
    mine.parent.mkdir()
    mine.write_text(nbformat.writes(week["hidden_fail"]))
    said: list[str] = []
    assert check(mine, release, Settings(**SETTINGS), say=said.append) == 0, said
    assert any(l.startswith("[pass] test_double (2/2)") for l in said), said
    mine.write_text(nbformat.writes(week["visible_fail"]))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    p = subprocess.run([sys.executable, "-m", "autograder", "check", str(mine), "--release", str(release)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "[FAIL] test_double (0/2)" in p.stdout and "double(2) gave 6, expected 4" in p.stdout, p.stdout


def test_stretch_report_says_what_the_stretch_check_said():
    """`check` shows the ungraded stretch's own check: its last printed line, or its error (issue 38: a passing
    stretch said nothing)."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from autograder.grade.job import stretch_report

    answer = new_code_cell("def f():\n    return 1", metadata={"nbgrader": {
        "grade": False, "grade_id": "stretch_f", "locked": False, "schema_version": 3, "solution": True, "task": False}})
    check = new_code_cell("assert f() == 1\nprint('Stretch check passed')")

    def nb(*outputs):
        check.outputs = list(outputs)
        return new_notebook(cells=[new_markdown_cell("## 1. Warm-up: x"), new_code_cell("x = 1"),
                                   new_markdown_cell("## Stretch (optional, ungraded): f\nEstimated time: about 5 min"),
                                   answer, check])

    assert stretch_report(nb(new_output("stream", name="stdout", text="one\nStretch check passed\n"))) == (
        "Stretch check passed")
    assert stretch_report(nb(new_output("error", ename="AssertionError", evalue="f() gave  2", traceback=[]))) == (
        "failed: AssertionError: f() gave 2")
    assert stretch_report(nb()) == "ran; its check printed nothing"
    assert stretch_report(new_notebook(cells=[new_markdown_cell("## 1. Warm-up: x")])) == ""


def test_canary_names_the_setting(week, tmp_path):
    lines: list[str] = []
    status = grade_batch(week["archive"], tmp_path / "out", week["solutions"], workers=1,
                         settings=Settings(**dict(SETTINGS, memory_mb=10)), say=lines.append)
    assert status == 1, lines[-5:]
    assert any("instructor solution" in l and "--memory" in l for l in lines), lines[-5:]
    assert not (tmp_path / "out" / "grades.csv").exists()  # no student was graded


def test_every_row_error_exits_1(week, tmp_path):
    subs = tmp_path / "subs" / "alice"
    subs.mkdir(parents=True)
    dies = with_cell(week["solved"], "double", "import os\nos.kill(os.getpid(), 9)")
    (subs / f"{STEM}.ipynb").write_text(nbformat.writes(dies))
    lines: list[str] = []
    assert grade_batch(subs.parent, tmp_path / "out", week["solutions"], workers=1, settings=Settings(**SETTINGS),
                       canary=False, say=lines.append) == 1
    assert any("every graded notebook ended with status `error`" in l for l in lines), lines[-5:]
