"""What the pipeline needs to know about an nbgrader notebook, without running nbgrader.

- which lines are secret (solution regions, hidden tests, mark schemes) and which are public,
- a perfect student's submission (``fill_answers``) and a wrong one (``apply_wrong``),
- the checks an instructor source must pass (``lint``),
- the normal form two releases are compared in (``normalized``).

Region markers follow nbgrader 0.9: any line *containing* ``BEGIN SOLUTION`` opens a solution
region (so ``### BEGIN SOLUTION`` and ``# BEGIN SOLUTION`` both work), and likewise for
``BEGIN HIDDEN TESTS`` and ``BEGIN MARK SCHEME``. An answer cell without markers is secret as a whole
(nbgrader replaces all of it).
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

SOLUTION = ("BEGIN SOLUTION", "END SOLUTION")
HIDDEN = ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
MARK_SCHEME = ("BEGIN MARK SCHEME", "END MARK SCHEME")
STRETCH_HEADING = re.compile(r"^##\s+Stretch \(optional, ungraded\):", re.M)  # the ungraded exercise at the end
MARKERS = (SOLUTION, HIDDEN, MARK_SCHEME)

# A secret line shorter than this (whitespace collapsed) is too generic to call a leak:
# `return x`, `else:`, `pass`, `k, v = kv`, `return logits` show up in any Python code.
# 16 characters keeps lines such as `self.pos += T  # advance` or `torch.cat([k, k_new], dim=2)`.
MIN_SECRET_CHARS = 16

# Cell metadata that Jupyter front ends add or change while a notebook is open.
UI_METADATA = ("collapsed", "scrolled", "execution", "ExecuteTime", "jupyter", "trusted")


def read(path: str | Path) -> NotebookNode:
    return nbformat.read(str(path), as_version=4)


def write(nb: NotebookNode, path: str | Path) -> None:
    """The one way notebooks are written here: nbformat's canonical JSON (sorted keys, indent 1)."""
    nbformat.validate(nb)
    Path(path).write_text(nbformat.writes(nb) + "\n", encoding="utf-8")


KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}  # the course's only kernel


def course_notebook(cells: list[NotebookNode]) -> NotebookNode:
    """A notebook of ``cells`` for the course's Python 3 kernel."""
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": dict(KERNELSPEC)})


def nbgrader_cell(kind: str, gid: str, source: str, points: int = 0) -> NotebookNode:
    """A code cell with nbgrader metadata: ``kind`` is "setup" (locked), "answer" or "test" (graded)."""
    m = {"grade": kind == "test", "grade_id": gid, "locked": kind != "answer", "schema_version": 3,
         "solution": kind == "answer", "task": False}
    if points:
        m["points"] = points
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": m})


