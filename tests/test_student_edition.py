"""The student edition (autograder/student.py) and installing kvref outside the repository.

- The edition holds no solutions/, no tests/, and no solution or hidden-test line anywhere (the
  leak search itself is shown to find a planted hidden line, so it can fail).
- A fresh virtual environment made from the edition alone (its own kvref and autograder; the
  third-party packages from this environment's site-packages through a .pth file, so no download)
  runs a notebook filled with correct answers through `python -m autograder check`: every visible
  test passes.
- `pip install .` of a copy of the package files, outside the checkout, into a fresh venv installs
  everything kvref imports (torch resolves to the pinned CPU build here) and loads kvref.tiny_model().
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import nbformat
import pytest

from autograder.shared import notebooks as nbs
from autograder.student import build_edition, leaks

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "03_memory"  # the cheapest chapter to run (the hostile batch grades it too)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("edition") / "student"
    assert build_edition(dest, say=lambda m: None) == 0
    return dest


def test_edition_has_what_a_student_needs_and_nothing_else(edition):
    top = sorted(p.name for p in edition.iterdir())
    for needed in ("notebooks", "kvref", "autograder", "requirements.txt", "pyproject.toml", "README.md",
                   "Makefile", "nbgrader_config.py", ".gitignore"):
        assert needed in top, top
    assert "solutions" not in top and "tests" not in top and not list(edition.rglob("wrong_answers"))
    assert sorted(p.name for p in (edition / "notebooks").glob("*.ipynb")) == sorted(
        p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert edition.with_suffix(".zip").is_file()
    reqs = (edition / "requirements.txt").read_text()
    assert "jupyterlab==" in reqs and "torch==" in reqs and "jupyter-book" not in reqs
    readme = (edition / "README.md").read_text()
    assert "make check NB=" in readme and "Validate" in readme and "make venv" in readme


# The import names of the packages the edition leaves out (and of what only they pull in: Sphinx, myst-nb).
DROPPED_IMPORTS = ("jupyter_book", "jupytext", "pytest", "_pytest", "xdist", "pypdf", "sphinx_intl", "jieba",
                   "transformers", "matplotlib", "sphinx", "myst_nb")


def test_student_requirements_are_what_the_notebooks_need(edition):
    """The edition's requirements leave out the book's, the tests' and the instructor's packages (issue 38: a
    student's `make venv` installs only what the student edition needs), and every import of every notebook, and
    `make check`'s grader, load with those packages made unimportable."""
    names = {line.split("==")[0] for line in (edition / "requirements.txt").read_text().split()}
    assert {"torch", "nbgrader", "jupyterlab", "ipykernel", "ipywidgets", "numpy", "safetensors", "tqdm"} <= names
    assert not names & {"transformers", "matplotlib", "jupyter-book", "pytest", "pytest-xdist", "sphinx-intl"}, names
    assert (edition / "scripts" / "torch_cpu.py").is_file() and "scripts/torch_cpu.py" in (edition / "Makefile").read_text()
    imports = set()
    for path in sorted((edition / "notebooks").glob("*.ipynb")):
        for cell in nbs.read(path).cells:
            if cell.cell_type == "code":
                imports |= {ast.unparse(n) for n in ast.walk(ast.parse(cell.source))
                            if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert any("kvref" in line for line in imports), imports
    code = ("import importlib.abc, sys\n"
            f"BLOCKED = {DROPPED_IMPORTS!r}\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in BLOCKED:\n"
            "            raise ImportError(f'{name} is not in the student edition')\n"
            "sys.meta_path.insert(0, Block())\n"
            + "".join(f"{line}\n" for line in sorted(imports))
            + "import kvref, autograder.check, autograder.__main__\n"
            "assert kvref.__file__.startswith(sys.argv[1]), kvref.__file__\n"
            "print('imported', len(sys.modules), 'modules')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    p = subprocess.run([sys.executable, "-c", code, str(edition)], capture_output=True, text=True, cwd=edition,
                       env=dict(env, PYTHONPATH=str(edition)), timeout=300)
    assert p.returncode == 0 and "imported" in p.stdout, p.stderr[-3000:]


def test_edition_has_no_solution_or_hidden_test(edition, tmp_path):
    sources = sorted((ROOT / "solutions").glob("*.ipynb"))
    assert leaks(edition, sources) == []
    # The search can fail: a hidden test line planted in a copy is found.
    copy = tmp_path / "copy"
    shutil.copytree(edition, copy)
    from autograder.student import hidden_needles

    line = sorted(hidden_needles(nbs.read(ROOT / "solutions" / f"{CHAPTER}.ipynb")))[0]
    (copy / "kvref" / "planted.py").write_text(f"# {line}\n")
    assert any("planted.py" in f and "hidden test" in f for f in leaks(copy, sources))


def test_fresh_venv_from_the_edition_passes_visible_tests(edition, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Third-party packages from this environment, never this checkout (no PYTHONPATH, no editable kvref).
    Path(site, "course-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    alembic = env_dir / "bin" / "alembic"  # the console script pip would have written (nbgrader runs it)
    alembic.write_text(f"#!/bin/sh\nexec {py} -m alembic \"$@\"\n")
    alembic.chmod(0o755)
    (env_dir / "share").mkdir(exist_ok=True)  # the data files pip would have installed (nbconvert's templates)
    (env_dir / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter")
    work = tmp_path / "clone"
    shutil.copytree(edition, work)
    source = nbs.read(ROOT / "solutions" / f"{CHAPTER}.ipynb")
    filled = nbs.fill_answers(nbs.read(work / "notebooks" / f"{CHAPTER}.ipynb"), source)
    (work / "notebooks" / f"{CHAPTER}.ipynb").write_text(nbformat.writes(filled))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run([str(py), "-c", "import kvref, autograder; print(kvref.__file__, autograder.__file__)"],
                           capture_output=True, text=True, cwd=work, env=env, check=True).stdout
    assert str(ROOT) not in where and str(work) in where, where  # the edition's own packages
    p = subprocess.run([str(py), "-m", "autograder", "check", f"notebooks/{CHAPTER}.ipynb"], capture_output=True,
                       text=True, cwd=work, env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "[FAIL]" not in p.stdout and "visible tests pass" in p.stdout, p.stdout[-2000:]


def test_pip_install_outside_the_checkout(tmp_path):
    """What `pip install .` (or a git URL) gives a fresh venv: everything kvref imports."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, src / name)
    shutil.copytree(ROOT / "kvref", src / "kvref", ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # --no-compile: this throwaway venv imports torch once; compiling every file of it would cost ~25 s more
    p = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-compile", str(src)], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    code = ("import kvref, torch; m = kvref.tiny_model(); "
            "print(kvref.__file__); print(torch.__version__); print(sum(x.numel() for x in m.parameters()))")
    p = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    path, version, params = p.stdout.split()
    assert str(ROOT) not in path and "site-packages" in path
    assert "cu" not in version.split("+")[-1], version  # not a CUDA build
    assert int(params) > 0
