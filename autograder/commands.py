"""The two instructor commands: ``release`` (solutions/ -> notebooks/) and ``grade``."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from autograder.shared import notebooks
from autograder.batch import grade_batch
from autograder.grade.grading import Settings
from autograder.check import check
from autograder.grade.course import NOTEBOOKS, ROOT, SOLUTIONS, STEM_RE, Course, cell_timeout, solution_files  # noqa: F401
from autograder.export.gradebook import feedback_zip
from autograder.gradescope import build as build_gradescope, run as run_gradescope
from autograder.record.results import Say, _stderr
from autograder.record.review import review
from autograder.student import build_edition


def stable_ids(released: notebooks.NotebookNode, source_path: Path, stem: str) -> None:
    """Cell ids in the release: the source's own where it has them (nbgrader keeps them), else
    derived from the stem and position, so regenerating never changes a committed file."""
    if (released.nbformat, released.nbformat_minor) < (4, 5):
        return  # cell ids exist from nbformat 4.5 on
    raw = json.loads(Path(source_path).read_text(encoding="utf-8"))
    if all("id" in c for c in raw.get("cells", [])):
        return
    for i, cell in enumerate(released.cells):
        cell.id = hashlib.sha1(f"{stem}:{i}".encode()).hexdigest()[:8]


def build_releases(course: Course, sources: dict[str, Path]) -> dict[str, notebooks.NotebookNode]:
    """{stem: student notebook}, exactly as ``release`` writes them."""
    out = {}
    for stem in sorted(sources):
        nb = course.generate(stem)
        for cell in nb.cells:  # generate_assignment clears outputs; make sure, the files are committed
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        stable_ids(nb, sources[stem], stem)
        out[stem] = nb
    return out


def release(solutions: Path = SOLUTIONS, dest: Path = NOTEBOOKS, check: bool = False, say: Say = _stderr) -> int:
    """Regenerate ``dest``/NN_topic.ipynb from ``solutions``/NN_topic.ipynb (stale ones removed).
    With ``check``, write nothing and return 1 if ``dest`` is out of date. Returns an exit status."""
    sources = solution_files(solutions)
    if not sources:
        say(f"error: no NN_topic.ipynb notebooks in {solutions}")
        return 1
    limit = cell_timeout()
    for stem, path in sources.items():
        for problem in notebooks.lint(notebooks.read(path), limit):
            say(f"warning: {path.name}: {problem}")
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="kvcourse-release-") as tmp:
        releases = build_releases(Course(tmp, sources), sources)
    stale = sorted(p for p in dest.glob("*.ipynb") if p.stem not in releases)
    status = 0
    if check:
        for stem, nb in releases.items():
            path = dest / f"{stem}.ipynb"
            if not path.is_file():
                say(f"{path} is missing")
                status = 1
            elif notebooks.normalized(notebooks.read(path)) != notebooks.normalized(nb):
                say(f"{path} differs from its source: "
                    f"{notebooks.describe_difference(nb, notebooks.read(path))}")
                status = 1
        for path in stale:
            say(f"{path} has no source in {solutions}")
            status = 1
        if status:
            say("run `make release` and commit notebooks/")
        return status
    dest.mkdir(parents=True, exist_ok=True)
    for stem, nb in releases.items():
        notebooks.write(nb, dest / f"{stem}.ipynb")
        say(f"wrote {dest / f'{stem}.ipynb'}")
    for path in stale:
        path.unlink()
        say(f"removed {path} (no source in {solutions})")
    return status


# -- grading ------------------------------------------------------------------------------------
# The batch grader lives in batch.py (sandboxed jobs, cache, shards), with intake.py (submissions,
# preflight), feedback.py (the student's page) and results.py (grades.csv, merge).


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def grade(submissions: Path, out: Path, solutions: Path = SOLUTIONS, workers: int | None = None,
          say: Say = _stderr, **options) -> int:
    """Autograde ``submissions``/<student>/<NN_topic>.ipynb (a folder or a .zip) against the
    current solutions into ``out``/grades.csv (student, notebook, score, max_score, status,
    reason) and ``out``/feedback/<student>/<NN_topic>.html. ``options``: settings (a
    ``batch.Settings``), shard ("K/N"), force, notebook_names; see ``batch.grade_batch``.
    Returns 0 when every submission has its row; 1 when ``out`` cannot be written, nothing was
    graded, every row is an error or the canary failed; 2 on a usage error."""
    return grade_batch(submissions, out, solutions, workers=default_workers() if workers is None else workers,
                       say=say, **options)


# -- the course round trip: review, feedback-zip, check, gradescope, student -------------------------


def add_course_commands(sub) -> None:
    """The subcommands around ``grade`` (see the README's instructor section)."""
    r = sub.add_parser("review", help="free-text answers: one HTML page per question + OUT/review/review.csv")
    r.add_argument("out", type=Path)
    r.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    z = sub.add_parser("feedback-zip", help="pack OUT/feedback into one zip (a folder per student) for the LMS")
    z.add_argument("out", type=Path)
    z.add_argument("-o", "--output", type=Path, default=None, help="default OUT/feedback.zip")
    c = sub.add_parser("check", help="a student's self-check: run a notebook as the grader does, visible tests only")
    c.add_argument("notebook", type=Path)
    c.add_argument("--release", type=Path, default=None,
                   help="the untouched released notebook whose tests to run (default: the file's own)")
    c.add_argument("--no-sandbox", action="store_true", help="run the kernel with resource limits only")
    gs = sub.add_parser("gradescope", help="build a Gradescope autograder zip for one notebook")
    gs.add_argument("stem", help="NN_topic")
    gs.add_argument("-o", "--output", type=Path, required=True)
    gs.add_argument("--solutions", type=Path, default=SOLUTIONS, help=f"instructor sources (default {SOLUTIONS})")
    run = sub.add_parser("gradescope-run", help="(inside Gradescope) grade ROOT/submission into ROOT/results")
    run.add_argument("--root", type=Path, default=Path(os.environ.get("AUTOGRADER_ROOT", "/autograder")))
    s = sub.add_parser("student", help="the student edition: _build/student/ and _build/student.zip")
    s.add_argument("--dest", type=Path, default=ROOT / "_build" / "student")


def _review(args) -> int:
    return review(args.out, args.solutions)


def _feedback_zip(args) -> int:
    return feedback_zip(args.out, args.output)


def _check(args) -> int:
    return check(args.notebook, args.release, Settings(isolate=not args.no_sandbox))


def _gradescope(args) -> int:
    return build_gradescope(args.stem, args.output, args.solutions)


def _gradescope_run(args) -> int:
    return run_gradescope(args.root)


def _student(args) -> int:
    return build_edition(args.dest)


COURSE_COMMANDS = {"review": _review, "feedback-zip": _feedback_zip, "check": _check, "gradescope": _gradescope,
                   "gradescope-run": _gradescope_run, "student": _student}
