"""One grading job: ``python -m autograder.grade.job JOBDIR`` (started by ``grading.run_job``).

JOBDIR/job.json says what to grade; JOBDIR/course is a private nbgrader course directory with
this one submission and a copy of the gradebook. The kernel starts through
``autograder.shared.sandbox`` with jupyter_client's ``ipc`` transport (Unix sockets in a short folder
under /tmp, removed at the end). Writes JOBDIR/result.json (status, score, reason, per-cell
scores) and JOBDIR/feedback.html (hidden tests taken out).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from traitlets.config import Config

from autograder.shared import notebooks, sandbox, warm
from autograder.grade.feedback import ANSI as feedback_ANSI, feedback_html, redact
from autograder.grade.course import ROOT, Course, kernel_environment
from autograder.grade.quick import alembic_head_in_process, shared_engines

OUTPUT_CAP = 2_000_000  # characters a kernel may print to stdout and to stderr, each

# Runs in the kernel at start-up (IPKernelApp.exec_files), before any student code: a notebook
# printing without end would otherwise flood the grader with messages.
STARTUP = f'''
import sys as _sys
def _kvref_cap(stream, limit={OUTPUT_CAP}):
    state = {{"n": 0}}
    write = stream.write
    def capped(text):
        if state["n"] >= limit:
            return len(text)
        state["n"] += len(text)
        if state["n"] >= limit:
            text = text[:len(text) - (state["n"] - limit)] + "\\n[output beyond {OUTPUT_CAP} characters dropped by the grader]\\n"
        return write(text)
    stream.write = capped
_kvref_cap(_sys.stdout)
_kvref_cap(_sys.stderr)
del _kvref_cap, _sys
'''


def lost_points(nb, cells: dict[str, tuple[float, float]], limit: int = 140) -> list[str]:
    """'grade_id s/m: why' for each graded cell below its maximum."""
    out = []
    by_id = notebooks.cells_by_id(nb)
    for gid, (s, m) in cells.items():
        if s >= m:
            continue
        why = "no output to check"
        cell = by_id.get(gid)
        for o in (cell.get("outputs", []) if cell is not None else []):
            if o.output_type == "error":
                why = f"{o.ename}: {o.evalue}".strip().rstrip(":")
                break
            if o.output_type == "stream" and o.name == "stderr":
                why = "wrote to stderr: " + o.text.strip().splitlines()[0] if o.text.strip() else "wrote to stderr"
        else:
            if cell is not None and notebooks.is_manual(cell) and cell.source.strip() not in ("", "YOUR ANSWER HERE"):
                continue  # a free-text answer: a person gives its points (status needs_review)
            if cell is not None and notebooks.is_answer(cell):
                why = "answer not given"
        why = " ".join(why.split())
        out.append(f"{gid} {s:g}/{m:g} ({why[:limit]})")
    return out


def test_results(redacted, release, cells: dict[str, tuple[float, float]]) -> tuple[list[dict], dict]:
    """Per graded cell, in notebook order, what the student may see: {name, score, max_score,
    output} (the error message, hidden test code already taken out by ``redact``); and the
    free-text answers given, {grade_id: {max_score, answer}}, which wait for a person."""
    released = notebooks.cells_by_id(release)
    tests, manual = [], {}
    for cell in redacted.cells:
        gid = notebooks.grade_id(cell)
        if gid not in cells:
            continue
        score, top = cells[gid]
        if notebooks.is_manual(cell):
            given = gid in released and cell.source.strip() != released[gid].source.strip() and cell.source.strip()
            if given:
                manual[gid] = {"max_score": top, "answer": cell.source}
            tests.append({"name": gid, "score": score, "max_score": top, "manual": True,
                          "output": "waits for review" if given else "answer not given"})
            continue
        lines = []
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                lines += [feedback_ANSI.sub("", t) for t in o.traceback]
            elif o.output_type == "stream" and o.name == "stderr" and score < top:
                lines.append("wrote to stderr: " + o.text.strip())
        tests.append({"name": gid, "score": score, "max_score": top, "output": "\n".join(lines).strip()})
    return tests, manual


def other_errors(nb, limit: int = 100) -> list[str]:
    """Errors in cells that carry no points (the student's own cells): a timeout or a crash there
    explains the lost points of the tests after it."""
    out = []
    for i, cell in enumerate(nb.cells):
        if notebooks.meta(cell).get("grade"):
            continue
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                name = notebooks.grade_id(cell) or f"cell {i}"
                out.append(f"{name}: " + " ".join(f"{o.ename}: {o.evalue}".split())[:limit])
    return out


def stretch_report(nb) -> str:
    """What the ungraded stretch exercise's own check said in the graded notebook: the last line it printed, or
    "failed: <error>"; "" when the notebook has no stretch. The stretch carries no points, so only ``check``
    shows this (a passing check said nothing before)."""
    start = next((i for i, c in enumerate(nb.cells)
                  if c.cell_type == "markdown" and notebooks.STRETCH_HEADING.search(c.source)), None)
    if start is None:
        return ""
    for cell in nb.cells[start + 1:]:
        if cell.cell_type != "code" or notebooks.is_answer(cell) or "assert" not in cell.source:
            continue
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                return "failed: " + " ".join(f"{o.ename}: {o.evalue}".split())[:300]
        printed = [line for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == "stdout"
                   for line in o.text.splitlines() if line.strip()]
        return printed[-1].strip() if printed else "ran; its check printed nothing"
    return ""


def cell_span(nb) -> tuple[float, float] | None:
    """(first cell's start, last cell's reply) in epoch seconds, from nbclient's timing metadata."""
    from datetime import datetime

    times = [datetime.fromisoformat(str(t).replace("Z", "+00:00")).timestamp()
             for c in nb.cells for k, t in c.get("metadata", {}).get("execution", {}).items()
             if k in ("iopub.execute_input", "shell.execute_reply")]
    return (min(times), max(times)) if times else None


def warm_up() -> None:
    """Run once by the warm job server after its imports, before it forks jobs: fill the
    per-process caches every job would otherwise fill again (SQLAlchemy's mapper set-up for
    nbgrader's gradebook, its migrations' head revision, the notebook JSON-schema validators, the
    feedback page's templates and compiled patterns). Nothing here starts a thread or touches a file."""
    import nbformat
    from nbgrader import api  # its ORM classes, configured below
    from nbgrader.nbgraderformat import MetadataValidator
    from sqlalchemy.orm import configure_mappers

    from autograder.grade.feedback import warm_up as feedback_warm_up

    configure_mappers()
    alembic_head_in_process()
    api.get_alembic_version()  # read once here: every forked job's new gradebook has it
    nb = notebooks.course_notebook([notebooks.nbgrader_cell("answer", "warm", "x = 1"),
                                    notebooks.nbgrader_cell("test", "test_warm", "assert x == 1", points=1)])
    nb = nbformat.reads(nbformat.writes(nb), as_version=4)
    nbformat.validate(nb)
    MetadataValidator().validate_nb(nb)
    feedback_warm_up()


def time_preprocessors(spent: dict) -> None:
    """Always-on stage timers (this process only): the seconds each nbconvert/nbgrader preprocessor
    takes go into ``spent`` by class name; ``spent["execute_start"]`` and ``spent["execute_end"]``
    frame the Execute step (the kernel's start, the cells and its shutdown)."""
    from nbconvert.preprocessors.base import Preprocessor

    if getattr(Preprocessor.__call__, "_kvref_timed", False):
        return
    plain = Preprocessor.__call__

    def timed(self, nb, resources):
        t = time.time()
        if type(self).__name__ == "Execute":
            spent["execute_start"] = t
        try:
            return plain(self, nb, resources)
        finally:
            name, now = type(self).__name__, time.time()
            spent[name] = spent.get(name, 0.0) + now - t
            if name == "Execute":
                spent["execute_end"] = now

    timed._kvref_timed = True
    Preprocessor.__call__ = timed


DATABASE_STEPS = ("SaveAutoGrades", "AssignLatePenalties", "OverwriteCells", "OverwriteKernelspec", "SaveCells")


def stage_times(spent: dict, entered: float, queued: float, started: float, ended: float,
                span: tuple[float, float] | None, marks: dict) -> dict:
    """Where one job's seconds went, by stage (see ``bench.STAGES``); the older coarse keys
    (to_first_cell, after_cells) are kept for grading.json's readers."""
    exec_start, exec_end = spent.get("execute_start", ended), spent.get("execute_end", ended)
    first, last = span or (exec_end, exec_end)
    database = sum(spent.get(k, 0.0) for k in DATABASE_STEPS) + marks.get("scores", 0.0)
    nbgrader = (ended - started) - (exec_end - exec_start) - sum(spent.get(k, 0.0) for k in DATABASE_STEPS)
    return {"job_start": entered - queued, "setup": started - entered, "to_first_cell": first - started,
            "cells": last - first, "after_cells": ended - last, "result": time.time() - ended,
            "kernel_start": max(0.0, first - exec_start), "kernel_stop": max(0.0, exec_end - last),
            "nbgrader": max(0.0, nbgrader), "database": database, "feedback": marks.get("feedback", 0.0)}


def main(jobdir: Path) -> int:
    entered = time.time()
    job = json.loads((jobdir / "job.json").read_text())
    stem, student, settings = job["stem"], job["student"], job["settings"]
    course_dir = jobdir / "course"
    # Unix socket paths must be short (108 bytes): under OUT when it is, else under /tmp.
    short = len(str(jobdir)) + len("/kvk-12345678/run/k-12345") < 100
    runtime = Path(tempfile.mkdtemp(prefix="kvk-", dir=str(jobdir) if short else "/tmp"))
    (jobdir / "runtime.txt").write_text(str(runtime))  # removed by the grader if this process is killed
    try:
        spec, run = runtime / "spec", runtime / "run"
        (spec / "kernels" / "python3").mkdir(parents=True)
        run.mkdir()
        (spec / "startup.py").write_text(STARTUP)
        policy = {
            "isolate": settings["isolate"],
            "ro": sandbox.readonly_paths(ROOT) + [str(spec)],
            "rw": [str(run), str(course_dir / "submitted" / student / stem),
                   str(course_dir / "autograded" / student / stem)],
            "memory_mb": settings["memory_mb"],
            "cpu_s": int(settings["notebook_timeout"] * max(1, job["threads"]) + 30),
            "fsize_mb": 256,
            "nproc": 4096,
            "env": {"HOME": "/tmp", "IPYTHONDIR": "/tmp/.ipython", "MPLCONFIGDIR": "/tmp/.mpl", "TMPDIR": "/tmp",
                    "OMP_NUM_THREADS": str(job["threads"]), "MKL_NUM_THREADS": str(job["threads"])},
        }
        (spec / "policy.json").write_text(json.dumps(policy))
        kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                  f"--IPKernelApp.exec_files={json.dumps([str(spec / 'startup.py')])}"]
        (spec / "kernels" / "python3" / "kernel.json").write_text(json.dumps({
            "argv": warm.command("kernel", kernel, spec / "policy.json"), "display_name": "Python 3 (sandboxed)",
            "language": "python", "metadata": {"debugger": False}}))
        os.environ["JUPYTER_PATH"] = str(spec)
        os.environ["JUPYTER_RUNTIME_DIR"] = str(run)
        os.environ["TMPDIR"] = tempfile.tempdir = str(run)  # jupyter_client puts the connection file (so the sockets) there
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(job["threads"])

        c = Config()
        c.Execute.timeout = int(settings["cell_timeout"])
        c.KernelManager.transport = "ipc"
        c.KernelManager.ip = str(run / "k")  # socket paths run/k-1 ... (one kernel per job)
        c.Execute.startup_timeout = int(os.environ.get("KVREF_STARTUP_TIMEOUT", 120))
        c.LimitOutput.max_lines = 2000
        shared_engines()  # one gradebook engine for nbgrader's many opens
        course = Course(course_dir, overrides=c)
        spent: dict = {}
        time_preprocessors(spent)
        started = time.time()
        result = course.autograde(stem, student)
        ended = time.time()
        (jobdir / "nbgrader.log").write_text(result.get("log", "") + "\n" + str(result.get("error", "")))
        marks = {}
        found = course.submission_scores(stem, student)  # one gradebook visit: the total and every cell
        scores = found[0] if found else None
        graded_path = course.autograded_path(stem, student)
        graded = notebooks.read(graded_path) if graded_path.is_file() else None  # read once, used in memory
        span = cell_span(graded) if graded is not None else None
        if scores is None or graded is None:
            log = result.get("log", "") + str(result.get("error", ""))
            status = "error"
            if "CellTimeoutError" in log or "Timeout waiting for execute reply" in log:
                status, why = "timeout", (f"a cell ran past the {settings['cell_timeout']:g} s limit per cell and "
                                          f"ignored the interrupt: the notebook was stopped")
            elif "UnresponsiveKernel" in log or "became unresponsive" in log:
                why = "the kernel stopped responding (an endless loop that ignores interrupts, or memory)"
            elif "DeadKernel" in log or "Kernel died" in log or "kernel died" in log.lower():
                why = "the kernel died while running the notebook (memory limit, or the code ended the process)"
            else:
                lines = [l for l in log.splitlines() if l.strip() and "checksum" not in l and "SAWarning" not in l]
                why = "nbgrader could not grade it: " + " | ".join(lines[-3:])[-300:]
            out = {"status": status, "score": 0.0, "reason": why}
        else:
            cells = {g: (s.score, s.max_score) for g, s in found[1].items()}
            marks["scores"] = time.time() - ended
            lost, errors = lost_points(graded, cells), other_errors(graded)
            reason = "; ".join(([("lost: " + "; ".join(lost))] if lost else [])
                               + ([("errors in " + "; ".join(errors[:3]))] if errors else []))
            out = {"status": "ok", "score": scores.score, "max_score": scores.max_score, "reason": reason,
                   "cells": cells}
            release = notebooks.read(course.release_path(stem))
            redacted = redact(graded, release)
            out["tests"], out["manual"] = test_results(redacted, release, cells)
            out["stretch"] = stretch_report(graded)
            if out["manual"]:
                out["status"] = "needs_review"
                out["reason"] = "; ".join([f"free-text answer(s) {', '.join(out['manual'])} wait for review"]
                                          + [r for r in [reason] if r])
            t = time.time()
            page = feedback_html(redacted, cells, f"{stem} — {student}")
            (jobdir / "feedback.html").write_text(page, encoding="utf-8")
            marks["feedback"] = time.time() - t
        # Where the time went (seconds), by stage: see ``stage_times``.
        out["timing"] = stage_times(spent, entered, job.get("queued", entered), started, ended, span, marks)
        (jobdir / "result.json").write_text(json.dumps(out))
        return 0
    finally:
        if not os.environ.get("KVREF_KEEP_WORK"):
            shutil.rmtree(runtime, ignore_errors=True)


if __name__ == "__main__":
    with kernel_environment():
        sys.exit(main(Path(sys.argv[1])))
