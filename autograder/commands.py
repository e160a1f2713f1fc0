"""The two instructor commands: ``release`` (solutions/ -> notebooks/) and ``grade``."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import notebooks
from .course import ROOT, Course, cell_timeout

SOLUTIONS = ROOT / "solutions"
NOTEBOOKS = ROOT / "notebooks"
STEM_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+$")  # NN_topic
STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")  # becomes a path and a CSV cell

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def solution_files(solutions: Path = SOLUTIONS) -> dict[str, Path]:
    """{stem: path} for solutions/NN_topic.ipynb."""
    return {p.stem: p for p in sorted(Path(solutions).glob("*.ipynb")) if STEM_RE.match(p.stem)}


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


@dataclass
class Row:
    student: str
    notebook: str
    score: float
    max_score: float


def find_submissions(submissions: Path, stems: set[str], say: Say = _stderr) -> dict[str, dict[str, Path]]:
    """{stem: {student: path}} from ``submissions``/<student>/<stem>.ipynb; anything else is
    reported and skipped."""
    found: dict[str, dict[str, Path]] = {}
    for folder in sorted(Path(submissions).iterdir()):
        if folder.name.startswith("."):
            continue
        if not folder.is_dir():
            say(f"skipped {folder}: expected one folder per student")
            continue
        if not STUDENT_RE.match(folder.name):
            say(f"skipped {folder}: a student id is letters, digits and _ . @ - (starting with a letter or digit)")
            continue
        for path in sorted(folder.iterdir()):
            if path.name.startswith("."):
                continue
            if path.suffix == ".ipynb" and path.stem in stems and path.is_file():
                found.setdefault(path.stem, {})[folder.name] = path
            else:
                say(f"skipped {path}: not one of the course notebooks ({', '.join(sorted(stems))})")
    return found


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "score", "max_score"])
        for r in sorted(rows, key=lambda r: (r.student, r.notebook)):
            w.writerow([r.student, r.notebook, f"{r.score:g}", f"{r.max_score:g}"])


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def grade(submissions: Path, out: Path, solutions: Path = SOLUTIONS, workers: int | None = None,
          say: Say = _stderr) -> int:
    """Autograde ``submissions``/<student>/<NN_topic>.ipynb against the current solutions.

    Writes ``out``/grades.csv (student, notebook, score, max_score: one row per submitted
    notebook) and ``out``/feedback/<student>/<NN_topic>.html. Submissions are graded by
    ``workers`` processes in parallel (default: one per CPU core). A submission nbgrader cannot
    process scores 0, gets no feedback page, and makes the exit status 1.
    """
    sources = solution_files(solutions)
    if not sources:
        say(f"error: no NN_topic.ipynb notebooks in {solutions}")
        return 2
    submissions, out = Path(submissions), Path(out)
    if not submissions.is_dir():
        say(f"error: {submissions} is not a folder of <student>/<NN_topic>.ipynb")
        return 2
    found = find_submissions(submissions, set(sources), say)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "feedback", ignore_errors=True)
    rows: list[Row] = []
    failed: list[str] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvcourse-grade-") as tmp:
        course = Course(tmp, {stem: sources[stem] for stem in found})
        for stem in sorted(found):
            course.generate(stem)
            for student, path in found[stem].items():
                course.submit(stem, student, path)
        results = course.autograde_all(workers=workers or default_workers(), feedback=True)
        for stem in sorted(found):
            scores = course.scores(stem)
            max_score = notebooks.max_points(notebooks.read(sources[stem]))
            for student in sorted(found[stem]):
                s = scores.get(student)
                if s is None:
                    failed.append(f"{student}/{stem}.ipynb")
                    rows.append(Row(student, stem, 0.0, max_score))
                    continue
                rows.append(Row(student, stem, s.score, s.max_score))
                page = course.feedback_path(stem, student)
                if page.is_file():
                    dest = out / "feedback" / student / f"{stem}.html"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(page, dest)
            if any(f.endswith(f"/{stem}.ipynb") for f in failed):
                for r in results.get(stem, []):
                    if not r.get("success"):
                        say(f"nbgrader's log for {stem}:\n{r.get('log', '')[-4000:]}")
    write_csv(rows, out / "grades.csv")
    n = sum(len(v) for v in found.values())
    say(f"graded {n} submission(s) in {time.perf_counter() - t0:.0f} s; wrote {out / 'grades.csv'}")
    if failed:
        say(f"could not grade (scored 0): {', '.join(failed)}")
        return 1
    return 0