def meta(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_answer(cell: NotebookNode) -> bool:
    return bool(meta(cell).get("solution"))


def is_test(cell: NotebookNode) -> bool:
    """A graded code cell that is not also an answer cell: nbgrader runs it and scores it."""
    m = meta(cell)
    return bool(m.get("grade")) and not m.get("solution")


def grade_id(cell: NotebookNode) -> str | None:
    return meta(cell).get("grade_id")


def max_points(nb: NotebookNode) -> float:
    """Points of all graded cells: the notebook's maximum score."""
    return float(sum(meta(c).get("points", 0) for c in nb.cells if meta(c).get("grade") or meta(c).get("task")))


def is_manual(cell: NotebookNode) -> bool:
    """A free-text answer: an answer cell that carries points. nbgrader leaves its score to a person."""
    m = meta(cell)
    return bool(m.get("grade") and m.get("solution"))


def auto_points(nb: NotebookNode) -> float:
    """The points the tests give (``max_points`` less the free-text answers a person grades)."""
    return max_points(nb) - float(sum(meta(c).get("points", 0) for c in nb.cells if is_manual(c)))


def cells_by_id(nb: NotebookNode) -> dict[str, NotebookNode]:
    return {grade_id(c): c for c in nb.cells if grade_id(c)}


# -- secret and public text ------------------------------------------------------------------


def split_regions(source: str, markers: tuple[str, str]) -> tuple[list[str], list[str], bool]:
    """(lines inside regions, lines outside, any region found); marker lines are in neither."""
    begin, end = markers
    inside, outside, found, open_ = [], [], False, False
    for line in source.split("\n"):
        if begin in line:
            open_, found = True, True
        elif end in line:
            open_ = False
        else:
            (inside if open_ else outside).append(line)
    return inside, outside, found


def secret_and_public(nb: NotebookNode) -> tuple[list[str], list[str]]:
    """All lines of a source notebook, split into what students must never see and what they do."""
    secret, public = [], []
    for cell in nb.cells:
        rest = [cell.source]
        for markers in MARKERS:
            hidden, shown, _ = split_regions("\n".join(rest), markers)
            secret += hidden
            rest = shown
        if is_answer(cell) and not split_regions(cell.source, SOLUTION)[2]:
            secret += rest  # an answer cell without markers is replaced as a whole
        else:
            public += rest
    return secret, public


def squash(text: str) -> str:
    """Collapse every run of whitespace to one space (HTML highlighting keeps the characters)."""
    return re.sub(r"\s+", " ", text).strip()


def secret_needles(nb: NotebookNode, min_chars: int = MIN_SECRET_CHARS) -> list[str]:
    """The secret lines worth searching for: long enough to be distinctive, and not shown to
    students anyway elsewhere in the same notebook (a solution line that is also part of the
    scaffolding or of a visible test, e.g. ``self.current_pos = 0`` in a public ``__init__``,
    reveals nothing)."""
    secret, public = secret_and_public(nb)
    shown = squash("\n".join(public))  # searched as a substring, exactly as the leak tests search
    needles = []
    for line in secret:
        s = squash(line)
        if len(s) >= min_chars and s not in shown and s not in needles:
            needles.append(s)
    return needles


# -- submissions -------------------------------------------------------------------------------


def fill_answers(released: NotebookNode, source: NotebookNode) -> NotebookNode:
    """The released notebook with every answer cell holding the instructor source's cell, verbatim
    (solution markers are comments: nbgrader ignores them at autograde, and wrong answers are
    written against exactly this text)."""
    solutions = cells_by_id(source)
    nb = copy.deepcopy(released)
    for cell in nb.cells:
        if is_answer(cell):
            cell.source = solutions[grade_id(cell)].source
    return nb


def load_wrong_answers(path: str | Path, name: str = "WRONG") -> dict:
    """The ``WRONG`` dict of a tests/wrong_answers/<stem>.py file: {name: [(grade_id, exact text,
    replacement), ...]} (see docs/COURSE_PIPELINE.md). Raises if the file does not load.
    ``name="RIGHT"`` reads tests/right_answers/<stem>.py, the same format."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"{name.lower()}_answers_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answers = getattr(module, name)
    if not isinstance(answers, dict):
        raise TypeError(f"{name} must be a dict, got {type(answers).__name__}")
    return answers


def apply_wrong(nb: NotebookNode, substitutions, name: str = "wrong answer") -> NotebookNode:
    """Apply one wrong answer: [(grade_id of an answer cell, exact text, replacement), ...].
    Every occurrence is replaced; text that does not occur is an error (the fixture has rotted)."""
    nb = copy.deepcopy(nb)
    cells = cells_by_id(nb)
    if not substitutions:
        raise ValueError(f"{name}: no substitutions")
    for item in substitutions:
        if not (isinstance(item, (tuple, list)) and len(item) == 3 and all(isinstance(x, str) for x in item)):
            raise ValueError(f"{name}: each substitution is (grade_id, exact_text, replacement), got {item!r}")
        gid, old, new = item
        cell = cells.get(gid)
        if cell is None or not is_answer(cell):
            answers = sorted(g for g, c in cells.items() if is_answer(c))
            raise ValueError(f"{name}: {gid!r} is not an answer cell; answer cells: {answers}")
        if not old or old not in cell.source:
            raise ValueError(f"{name}: the text {old!r} does not occur in answer cell {gid!r}")
        cell.source = cell.source.replace(old, new)
    return nb


# -- checks on an instructor source -------------------------------------------------------------


@dataclass
class CheckedBlock:
    line: int
    seconds: float | None  # None: not a number written in the cell


def checked_blocks(source: str) -> list[CheckedBlock]:
    """The outermost ``with grading.checked(seconds=N)`` blocks of a code cell."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))
    tree = ast.parse(code)
    found: list[CheckedBlock] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.With, ast.AsyncWith)):
                for item in child.items:
                    call = item.context_expr
                    if isinstance(call, ast.Call) and (getattr(call.func, "attr", None) == "checked"
                                                       or getattr(call.func, "id", None) == "checked"):
                        arg = next((k.value for k in call.keywords if k.arg == "seconds"),
                                   call.args[0] if call.args else ast.Constant(30.0))
                        value = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float)) else None
                        found.append(CheckedBlock(child.lineno, value))
                        break
                else:
                    visit(child)
            else:
                visit(child)

    visit(tree)
    return found


