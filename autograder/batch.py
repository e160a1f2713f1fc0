"""Batch grading of a class: untrusted submissions in, a complete grade sheet out.

    python -m autograder grade SUBMISSIONS OUT [--workers N] [--shard K/N] [--force] ...
    python -m autograder merge OUT1/grades.csv OUT2/grades.csv ... -o grades.csv

SUBMISSIONS is a folder (or a .zip in the same shape) of ``<student>/<NN_topic>.ipynb``. Every
submission goes through these steps, each in its own process, N at a time:

1. ``intake.preflight`` (here, no student code runs): read the file, refuse what is not a notebook,
   clear stored outputs, reset the kernel, put back deleted graded cells, note edited test
   cells and duplicate grade ids. What was repaired goes into the ``reason`` column.
2. ``python -m autograder.job`` (a child process with a wall-clock limit): a private nbgrader
   course directory holding only this submission and a copy of the gradebook, nbgrader's
   autograde with the kernel started through ``autograder.sandbox`` (no network, no view of the
   instructor's files, memory/CPU/file-size limits), then a feedback page made from the graded
   notebook with the hidden tests taken out again.
3. The row: ``student, notebook, score, max_score, status, reason`` (see ``results.STATUSES``);
   the feedback page is made by ``feedback.py``, the sheet and shard merging live in ``results.py``.

Results are cached in OUT/.cache by the hash of the submission, the instructor source and the
grading settings: a re-run only grades what changed (``--force`` grades everything again).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import nbformat

from . import notebooks, warm
from .course import Course, cell_timeout, kernel_environment
from .intake import Invalid, match_files, preflight, unzip
from .gradebook import write_outputs
from .results import Row, Say, _stderr, shard_of, summary

VERSION = "2"  # part of the cache key: bump when grading changes meaning


@dataclasses.dataclass
class Settings:
    cell_timeout: float = 0.0  # 0: from nbgrader_config.py
    notebook_timeout: float = 600.0
    memory_mb: int = 4096
    isolate: bool = True  # False: resource limits only

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return 1, 1
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ValueError(f"--shard takes K/N with 1 <= K <= N, got {text!r}")
    return int(m[1]), int(m[2])


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
    with kernel_environment():
        cmd = warm.command("job", [sys.executable, "-m", "autograder.job", str(jobdir)])
        proc = subprocess.Popen(cmd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ))
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


# -- the batch -------------------------------------------------------------------------------------


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
    from . import sandbox

    if not settings.isolate:
        return False, "OFF (--no-sandbox): student code runs with resource limits only"
    if os.environ.get("KVREF_SANDBOX", "").lower() in ("0", "off", "no"):
        return False, "OFF (KVREF_SANDBOX=off): student code runs with resource limits only"
    ok, why = sandbox.probe(hidden)
    if ok:
        return True, "on (user, mount, PID and network namespaces; read-only minimal root; rlimits)"
    return False, f"OFF (user namespaces unavailable: {why}): student code runs with resource limits only"


def usage_problem(submissions: Path, out: Path, workers: int | None, shard: str | None) -> str | None:
    """The one-line usage error for these arguments, or None."""
    if workers is not None and workers < 1:
        return f"--workers must be at least 1, got {workers}"
    try:
        parse_shard(shard)
    except ValueError as e:
        return str(e)
    if not submissions.exists():
        return f"{submissions} does not exist (expected a folder or .zip of submissions)"
    if out.exists() and not out.is_dir():
        return f"OUT {out} is a file; give a folder (it will hold grades.csv and feedback/)"
    if submissions.is_dir() and (out == submissions or submissions in out.parents):
        return f"OUT {out} is inside SUBMISSIONS {submissions}; put the results somewhere else"
    return None


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


def grade_batch(submissions: Path, out: Path, solutions: Path, workers: int | None = None,
                settings: Settings | None = None, shard: str | None = None, force: bool = False,
                notebook_names: list[str] | None = None, say: Say = _stderr, fmt: str = "auto",
                roster: Path | None = None, canary: bool = True, manual: Path | None = None) -> int:
    """Grade a class. Returns 0 when every submission got a row; 1 when OUT cannot be written, there
    was nothing to grade, every graded row is an ``error``, or the instructor solution (the canary) did
    not get full marks;
    2 on a usage error. ``fmt``: the export format (``platforms.FORMATS``); ``roster``: roster.csv;
    ``manual``: a filled-in review.csv whose points are added (see ``review.py``)."""
    from . import platforms, review
    from .commands import solution_files

    settings = settings or Settings()
    if not settings.cell_timeout:
        settings.cell_timeout = cell_timeout()
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    problem = usage_problem(submissions, out, workers, shard)
    if problem:
        say(f"error: {problem}")
        return 2
    k, n = parse_shard(shard)
    sources = solution_files(solutions)
    if not sources:
        say(f"error: no NN_topic.ipynb notebooks in {solutions}")
        return 2
    try:
        people = platforms.read_roster(roster) if roster else None
        marks = review.read_review(manual) if manual else None
    except (OSError, ValueError) as e:
        say(f"error: {e}")
        return 2
    work = out / ".work"
    try:  # fail here, before any grading, when OUT cannot hold the results
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as e:
        say(f"error: cannot write the results to {out}: {e}")
        return 1
    if submissions.is_file() and zipfile.is_zipfile(submissions):
        submissions = unzip(submissions, work / "unzipped", say)
    if not submissions.is_dir():
        say(f"error: {submissions} is not a folder (or .zip) of submissions")
        return 2
    t0 = time.perf_counter()
    try:
        intake = platforms.collect(submissions, fmt, work / "intake", say)
    except ValueError as e:
        say(f"error: {e}")
        return 2
    say(f"format: {intake.format} ({len(intake.students)} student(s))")
    if people is not None:
        entries, info = platforms.apply_roster(intake, people)
    else:
        entries = intake.students
        info = {sid: platforms.Student(sid, e.name, "", e.lms_id, "") for sid, e in entries.items()}
    grade_ids = {s: {notebooks.grade_id(c) for c in notebooks.read(p).cells} - {None} for s, p in sources.items()}
    matched = {sid: match_files(e.folder, sources, grade_ids) for sid, e in entries.items()}
    for sid, (_, ignored) in matched.items():
        for note in ignored:
            say(f"{sid}: {note}")
    stems = sorted(set(notebook_names or []) or {s for found, _ in matched.values() for s in found})
    unknown = [s for s in stems if s not in sources]
    if unknown:
        say(f"error: no instructor source for {unknown}")
        return 2
    if not stems:
        say(f"error: nothing to grade: no course notebook found in {submissions} (read as {intake.format}; "
            f"{len(entries)} student(s)); expected {', '.join(platforms.FORMATS[1:])} exports "
            f"(see --format) holding {', '.join(sorted(sources))}.ipynb")
        return 1
    everyone = sorted(set(entries) | set(info))
    mine = sorted(s for s in everyone if shard_of(s, n) == k)
    base = work / "course"
    hidden = [str(solutions.resolve()), str(base / "gradebook.db"), str(submissions), str(out / "grades.csv")]
    warm.start()  # the warm servers import torch and nbgrader while the course is set up
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        probe = pool.submit(isolation_status, settings, hidden)  # starts a sandboxed Python: also seconds
        course = Course(base, {s: sources[s] for s in stems})
        releases = {stem: course.generate(stem) for stem in stems}
        isolated, isolation = probe.result()
    source_nbs = {stem: notebooks.read(sources[stem]) for stem in stems}
    max_points = {stem: notebooks.max_points(nb) for stem, nb in source_nbs.items()}
    settings.isolate = isolated
    say(f"isolation: {isolation}")
    warm.ensure()
    say(f"kernels: {warm.status()}")
    workers = max(1, workers or os.cpu_count() or 1)
    threads = max(1, (os.cpu_count() or 1) // workers)

    cache_dir, fb_dir = out / ".cache", out / "feedback"

    def grade_one(item, progress=None) -> Row:
        student, stem, path, note, digest, late = item
        cached = cache_dir / student / f"{stem}.json"
        if not force and cached.is_file():
            c = json.loads(cached.read_text())
            if c.get("digest") == digest and (c["status"] not in ("ok", "needs_review")
                                              or (fb_dir / student / f"{stem}.html").is_file()):
                row = Row(**c["row"])
                row.late = late
                if progress:
                    progress.step(row, cached=True)
                return row
        t = time.perf_counter()
        row = _grade_one(student, stem, path, note, releases[stem], source_nbs[stem], base, work,
                         fb_dir if student != CANARY else work / "canary-feedback", settings, max_points[stem], threads)
        row.seconds, row.late = time.perf_counter() - t, late
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"digest": digest, "status": row.status, "row": dataclasses.asdict(row)}))
        if progress:
            progress.step(row)
        return row

    phases = {"setup": time.perf_counter() - t0}
    if canary:
        checks = []
        for stem in stems:
            path = work / "canary" / f"{stem}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(nbformat.writes(notebooks.fill_answers(releases[stem], source_nbs[stem])), encoding="utf-8")
            digest = hashlib.sha256(sources[stem].read_bytes() + (settings.key() + VERSION).encode()).hexdigest()
            checks.append((CANARY, stem, path, "", digest, False))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(grade_one, checks))
        for row in results:
            auto = notebooks.auto_points(source_nbs[row.notebook])
            if row.status not in ("ok", "needs_review") or row.score < auto:
                say(f"error: the instructor solution of {row.notebook} got {row.score:g}/{auto:g} "
                    f"({row.status}: {row.reason[:300]}) with these settings, so no student was graded; "
                    f"likely cause: {canary_hint(row)}. (--no-canary skips this check.)")
                return 1
        say("canary: the instructor solution of " + ", ".join(stems) + " gets full marks with these settings")

    phases["canary"] = time.perf_counter() - t0 - phases["setup"]
    rows: list[Row] = []
    todo = []
    for student in mine:
        entry = entries.get(student)
        found, ignored = matched.get(student, ({}, []))
        late = bool(entry and entry.late)
        notes = (entry.notes if entry else []) + [i for i in ignored if ".ipynb" in i]
        for stem in stems:
            if stem not in found:
                why = "nothing handed in" if entry is None else f"no {stem}.ipynb handed in"
                rows.append(Row(student, stem, 0.0, max_points[stem], "missing", "; ".join([why] + notes), late))
                continue
            path, note = found[stem]
            note = "; ".join([n for n in [note] if n] + notes)
            digest = hashlib.sha256(path.read_bytes() + sources[stem].read_bytes()
                                    + (settings.key() + VERSION + note).encode()).hexdigest()
            todo.append((student, stem, path, note, digest, late))
    progress = Progress(len(todo) + len(rows), say)
    for r in rows:
        progress.step(r)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        rows += list(pool.map(lambda item: grade_one(item, progress), todo))
    if marks is not None:
        for line in review.apply(rows, marks, fb_dir):
            say(line)
    # shard and class (every student of every shard, the notebooks): merge checks completeness against them
    meta = {"class": {"students": everyone, "notebooks": stems}, "format": intake.format, "isolation": isolation,
            "isolated": isolated, "kernels": warm.status(), "workers": workers,
            "shard": f"{k}/{n}", "settings": dataclasses.asdict(settings), "seconds": time.perf_counter() - t0,
            "phases": dict(phases, students=time.perf_counter() - t0 - sum(phases.values())),
            "graded": len(todo), "rows": len(rows), "canary": canary,
            "per_notebook_seconds": {f"{r.student}/{r.notebook}": round(r.seconds, 2) for r in rows if r.seconds},
            "per_notebook_timing": {f"{r.student}/{r.notebook}": {k: round(v, 3) for k, v in r.timing.items()}
                                    for r in rows if r.timing}}
    write_outputs(out, rows, {sid: s for sid, s in info.items() if sid in mine}, meta, say=say)
    if not os.environ.get("KVREF_KEEP_WORK"):  # debugging: keep OUT/.work (job logs, course dirs)
        shutil.rmtree(work, ignore_errors=True)
    say(summary(rows) if rows else "no submissions")
    say(f"isolation: {isolation}")
    say(f"{len(rows)} row(s) ({len(todo)} notebook(s) graded or cached) in {time.perf_counter() - t0:.0f} s "
        f"with {workers} worker(s); wrote {out / 'grades.csv'}")
    graded = [r for r in rows if r.status != "missing"]
    if not todo:
        say(f"error: nothing to grade in this shard ({k}/{n}): every row is `missing`")
        return 1
    if graded and all(r.status == "error" for r in graded):
        say(f"error: every graded notebook ended with status `error` (first reason: {graded[0].reason[:300]})")
        return 1
    return 0


def _grade_one(student, stem, path, note, release, source, base, work, fb_dir, settings: Settings, max_score, threads) -> Row:
    notes = [note] if note else []
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
        timing = dict(result.get("timing", {}), total=time.perf_counter() - t)
        score = float(result.get("score", 0.0))
        if result["status"] in ("ok", "needs_review"):
            page = jobdir / "feedback.html"
            if page.is_file():
                dest = fb_dir / student / f"{stem}.html"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, dest)
        return Row(student, stem, score, float(result.get("max_score", max_score)), result["status"],
                   "; ".join(notes + [r for r in [result.get("reason", "")] if r]),
                   tests=result.get("tests", []), manual=result.get("manual", {}), timing=timing)
    finally:
        if not os.environ.get("KVREF_KEEP_WORK"):
            shutil.rmtree(jobdir, ignore_errors=True)
