"""The graded-notebook pipeline (docs/COURSE_PIPELINE.md), end to end through nbgrader.

For every solutions/NN_topic.ipynb:
  - it is a well-formed instructor source (points, unique ids, locked tests, time limits);
  - notebooks/NN_topic.ipynb is exactly what `make release` generates from it;
  - no solution line and no hidden test appears in notebooks/ or in the built book;
  - the solution, submitted as a student, runs top to bottom and gets full marks;
  - the released notebook, submitted untouched, gets zero;
  - every wrong answer in tests/wrong_answers/NN_topic.py loses points (and there are >= 3), and every correct
    alternative in tests/right_answers/NN_topic.py keeps full marks.
Plus a self-test assignment written here (the stderr rule, forbid and time limits inside a real
kernel) and `make grade` on a tiny submissions folder.

Everything is graded once, by two module fixtures; the tests below only read their results.
  - `graded`, nbgrader (autograde in a kernel): one course directory, where the solution, the release and the first
    wrong answer and the first correct alternative of each chapter are submitted together and graded by
    parallel workers;
  - `inprocess` (autograder.mutation.grade_variants, the grader of the mutation sweep): every wrong answer and
    the other correct alternatives, the instructor source run once per chapter (it must pass every test there
    too) and forked at the first cell an answer changes. This is how each wrong answer is shown to lose points
    (on those graded both ways the two graders must agree) and each alternative to keep them
    (KVREF_ALL_NBGRADER=1 sends every answer through nbgrader).
"""

from __future__ import annotations

import csv
import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from book_build import built_book  # noqa: F401  (the one shared book build)
from nbformat.v4 import new_markdown_cell

from autograder import Course, cell_timeout, solution_files
from autograder.shared import notebooks as nbs
from autograder.commands import STEM_RE, build_releases
from autograder.mutation import answer_variants, grade_variants

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
WRONG_DIR = ROOT / "tests" / "wrong_answers"
RIGHT_DIR = ROOT / "tests" / "right_answers"
MIN_RIGHT = 2
# KVREF_STEMS=05_paging,06_quantization limits the run to those chapters (for authors iterating on one).
STEMS = sorted(s for s in solution_files(SOLUTIONS)
               if not os.environ.get("KVREF_STEMS") or s in os.environ["KVREF_STEMS"].split(","))
SELFTEST = "zz_selftest"
MIN_WRONG = 3
# Wrong answers and correct alternatives per chapter that nbgrader grades too (the first ones of each file); the
# rest only in-process. Every answer through nbgrader: KVREF_ALL_NBGRADER=1.
NBGRADER_ANSWERS = 10**6 if os.environ.get("KVREF_ALL_NBGRADER") else 1
WORKERS = max(1, min(4, os.cpu_count() or 1))


def load_wrong(stem: str) -> dict | str:
    """tests/wrong_answers/<stem>.py's WRONG, or why it could not be loaded (reported by a test)."""
    path = WRONG_DIR / f"{stem}.py"
    if not path.is_file():
        return f"missing {path.relative_to(ROOT)}"
    try:
        return nbs.load_wrong_answers(path)
    except Exception as e:  # reported by test_enough_wrong_answers, collection goes on
        return f"{path.relative_to(ROOT)} does not load: {type(e).__name__}: {e}"


def load_right(stem: str) -> dict | str:
    """tests/right_answers/<stem>.py's RIGHT (same format as WRONG), or why it could not be loaded."""
    path = RIGHT_DIR / f"{stem}.py"
    if not path.is_file():
        return f"missing {path.relative_to(ROOT)}"
    try:
        return nbs.load_wrong_answers(path, "RIGHT")
    except Exception as e:  # reported by test_enough_right_answers
        return f"{path.relative_to(ROOT)} does not load: {type(e).__name__}: {e}"


WRONG = {stem: load_wrong(stem) for stem in STEMS}
RIGHT = {stem: load_right(stem) for stem in STEMS}
RIGHT_CASES = [(stem, name) for stem in STEMS if isinstance(RIGHT[stem], dict) for name in RIGHT[stem]]
WRONG_CASES = [(stem, name) for stem in STEMS if isinstance(WRONG[stem], dict) for name in WRONG[stem]]


def student_id(name: str, kind: str = "wrong") -> str:
    return f"{kind}-{name}"


# -- the self-test assignment -------------------------------------------------------------------


