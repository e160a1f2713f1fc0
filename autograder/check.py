"""The student's self-check: run one notebook as the grader does, visible tests only.

    python -m autograder check notebooks/03_memory.ipynb      # or: make check NB=03_memory

The notebook goes through the grader's own steps (preflight, a private nbgrader course, the kernel
in the same sandbox with the same limits) with the student edition's notebook as the "instructor
source", so only the visible tests run. Every graded cell is printed with pass/fail, its points
and its full message; the exit status is 1 when any visible test fails.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from autograder.shared import notebooks, warm
from autograder.grade.grading import Settings, _grade_one, isolation_status
from autograder.grade.course import STEM_RE, Course, cell_timeout
from autograder.record.results import Say


def _print(msg: str) -> None:
    print(msg, flush=True)


def check(path: Path, release: Path | None = None, settings=None, say: Say = _print) -> int:
    """Grade ``path`` against the visible tests of ``release`` (default: the file itself, whose
    locked cells are then taken as they are). Returns 0 when every visible test passes, 1 when
    one fails or the notebook could not be run, 2 on a usage error."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".ipynb":
        say(f"error: {path} is not a notebook file (.ipynb)")
        return 2
    stem = path.stem
    if not STEM_RE.match(stem):
        say(f"error: {path.name}: the notebook's name must stay NN_topic.ipynb (as released), got {stem!r}")
        return 2
    pristine = Path(release) if release else path
    settings = settings or Settings()
    if not settings.cell_timeout:
        settings.cell_timeout = cell_timeout()
    warm.start()  # the warm servers import torch and nbgrader while the course is set up
    work = Path(tempfile.mkdtemp(prefix="kvcheck-"))
    try:
        base = work / "course"
        source = work / f"{stem}.ipynb"
        shutil.copyfile(pristine, source)
        course = Course(base, {stem: source})
        visible = course.generate(stem)
        settings.isolate, isolation = isolation_status(settings, [str(work / "course" / "gradebook.db")])
        warm.ensure()
        say(f"checking {path} (visible tests only; isolation: {isolation}; kernel: {warm.status().split(' (')[0]})")
        row = _grade_one("you", stem, path.resolve(), "", visible, notebooks.read(source), base, work,
                         work / "feedback", settings, notebooks.max_points(visible), max(1, os.cpu_count() or 1))
    finally:
        if not os.environ.get("KVREF_KEEP_WORK"):
            shutil.rmtree(work, ignore_errors=True)
    if row.status not in ("ok", "needs_review"):
        say(f"FAILED to run: {row.status}: {row.reason}")
        return 1
    failed = 0
    for t in row.tests:
        if t.get("manual"):
            say(f"[----] {t['name']} ({t['max_score']:g} points): free text, graded by a person ({t['output']})")
            continue
        ok = t["score"] >= t["max_score"]
        failed += not ok
        say(f"[{'pass' if ok else 'FAIL'}] {t['name']} ({t['score']:g}/{t['max_score']:g})")
        if not ok:
            for line in (t["output"] or "no output; see the notebook").splitlines():
                say(f"       {line}")
    if row.reason and "lost:" not in row.reason:
        say(f"note: {row.reason}")
    if row.stretch:
        say(f"stretch (optional, no points): {row.stretch}")
    auto = [t for t in row.tests if not t.get("manual")]
    say(f"{len(auto) - failed}/{len(auto)} visible tests pass"
        + ("; hidden tests run only at grading" if auto else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(check(Path(sys.argv[1])))
