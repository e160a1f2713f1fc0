"""Batch grading of a class, the pipeline: untrusted submissions in, a complete OUT folder out.

    python -m autograder grade SUBMISSIONS OUT [--workers N] [--shard K/N] [--force] ...
    python -m autograder merge OUT1/grades.csv OUT2/grades.csv ... -o grades.csv

SUBMISSIONS is a folder (or a .zip in the same shape) of ``<student>/<NN_topic>.ipynb``. Every
submission goes through these steps, each in its own process, N at a time:

1. ``intake.preflight`` (here, no student code runs): read the file, refuse what is not a notebook,
   clear stored outputs, reset the kernel, put back deleted graded cells, note edited test
   cells and duplicate grade ids. What was repaired goes into the ``reason`` column.
2. ``grading.run_job``: ``python -m autograder.grade.job`` (a child process with a wall-clock limit): a private nbgrader
   course directory holding only this submission and a copy of the gradebook, nbgrader's
   autograde with the kernel started through ``autograder.shared.sandbox`` (no network, no view of the
   instructor's files, memory/CPU/file-size limits), then a feedback page made from the graded
   notebook with the hidden tests taken out again.
3. The row: ``student, notebook, score, max_score, status, reason`` (see ``rows.STATUSES``);
   the feedback page is made by ``feedback.py``, the sheet and shard merging live in ``results.py``,
   the free-text review in ``review.py``, and ``gradebook.write_outputs`` writes OUT.

The stages, each a module that imports only those before it: intake (``platforms``, ``intake``) ->
grade (``course``, ``job``, ``feedback``, ``grading``) -> record (``results``, ``review``) -> export
(``gradebook``, ``merging``) -> report (``report_stats``, ``report``); this module and the command
line (``commands``, ``__main__``) sit on top. ``tests/test_imports.py`` checks the order.

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
import time
import zipfile
from pathlib import Path

import nbformat

from autograder.shared import notebooks, warm
from autograder.intake import platforms
from autograder.record import review
from autograder.grade.course import cell_timeout, solution_files
from autograder.export.gradebook import write_outputs
from autograder.grade.grading import CANARY, Grader, Progress, Settings, canary_hint, isolation_status
from autograder.grade.remember import (CANARY_CACHE, VERSION, build_course, canary_cache,  # noqa: F401
                                       canary_key)
from autograder.intake.intake import match_files, unzip
from autograder.record.results import Row, Say, _stderr, shard_of, summary

__all__ = ["Settings", "Stop", "grade_batch", "parse_shard", "shard_of", "usage_problem"]  # Settings, shard_of: imported here

def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return 1, 1
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ValueError(f"--shard takes K/N with 1 <= K <= N, got {text!r}")
    return int(m[1]), int(m[2])


# -- the batch -------------------------------------------------------------------------------------


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


class Stop(Exception):
    """A stage cannot go on: the run ends with ``status`` and one line, ``error: <message>``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Class:
    """What intake found: the students (roster applied), their files matched to the notebooks."""
    submissions: Path  # the folder (a .zip unpacked)
    format: str  # platforms.FORMATS
    entries: dict[str, platforms.Entry]  # student id -> what they handed in
    info: dict[str, platforms.Student]  # student id -> name, email, LMS id, section
    matched: dict[str, tuple[dict, list[str]]]  # student id -> ({stem: (path, note)}, ignored files)
    stems: list[str]  # the notebooks every student must hand in
    everyone: list[str]  # every student of every shard


