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

from . import notebooks
from .course import Course, cell_timeout, kernel_environment
from .intake import Invalid, match_files, preflight, student_folders, unzip
from .results import Row, Say, _stderr, summary, write_csv

VERSION = "2"  # part of the cache key: bump when grading changes meaning


@dataclasses.dataclass
class Settings:
    cell_timeout: float = 0.0  # 0: from nbgrader_config.py
    notebook_timeout: float = 600.0
    memory_mb: int = 4096
    isolate: bool = True  # False: resource limits only

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def shard_of(student: str, n: int) -> int:
    """1..n: a student's shard, stable across machines, runs and the order of the folder."""
    return int(hashlib.sha256(student.encode()).hexdigest(), 16) % n + 1


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
        proc = subprocess.Popen([sys.executable, "-m", "autograder.job", str(jobdir)], stdout=log,
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


def grade_batch(submissions: Path, out: Path, solutions: Path, workers: int | None = None,
                settings: Settings | None = None, shard: str | None = None, force: bool = False,
                notebook_names: list[str] | None = None, say: Say = _stderr) -> int:
    """Grade a class. Returns 0 when every submission got a row (whatever its status), 1 when OUT
    cannot be written, 2 on a usage error."""
    from .commands import solution_files

    settings = settings or Settings()
    if not settings.cell_timeout:
        settings.cell_timeout = cell_timeout()
    k, n = parse_shard(shard)
    sources = solution_files(solutions)
    if not sources:
        say(f"error: no NN_topic.ipynb notebooks in {solutions}")
        return 2
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
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
        say(f"error: {submissions} is not a folder (or .zip) of <student>/<NN_topic>.ipynb")
        return 2
    t0 = time.perf_counter()
    folders = student_folders(submissions, say)
    grade_ids = {s: {notebooks.grade_id(c) for c in notebooks.read(p).cells} - {None} for s, p in sources.items()}
    matched = {student: match_files(folder, sources, grade_ids) for student, folder in folders.items()}
    for student, (_, ignored) in matched.items():
        for note in ignored:
            say(f"{student}: {note}")
    stems = sorted(set(notebook_names or []) or {s for found, _ in matched.values() for s in found})
    unknown = [s for s in stems if s not in sources]
    if unknown:
        say(f"error: no instructor source for {unknown}")
        return 2
    mine = sorted(s for s in folders if shard_of(s, n) == k)
    base = work / "course"
    course = Course(base, {s: sources[s] for s in stems})
    releases = {stem: course.generate(stem) for stem in stems}
    source_nbs = {stem: notebooks.read(sources[stem]) for stem in stems}
    max_points = {stem: notebooks.max_points(nb) for stem, nb in source_nbs.items()}

    hidden = [str(solutions.resolve()), str(base / "gradebook.db"), str(submissions), str(out / "grades.csv")]
    isolated, isolation = isolation_status(settings, hidden)
    settings.isolate = isolated
    say(f"isolation: {isolation}")
    workers = max(1, workers or os.cpu_count() or 1)
    threads = max(1, (os.cpu_count() or 1) // workers)

    cache_dir, fb_dir = out / ".cache", out / "feedback"
    rows: list[Row] = []
    todo = []
    for student in mine:
        found = matched[student][0]
        for stem in stems:
            if stem not in found:
                rows.append(Row(student, stem, 0.0, max_points[stem], "missing", f"no {stem}.ipynb handed in"))
                continue
            path, note = found[stem]
            digest = hashlib.sha256(path.read_bytes() + sources[stem].read_bytes()
                                    + (settings.key() + VERSION).encode()).hexdigest()
            todo.append((student, stem, path, note, digest))
    progress = Progress(len(todo) + len(rows), say)
    for r in rows:
        progress.step(r)

    def grade_one(item) -> Row:
        student, stem, path, note, digest = item
        cached = cache_dir / student / f"{stem}.json"
        if not force and cached.is_file():
            c = json.loads(cached.read_text())
            if c.get("digest") == digest and (c["status"] != "ok" or (fb_dir / student / f"{stem}.html").is_file()):
                row = Row(**c["row"])
                progress.step(row, cached=True)
                return row
        t = time.perf_counter()
        row = _grade_one(student, stem, path, note, releases[stem], source_nbs[stem], base, work, fb_dir, settings,
                         max_points[stem], threads)
        row.seconds = time.perf_counter() - t
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"digest": digest, "status": row.status, "row": dataclasses.asdict(row)}))
        progress.step(row)
        return row

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        rows += list(pool.map(grade_one, todo))
    write_csv(rows, out / "grades.csv")
    # shard and class (every student of every shard, the notebooks): merge checks completeness against them
    meta = {"isolation": isolation, "isolated": isolated, "workers": workers, "shard": f"{k}/{n}",
            "class": {"students": sorted(folders), "notebooks": stems},
            "settings": dataclasses.asdict(settings), "seconds": time.perf_counter() - t0,
            "graded": len(todo), "rows": len(rows),
            "per_notebook_seconds": {f"{r.student}/{r.notebook}": round(r.seconds, 2) for r in rows if r.seconds}}
    (out / "grading.json").write_text(json.dumps(meta, indent=1))
    if not os.environ.get("KVREF_KEEP_WORK"):  # debugging: keep OUT/.work (job logs, course dirs)
        shutil.rmtree(work, ignore_errors=True)
    say(summary(rows) if rows else "no submissions")
    say(f"isolation: {isolation}")
    say(f"{len(rows)} row(s) ({len(todo)} notebook(s) graded or cached) in {time.perf_counter() - t0:.0f} s "
        f"with {workers} worker(s); wrote {out / 'grades.csv'}")
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
            "stem": stem, "student": student, "threads": threads, "settings": dataclasses.asdict(settings)}))
        result = run_job(jobdir, settings.notebook_timeout)
        if result["status"] == "ok":
            page = jobdir / "feedback.html"
            if page.is_file():
                dest = fb_dir / student / f"{stem}.html"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, dest)
        score = float(result.get("score", 0.0))
        return Row(student, stem, score, float(result.get("max_score", max_score)), result["status"],
                   "; ".join(notes + [r for r in [result.get("reason", "")] if r]))
    finally:
        if not os.environ.get("KVREF_KEEP_WORK"):
            shutil.rmtree(jobdir, ignore_errors=True)