def lint(nb: NotebookNode, cell_timeout: float) -> list[str]:
    """Problems with an instructor source, as sentences; an empty list means it is fine."""
    problems = []
    kernel = nb.metadata.get("kernelspec", {})
    if kernel.get("name") != "python3" or kernel.get("language", "python") != "python":
        problems.append(f"kernelspec must be python3 (Python), got {kernel or 'none'}")
    seen: dict[str, int] = {}
    graded = 0
    for i, cell in enumerate(nb.cells):
        where = f"cell {i}"
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            problems.append(f"{where}: has outputs; commit sources without outputs")
        m = meta(cell)
        if not m:
            for markers in MARKERS:
                if split_regions(cell.source, markers)[2]:
                    problems.append(f"{where}: has a {markers[0]} region but no nbgrader metadata")
            continue
        gid = m.get("grade_id")
        where = f"cell {i} ({gid!r})"
        if not gid:
            problems.append(f"cell {i}: nbgrader cell without a grade_id")
        elif gid in seen:
            problems.append(f"{where}: grade_id used twice (also cell {seen[gid]})")
        else:
            seen[gid] = i
        if m.get("schema_version") != 3:
            problems.append(f"{where}: nbgrader schema_version must be 3")
        if m.get("grade") or m.get("task"):
            graded += 1
            points = m.get("points")
            if not isinstance(points, (int, float)) or points <= 0:
                problems.append(f"{where}: graded cell needs points > 0, got {points!r}")
        for markers, allowed, what in ((SOLUTION, m.get("solution"), "answer cells"),
                                       (HIDDEN, is_test(cell), "test cells"),
                                       (MARK_SCHEME, m.get("task"), "task cells")):
            inside, _, found = split_regions(cell.source, markers)
            if found and not allowed:
                problems.append(f"{where}: {markers[0]} regions belong in {what} only")
            opened = sum(markers[0] in line for line in cell.source.split("\n"))
            closed = sum(markers[1] in line for line in cell.source.split("\n"))
            if opened != closed:
                problems.append(f"{where}: {opened} {markers[0]} but {closed} {markers[1]}")
        if is_answer(cell) and m.get("locked"):
            problems.append(f"{where}: an answer cell must not be locked")
        if is_test(cell):
            if not m.get("locked"):
                problems.append(f"{where}: a test cell must be locked")
            if cell.cell_type != "code":
                problems.append(f"{where}: a test cell must be a code cell")
                continue
            try:
                blocks = checked_blocks(cell.source)
            except SyntaxError as e:
                problems.append(f"{where}: does not parse: {e}")
                continue
            if not blocks:
                problems.append(f"{where}: wrap the test in `with grading.checked(seconds=N):`")
            elif any(b.seconds is None for b in blocks):
                problems.append(f"{where}: grading.checked(seconds=N) needs a number written in the cell")
            elif sum(b.seconds for b in blocks) >= cell_timeout:
                problems.append(f"{where}: grading.checked limits add up to {sum(b.seconds for b in blocks):g} s, "
                                f"not below the per-cell kernel timeout of {cell_timeout:g} s")
    if not graded:
        problems.append("no graded cell")
    return problems


# -- comparing releases -------------------------------------------------------------------------


def normalized(nb: NotebookNode) -> dict:
    """What must agree between two releases: the notebook metadata and, per cell, the type, the
    source, the metadata (nbgrader's, checksums included; front-end UI state dropped), outputs and
    attachments. Cell ids are left out: they carry no content."""
    cells = []
    for cell in nb.cells:
        c = {"cell_type": cell.cell_type, "source": cell.source,
             "metadata": {k: v for k, v in cell.get("metadata", {}).items() if k not in UI_METADATA}}
        if cell.cell_type == "code":
            c["outputs"] = cell.get("outputs", [])
            c["execution_count"] = cell.get("execution_count")
        if "attachments" in cell:
            c["attachments"] = cell.attachments
        cells.append(c)
    return {"nbformat": nb.nbformat, "metadata": dict(nb.metadata), "cells": cells}


def describe_difference(expected: NotebookNode, actual: NotebookNode) -> str:
    """A short, readable account of how two notebooks differ (for test failures)."""
    a, b = normalized(expected), normalized(actual)
    out = []
    if a["metadata"] != b["metadata"]:
        out.append(f"notebook metadata: {b['metadata']} != {a['metadata']}")
    if len(a["cells"]) != len(b["cells"]):
        out.append(f"{len(b['cells'])} cells, expected {len(a['cells'])}")
    for i, (x, y) in enumerate(zip(a["cells"], b["cells"])):
        if x != y:
            keys = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
            gid = x["metadata"].get("nbgrader", {}).get("grade_id", "")
            out.append(f"cell {i} {gid!r}: {', '.join(keys)} differ")
    return "; ".join(out[:8]) or "no difference"