def grade_batch(submissions: Path, out: Path, solutions: Path, workers: int | None = None,
                settings: Settings | None = None, shard: str | None = None, force: bool = False,
                notebook_names: list[str] | None = None, say: Say = _stderr, fmt: str = "auto",
                roster: Path | None = None, canary: bool = True, manual: Path | None = None) -> int:
    """Grade a class. Returns 0 when every submission got a row; 1 when OUT cannot be written, there
    was nothing to grade, every graded row is an ``error``, or the instructor solution (the canary) did
    not get full marks;
    2 on a usage error. ``fmt``: the export format (``platforms.FORMATS``); ``roster``: roster.csv;
    ``manual``: a filled-in review.csv whose points are added (see ``review.py``)."""
    settings = settings or Settings()
    if not settings.cell_timeout:
        settings.cell_timeout = cell_timeout()
    submissions, out = Path(submissions).resolve(), Path(out).resolve()
    try:
        k, n, sources, people, marks = check_arguments(submissions, out, solutions, workers, shard, roster, manual)
        workers = max(1, workers or os.cpu_count() or 1)
        work = make_out(out)
        t0 = time.perf_counter()
        cls = read_class(submissions, sources, fmt, people, notebook_names, work, say)  # intake
        grader = set_up(cls, sources, solutions, settings, workers, out, work, force, say)  # grade: the course
        phases = {"setup": time.perf_counter() - t0}
        if canary:
            run_canary(grader, cls.stems, sources, workers, say)
        phases["canary"] = time.perf_counter() - t0 - phases["setup"]
        mine = sorted(s for s in cls.everyone if shard_of(s, n) == k)
        rows, todo = plan(cls, mine, grader, sources)
        rows += grade_all(grader, rows, todo, workers, say)  # grade: every submission of the shard
    except Stop as e:
        say(f"error: {e}")
        return e.status
    if marks is not None:  # record: the reviewed free-text answers
        for line in review.apply(rows, marks, out / "feedback"):
            say(line)
    # shard and class (every student of every shard, the notebooks): merge checks completeness against them
    meta = {"class": {"students": cls.everyone, "notebooks": cls.stems}, "format": cls.format,
            "isolation": grader.isolation, "isolated": settings.isolate, "kernels": warm.status(), "workers": workers,
            "shard": f"{k}/{n}", "settings": dataclasses.asdict(settings), "seconds": time.perf_counter() - t0,
            "phases": dict(phases, students=time.perf_counter() - t0 - sum(phases.values())),
            "graded": len(todo), "rows": len(rows), "canary": canary,
            "per_notebook_seconds": {f"{r.student}/{r.notebook}": round(r.seconds, 2) for r in rows if r.seconds},
            "per_notebook_timing": {f"{r.student}/{r.notebook}": {k: round(v, 3) for k, v in r.timing.items()}
                                    for r in rows if r.timing}}
    write_outputs(out, rows, {sid: s for sid, s in cls.info.items() if sid in mine}, meta, say=say)  # export
    if not os.environ.get("KVREF_KEEP_WORK"):  # debugging: keep OUT/.work (job logs, course dirs)
        shutil.rmtree(work, ignore_errors=True)
    return finish(rows, todo, (k, n), grader.isolation, workers, t0, out, say)


def check_arguments(submissions: Path, out: Path, solutions: Path, workers: int | None, shard: str | None,
                    roster: Path | None, manual: Path | None) -> tuple[int, int, dict[str, Path], list | None,
                                                                       dict | None]:
    """(K, N, {stem: instructor source}, roster, review marks), or Stop(2) on a usage error."""
    problem = usage_problem(submissions, out, workers, shard)
    if problem:
        raise Stop(2, problem)
    k, n = parse_shard(shard)
    sources = solution_files(solutions)
    if not sources:
        raise Stop(2, f"no NN_topic.ipynb notebooks in {solutions}")
    try:
        people = platforms.read_roster(roster) if roster else None
        marks = review.read_review(manual) if manual else None
    except (OSError, ValueError) as e:
        raise Stop(2, str(e)) from None
    return k, n, sources, people, marks


def make_out(out: Path) -> Path:
    """OUT and an empty OUT/.work, made before any grading: Stop(1) when OUT cannot hold the results."""
    work = out / ".work"
    try:
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as e:
        raise Stop(1, f"cannot write the results to {out}: {e}") from None
    return work


def read_class(submissions: Path, sources: dict[str, Path], fmt: str, people: list | None,
               notebook_names: list[str] | None, work: Path, say: Say) -> Class:
    """The intake stage: the export read (a .zip unpacked, the LMS layout recognised), the roster
    applied, each student's files matched to the course notebooks."""
    if submissions.is_file() and zipfile.is_zipfile(submissions):
        submissions = unzip(submissions, work / "unzipped", say)
    if not submissions.is_dir():
        raise Stop(2, f"{submissions} is not a folder (or .zip) of submissions")
    try:
        intake = platforms.collect(submissions, fmt, work / "intake", say)
    except ValueError as e:
        raise Stop(2, str(e)) from None
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
        raise Stop(2, f"no instructor source for {unknown}")
    if not stems:
        raise Stop(1, f"nothing to grade: no course notebook found in {submissions} (read as {intake.format}; "
                      f"{len(entries)} student(s)); expected {', '.join(platforms.FORMATS[1:])} exports "
                      f"(see --format) holding {', '.join(sorted(sources))}.ipynb")
    return Class(submissions, intake.format, entries, info, matched, stems, sorted(set(entries) | set(info)))


