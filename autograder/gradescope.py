"""A Gradescope autograder for one notebook.

    python -m autograder gradescope 03_memory -o autograder.zip      # upload this zip to Gradescope

The zip holds ``setup.sh`` (installs the pinned requirements and kvref), ``run_autograder``,
the ``autograder`` and ``kvref`` packages and the one instructor source. Gradescope unpacks it
into ``/autograder/source``, puts the student's files into ``/autograder/submission`` and runs
``/autograder/run_autograder``, which grades the notebook with the batch grader (same preflight,
sandbox and limits) and writes ``/autograder/results/results.json``: ``score``,
``execution_time``, ``output`` and ``tests``, each test with ``name``, ``score``, ``max_score``,
``output`` and ``visibility``. Outputs come from the redacted notebook, so hidden test code never
appears; a failing hidden test shows only its message. Where the container has no user
namespaces the kernel runs with resource limits only and ``output`` says so.

``AUTOGRADER_ROOT`` (or ``gradescope-run --root``) moves ``/autograder`` elsewhere, for tests.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

from autograder.batch import grade_batch
from autograder.grade.course import ROOT
from autograder.record.results import Say, _stderr, read_csv

SETUP = """#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image.
set -euo pipefail
cd /autograder/source
if ! command -v python3 >/dev/null || ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    apt-get update && apt-get install -y python3 python3-venv python3-pip
fi
python3 -m pip install -r requirements.txt
python3 -m pip install --no-deps .
"""

RUN = """#!/usr/bin/env bash
# Gradescope runs this for every submission; AUTOGRADER_ROOT moves /autograder (tests).
ROOT="${AUTOGRADER_ROOT:-/autograder}"
cd "$ROOT/source"
exec python3 -m autograder gradescope-run --root "$ROOT"
"""


def _add_tree(z: zipfile.ZipFile, folder: Path, arc: str) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith("."):
            z.write(p, f"{arc}/{p.relative_to(folder).as_posix()}")


def build(stem: str, output: Path, solutions: Path, say: Say = _stderr) -> int:
    """Write the autograder zip for ``stem``. Returns an exit status."""
    source = Path(solutions) / f"{stem}.ipynb"
    if not source.is_file():
        found = ", ".join(sorted(p.stem for p in Path(solutions).glob("*.ipynb")))
        say(f"error: no instructor source {source}; the notebooks are: {found}")
        return 2
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("setup.sh", SETUP), ("run_autograder", RUN)):
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o100755 << 16
            z.writestr(info, text)
        _add_tree(z, ROOT / "autograder", "autograder")
        _add_tree(z, ROOT / "kvref", "kvref")
        for name in ("pyproject.toml", "requirements.txt", "README.md"):
            z.write(ROOT / name, name)
        z.write(source, f"solutions/{stem}.ipynb")
        z.writestr("gradescope.json", json.dumps({"notebook": stem}))
    say(f"wrote {output}: upload it as the Gradescope autograder of {stem}")
    return 0


def _results(score: float, output: str, tests: list[dict], seconds: float) -> dict:
    return {"score": score, "execution_time": round(seconds, 1), "output": output, "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"name": t["name"], "number": str(i), "score": t["score"], "max_score": t["max_score"],
                       "output": t["output"] or ("passed" if t["score"] >= t["max_score"] else ""),
                       "visibility": "visible", "status": "passed" if t["score"] >= t["max_score"] else "failed"}
                      for i, t in enumerate(tests, start=1)]}


def run(root: Path, say: Say = _stderr) -> int:
    """Grade ROOT/submission into ROOT/results/results.json (always written, also on failure)."""
    t0 = time.perf_counter()
    root = Path(root)
    stem = json.loads((root / "source" / "gradescope.json").read_text())["notebook"]
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvgs-"))
    lines: list[str] = []
    try:
        subs = work / "submissions" / "student"
        subs.mkdir(parents=True)
        for p in (root / "submission").iterdir() if (root / "submission").is_dir() else []:
            if p.is_file():
                shutil.copyfile(p, subs / p.name)
            elif p.name == "notebooks" and p.is_dir():
                shutil.copytree(p, subs / "notebooks")
        status = grade_batch(work / "submissions", work / "out", root / "source" / "solutions", workers=1,
                             notebook_names=[stem], canary=False, say=lines.append, fmt="folders")
        meta = json.loads((work / "out" / "grading.json").read_text()) if (work / "out" / "grading.json").is_file() else {}
        isolation = meta.get("isolation", "unknown")
        cached = work / "out" / ".cache" / "student" / f"{stem}.json"
        row = json.loads(cached.read_text())["row"] if cached.is_file() else None
        if row is None:
            rows = read_csv(work / "out" / "grades.csv") if (work / "out" / "grades.csv").is_file() else []
            row = rows and vars(rows[0]) or {"score": 0, "status": "error", "reason": " | ".join(lines[-3:]),
                                               "tests": []}
        head = [f"{stem}: {row['status']}" + (f" ({row['reason']})" if row.get("reason") else ""),
                f"isolation: {isolation}"]
        if row["status"] == "needs_review":
            head.append("free-text answers are graded by your instructor after the deadline")
        data = _results(float(row["score"]), "\n".join(head), row.get("tests") or [], time.perf_counter() - t0)
        if status not in (0, 1) and not data["tests"]:
            data["output"] += "\n" + "\n".join(lines[-3:])
    except Exception as e:  # the student must always get a results.json
        data = _results(0.0, f"the autograder failed: {type(e).__name__}: {e}", [], time.perf_counter() - t0)
    finally:
        if not os.environ.get("KVREF_KEEP_WORK"):
            shutil.rmtree(work, ignore_errors=True)
    results.write_text(json.dumps(data, indent=1), encoding="utf-8")
    say(f"wrote {results}: {data['score']:g} points")
    return 0
