"""The grade stage: one submission through a sandboxed nbgrader job, and the canary.

``_grade_one`` takes a submission that intake found (``intake.preflight`` repairs it first), makes
a private nbgrader course directory for it (``_job_course``), runs ``python -m autograder.grade.job`` in
a child process with a wall-clock limit (``run_job``), copies the feedback page out and returns the
``Row``. ``Settings`` are the limits of every job; ``isolation_status`` says whether the kernels
will run in the sandbox; ``canary_hint`` names the setting to blame when the instructor's own
solution loses points.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

from autograder.shared import sandbox, warm
from autograder.intake.intake import Invalid, preflight
from autograder.shared.rows import Row, Say


@dataclasses.dataclass
class Settings:
    cell_timeout: float = 0.0  # 0: from nbgrader_config.py
    notebook_timeout: float = 600.0
    memory_mb: int = 4096
    isolate: bool = True  # False: resource limits only

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


# -- one job ---------------------------------------------------------------------------------------


def _job_course(jobdir: Path, base: Path, stem: str, student: str, nb: nbformat.NotebookNode) -> Path:
    course = jobdir / "course"
    shutil.rmtree(course, ignore_errors=True)
    (course / "source").mkdir(parents=True)
    shutil.copytree(base / "source" / stem, course / "source" / stem)
    shutil.copytree(base / "release" / stem, course / "release" / stem)
    shutil.copyfile(base / "gradebook.db", course / "gradebook.db")
    dest = course / "submitted" / student / stem / f"{stem}.ipynb"
    dest.parent.mkdir(parents=True)
    dest.write_text(nbformat.writes(nb), encoding="utf-8")
    return course


def run_job(jobdir: Path, wall: float) -> dict:
    """Grade one prepared job in a child process; kill its whole process group past ``wall``."""
    log = open(jobdir / "job.log", "wb")
    cmd = warm.command("job", [sys.executable, "-m", "autograder.grade.job", str(jobdir)])
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=warm.kernel_env())  # workers are threads: os.environ is left alone
    try:
        proc.wait(timeout=wall)
    except subprocess.TimeoutExpired:
        with_kill(proc)
        return {"status": "timeout", "reason": f"still running after the {wall:g} s limit per notebook: stopped"}
    finally:
        log.close()
        with_kill(proc)  # whatever the job left behind (a kernel that ignores shutdown)
        runtime = jobdir / "runtime.txt"
        if runtime.is_file() and Path(runtime.read_text()).name.startswith("kvk-"):
            shutil.rmtree(runtime.read_text(), ignore_errors=True)
    result = jobdir / "result.json"
    if result.is_file():
        return json.loads(result.read_text())
    tail = (jobdir / "job.log").read_text(errors="replace")[-600:]
    return {"status": "error", "reason": f"the grading process failed (exit {proc.returncode}): {tail.strip()[-300:]}"}


def with_kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


# -- progress, isolation, the canary ---------------------------------------------------------------


class Progress:
    def __init__(self, total: int, say: Say):
        self.total, self.done, self.say, self.t0 = total, 0, say, time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.lock = threading.Lock()

    def step(self, row: Row, cached: bool = False) -> None:
        with self.lock:
            self.done += 1
            width = 30
            bar = "#" * (width * self.done // max(1, self.total))
            msg = (f"[{bar:<{width}}] {self.done}/{self.total} {time.perf_counter() - self.t0:5.0f} s  "
                   f"{row.student}/{row.notebook}: {row.status} {row.score:g}/{row.max_score:g}"
                   + (" (cached)" if cached else ""))
            if self.tty:
                sys.stderr.write("\r\033[K" + msg + ("\n" if self.done == self.total else ""))
                sys.stderr.flush()
            else:
                self.say(msg)


def isolation_status(settings: Settings, hidden: list[str]) -> tuple[bool, str]:
    """Whether kernels will be sandboxed, and a sentence saying so (or why not)."""
    if not settings.isolate:
        return False, "OFF (--no-sandbox): student code runs with resource limits only"
    if os.environ.get("KVREF_SANDBOX", "").lower() in ("0", "off", "no"):
        return False, "OFF (KVREF_SANDBOX=off): student code runs with resource limits only"
    ok, why = sandbox.probe(hidden)
    if ok:
        return True, "on (user, mount, PID and network namespaces; read-only minimal root; rlimits)"
    return False, f"OFF (user namespaces unavailable: {why}): student code runs with resource limits only"


CANARY = "_instructor_solution"


def canary_hint(row: Row) -> str:
    """The grading setting most likely to blame when the instructor's own solution loses points."""
    why = row.reason
    if row.status == "timeout" and "per notebook" in why:
        return "--notebook-timeout (the wall-clock limit per notebook) is too small"
    if row.status == "timeout" or "CellTimeoutError" in why or "GradingTimeout" in why:
        return "--cell-timeout (the limit per cell) is too small"
    if "MemoryError" in why or "kernel died" in why or "memory" in why.lower():
        return "--memory (the kernel's address-space limit, MB) is too small"
    return "a setting, or the instructor source itself (grade it alone with `python -m autograder check`)"


