"""One full book build per test session, shared by every test that looks at the built HTML.

A test module uses it with `from book_build import built_book  # noqa: F401` and a `built_book` argument.
The build runs exactly what `make book` runs (warnings as errors), into a temporary folder, with the
environment running the tests. It takes minutes, so it is done once: pytest keeps a separate session
fixture per importing module, and the module-level memo below makes them share the one build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BookBuild:
    returncode: int
    stdout: str
    log: str  # stdout + stderr
    html: Path  # <build dir>/_build/html


_memo: dict[str, BookBuild] = {}


def build_book(build_dir: Path) -> BookBuild:
    make = shutil.which("make")
    assert make, "GNU make is needed to build the book"
    bindir = Path(sys.executable).parent
    jupyter_book = bindir / "jupyter-book"
    assert jupyter_book.exists(), f"jupyter-book is not installed next to {sys.executable}"
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    # `-o .venv/.installed`: use the environment running this test; never (re)create .venv here.
    cmd = [make, "-C", str(ROOT), "--no-print-directory", "-o", ".venv/.installed", "book",
           f"BUILD_DIR={build_dir}", f"JUPYTER_BOOK={jupyter_book}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    return BookBuild(proc.returncode, proc.stdout, proc.stdout + proc.stderr, build_dir / "_build" / "html")


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> BookBuild:
    if "book" not in _memo:
        _memo["book"] = build_book(tmp_path_factory.mktemp("book"))
    return _memo["book"]
