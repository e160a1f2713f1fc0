"""Intake of a class's submissions, before any student code runs.

``unzip`` an export safely, find one folder per student, ``match_files`` (exact names, then renamed
files by name or by their grade ids), and ``preflight`` each notebook: refuse what is not a
notebook, clear stored outputs, reset the kernel, put back deleted graded cells, note edited test
cells and duplicate grade ids. What was repaired becomes sentences for the ``reason`` column.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path
from typing import Iterable

import nbformat

from autograder.shared import notebooks
from autograder.intake.platforms import candidate_files
from autograder.shared.rows import Say, _stderr

STUDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
MAX_NOTEBOOK_MB = 20  # a bigger file is not a hand-written notebook (stored outputs are cleared anyway)
MAX_ZIP_MB = 2000  # uncompressed, all members together

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
    ids of its cells). Only files at the top of the folder or under notebooks/ count
    (``platforms.ANSWER_PLACES``): a notebook under solutions/ or tests/ is never the answer."""
    stems = sorted(stems)
    files, ignored = candidate_files(folder)
    found: dict[str, tuple[Path, str]] = {}
    for p in files:
        if p.suffix == ".ipynb" and p.stem in stems and p.stem not in found:
            found[p.stem] = (p, "" if p.parent == folder else f"graded {p.relative_to(folder)}")
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