def set_up(cls: Class, sources: dict[str, Path], solutions: Path, settings: Settings, workers: int, out: Path,
           work: Path, force: bool, say: Say) -> Grader:
    """The grade stage's set-up: the course directory and its releases, the sandbox probed (hiding
    the instructor's files), the warm kernel servers."""
    base = work / "course"
    hidden = [str(solutions.resolve()), str(base / "gradebook.db"), str(cls.submissions), str(out / "grades.csv")]
    warm.start()  # the warm servers import torch and nbgrader while the course is set up
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        probe = pool.submit(isolation_status, settings, hidden)  # starts a sandboxed Python: also seconds
        releases = build_course(base, {s: sources[s] for s in cls.stems})
        isolated, isolation = probe.result()
    source_nbs = {stem: notebooks.read(sources[stem]) for stem in cls.stems}
    max_points = {stem: notebooks.max_points(nb) for stem, nb in source_nbs.items()}
    settings.isolate = isolated
    say(f"isolation: {isolation}")
    warm.ensure()
    say(f"kernels: {warm.status()}")
    threads = max(1, (os.cpu_count() or 1) // workers)
    return Grader(base, work, out, releases, source_nbs, max_points, settings, threads, isolation, force)


def run_canary(grader: Grader, stems: list[str], sources: dict[str, Path], workers: int, say: Say) -> None:
    """The instructor solution of each notebook, graded first with the same settings: Stop(1) naming
    the setting to blame when it does not get full marks. A solution that got full marks under the
    same key (``canary_key``) in an earlier run is not graded again."""
    checks, keys, cache, remembered = [], {}, canary_cache(), []
    for stem in stems:
        keys[stem] = canary_key(grader, stem, sources[stem])
        if cache is not None and (cache / f"{keys[stem]}.json").is_file():
            remembered.append(stem)
            continue
        path = grader.work / "canary" / f"{stem}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(nbformat.writes(notebooks.fill_answers(grader.releases[stem], grader.sources[stem])),
                        encoding="utf-8")
        digest = hashlib.sha256(sources[stem].read_bytes() + (grader.settings.key() + VERSION).encode()).hexdigest()
        checks.append((CANARY, stem, path, "", digest, False))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(grader.grade, checks))
    for row in results:
        auto = notebooks.auto_points(grader.sources[row.notebook])
        if row.status not in ("ok", "needs_review") or row.score < auto:
            raise Stop(1, f"the instructor solution of {row.notebook} got {row.score:g}/{auto:g} "
                          f"({row.status}: {row.reason[:300]}) with these settings, so no student was graded; "
                          f"likely cause: {canary_hint(row)}. (--no-canary skips this check.)")
    for row in results if cache is not None else []:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            tmp = cache / f".{keys[row.notebook]}.{os.getpid()}"
            tmp.write_text(json.dumps({"notebook": row.notebook, "score": row.score, "when": time.time()}))
            tmp.replace(cache / f"{keys[row.notebook]}.json")
        except OSError:
            pass  # no cache: the next run grades it again
    say("canary: the instructor solution of " + ", ".join(stems) + " gets full marks with these settings"
        + (f" ({', '.join(remembered)} remembered from an earlier run with the same solution, code and settings)"
           if remembered else ""))


def plan(cls: Class, mine: list[str], grader: Grader, sources: dict[str, Path]) -> tuple[list[Row], list[tuple]]:
    """The rows of notebooks not handed in (``missing``), and the submissions to grade, each with
    the digest that keys its cached result."""
    rows: list[Row] = []
    todo = []
    for student in mine:
        entry = cls.entries.get(student)
        found, ignored = cls.matched.get(student, ({}, []))
        late = bool(entry and entry.late)
        notes = (entry.notes if entry else []) + [i for i in ignored if ".ipynb" in i]
        for stem in cls.stems:
            if stem not in found:
                why = "nothing handed in" if entry is None else f"no {stem}.ipynb handed in"
                rows.append(Row(student, stem, 0.0, grader.max_points[stem], "missing", "; ".join([why] + notes), late))
                continue
            path, note = found[stem]
            note = "; ".join([n for n in [note] if n] + notes)
            digest = hashlib.sha256(path.read_bytes() + sources[stem].read_bytes()
                                    + (grader.settings.key() + VERSION + note).encode()).hexdigest()
            todo.append((student, stem, path, note, digest, late))
    return rows, todo


def grade_all(grader: Grader, missing: list[Row], todo: list[tuple], workers: int, say: Say) -> list[Row]:
    """Every submission of ``todo`` graded (or taken from the cache), ``workers`` at a time, with a
    progress line for each row (the ``missing`` ones first)."""
    progress = Progress(len(todo) + len(missing), say)
    for r in missing:
        progress.step(r)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda item: grader.grade(item, progress), todo))


def finish(rows: list[Row], todo: list[tuple], shard: tuple[int, int], isolation: str, workers: int, t0: float,
           out: Path, say: Say) -> int:
    """The summary table and the exit status: 1 when the shard had nothing to grade or every graded
    notebook ended in ``error``."""
    say(summary(rows) if rows else "no submissions")
    say(f"isolation: {isolation}")
    say(f"{len(rows)} row(s) ({len(todo)} notebook(s) graded or cached) in {time.perf_counter() - t0:.0f} s "
        f"with {workers} worker(s); wrote {out / 'grades.csv'}")
    graded = [r for r in rows if r.status != "missing"]
    if not todo:
        say(f"error: nothing to grade in this shard ({shard[0]}/{shard[1]}): every row is `missing`")
        return 1
    if graded and all(r.status == "error" for r in graded):
        say(f"error: every graded notebook ended with status `error` (first reason: {graded[0].reason[:300]})")
        return 1
    return 0
