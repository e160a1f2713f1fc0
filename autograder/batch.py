"""Batch grading of a class: untrusted submissions in, a complete grade sheet out.

    python -m autograder grade SUBMISSIONS OUT [--workers N] [--shard K/N] [--force] ...
    python -m autograder merge OUT1/grades.csv OUT2/grades.csv ... -o grades.csv

SUBMISSIONS is a folder (or a .zip in the same shape) of ``<student>/<NN_topic>.ipynb``. Every
submission goes through these steps, each in its own process, N at a time:

1. ``preflight`` (here, no student code runs): read the file, refuse what is not a notebook,
   clear stored outputs, reset the kernel, put back deleted graded cells, note edited test
   cells and duplicate grade ids. What was repaired goes into the ``reason`` column.
2. ``python -m autograder.job`` (a child process with a wall-clock limit): a private nbgrader
   course directory holding only this submission and a copy of the gradebook, nbgrader's
   autograde with the kernel started through ``autograder.sandbox`` (no network, no view of the
   instructor's files, memory/CPU/file-size limits), then a feedback page made from the graded
   notebook with the hidden tests taken out again.
3. The row: ``student, notebook, score, max_score, status, reason`` (see ``STATUSES``).

Results are cached in OUT/.cache by the hash of the submission, the instructor source and the
grading settings: a re-run only grades what changed (``--force`` grades everything again).
"""

from __future__ import annotations

import concurrent.futures
import csv
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
from typing import Callable, Iterable

import nbformat

from . import notebooks
from .course import Course, cell_timeout, kernel_environment

VERSION = "2"  # part of the cache key: bump when grading changes meaning
STEM_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
MAX_NOTEBOOK_MB = 20  # a bigger file is not a hand-written notebook (stored outputs are cleared anyway)
MAX_ZIP_MB = 2000  # uncompressed, all members together

STATUSES = {
    "ok": "graded; the score is what the tests gave (the reason lists lost points and repairs)",
    "missing": "the student handed in no notebook of this name",
    "invalid": "the file is not a notebook nbgrader can read (not JSON, not nbformat, too large)",
    "timeout": "stopped: a cell ignored the interrupt after the per-cell limit, or the notebook ran past the "
               "per-notebook wall-clock limit",
    "error": "nbgrader could not grade it (for example the kernel died); see the reason",
}
CSV_FIELDS = ["student", "notebook", "score", "max_score", "status", "reason"]

Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Row:
    student: str
    notebook: str
    score: float
    max_score: float
    status: str = "ok"
    reason: str = ""
    seconds: float = 0.0  # not in the CSV


@dataclasses.dataclass
class Settings:
    cell_timeout: float = 0.0  # 0: from nbgrader_config.py
    notebook_timeout: float = 600.0
    memory_mb: int = 4096
    isolate: bool = True  # False: resource limits only

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


# -- submissions -----------------------------------------------------------------------------------


