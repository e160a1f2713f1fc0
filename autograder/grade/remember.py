"""What a grading run remembers from the last one, so that it is not done again: the canary's verdicts and the
course set-up, each under a key of everything that decides it.

    canary_cache()                     # the folder: $KVREF_CANARY_CACHE, else ~/.cache/kvref-autograder/canary
    canary_key(grader, stem, source)   # the solution, its release, settings, isolation, threads, the code
    build_course(base, sources)        # source/, release/, gradebook.db: generated, or copied from courses/

``KVREF_CANARY_CACHE=off`` remembers nothing. The canary's use of the key (never remembering a failure) is in
``batch.run_canary``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import nbformat

from autograder.shared import notebooks
from autograder.grade.course import ROOT, Course
from autograder.grade.grading import Grader

VERSION = "2"  # part of every cache key (also batch's results cache): bump when grading changes meaning


CANARY_CACHE = "KVREF_CANARY_CACHE"  # a folder for the canary's verdicts; 0/off: grade the canary every run


def canary_cache() -> Path | None:
    """Where passed canaries are remembered across runs (None: nowhere): $KVREF_CANARY_CACHE, else
    $XDG_CACHE_HOME/kvref-autograder/canary (~/.cache when unset)."""
    value = os.environ.get(CANARY_CACHE, "")
    if value.lower() in ("0", "off", "no"):
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvref-autograder" / "canary"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of everything besides the solution that decides the canary's score: the course
    package and the grader (every .py file, the nbgrader settings among them), the interpreter and the
    versions of nbgrader, nbclient, ipykernel and torch."""
    from importlib.metadata import version

    pins = " ".join(f"{p}=={version(p)}" for p in ("nbgrader", "nbclient", "ipykernel", "torch"))
    h = hashlib.sha256(f"{sys.executable}\n{VERSION}\n{pins}\n".encode())
    for folder in ("kvref", "autograder"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def canary_key(grader: Grader, stem: str, source: Path) -> str:
    """The canary's cache key: the solution, the release, the settings, the isolation, the threads
    per kernel and ``code_fingerprint``. A changed bit anywhere grades the canary again."""
    release = json.dumps(notebooks.normalized(grader.releases[stem]), sort_keys=True)  # cell ids left out
    parts = [source.read_bytes(), release.encode(), grader.settings.key().encode(),
             grader.isolation.encode(), str(grader.threads).encode(), code_fingerprint().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


KEPT_COURSES = 4  # course set-ups remembered (the newest); each is a few MB


def build_course(base: Path, sources: dict[str, Path]) -> dict[str, nbformat.NotebookNode]:
    """The course directory in ``base`` (source/, release/ and gradebook.db, by nbgrader's
    generate_assignment of every chapter); {stem: release}. A set-up made before from the same
    solutions and code (``code_fingerprint``) is copied from the cache folder's ``courses/``
    instead of generated again."""
    cache = canary_cache()
    h = hashlib.sha256(code_fingerprint().encode())
    for stem in sorted(sources):
        h.update(stem.encode() + b"\0" + Path(sources[stem]).read_bytes() + b"\0")
    kept = cache / "courses" / h.hexdigest()[:32] if cache is not None else None
    if kept is not None and (kept / "complete").is_file():
        shutil.copytree(kept, base, ignore=shutil.ignore_patterns("complete"), dirs_exist_ok=True)
        os.utime(kept)  # recently used: kept longest
        return {stem: notebooks.read(base / "release" / stem / f"{stem}.ipynb") for stem in sorted(sources)}
    course = Course(base, sources)
    releases = {stem: course.generate(stem) for stem in sorted(sources)}
    if kept is not None:
        try:
            tmp = kept.parent / f".{kept.name}.{os.getpid()}"
            shutil.copytree(base, tmp, ignore=shutil.ignore_patterns("exchange"))
            (tmp / "complete").write_text("")
            tmp.rename(kept)
            old = sorted(kept.parent.iterdir(), key=lambda p: p.stat().st_mtime)[:-KEPT_COURSES]
            for folder in old:
                if not folder.name.startswith("."):
                    shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            shutil.rmtree(kept.parent / f".{kept.name}.{os.getpid()}", ignore_errors=True)  # not remembered
    return releases