def selftest_notebook() -> nbformat.NotebookNode:
    """Checks of kvref.grading inside a real kernel, graded by nbgrader: a noisy cell wrapped in
    grading.checked keeps its points, the same noise outside loses them (nbgrader's stderr rule),
    forbid blocks a name the notebook imported, and a time limit interrupts a loop."""
    cells = [
        new_markdown_cell("# Self-test of kvref.grading under nbgrader"),
        nbs.nbgrader_cell("setup", "setup", (
            "import logging, os, sys, warnings\n"
            "import torch\n"
            "import kvref\n"
            "from kvref import grading\n"
            "from kvref import generate  # in the notebook's namespace: forbid must block this name too\n"
            "noisy = logging.getLogger('selftest')\n"
            "noisy.addHandler(logging.StreamHandler(sys.stderr))  # holds the kernel's stderr, like transformers'")),
        nbs.nbgrader_cell("answer", "double", "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbs.nbgrader_cell("test", "test_quiet", (
            "with grading.checked(seconds=30):\n"
            "    torch.nn.functional.softmax(torch.zeros(2, 3))  # torch UserWarning: implicit dim\n"
            "    torch.ones(3).T  # torch C++ warning (x.T on a 1-D tensor)\n"
            "    warnings.warn('a plain Python warning')\n"
            "    print('a print to stderr', file=sys.stderr)\n"
            "    os.write(2, b'a C-level write to file descriptor 2\\n')\n"
            "    noisy.warning('a log record')\n"
            "    assert double(2) == 4"), points=1),
        nbs.nbgrader_cell("test", "test_loud", (
            "warnings.warn('this warning reaches stderr: nbgrader scores the cell 0')\n"
            "assert double(2) == 4"), points=1),
        nbs.nbgrader_cell("test", "test_forbid", (
            "with grading.checked(seconds=30):\n"
            "    cfg = kvref.ModelConfig(arch='gpt2', n_layers=1, n_heads=2, d_model=32, vocab_size=256, max_seq_len=32)\n"
            "    model = kvref.Transformer(cfg).eval()\n"
            "    ids = torch.tensor([[1, 2, 3]])\n"
            "    def student():\n"
            "        return generate(model, ids, max_new_tokens=2, cache=None)\n"
            "    blocked = ''\n"
            "    with grading.forbid('kvref.generate'):\n"
            "        try:\n"
            "            student()\n"
            "        except AssertionError as e:\n"
            "            blocked = str(e)\n"
            "    assert 'your code called kvref.generate' in blocked, blocked\n"
            "    assert tuple(student().tokens.shape) == (1, 5)  # restored afterwards"), points=1),
        nbs.nbgrader_cell("test", "test_time_limit", (
            "def spin():\n"
            "    while True:\n"
            "        pass\n"
            "interrupted = False\n"
            "try:\n"
            "    with grading.checked(seconds=1):\n"
            "        spin()\n"
            "except grading.GradingTimeout:\n"
            "    interrupted = True\n"
            "assert interrupted"), points=1),
    ]
    return nbs.course_notebook(cells)


# -- the one autograding run --------------------------------------------------------------------


@dataclass
class Graded:
    course: Course
    fresh: dict  # stem -> release as `make release` writes it
    base: dict  # stem -> the notebook students get (committed if present, else fresh)
    setup_errors: dict = field(default_factory=dict)  # (stem, student) -> why it was not submitted
    generate_errors: dict = field(default_factory=dict)  # stem -> why nbgrader could not release it
    scores: dict = field(default_factory=dict)  # stem -> {student: Score}, read once from the gradebooks
    durations: dict = field(default_factory=dict)  # (stem, student) -> seconds of autograde (estimated)
    seconds: float = 0.0
    submissions: int = 0