def _canon(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def unzip(archive: Path, dest: Path, say: Say = _stderr) -> Path:
    """Extract a platform export safely (no absolute paths, no ``..``, no links, bounded size) and
    return the folder that holds the student folders (a single wrapping folder is skipped)."""
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            name = info.filename.replace("\\", "/")
            parts = [p for p in name.split("/") if p not in ("", ".")]
            if not parts or info.is_dir() or name.startswith("/") or ".." in parts or parts[0] == "__MACOSX":
                continue
            if (info.external_attr >> 16) & 0o170000 == 0o120000:  # a symlink
                say(f"skipped {name} in {archive.name}: a link")
                continue
            total += info.file_size
            if total > MAX_ZIP_MB * 2 ** 20:
                raise ValueError(f"{archive} unpacks to more than {MAX_ZIP_MB} MB")
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 2 ** 20)
    entries = [p for p in dest.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and not any(entries[0].glob("*.ipynb")):
        inner = [p for p in entries[0].iterdir() if p.is_dir()]
        if inner and all(not any(p.glob("*/*.ipynb")) for p in inner):
            return entries[0]
    return dest


def student_folders(submissions: Path, say: Say = _stderr) -> dict[str, Path]:
    out = {}
    for folder in sorted(submissions.iterdir()):
        if folder.name.startswith(".") or folder.name == "__MACOSX":
            continue
        if not folder.is_dir():
            say(f"skipped {folder}: expected one folder per student")
        elif not STUDENT_RE.match(folder.name):
            say(f"skipped {folder}: a student id is letters, digits and _ . @ - (starting with a letter or digit)")
        else:
            out[folder.name] = folder
    return out


def match_files(folder: Path, stems: Iterable[str], grade_ids: dict[str, set[str]]) -> tuple[dict[str, tuple[Path, str]], list[str]]:
    """{stem: (path, note)} for one student's folder, and notes on files that were ignored.

    Exact names first; then a renamed file is matched by name (``03_memory (1).ipynb``,
    ``03-Memory.ipynb``, ``alice_03_memory.ipynb``) or, failing that, by its content (the grade
    ids of its cells)."""
    stems = sorted(stems)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.relative_to(folder).parts))
    found: dict[str, tuple[Path, str]] = {}
    for p in files:
        if p.parent == folder and p.suffix == ".ipynb" and p.stem in stems:
            found[p.stem] = (p, "")
    ignored = []
    for p in files:
        if any(p == f for f, _ in found.values()):
            continue
        if p.suffix.lower() != ".ipynb":
            ignored.append(f"ignored {p.relative_to(folder)}")
            continue
        by_name = [s for s in stems if s not in found and _canon(s) in _canon(p.stem)]
        stem = by_name[0] if len(by_name) == 1 else None
        if stem is None:
            try:
                ids = {notebooks.grade_id(c) for c in json.loads(p.read_text(encoding="utf-8")).get("cells", [])}
                best = max((len(ids & grade_ids[s]), s) for s in stems if s not in found) if len(found) < len(stems) else (0, None)
                stem = best[1] if best[0] >= 2 else None
            except Exception:
                stem = None
        if stem is None:
            ignored.append(f"ignored {p.relative_to(folder)} (not one of the course notebooks)")
        else:
            found[stem] = (p, f"renamed: graded {p.relative_to(folder)} as {stem}.ipynb")
    return found, ignored


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


# -- preflight -------------------------------------------------------------------------------------


class Invalid(ValueError):
    pass


