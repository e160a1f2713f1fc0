"""One full book build per test session, shared by every test that looks at the built HTML.

A test module uses it with `from book_build import built_book  # noqa: F401` and a `built_book` argument.
The build runs exactly what `make book` runs (warnings as errors), into a temporary folder, with the
environment running the tests. It takes minutes, so it is done once: pytest keeps a separate session
fixture per importing module, and the module-level memo below makes them share the one build. Under
pytest-xdist (`make test` runs two workers) the workers share it too: the first to need the book builds it
into the run's common temporary folder, holding a file lock; the others wait for the lock and read the result.
"""

from __future__ import annotations

import fcntl
import json
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


def shared_build(folder: Path) -> BookBuild:
    """The book built once into `folder` by whichever process gets there first (the others wait, then read)."""
    folder.mkdir(parents=True, exist_ok=True)
    result = folder / "result.json"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not result.is_file():
            b = build_book(folder / "build")
            result.write_text(json.dumps({"returncode": b.returncode, "stdout": b.stdout, "log": b.log}))
        saved = json.loads(result.read_text())
    return BookBuild(saved["returncode"], saved["stdout"], saved["log"], folder / "build" / "_build" / "html")


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> BookBuild:
    if "book" not in _memo:
        if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp is <run>/popen-gwN: <run> is common to the workers
            _memo["book"] = shared_build(tmp_path_factory.getbasetemp().parent / "book")
        else:
            _memo["book"] = build_book(tmp_path_factory.mktemp("book"))
    return _memo["book"]