def _grade_one(student, stem, path, note, release, source, base, work, fb_dir, settings: Settings, max_score, threads) -> Row:
    notes = [note] if note else []
    t0 = time.perf_counter()
    try:
        nb, repairs = preflight(path, release, source)
    except Invalid as e:
        return Row(student, stem, 0.0, max_score, "invalid", "; ".join(notes + [str(e)]))
    notes += repairs
    jobdir = Path(tempfile.mkdtemp(prefix=f"{stem}-{student}-"[:40], dir=work))
    try:
        _job_course(jobdir, base, stem, student, nb)
        (jobdir / "job.json").write_text(json.dumps({
            "stem": stem, "student": student, "threads": threads, "settings": dataclasses.asdict(settings),
            "queued": time.time()}))
        t = time.perf_counter()
        result = run_job(jobdir, settings.notebook_timeout)
        # total: the job, start to end; prepare: the submission read and repaired, its job folder made
        timing = dict(result.get("timing", {}), total=time.perf_counter() - t, prepare=t - t0)
        score = float(result.get("score", 0.0))
        if result["status"] in ("ok", "needs_review"):
            page = jobdir / "feedback.html"
            if page.is_file():
                dest = fb_dir / student / f"{stem}.html"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, dest)
        return Row(student, stem, score, float(result.get("max_score", max_score)), result["status"],
                   "; ".join(notes + [r for r in [result.get("reason", "")] if r]),
                   tests=result.get("tests", []), manual=result.get("manual", {}), timing=timing,
                   stretch=result.get("stretch", ""))
    finally:
        if not os.environ.get("KVREF_KEEP_WORK"):
            shutil.rmtree(jobdir, ignore_errors=True)


@dataclasses.dataclass
class Grader:
    """Grades the submissions of a course set up in ``base``, each once: a result is kept in
    OUT/.cache/<student>/<stem>.json under the digest of what it was graded from."""
    base: Path  # the course directory: source/, release/, gradebook.db
    work: Path  # OUT/.work: the job directories
    out: Path
    releases: dict[str, nbformat.NotebookNode]  # stem -> what students got
    sources: dict[str, nbformat.NotebookNode]  # stem -> the instructor source
    max_points: dict[str, float]
    settings: Settings
    threads: int  # per kernel
    isolation: str  # the sentence of ``isolation_status``
    force: bool = False  # grade again what the cache holds

    def grade(self, item: tuple, progress: Progress | None = None) -> Row:
        """``item``: (student, stem, path, note, digest, late)."""
        student, stem, path, note, digest, late = item
        cached, fb_dir = self.out / ".cache" / student / f"{stem}.json", self.out / "feedback"
        if not self.force and cached.is_file():
            c = json.loads(cached.read_text())
            if c.get("digest") == digest and (c["status"] not in ("ok", "needs_review")
                                              or (fb_dir / student / f"{stem}.html").is_file()):
                row = Row(**c["row"])
                row.late = late
                if progress:
                    progress.step(row, cached=True)
                return row
        t = time.perf_counter()
        row = _grade_one(student, stem, path, note, self.releases[stem], self.sources[stem], self.base, self.work,
                         fb_dir if student != CANARY else self.work / "canary-feedback", self.settings,
                         self.max_points[stem], self.threads)
        row.seconds, row.late = time.perf_counter() - t, late
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"digest": digest, "status": row.status, "row": dataclasses.asdict(row)}))
        if progress:
            progress.step(row)
        return row