def preflight(path: Path, release: nbformat.NotebookNode,
              source: nbformat.NotebookNode | None = None) -> tuple[nbformat.NotebookNode, list[str]]:
    """The submission as nbgrader should see it, and what was repaired (sentences). Raises
    ``Invalid`` for a file that is not a notebook."""
    size = path.stat().st_size
    if size > MAX_NOTEBOOK_MB * 2 ** 20:
        raise Invalid(f"file of {size / 2 ** 20:.0f} MB, more than the {MAX_NOTEBOOK_MB} MB a notebook may have")
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Invalid(f"not a notebook: the file is not JSON ({type(e).__name__}: {str(e)[:80]})")
    if not isinstance(data, dict) or "cells" not in data or "nbformat" not in data:
        raise Invalid("not a notebook: JSON without cells/nbformat")
    try:
        nb = nbformat.reads(json.dumps(data), as_version=4)
        for cell in nb.cells:
            cell.setdefault("metadata", {})
            if cell.cell_type not in ("code", "markdown", "raw"):
                raise ValueError(f"unknown cell type {cell.cell_type!r}")
    except Exception as e:
        raise Invalid(f"not a readable notebook ({type(e).__name__}: {str(e)[:80]})")
    notes = []
    outputs = 0
    for cell in nb.cells:
        cell.pop("id", None) if (nb.nbformat, nb.nbformat_minor) < (4, 5) else None
        if cell.cell_type == "code":
            outputs += len(json.dumps(cell.get("outputs", [])))
            cell.outputs, cell.execution_count = [], None
    if outputs > 2 ** 20:
        notes.append(f"{outputs / 2 ** 20:.0f} MB of stored outputs cleared")
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    if kernel != "python3":
        notes.append(f"kernel {kernel!r} replaced by python3")
    nb.metadata["kernelspec"] = dict(release.metadata.get("kernelspec", notebooks.KERNELSPEC))
    # Duplicate grade ids: nbgrader grades the last copy; the others run as ordinary cells.
    positions: dict[str, list[int]] = {}
    for i, cell in enumerate(nb.cells):
        gid = notebooks.grade_id(cell)
        if gid:
            positions.setdefault(gid, []).append(i)
    for gid, where in positions.items():
        if len(where) > 1:
            notes.append(f"grade id {gid!r} on {len(where)} cells (copied cell): graded the last one")
            for i in where[:-1]:
                nb.cells[i].metadata.pop("nbgrader", None)
    # Deleted graded or locked cells come back from the release, at their place.
    present = {notebooks.grade_id(c) for c in nb.cells}
    index_of = {notebooks.grade_id(c): i for i, c in enumerate(nb.cells) if notebooks.grade_id(c)}
    restored = []
    for k, cell in enumerate(release.cells):
        gid = notebooks.grade_id(cell)
        if not gid or gid in present:
            continue
        before = [notebooks.grade_id(c) for c in release.cells[:k] if notebooks.grade_id(c) in index_of]
        at = index_of[before[-1]] + 1 if before else 0
        new = nbformat.from_dict(json.loads(json.dumps(cell)))
        new.pop("id", None)
        nb.cells.insert(at, new)
        index_of = {notebooks.grade_id(c): i for i, c in enumerate(nb.cells) if notebooks.grade_id(c)}
        present.add(gid)
        restored.append(gid)
    if restored:
        notes.append("deleted cell(s) " + ", ".join(repr(g) for g in restored) + " restored from the release")
    released = notebooks.cells_by_id(release)
    original = notebooks.cells_by_id(source) if source is not None else {}
    edited = [notebooks.grade_id(c) for c in nb.cells if notebooks.grade_id(c) in released
              and notebooks.meta(released[notebooks.grade_id(c)]).get("locked")
              and c.source != released[notebooks.grade_id(c)].source
              and c.source != getattr(original.get(notebooks.grade_id(c)), "source", None)]
    if edited:
        notes.append("edited locked cell(s) " + ", ".join(repr(g) for g in edited) + " restored from the source")
    if (nb.nbformat, nb.nbformat_minor) >= (4, 5):
        for i, cell in enumerate(nb.cells):
            cell.id = f"c{i:04d}"  # valid and unique whatever the student's ids were
    return nb, notes


# -- feedback --------------------------------------------------------------------------------------


MAX_FEEDBACK_OUTPUT = 20_000  # characters of one output shown in a feedback page


