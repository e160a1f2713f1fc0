"""Helpers the notebooks' graded test cells use. Student code is untrusted: everything here fails
with a plain ``AssertionError`` that tells the student what was expected, and writes nothing to
stderr (nbgrader scores a cell with any stderr output as zero).

    with grading.checked(seconds=20):                       # time limit + silence warnings
        grading.assert_close(student_logits, ref_logits, atol=1e-5, what="logits")
        with grading.RowCounter(model_linears) as rows:      # deterministic work measure
            ...
        grading.assert_faster(fast, slow, at_least=3.0)     # best-of-k wall clock ratio
        with grading.forbid(kvref.generate):                  # student must not call the reference
            student_generate(...)
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import signal
import sys
import time
import warnings
from typing import Callable, Iterable, Iterator

import torch
import torch.nn as nn


class GradingTimeout(AssertionError):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail with a clear message if the block runs longer than ``seconds`` (main thread, Unix)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise GradingTimeout(f"this check took longer than {seconds:g} s; look for a loop that never ends "
                             f"or work repeated on every step")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def checked(seconds: float = 30.0) -> Iterator[None]:
    """Everything a graded cell needs: a time limit, warnings silenced, stray stderr swallowed."""
    err = io.StringIO()
    with time_limit(seconds), warnings.catch_warnings(), contextlib.redirect_stderr(err):
        warnings.simplefilter("ignore")
        yield


def assert_close(actual, expected, atol: float = 1e-5, rtol: float = 0.0, what: str = "output") -> None:
    """Tensors have the same shape and agree within ``atol + rtol * |expected|`` everywhere."""
    if not isinstance(actual, torch.Tensor):
        raise AssertionError(f"{what}: expected a torch.Tensor, got {type(actual).__name__}")
    expected = torch.as_tensor(expected)
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if not torch.isfinite(a).all():
        raise AssertionError(f"{what}: contains NaN or inf")
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    if (err > bound).any():
        worst = int(err.argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), err.shape))
        raise AssertionError(f"{what}: max difference {err.max().item():.3g} at index {idx} "
                             f"exceeds the tolerance {atol:g} (+ {rtol:g} relative)")


def assert_equal(actual, expected, what: str = "value") -> None:
    """Exact equality for tokens, counts, shapes and plain numbers."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or not torch.equal(
                actual.cpu(), expected.cpu()):
            shown = tuple(actual.shape) if isinstance(actual, torch.Tensor) else type(actual).__name__
            raise AssertionError(f"{what}: differs from the expected tensor of shape {tuple(expected.shape)} "
                                 f"(got {shown})")
    elif actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")


class RowCounter:
    """Count the rows (tokens) that pass through some linear layers: the K/V work actually done.

    Hooks are removed on exit, whatever the student code did.
    """

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        self.layers = list(layers)
        if not self.layers:
            raise AssertionError("RowCounter needs at least one layer to watch")
        self.rows = 0
        self._hooks: list = []

    def _hook(self, module, inputs, output) -> None:
        x = inputs[0]
        self.rows += x.numel() // x.shape[-1]  # every leading index is one token's row

    def __enter__(self) -> "RowCounter":
        self._hooks = [m.register_forward_hook(self._hook) for m in self.layers]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self.rows //= len(self.layers)  # per watched layer


def best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    """Fastest of ``repeats`` runs, in seconds (noise only ever makes a run slower)."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def speedup(fast: Callable[[], object], slow: Callable[[], object], repeats: int = 5) -> float:
    """Best-of-k time of ``slow`` over best-of-k time of ``fast``, runs interleaved (A B A B ...)."""
    fast(), slow()  # warm up both
    t_fast = t_slow = float("inf")
    for _ in range(repeats):
        t_slow = min(t_slow, best_time(slow, 1))
        t_fast = min(t_fast, best_time(fast, 1))
    return t_slow / t_fast


def assert_faster(fast: Callable[[], object], slow: Callable[[], object], at_least: float, repeats: int = 5,
                  what: str = "the cached version") -> float:
    """The ratio is generous on purpose: a correct solution is many times faster than ``at_least``."""
    ratio = speedup(fast, slow, repeats)
    if ratio < at_least:
        raise AssertionError(f"{what} is only {ratio:.2f}x faster than the baseline; expected at least "
                             f"{at_least:g}x. Is work repeated on every step?")
    return ratio


def _resolve(target: str) -> tuple[object, str]:
    module_name, _, attr = target.rpartition(".")
    try:
        return importlib.import_module(module_name), attr
    except ModuleNotFoundError:  # "package.Class.method"
        mod_name, _, cls = module_name.rpartition(".")
        return getattr(importlib.import_module(mod_name), cls), attr


@contextlib.contextmanager
def forbid(*targets: str) -> Iterator[None]:
    """While the block runs, calling any of ``targets`` (dotted names such as
    ``"kvref.generate"`` or ``"kvref.cache.StaticCache.update"``) fails: the student's function
    must do its own work rather than call the reference it is compared to. Names the notebook
    imported directly (``from kvref import generate``) are blocked too."""
    saved: list[tuple[object, str, object]] = []
    for target in targets:
        owner, attr = _resolve(target)
        original = getattr(owner, attr)

        def refuse(*args, _name=target, **kwargs):
            raise AssertionError(f"your code called {_name}; write this part yourself")

        places = [(owner, attr)]
        for ns in (sys.modules.get("kvref"), sys.modules.get("__main__")):
            for name, value in list(vars(ns).items()) if ns is not None else []:
                if value is original and (ns, name) != (owner, attr):
                    places.append((ns, name))
        for obj, name in places:
            saved.append((obj, name, original))
            setattr(obj, name, refuse)
    try:
        yield
    finally:
        for obj, name, original in reversed(saved):
            setattr(obj, name, original)
