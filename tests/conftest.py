"""Shared fixtures: tiny seeded models (fast on 2 CPU cores) and the device list.

CUDA cases are collected everywhere and skip cleanly when no GPU is present.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

import kvref

# The autograder remembers passed canaries and course set-ups (autograder/grade/remember.py), by default in
# ~/.cache. The tests keep them in a folder of their own run (shared by its xdist workers), so a run never
# reads what an earlier run left and never writes to the user's home.
os.environ.setdefault("KVREF_CANARY_CACHE", os.path.join(
    tempfile.gettempdir(), f"kvref-canary-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """Under `make test` (pytest-xdist, `--dist loadgroup`) the tests run in groups, one group at a time per
    worker: every test that reads the built book in one group (the book is built once, by that worker), every
    other test with the rest of its file (a file's module fixtures, e.g. a graded class, are made once)."""
    for item in items:
        group = "built_book" if "built_book" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


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