def redact(graded: nbformat.NotebookNode, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The graded notebook as the student may see it: every locked cell shows the release's text
    (hidden tests and mark schemes gone), the traceback of a cell that holds hidden tests is
    reduced to its last line, long outputs are cut."""
    released = notebooks.cells_by_id(release)
    for cell in graded.cells:
        gid = notebooks.grade_id(cell)
        hidden = False
        if gid in released and (notebooks.meta(released[gid]).get("locked") or notebooks.is_test(released[gid])):
            hidden = cell.source != released[gid].source
            cell.source = released[gid].source
        elif not gid:
            for markers in (notebooks.HIDDEN, notebooks.MARK_SCHEME):
                inside, outside, found = notebooks.split_regions(cell.source, markers)
                if found:
                    hidden, cell.source = True, "\n".join(outside)
        for out in cell.get("outputs", []):
            if out.output_type == "error" and hidden:
                out.traceback = [f"{out.ename}: {out.evalue}  (a hidden test failed; its code is not shown)"]
            elif out.output_type == "error" and len(out.traceback) > 60:
                out.traceback = out.traceback[:10] + ["..."] + out.traceback[-20:]
            elif out.output_type == "stream" and len(out.text) > MAX_FEEDBACK_OUTPUT:
                out.text = out.text[:MAX_FEEDBACK_OUTPUT] + f"\n... [{len(out.text) - MAX_FEEDBACK_OUTPUT} more characters cut]"
            elif out.output_type in ("display_data", "execute_result"):
                for mime, value in list(out.get("data", {}).items()):
                    if isinstance(value, str) and len(value) > MAX_FEEDBACK_OUTPUT * 20:
                        out.data[mime] = "[output too large for the feedback page]" if mime.startswith("text") else ""
                        if not mime.startswith("text"):
                            del out.data[mime]
    return graded


def feedback_html(nb: nbformat.NotebookNode, cells: dict[str, tuple[float, float]], title: str) -> str:
    """A self-contained HTML page (no CDN): the notebook with each graded cell's score."""
    from nbconvert import HTMLExporter

    for cell in nb.cells:
        gid = notebooks.grade_id(cell)
        if gid in cells:
            s, m = cells[gid]
            cell.source = f"# [{gid}] score: {s:g} / {m:g}\n" + cell.source if cell.cell_type == "code" else \
                f"**[{gid}] score: {s:g} / {m:g}**\n\n" + cell.source
    exporter = HTMLExporter(template_name="classic")
    exporter.exclude_input_prompt = exporter.exclude_output_prompt = True
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = re.sub(r'<script[^>]*src="https?://[^"]*"[^>]*>\s*</script>', "", body)  # nothing from the network
    total = sum(s for s, _ in cells.values()), sum(m for _, m in cells.values())
    return body.replace("<body>", f"<body><h1>{title}: {total[0]:g} / {total[1]:g}</h1>", 1)


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


def write_csv(rows: list[Row], path: Path) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in sorted(rows, key=lambda r: (r.student, r.notebook)):
            w.writerow([r.student, r.notebook, f"{r.score:g}", f"{r.max_score:g}", r.status,
                        " ".join(r.reason.split())])
    os.replace(tmp, path)


def read_csv(path: Path) -> list[Row]:
    with open(path, newline="", encoding="utf-8") as f:
        return [Row(r["student"], r["notebook"], float(r["score"]), float(r["max_score"]), r.get("status") or "ok",
                    r.get("reason") or "") for r in csv.DictReader(f)]


def summary(rows: list[Row]) -> str:
    """The terminal table: per notebook, how many, mean score, and the count of each status."""
    lines = [f"{'notebook':<22} {'graded':>6} {'mean':>7} {'max':>5}  statuses"]
    for stem in sorted({r.notebook for r in rows}):
        rs = [r for r in rows if r.notebook == stem]
        counts = {s: sum(r.status == s for r in rs) for s in STATUSES}
        mean = sum(r.score for r in rs) / len(rs)
        lines.append(f"{stem:<22} {len(rs):>6} {mean:>7.2f} {rs[0].max_score:>5g}  "
                     + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    return "\n".join(lines)


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
    """Grade a class. Returns 0 when every submission got a row (whatever its status), 2 on a
    usage error."""
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
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
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
    max_points = {s: notebooks.max_points(nbs) for s, nbs in ((s, notebooks.read(sources[s])) for s in stems)}

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
    meta = {"isolation": isolation, "isolated": isolated, "workers": workers, "shard": f"{k}/{n}",
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


# -- merge -----------------------------------------------------------------------------------------


def merge(inputs: list[Path], output: Path, say: Say = _stderr) -> int:
    """Join the grades.csv of several shards (files or OUT folders) into one."""
    rows: dict[tuple[str, str], Row] = {}
    for p in inputs:
        p = Path(p)
        p = p / "grades.csv" if p.is_dir() else p
        for r in read_csv(p):
            key = (r.student, r.notebook)
            if key in rows:
                say(f"error: {r.student}/{r.notebook} is in two inputs (the shards overlap); the second is {p}")
                return 1
            rows[key] = r
    output.parent.mkdir(parents=True, exist_ok=True)
    write_csv(list(rows.values()), output)
    say(summary(list(rows.values())) if rows else "no rows")
    say(f"merged {len(rows)} row(s) from {len(inputs)} file(s) into {output}")
    return 0
