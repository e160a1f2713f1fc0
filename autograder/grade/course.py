"""A throwaway nbgrader course directory, driven through nbgrader's Python API.

Each chapter is its own assignment, named after the notebook's stem, holding one notebook of the
same name. Everything lives under ``root`` (a temp dir; never the repository):

    root/source/03_memory/03_memory.ipynb                 the instructor source (from solutions/)
    root/release/03_memory/03_memory.ipynb                the student version (generate_assignment)
    root/submitted/<student>/03_memory/03_memory.ipynb    what a student handed in
    root/autograded/<student>/03_memory/03_memory.ipynb   executed and scored
    root/feedback/<student>/03_memory/03_memory.html      feedback page
    root/gradebook.db                                     scores (sqlite)

    course = Course(tmp, {"03_memory": Path("solutions/03_memory.ipynb")})
    released = course.generate("03_memory")
    course.submit("03_memory", "alice", released)
    course.autograde("03_memory")
    course.scores("03_memory")   # {"alice": Score(0.0, 7.0)}

nbgrader shells out to ``alembic`` and starts ``python3`` kernels: while the API runs, the
directory of the running interpreter (the venv's bin/) comes first on PATH and the repository
root on PYTHONPATH, so kernels import this checkout's ``kvref``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import nbformat
from nbformat import NotebookNode
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from autograder.shared import notebooks, warm
from autograder.shared.warm import kernel_environment  # noqa: F401  (the kernels' environment, imported from here)

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILE = Path(__file__).resolve().parents[1] / "shared" / "nbgrader_config.py"
SOLUTIONS = ROOT / "solutions"  # the instructor sources
NOTEBOOKS = ROOT / "notebooks"  # the student notebooks made from them (``release``)
STEM_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+$")  # NN_topic


def solution_files(solutions: Path = SOLUTIONS) -> dict[str, Path]:
    """{stem: path} for solutions/NN_topic.ipynb."""
    return {p.stem: p for p in sorted(Path(solutions).glob("*.ipynb")) if STEM_RE.match(p.stem)}


def load_config() -> Config:
    """The settings in autograder/shared/nbgrader_config.py."""
    return PyFileConfigLoader(CONFIG_FILE.name, path=str(CONFIG_FILE.parent)).load_config()


def cell_timeout() -> float:
    return float(load_config().Execute.timeout)


def quiet_nbgrader() -> None:
    """nbgrader 0.9 trips SQLAlchemy's autoflush warnings (SAWarning) on every autograde: its
    own internals, nothing to act on."""
    import warnings

    from sqlalchemy.exc import SAWarning

    warnings.filterwarnings("ignore", category=SAWarning)


class NbgraderError(RuntimeError):
    """An nbgrader step failed; the message carries nbgrader's log."""


@dataclass(frozen=True)
class Score:
    score: float
    max_score: float