@dataclass
class InProcess:
    verdicts: dict = field(default_factory=dict)  # stem -> {student: first failing test cell, or None}
    errors: dict = field(default_factory=dict)  # stem -> why the in-process grading of it failed
    setup_errors: dict = field(default_factory=dict)  # (stem, student) -> why the answer does not apply


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Graded:
    if not STEMS:
        pytest.fail(f"no solutions/NN_topic.ipynb in {SOLUTIONS}: nothing to grade")
    tmp = tmp_path_factory.mktemp("pipeline")
    selftest_path = tmp / f"{SELFTEST}.ipynb"
    nbformat.write(selftest_notebook(), str(selftest_path))
    sources = {stem: SOLUTIONS / f"{stem}.ipynb" for stem in STEMS}
    course = Course(tmp / "course", {**sources, SELFTEST: selftest_path})
    t0 = time.perf_counter()
    result = Graded(course, {}, {})
    for stem in STEMS:  # one chapter that nbgrader rejects must not hide the others' results
        try:
            result.fresh.update(build_releases(course, {stem: sources[stem]}))
        except Exception as e:
            result.generate_errors[stem] = f"nbgrader generate_assignment failed for solutions/{stem}.ipynb:\n{e}"
    selftest_release = course.generate(SELFTEST)
    t_generate = time.perf_counter() - t0
    course.submit(SELFTEST, "solution", nbs.fill_answers(selftest_release, nbs.read(selftest_path)))
    for stem in result.fresh:
        committed = NOTEBOOKS / f"{stem}.ipynb"
        base = nbs.read(committed) if committed.is_file() else result.fresh[stem]
        result.base[stem] = base
        solved = nbs.fill_answers(base, nbs.read(sources[stem]))
        course.submit(stem, "solution", solved)
        course.submit(stem, "released", base)
        for kind, answers in (("wrong", WRONG[stem]), ("right", RIGHT[stem])):
            for name in through_nbgrader(stem, kind):
                try:
                    course.submit(stem, student_id(name, kind), nbs.apply_wrong(solved, answers[name], name))
                except ValueError as e:
                    result.setup_errors[(stem, student_id(name, kind))] = str(e)
    result.submissions = sum(len(course.submitted_students(s)) for s in course.stems)
    t0 = time.perf_counter()
    course.autograde_all(workers=WORKERS)
    result.seconds = time.perf_counter() - t0
    result.scores = {stem: course.scores(stem) for stem in course.stems}
    result.durations = course.durations()
    lines = [f"[pipeline] generate_assignment x{len(course.stems)}: {t_generate:.0f} s; autograde of "
             f"{result.submissions} submissions by {WORKERS} worker(s): {result.seconds:.0f} s"]
    for stem in course.stems:
        times = [t for (s, _), t in result.durations.items() if s == stem]
        if times:
            lines.append(f"  {stem}: {len(times)} submissions, {sum(times) / len(times):.1f} s each on average, "
                         f"solution {result.durations.get((stem, 'solution'), float('nan')):.1f} s")
    print("\n" + "\n".join(lines))
    return result


def through_nbgrader(stem: str, kind: str = "wrong") -> list[str]:
    """The wrong answers (kind "wrong") or correct alternatives ("right") of ``stem`` that nbgrader grades as
    well as the in-process grader."""
    answers = WRONG[stem] if kind == "wrong" else RIGHT[stem]
    return list(answers)[:NBGRADER_ANSWERS] if isinstance(answers, dict) else []


@pytest.fixture(scope="module")
def inprocess() -> InProcess:
    """Every wrong answer and the correct alternatives that nbgrader does not grade, graded in-process against
    the instructor source (hidden tests included, as nbgrader grades): {student id: the first failing test cell,
    or None}. A fixture of its own, apart from `graded`: under `make test` it is an xdist group of its own
    (tests/conftest.py), which the first worker to finish its first group takes."""
    result = InProcess()
    t0 = time.perf_counter()
    for stem in STEMS:
        source = nbs.read(SOLUTIONS / f"{stem}.ipynb")
        variants = {}
        for kind, answers in (("wrong", WRONG[stem]), ("right", RIGHT[stem])):
            if not isinstance(answers, dict):
                continue
            if kind == "right":  # a right answer runs every test: once, by one grader, is enough
                by_nbgrader = set(through_nbgrader(stem, "right"))
                answers = {n: a for n, a in answers.items() if n not in by_nbgrader}
            label = "wrong answer" if kind == "wrong" else "correct alternative"
            found, errors = answer_variants(source, answers, label)
            variants |= {student_id(name, kind): v for name, v in found.items()}
            result.setup_errors |= {(stem, student_id(name, kind)): e for name, e in errors.items()}
        try:
            result.verdicts[stem] = grade_variants(source, variants, timeout=cell_timeout(), say=lambda _: None)
        except Exception as e:  # reported by the tests of this chapter; the other chapters go on
            result.errors[stem] = f"in-process grading of solutions/{stem}.ipynb failed: {e}"
    print(f"\n[pipeline] in-process grading of {sum(map(len, result.verdicts.values()))} answers: "
          f"{time.perf_counter() - t0:.0f} s")
    return result


