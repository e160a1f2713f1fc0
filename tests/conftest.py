"""Shared fixtures: tiny seeded models (fast on 2 CPU cores) and the device list.

CUDA cases are collected everywhere and skip cleanly when no GPU is present.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

# torch.compile's inductor compiles in a pool of worker processes, each importing torch: on 2 busy cores the pool
# costs more CPU than it saves (tests/test_compiled_decode.py: 33 s of CPU with the pool, 18 s without). Set before
# torch loads; the kernels and the book build the tests start inherit it.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

import kvref

# One intra-op thread per test process: `make test` runs two workers on two cores, the models here are tiny (a
# thread's start-up costs more than it saves) and two workers' OpenMP threads, which spin while they wait, slow
# each other down many times over when the cores are oversubscribed (an engine test: 1 s alone, 25 s beside a
# busy worker). The kernels and scripts the tests start inherit the same (unless the caller set it); tests about
# threads set their own.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The autograder remembers passed canaries and course set-ups (autograder/grade/remember.py), by default in
# ~/.cache. The tests keep them in a folder of their own run (shared by its xdist workers), so a run never
# reads what an earlier run left and never writes to the user's home.
os.environ.setdefault("KVREF_CANARY_CACHE", os.path.join(
    tempfile.gettempdir(), f"kvref-canary-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"))


# The order in which the two workers of `make test` take the groups (pytest-xdist `--dist loadgroup` with
# `--no-loadscope-reorder`: a worker that runs low on tests takes the next group of the collection). The book build
# (its pages two at a time, ~7 min beside the other worker) and the graded class go first, one to each worker; the
# files that take longest next, so that short ones fill the ends; the tests that read the built book last, one
# group per file, so that either worker can take them once the book is there (a worker that gets there first
# waits on the build's lock).
BOOK_BUILD = "tests/test_book_offline.py"  # its tests that read the book are the group that builds it
# Then the answers graded in-process (one core, minutes): the first worker to finish its group takes them, while
# the other still runs the book's kernels or nbgrader's.
FIRST = [BOOK_BUILD + "@built_book", "tests/test_pipeline.py", "tests/test_pipeline.py@inprocess"]
SLOW_FILES = ["tests/test_slurm.py", "tests/test_warm_kernels.py", "tests/test_autograder_hostile.py",
              "tests/test_mutants.py", "tests/test_serve_hybrid.py", "tests/test_grading.py",
              "tests/test_student_edition.py", "tests/test_course_loop.py", "tests/test_i18n.py"]
BOOK_READERS = ["tests/test_pdf.py", "tests/test_i18n.py", "tests/test_pipeline.py", "tests/test_book_pages.py"]


def xdist_group_of(item) -> str:
    """The xdist group of a test: its file, or '<file>@built_book' for a test that reads the built book, or
    '<file>@inprocess' for one that reads the answers graded in-process (test_pipeline.py)."""
    path = item.nodeid.split("::")[0]
    fixtures = getattr(item, "fixturenames", ())
    for fixture in ("built_book", "inprocess"):
        if fixture in fixtures:
            return f"{path}@{fixture}"
    return path


def group_rank(group: str) -> tuple[int, int]:
    if group in FIRST:
        return 0, FIRST.index(group)
    path, _, book = group.partition("@")
    if book == "built_book":
        return 3, BOOK_READERS.index(path) if path in BOOK_READERS else len(BOOK_READERS)
    return (1, SLOW_FILES.index(path)) if path in SLOW_FILES else (2, 0)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Under `make test` (pytest-xdist, `--dist loadgroup`) the tests run in groups, one group at a time per
    worker: a file's tests together (its module fixtures, e.g. a graded class, are made once), those of a file
    that read the built book apart from the rest; the groups in the order above (a stable sort: the collection's
    order within each rank)."""
    groups = {item.nodeid: xdist_group_of(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: group_rank(groups[item.nodeid]))


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def tiny_config(arch: str = "llama", n_kv_heads: int | None = None, **kw) -> kvref.ModelConfig:
    """Two layers, four heads of 16 dims: big enough for GQA/MQA, small enough to run in milliseconds."""
    base = dict(arch=arch, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, d_model=64, vocab_size=256, max_seq_len=96)
    base.update(kw)
    return kvref.ModelConfig(**base)


def tiny_model(cfg: kvref.ModelConfig, device: str = "cpu", seed: int = 0, std: float = 0.2) -> kvref.Transformer:
    """Random weights with a larger spread than the default init (0.02), so that greedy decoding
    does not collapse onto one repeated token and a wrong cache changes the chosen tokens."""
    torch.manual_seed(seed)
    model = kvref.Transformer(cfg, device=device).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    return model


# (arch, n_kv_heads): MHA for both architectures, GQA and MQA for the Llama family.
ATTENTION_KINDS = [("gpt2", None), ("llama", None), ("llama", 2), ("llama", 1)]


def require_tool(what: str, commands: tuple[str, ...], install: str, need_all: bool = True) -> None:
    """Skip when a prerequisite that only some tests need (Chromium, Slurm) is missing: every such test skips
    with the same one line (pytest -ra groups skips raised here by their reason). Under CI (CI set; .ci/run
    installs them) a missing one is a failure. `need_all=False`: any one of `commands` will do."""
    missing = [c for c in commands if shutil.which(c) is None]
    if not missing or (not need_all and len(missing) < len(commands)):
        return
    message = f"{what} is not installed ({', '.join(missing)} not on PATH): {install}"
    if os.environ.get("CI"):
        pytest.fail(f"CI: .ci/run installs the tests' prerequisites, yet {message}")
    pytest.skip(message)
