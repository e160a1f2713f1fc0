"""The student edition: what a student clones or downloads, and nothing an instructor keeps.

    make student        # or: python -m autograder student --dest _build/student

writes ``_build/student/`` and ``_build/student.zip``:

    notebooks/NN_topic.ipynb   the released notebooks (no solutions, no hidden tests)
    kvref/                     the package the notebooks import
    autograder/                the grader's code, for ``make check`` (no instructor sources)
    pyproject.toml, requirements.txt, environment.yml   pinned set-up (only what a student needs)
    scripts/torch_cpu.py       `make venv` installs the CPU build of torch with it
    nbgrader_config.py         widens nbgrader's Validate output
    Makefile, README.md, .gitignore

The folder works as a GitHub Classroom template repository as it is (commit it to a new
repository and mark it as a template). After copying, every file is searched for each secret line
of every instructor source (solution lines and hidden tests, ``notebooks.secret_needles``): one
found stops the build.
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from autograder.shared import notebooks
from autograder.grade.course import ROOT
from autograder.record.results import Say, _stderr

TEMPLATE = ROOT / "docs" / "student"  # README.md and Makefile of the edition
INSTRUCTOR_ONLY_MODULES = {"bench.py"}  # grades synthetic classes from solutions/
# What only the book build, the test suite and the instructor's tools use: a student's `make venv` skips them (the
# notebooks, kvref's modules they import and `make check` need none of them; tests/test_student_edition.py checks it).
DROPPED_REQUIREMENTS = ("jupyter-book", "jupytext", "pytest", "pytest-xdist", "pypdf", "sphinx-intl", "jieba",
                        "transformers", "matplotlib")


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


def _requirements(text: str) -> str:
    keep = [line for line in text.splitlines()
            if not any(line.strip().startswith(name + "==") for name in DROPPED_REQUIREMENTS)]
    return "\n".join(keep) + "\n"


REFERENCE = "kvref"  # the published reference package: see ``leaks``


def hidden_needles(nb: notebooks.NotebookNode) -> set[str]:
    """The secret lines that come from hidden tests or mark schemes (not from solutions)."""
    inside = set()
    for cell in nb.cells:
        for markers in (notebooks.HIDDEN, notebooks.MARK_SCHEME):
            inside |= {notebooks.squash(line) for line in notebooks.split_regions(cell.source, markers)[0]}
    return {n for n in notebooks.secret_needles(nb) if n in inside}


def leaks(folder: Path, sources: list[Path]) -> list[str]:
    """'file: line' for every secret line of ``sources`` found in a file under ``folder``.

    Hidden tests are searched in every file. Solution lines are searched in every file except the
    reference package ``kvref/``: it is the published implementation the notebooks compare the
    student's code against (and forbid calling), so some of its lines are necessarily the same as
    a solution's (a reference count going up, say)."""
    needles: dict[str, tuple[str, bool]] = {}
    for src in sources:
        nb = notebooks.read(src)
        hidden = hidden_needles(nb)
        for n in notebooks.secret_needles(nb):
            needles.setdefault(n, (src.name, n in hidden))
    found = []
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.suffix in (".safetensors", ".zip"):
            continue
        rel = p.relative_to(folder)
        text = notebooks.squash(p.read_text(encoding="utf-8", errors="replace"))
        for n, (src, hidden) in needles.items():
            if n in text and (hidden or rel.parts[0] != REFERENCE):
                found.append(f"{rel}: {n[:80]!r} ({'hidden test' if hidden else 'solution'} of {src})")
    return found


def build_edition(dest: Path = ROOT / "_build" / "student", root: Path = ROOT, say: Say = _stderr) -> int:
    """Write the edition into ``dest`` (replaced) and ``dest``.zip. Returns an exit status."""
    dest = Path(dest).resolve()
    if dest == root or root in dest.parents and dest.parent == root:
        say(f"error: --dest {dest} would overwrite the repository; use a folder such as _build/student")
        return 2
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    (dest / "notebooks").mkdir()
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        shutil.copyfile(nb, dest / "notebooks" / nb.name)
    _copy_tree(root / "kvref", dest / "kvref")
    (dest / "autograder").mkdir()
    for p in sorted((root / "autograder").rglob("*.py")):  # the stage folders keep their place
        if p.name not in INSTRUCTOR_ONLY_MODULES and "__pycache__" not in p.parts:
            (dest / p.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dest / p.relative_to(root))
    for name in ("pyproject.toml", "nbgrader_config.py"):
        shutil.copyfile(root / name, dest / name)
    (dest / "scripts").mkdir()
    shutil.copyfile(root / "scripts" / "torch_cpu.py", dest / "scripts" / "torch_cpu.py")  # the CPU build of torch
    (dest / "requirements.txt").write_text(_requirements((root / "requirements.txt").read_text()))
    env = (root / "environment.yml").read_text()
    (dest / "environment.yml").write_text("\n".join(
        l for l in env.splitlines() if not any(f"- {n}==" in l for n in DROPPED_REQUIREMENTS)) + "\n")
    for name in ("README.md", "Makefile"):
        shutil.copyfile(TEMPLATE / name, dest / name)
    (dest / ".gitignore").write_text(".venv/\n__pycache__/\n.ipynb_checkpoints/\n*.egg-info/\n")
    found = leaks(dest, sorted((root / "solutions").glob("*.ipynb")))
    if found:
        say("error: the student edition would contain instructor-only lines:\n  " + "\n  ".join(found[:20]))
        return 1
    archive = dest.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(dest.rglob("*")):
            if p.is_file():
                z.write(p, f"kvcache-course/{p.relative_to(dest).as_posix()}")
    count = sum(1 for p in dest.rglob("*") if p.is_file())
    say(f"wrote {dest} ({count} files) and {archive}")
    return 0