def in_process(inprocess: InProcess, stem: str, student: str) -> str | None:
    """The in-process verdict: the first test cell the answer fails ("grade_id: why"), or None."""
    assert stem not in inprocess.errors, inprocess.errors[stem]
    error = inprocess.setup_errors.get((stem, student))
    assert error is None, f"tests/{student.split('-')[0]}_answers/{stem}.py: {error}"
    return inprocess.verdicts[stem][student]


def released(graded: Graded, stem: str):
    assert stem not in graded.generate_errors, graded.generate_errors.get(stem)
    return graded.fresh[stem]


def score(graded: Graded, stem: str, student: str):
    released(graded, stem)
    s = graded.scores[stem].get(student)
    assert s is not None, graded.course.explain(stem, student)
    return s


# -- the sources --------------------------------------------------------------------------------


def test_there_are_solutions():
    # Chapters are written against this pipeline; with none, every test below would be vacuous.
    assert STEMS, f"no solutions/NN_topic.ipynb in {SOLUTIONS}"
    odd = [p.name for p in SOLUTIONS.glob("*.ipynb") if not STEM_RE.match(p.stem)]
    assert not odd, f"solutions/ notebooks must be named NN_topic.ipynb: {odd}"


@pytest.mark.parametrize("stem", STEMS)
def test_source_is_well_formed(stem):
    # Points on every graded cell, unique grade ids, locked tests, balanced markers, no outputs,
    # and grading.checked limits below the kernel's per-cell timeout.
    problems = nbs.lint(nbs.read(SOLUTIONS / f"{stem}.ipynb"), cell_timeout())
    assert not problems, f"solutions/{stem}.ipynb:\n  " + "\n  ".join(problems)


def test_cell_timeout_is_explicit():
    # nbgrader's default (30 s) is below the limits the notebooks use; the config must set it.
    text = (ROOT / "autograder" / "shared" / "nbgrader_config.py").read_text()
    assert re.search(r"^c\.Execute\.timeout = \d+", text, re.M)
    assert cell_timeout() >= 120


# -- the release --------------------------------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_release_is_up_to_date(graded, stem):
    path = NOTEBOOKS / f"{stem}.ipynb"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run `make release`"
    committed, fresh = nbs.read(path), released(graded, stem)
    assert nbs.normalized(committed) == nbs.normalized(fresh), (
        f"{path.relative_to(ROOT)} is not what `make release` generates from solutions/{stem}.ipynb "
        f"({nbs.describe_difference(fresh, committed)}): run `make release`")


def test_no_stale_release():
    stale = [p.name for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in solution_files(SOLUTIONS)]
    assert not stale, f"notebooks/ without a source in solutions/ (run `make release`): {stale}"