class Course:
    def __init__(self, root: str | Path, sources: Mapping[str, str | Path] | None = None,
                 log: logging.Logger | None = None, overrides: Config | None = None):
        """``sources``: {stem: path of the instructor notebook}, copied into ``root``/source;
        None opens a course directory that already exists (a clone made by ``autograde_all``).
        ``overrides``: nbgrader settings on top of nbgrader_config.py (the batch grader's limits)."""
        from nbgrader.apps import NbGraderAPI  # slow import; only when a course is built

        from autograder.grade.quick import QuickKernelClient, alembic_head_in_process

        quiet_nbgrader()
        alembic_head_in_process()  # each new gradebook: no `alembic heads` subprocess

        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        for stem, path in (sources or {}).items():
            dest = self.source_path(stem)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        self.stems = sorted(p.name for p in (self.root / "source").iterdir()) if (self.root / "source").is_dir() else []
        self._clone_of: dict[tuple[str, str], Path] = {}  # (stem, student) -> course dir that graded it
        self._results: dict[str, list[dict]] = {}  # the last autograde_all's nbgrader results, for explain

        self.log = log or logging.getLogger("autograder.nbgrader")
        if log is None:
            self.log.propagate = False  # nbgrader's messages are captured per call, shown on failure
            if not self.log.handlers:
                self.log.addHandler(logging.NullHandler())
        self.log.setLevel(logging.INFO)
        config = load_config()
        if overrides is not None:
            config.merge(overrides)
        config.CourseDirectory.root = str(self.root)
        config.CourseDirectory.db_url = f"sqlite:///{self.root / 'gradebook.db'}"
        config.Exchange.root = str(self.root / "exchange")  # never touch /srv/nbgrader/exchange
        config.KernelManager.client_factory = QuickKernelClient  # no idle 0.2 s after each kernel's start
        (self.root / "exchange").mkdir(exist_ok=True)
        self.config = config
        with kernel_environment():
            self.api = NbGraderAPI(config=config, log=self.log)

    # -- paths -----------------------------------------------------------------------------------

    def source_path(self, stem: str) -> Path:
        return self.root / "source" / stem / f"{stem}.ipynb"

    def release_path(self, stem: str) -> Path:
        return self.root / "release" / stem / f"{stem}.ipynb"

    def submitted_path(self, stem: str, student: str) -> Path:
        return self.root / "submitted" / student / stem / f"{stem}.ipynb"

    def _home(self, stem: str, student: str) -> Path:
        return self._clone_of.get((stem, student), self.root)

    def autograded_path(self, stem: str, student: str) -> Path:
        return self._home(stem, student) / "autograded" / student / stem / f"{stem}.ipynb"

    def feedback_path(self, stem: str, student: str) -> Path:
        return self._home(stem, student) / "feedback" / student / stem / f"{stem}.html"

    def _db_url(self, stem: str, student: str) -> str:
        return f"sqlite:///{self._home(stem, student) / 'gradebook.db'}"

    # -- nbgrader steps --------------------------------------------------------------------------

    def _run(self, what: str, call, *args, check: bool = True) -> dict:
        with kernel_environment():
            result = call(*args)
        if check and not result.get("success"):
            raise NbgraderError(f"nbgrader {what} failed:\n{result.get('log', '')}\n{result.get('error', '')}")
        return result

    def generate(self, stem: str) -> NotebookNode:
        """Run generate_assignment (this also records the assignment in the gradebook) and return
        the student version."""
        self._run(f"generate_assignment {stem}", self.api.generate_assignment, stem)
        return notebooks.read(self.release_path(stem))

    def submit(self, stem: str, student: str, notebook: NotebookNode | str | Path) -> Path:
        dest = self.submitted_path(stem, student)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(notebook, NotebookNode):
            dest.write_text(nbformat.writes(notebook), encoding="utf-8")
        else:
            shutil.copyfile(notebook, dest)
        return dest

    def submitted_students(self, stem: str) -> list[str]:
        return sorted(p.parent.parent.name for p in (self.root / "submitted").glob(f"*/{stem}/{stem}.ipynb"))

    def autograde(self, stem: str, student: str = "*") -> dict:
        """Autograde every submission of ``stem`` (or one student's). A submission that nbgrader
        cannot process is skipped (it then has no autograded notebook); nbgrader's result dict,
        with its log, is returned rather than raised, so one bad submission never stops the batch."""
        warm.ensure(("kernel",))  # kernels fork from this process's warm server (grading jobs: the grader's)
        return self._run(f"autograde {stem}", self.api.autograde, stem, student, check=False)

    def generate_feedback(self, stem: str, student: str | None = None) -> dict:
        return self._run(f"generate_feedback {stem}", self.api.generate_feedback, stem, student, check=False)

    def autograde_all(self, workers: int = 1, feedback: bool = False) -> dict[str, list[dict]]:
        """Autograde every submission of every assignment (and write feedback pages if asked).

        With ``workers`` > 1 the submissions are dealt round-robin to that many clones of this
        course (source, release and gradebook copied, so no assignment is generated twice), each
        graded in its own process; the results stay in the clones and every reader of this object
        (``scores``, ``autograded_path``, ...) looks in the right one. Returns nbgrader's result
        dicts per assignment (one per worker that had any of its submissions)."""
        jobs = [(stem, student) for stem in self.stems for student in self.submitted_students(stem)]
        workers = max(1, min(workers, len(jobs)))
        self._started = time.time()
        if workers == 1:
            out = {}
            for stem in self.stems:
                if self.submitted_students(stem):
                    out[stem] = [self.autograde(stem)]
                    if feedback:
                        self.generate_feedback(stem)
            self._results = out
            return out
        shards = [jobs[k::workers] for k in range(workers)]
        clones = [self._clone(k, shard) for k, shard in enumerate(shards)]
        threads = max(1, (os.cpu_count() or 1) // workers)
        ctx = multiprocessing.get_context("spawn")  # never fork a process that has torch loaded
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            futures = [pool.submit(_grade_clone, str(c), feedback, threads) for c in clones]
            results = [f.result() for f in futures]
        out: dict[str, list[dict]] = {}
        for result in results:
            for stem, r in result.items():
                out.setdefault(stem, []).append(r)
        self._results = out
        return out

    def _clone(self, k: int, shard: list[tuple[str, str]]) -> Path:
        clone = self.root / "workers" / str(k)
        shutil.rmtree(clone, ignore_errors=True)
        for part in ("source", "release"):
            shutil.copytree(self.root / part, clone / part)
        shutil.copyfile(self.root / "gradebook.db", clone / "gradebook.db")
        for stem, student in shard:
            dest = clone / "submitted" / student / stem
            dest.mkdir(parents=True)
            shutil.copyfile(self.submitted_path(stem, student), dest / f"{stem}.ipynb")
            self._clone_of[(stem, student)] = clone
        return clone

    # -- results ---------------------------------------------------------------------------------

    def durations(self) -> dict[tuple[str, str], float]:
        """{(stem, student): seconds} for the last ``autograde_all``, estimated from when each
        autograded notebook was written (each worker grades one submission after another; the
        first one of a worker also carries the worker's start-up)."""
        out = {}
        homes = sorted(set(self._clone_of.values())) or [self.root]
        for home in homes:
            prev = getattr(self, "_started", None)
            for path in sorted(home.glob("autograded/*/*/*.ipynb"), key=lambda p: p.stat().st_mtime):
                t = path.stat().st_mtime
                if prev is not None:
                    out[(path.parent.name, path.parent.parent.name)] = t - prev
                prev = t
        return out

    def graded_students(self, stem: str) -> list[str]:
        """Students whose submission of ``stem`` went through autograde."""
        return [s for s in self.submitted_students(stem) if self.autograded_path(stem, s).is_file()]

    def scores(self, stem: str) -> dict[str, Score]:
        """{student: Score} for every submission of ``stem`` that was autograded."""
        out = {}
        for student in self.graded_students(stem):
            nb = self._submission(stem, student)
            if nb is not None:
                out[student] = Score(*nb["total"])
        return out

    def cell_scores(self, stem: str, student: str) -> dict[str, Score]:
        """{grade_id: Score} for one autograded submission."""
        nb = self._submission(stem, student)
        return {} if nb is None else {g: Score(*s) for g, s in nb["cells"].items()}

    def submission_scores(self, stem: str, student: str) -> tuple[Score, dict[str, Score]] | None:
        """(total, {grade_id: Score}) of one autograded submission, read in one gradebook visit;
        None when it was not graded."""
        if not self.autograded_path(stem, student).is_file():
            return None
        nb = self._submission(stem, student)
        return None if nb is None else (Score(*nb["total"]), {g: Score(*s) for g, s in nb["cells"].items()})

    def _submission(self, stem: str, student: str) -> dict | None:
        from nbgrader.api import Gradebook, MissingEntry

        with Gradebook(self._db_url(stem, student)) as gb:
            try:
                nb = gb.find_submission_notebook(stem, stem, student)
            except MissingEntry:
                return None
            return {"total": (float(nb.score), float(nb.max_score)),
                    "cells": {g.name: (float(g.score), float(g.max_score)) for g in nb.grades}}

    def explain(self, stem: str, student: str, limit: int = 1500) -> str:
        """Why a submission lost points: each graded cell below its maximum, with the error or
        stderr output it produced, and any other cell that raised. For test failure messages."""
        path = self.autograded_path(stem, student)
        if not path.is_file():
            return (f"{student}: no autograded notebook (nbgrader could not process the submission)"
                    + self._log_about(stem, student, limit))
        nb = notebooks.read(path)
        lost = {g: s for g, s in self.cell_scores(stem, student).items() if s.score < s.max_score}
        lines = []
        for i, cell in enumerate(nb.cells):
            gid = notebooks.grade_id(cell)
            problems = []
            for out in cell.get("outputs", []):
                if out.output_type == "error":
                    problems.append(f"{out.ename}: {out.evalue}")
                elif out.output_type == "stream" and out.name == "stderr":
                    problems.append(f"stderr: {out.text.strip()}")
            if gid in lost or problems:
                head = f"cell {i} {gid or ''}"
                if gid in lost:
                    head += f" scored {lost[gid].score:g}/{lost[gid].max_score:g}"
                lines.append(head + (": " + " | ".join(problems) if problems else ""))
        text = "\n".join(lines) or "no cell lost points"
        return text if len(text) <= limit else text[:limit] + " ..."

    def _log_about(self, stem: str, student: str, limit: int) -> str:
        """What nbgrader's log of the last ``autograde_all`` says about one submission (the lines from where
        its grading starts to where the next one starts), for ``explain``."""
        found = []
        for result in self._results.get(stem, []):
            lines = f"{result.get('log') or ''}\n{result.get('error') or ''}".splitlines()
            starts = [i for i, line in enumerate(lines) if student in line]
            if starts:
                nxt = [i for i, line in enumerate(lines) if i > starts[0] and "Autograding" in line and student not in line]
                found += lines[starts[0]:nxt[0] if nxt else len(lines)]
        text = "\n".join(found)
        if not text:
            return "; nbgrader's log does not name it"
        return ":\n" + (text if len(text) <= limit else "... " + text[-limit:])


def _grade_clone(root: str, feedback: bool, threads: int) -> dict[str, dict]:
    """Worker process: autograde everything submitted in one clone (see ``Course.autograde_all``)."""
    from autograder.grade.quick import shared_engines

    quiet_nbgrader()
    shared_engines()  # this worker's gradebook opens share one engine
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)  # for the kernels: share the cores
    course = Course(root)
    out = {}
    try:
        for stem in course.stems:
            if course.submitted_students(stem):
                out[stem] = course.autograde(stem)
                if feedback:
                    course.generate_feedback(stem)
    finally:
        warm.stop()  # this worker's kernel server (a pool worker exits without atexit)
    return out