def searchable_text(path: Path) -> str | None:
    """A file's text as a reader sees it, whitespace collapsed: notebooks with their JSON
    escapes undone, HTML with tags stripped and entities decoded (syntax highlighting splits a
    line into many <span>s). None for binary files."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    if path.suffix == ".ipynb":
        try:
            strings = []

            def walk(x):
                if isinstance(x, str):
                    strings.append(x)
                elif isinstance(x, dict):
                    for v in x.values():
                        walk(v)
                elif isinstance(x, list):
                    strings.append("".join(x) if all(isinstance(v, str) for v in x) else "")
                    for v in x:
                        if not isinstance(v, str):
                            walk(v)

            walk(json.loads(raw))
            raw = "\n".join(strings)
        except json.JSONDecodeError:
            pass
    elif path.suffix in (".html", ".htm", ".xml", ".svg"):
        raw = html.unescape(re.sub(r"<[^>]*>", "", raw))
    return nbs.squash(raw)


def auto_points(stem: str) -> float:
    """The points the autograder can give: all but the free-text answers, which wait for a person."""
    return nbs.auto_points(nbs.read(SOLUTIONS / f"{stem}.ipynb"))


def texts_under(folder: Path) -> list[tuple[Path, str]]:
    """(path, searchable_text) of every text file under ``folder``."""
    found = ((p, searchable_text(p)) for p in sorted(p for p in folder.rglob("*") if p.is_file()))
    return [(p, t) for p, t in found if t is not None]


# The built book does not change once built: its thousands of files (MathJax's among them) are read once, not once
# per chapter.
book_texts = functools.cache(texts_under)


def leaks(stem: str, folder: Path, texts: list[tuple[Path, str]] | None = None) -> list[str]:
    needles = nbs.secret_needles(nbs.read(SOLUTIONS / f"{stem}.ipynb"))
    found = []
    for path, text in texts_under(folder) if texts is None else texts:
        for needle in needles:
            if needle in text:
                found.append(f"{path.relative_to(folder)}: {needle!r}")
    return found


@pytest.mark.parametrize("stem", STEMS)
def test_no_secret_in_notebooks(stem):
    # Solution and hidden-test lines of at least MIN_SECRET_CHARS characters that are not shown
    # to students anyway elsewhere in the same notebook (see autograder/shared/notebooks.py).
    found = leaks(stem, NOTEBOOKS)
    assert not found, f"solution or hidden-test lines of {stem} in notebooks/:\n  " + "\n  ".join(found[:20])


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_no_secret_in_book(built_book, stem):
    assert built_book.returncode == 0, f"book build failed:\n{built_book.log[-6000:]}"
    found = leaks(stem, built_book.html, book_texts(built_book.html))
    assert not found, f"solution or hidden-test lines of {stem} in the built book:\n  " + "\n  ".join(found[:20])


# -- grading ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_solution_gets_full_marks(graded, stem):
    s = score(graded, stem, "solution")
    expected = nbs.max_points(nbs.read(SOLUTIONS / f"{stem}.ipynb"))
    assert s.max_score == expected > 0, f"max score {s.max_score}, points in the source {expected}"
    auto = auto_points(stem)  # free-text answers wait for a person
    assert s.score == auto, f"the solution scored {s.score:g}/{auto:g}:\n" + graded.course.explain(stem, "solution")
    # Top to bottom: no cell of the solution raises, graded or not.
    nb = nbs.read(graded.course.autograded_path(stem, "solution"))
    errors = [(i, o.ename, o.evalue) for i, c in enumerate(nb.cells) for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors, f"cells raising with the solution: {errors}"


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_release_gets_zero(graded, stem):
    s = score(graded, stem, "released")
    assert s.score == 0, f"the untouched release scored {s.score:g}/{s.max_score:g}:\n" + graded.course.explain(stem, "released")


@pytest.mark.parametrize("stem", STEMS)
def test_enough_wrong_answers(stem):
    wrong = WRONG[stem]
    assert isinstance(wrong, dict), wrong
    assert len(wrong) >= MIN_WRONG, f"tests/wrong_answers/{stem}.py has {len(wrong)} wrong answers; at least {MIN_WRONG}"


@pytest.mark.slow
@pytest.mark.parametrize("stem,name", WRONG_CASES, ids=[f"{s}-{n}" for s, n in WRONG_CASES])
def test_wrong_answer_loses_points(inprocess, stem, name):
    failed = in_process(inprocess, stem, student_id(name))
    assert failed is not None, f"wrong answer {name!r} passes every test (graded in-process): no test catches it"


NBGRADER_WRONG_CASES = [(stem, name) for stem in STEMS for name in through_nbgrader(stem)]


@pytest.mark.slow
@pytest.mark.parametrize("stem,name", NBGRADER_WRONG_CASES, ids=[f"{s}-{n}" for s, n in NBGRADER_WRONG_CASES])
def test_wrong_answer_loses_points_through_nbgrader(graded, stem, name):
    # The in-process verdict (above) again, from nbgrader in a kernel.
    error = graded.setup_errors.get((stem, student_id(name)))
    assert error is None, f"tests/wrong_answers/{stem}.py: {error}"
    s = score(graded, stem, student_id(name))
    auto = auto_points(stem)  # a free-text answer is never auto-graded
    assert s.score < auto, f"wrong answer {name!r} got full marks ({s.score:g}) from nbgrader"


@pytest.mark.parametrize("stem", STEMS)
def test_enough_right_answers(stem):
    right = RIGHT[stem]
    assert isinstance(right, dict), right
    assert len(right) >= MIN_RIGHT, f"tests/right_answers/{stem}.py has {len(right)} correct alternatives; at least {MIN_RIGHT}"


# A correct answer written differently from the solution (loops, einsum, another order) keeps every point: the
# first of each chapter through nbgrader, the others in-process (every test passes, none writes to stderr).
NBGRADER_RIGHT_CASES = [(stem, name) for stem, name in RIGHT_CASES if name in through_nbgrader(stem, "right")]
INPROCESS_RIGHT_CASES = [case for case in RIGHT_CASES if case not in NBGRADER_RIGHT_CASES]


@pytest.mark.slow
@pytest.mark.parametrize("stem,name", NBGRADER_RIGHT_CASES, ids=[f"{s}-{n}" for s, n in NBGRADER_RIGHT_CASES])
def test_right_answer_gets_full_marks_through_nbgrader(graded, stem, name):
    error = graded.setup_errors.get((stem, student_id(name, "right")))
    assert error is None, f"tests/right_answers/{stem}.py: {error}"
    s = score(graded, stem, student_id(name, "right"))
    auto = auto_points(stem)  # a free-text answer waits for a person
    assert s.score == auto, (f"correct alternative {name!r} scored {s.score:g} of the {auto:g} automatic "
                             f"points:\n" + graded.course.explain(stem, student_id(name, "right")))


@pytest.mark.slow
@pytest.mark.parametrize("stem,name", INPROCESS_RIGHT_CASES, ids=[f"{s}-{n}" for s, n in INPROCESS_RIGHT_CASES])
def test_right_answer_gets_full_marks(inprocess, stem, name):
    failed = in_process(inprocess, stem, student_id(name, "right"))
    assert failed is None, f"correct alternative {name!r} fails {failed} (graded in-process)"


@pytest.mark.slow
def test_selftest_stderr_rule_forbid_and_time_limit(graded):
    cells = graded.course.cell_scores(SELFTEST, "solution")
    got = {gid: s.score for gid, s in cells.items()}
    # Noise inside grading.checked keeps the point; the same warning outside it costs the point
    # (this is nbgrader's rule the helpers exist for); forbid and the time limit work in a kernel.
    assert got == {"test_quiet": 1, "test_loud": 0, "test_forbid": 1, "test_time_limit": 1}, (
        f"{got}\n{graded.course.explain(SELFTEST, 'solution')}")


# -- make grade ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_make_grade(graded, tmp_path):
    # The chapter whose solution graded fastest above: this checks the command, not the chapter.
    candidates = [s for s in graded.fresh if (NOTEBOOKS / f"{s}.ipynb").is_file()]
    assert candidates, "no chapter has a committed release: run `make release`"
    stem = min(candidates, key=lambda s: graded.durations.get((s, "solution"), float("inf")))
    subs, out = tmp_path / "submissions", tmp_path / "out"
    (subs / "alice").mkdir(parents=True)
    (subs / "bob").mkdir()
    shutil.copyfile(SOLUTIONS / f"{stem}.ipynb", subs / "alice" / f"{stem}.ipynb")  # the instructor source as is
    shutil.copyfile(NOTEBOOKS / f"{stem}.ipynb", subs / "bob" / f"{stem}.ipynb")  # the release, untouched
    make = shutil.which("make")
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    # `-o .venv/.installed` and PY=...: use the environment running this test, never (re)create .venv.
    cmd = [make, "-C", str(ROOT), "--no-print-directory", "-o", ".venv/.installed", "grade",
           f"SUBMISSIONS={subs}", f"OUT={out}", f"PY={sys.executable}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"make grade failed:\n{(proc.stdout + proc.stderr)[-6000:]}"

    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student", "notebook", "score", "max_score", "status", "reason", "late"]
    points = nbs.max_points(nbs.read(SOLUTIONS / f"{stem}.ipynb"))
    got = {(r["student"], r["notebook"]): (float(r["score"]), float(r["max_score"])) for r in rows}
    auto = auto_points(stem)  # free-text answers wait for review
    assert got == {("alice", stem): (auto, points), ("bob", stem): (0.0, points)}, proc.stderr[-3000:]
    for student in ("alice", "bob"):
        page = out / "feedback" / student / f"{stem}.html"
        assert page.is_file() and page.stat().st_size > 0, f"missing {page}"


def test_explain_quotes_nbgraders_log_for_an_ungraded_submission(tmp_path):
    # A submission nbgrader could not process has no autograded notebook: the failure message must carry what
    # nbgrader's log of that batch says about it (from its start to the next submission's), not a bare "missing".
    course = Course(tmp_path / "course")
    course._results = {"ps": [{"log": "[AutogradeApp | INFO] Autograding submitted/alice/ps\n"
                                      "[AutogradeApp | ERROR] There was an error processing: kernel died\n"
                                      "[AutogradeApp | INFO] Autograding submitted/bob/ps\nbob was fine\n"}]}
    text = course.explain("ps", "alice")
    assert "no autograded notebook" in text and "kernel died" in text and "bob was fine" not in text
    assert "does not name it" in course.explain("ps", "carol")
