"""Helpers the notebooks' graded test cells use. Student code is untrusted: everything here fails
with a plain ``AssertionError`` that tells the student what was expected, and writes nothing to
stderr (nbgrader scores a cell with any stderr output as zero).

    with grading.checked(seconds=20):                       # time limit + silence warnings
        grading.assert_close(student_logits, ref_logits, atol=1e-5, what="logits")
        with grading.RowCounter(model_linears) as rows:      # deterministic work measure
            ...
        grading.assert_faster(fast, slow, at_least=3.0)     # best-of-k wall clock ratio
        with grading.forbid("kvref.generate"):                # student must not call the reference
            student_generate(...)
        with grading.raises(ValueError, mentions=(5, 4), what="a 5th row in a cache of 4"):
            cache.update(...)                                 # the error, and the numbers its message gives
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable, Iterable, Iterator

import torch
import torch.nn as nn


class GradingTimeout(AssertionError):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail with a clear message if the block runs longer than ``seconds``.

    Uses SIGALRM (Unix, main thread: where a notebook kernel runs cells); elsewhere the block
    runs without a limit and nbgrader's per-cell timeout is the only guard. The alarm repeats
    every second until the block exits, so student code that swallows the first
    ``GradingTimeout`` (``except Exception: pass`` in a loop) is interrupted again. Nested limits
    work: the outer one keeps counting while the inner one runs.
    """
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise GradingTimeout(f"this check took longer than {seconds:g} s; look for a loop that never ends "
                             f"or work repeated on every step")

    start = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    outer_left, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer_left > 0:  # an enclosing limit was running: give it back what is left of its time
            left = outer_left - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer_interval)


@contextlib.contextmanager
def _quiet_fd(fd: int) -> Iterator[None]:
    """Send what C code writes to file descriptor ``fd`` (torch's C++ warnings, OpenMP) to a
    temporary file for the duration; a notebook kernel would show it as stderr output."""
    try:
        saved = os.dup(fd)
    except OSError:  # no such descriptor (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        for stream in (sys.__stderr__, sys.__stdout__):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.__stderr__.flush()
            os.dup2(saved, fd)
            os.close(saved)


@contextlib.contextmanager
def checked(seconds: float = 30.0) -> Iterator[None]:
    """Everything a graded cell needs: a time limit, warnings silenced, stray stderr swallowed.

    Silenced while the block runs: Python warnings, anything written to ``sys.stderr``, log
    records (loggers whose handlers hold the original stderr, e.g. transformers'), and C-level
    writes to file descriptor 2. Errors still propagate: a failing check fails the cell.
    """
    err = io.StringIO()
    previous_disable = logging.root.manager.disable
    # The time limit is innermost: its alarm is off before anything else is restored.
    with warnings.catch_warnings(), _quiet_fd(2), contextlib.redirect_stderr(err):
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            with time_limit(seconds):
                yield
        finally:
            logging.disable(previous_disable)


def assert_close(actual, expected, atol: float = 1e-5, rtol: float = 0.0, what: str = "output",
                 axes: tuple[str, ...] | None = None) -> None:
    """Tensors have the same shape and agree within ``atol + rtol * |expected|`` everywhere (the
    message names the worst index, each axis by name when ``axes`` gives one per dimension)."""
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
        raise AssertionError(f"{what}: max difference {err.max().item():.3g} at {_where(idx, axes)} "
                             f"exceeds the tolerance {atol:g} (+ {rtol:g} relative)")


def _where(idx: tuple[int, ...], axes: tuple[str, ...] | None) -> str:
    """``index (0, 8, 0)``, or with the axes named, ``(head 0, token 8, dim 0)``."""
    if axes and len(axes) == len(idx):
        return "(" + ", ".join(f"{name} {i}" for name, i in zip(axes, idx)) + ")"
    return f"index {idx}"


def _describe_mismatch(actual: torch.Tensor, expected: torch.Tensor, limit: int = 5,
                       axes: tuple[str, ...] | None = None) -> str:
    """Where two tensors of one shape differ: how many elements, the first few indices with both
    values (as ``torch.testing`` reports it), each axis named when ``axes`` names them."""
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.dtype != e.dtype:
        common = torch.promote_types(a.dtype, e.dtype)
        a, e = a.to(common), e.to(common)
    differ = a != e  # NaN differs from everything, as torch.equal has it
    where = differ.nonzero()
    count, total = int(where.shape[0]), differ.numel()
    parts = []
    for idx in where[:limit].tolist():
        i = tuple(idx)
        parts.append(f"at {_where(i, axes)}: got {a[i].item()!r}, expected {e[i].item()!r}")
    more = f" (and {count - limit} more)" if count > limit else ""
    return f"{count} of {total} elements differ ({100 * count / max(total, 1):.1f}%); first " + "; ".join(parts) + more


def assert_equal(actual, expected, what: str = "value", axes: tuple[str, ...] | None = None) -> None:
    """Exact equality for tokens, counts, shapes and plain numbers. For tensors the message says
    where they differ: how many elements, the first differing indices (each axis named when
    ``axes`` gives one name per dimension, e.g. ``("head", "token", "dim")``), both values there."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{what}: expected a torch.Tensor of shape {tuple(expected.shape)}, "
                                 f"got {type(actual).__name__}")
        if tuple(actual.shape) != tuple(expected.shape):
            raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
        if not torch.equal(actual.detach().cpu().to(torch.promote_types(actual.dtype, expected.dtype)),
                           expected.detach().cpu().to(torch.promote_types(actual.dtype, expected.dtype))):
            raise AssertionError(f"{what}: differs from the expected tensor of shape {tuple(expected.shape)}: "
                                 f"{_describe_mismatch(actual, expected, axes=axes)}")
    elif actual != expected:
        raise AssertionError(f"{what}: got {actual!r}, expected {expected!r}")


_NUMBER = re.compile(r"(-?)(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def numbers_in(text: str) -> list[float]:
    """The numbers a message writes, whatever the words around them: ``"5 rows > max_len=4"`` gives
    [5.0, 4.0]. Thousands separators (``1,024``) are read as one number; a minus sign counts only
    right before the digits (``-2``), so a range ``0-3`` gives 0 and 3."""
    text = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)
    found = []
    for m in _NUMBER.finditer(text):
        sign = -1.0 if m.group(1) and (m.start() == 0 or not text[m.start() - 1].isalnum()) else 1.0
        found.append(sign * float(m.group(2)))
    return found


def _message(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # a student's exception whose __str__ fails
        return ""


@contextlib.contextmanager
def raises(error: type[BaseException] | tuple[type[BaseException], ...], mentions: Iterable[float] = (),
           what: str = "this call") -> Iterator[None]:
    """The block must raise ``error`` (or a subclass), and its message must give every number in
    ``mentions``: the values the exercise asks the message to name, in any wording and order.
    Anything else (no error, another error type, a message without one of the numbers) fails with
    an ``AssertionError`` that says which. A time limit running out (``GradingTimeout``) passes through."""
    wanted = list(mentions)
    names = error.__name__ if isinstance(error, type) else " or ".join(e.__name__ for e in error)
    try:
        yield
    except GradingTimeout:
        raise
    except error as e:
        message = _message(e)
        given = numbers_in(message)
        missing = [n for n in wanted if not any(g == n for g in given)]
        if missing:
            need = ("the number " if len(wanted) == 1 else "the numbers ") + ", ".join(f"{n:g}" for n in wanted)
            raise AssertionError(f"{what}: the {names} is right, but its message must give {need} "
                                 f"(in any words); it says {message!r}") from None
        return
    except Exception as e:
        raise AssertionError(f"{what}: expected a {names}, got {type(e).__name__}: {_message(e)}") from None
    raise AssertionError(f"{what}: expected a {names}, but nothing was raised")


class RowCounter:
    """Count the rows (tokens) that pass through some linear layers: the K/V work actually done.

    ``rows`` is per watched layer (the total divided by the number of layers), readable inside
    and after the block; each ``with`` starts from zero. Hooks are removed on exit, whatever the
    student code did.
    """

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        self.layers = list(layers)
        if not self.layers:
            raise AssertionError("RowCounter needs at least one layer to watch")
        self.total = 0  # rows summed over all watched layers
        self._hooks: list = []

    @property
    def rows(self) -> int:
        return self.total // len(self.layers)

    def _hook(self, module, inputs, output) -> None:
        x = inputs[0]
        self.total += x.numel() // x.shape[-1]  # every leading index is one token's row

    def __enter__(self) -> "RowCounter":
        self.total = 0
        self._hooks = [m.register_forward_hook(self._hook) for m in self.layers]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Collect once, then keep the garbage collector out of the timed runs (as timeit does): a collection
    costs as much as the whole heap holds, which in a big process dwarfs the work being timed."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run_time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    """Fastest of ``repeats`` runs, in seconds (noise only ever makes a run slower)."""
    with _no_gc():
        return min(_run_time(fn) for _ in range(repeats))


def speedup(fast: Callable[[], object], slow: Callable[[], object], repeats: int = 5) -> float:
    """Best-of-k time of ``slow`` over best-of-k time of ``fast``, runs interleaved (A B A B ...)."""
    fast(), slow()  # warm up both
    t_fast = t_slow = float("inf")
    with _no_gc():
        for _ in range(repeats):
            t_slow = min(t_slow, _run_time(slow))
            t_fast = min(t_fast, _run_time(fast))
    return t_slow / t_fast


def assert_faster(fast: Callable[[], object], slow: Callable[[], object], at_least: float, repeats: int = 5,
                  what: str = "the cached version", rounds: int = 3) -> float:
    """The ratio is generous on purpose: a correct solution is many times faster than ``at_least``.

    A ratio under ``at_least`` is measured again, up to ``rounds`` times in all, before it fails: a burst of
    load from another process (a compiler's workers, say) can slow every fast run of one round, but not of
    every round, while an answer that repeats work stays slow in all of them."""
    for _ in range(rounds):
        ratio = speedup(fast, slow, repeats)
        if ratio >= at_least:
            return ratio
    raise AssertionError(f"{what} is only {ratio:.2f}x faster than the baseline in each of {rounds} rounds; "
                         f"expected at least {at_least:g}x. Is work repeated on every step?")


def _resolve(target: str) -> tuple[object, str]:
    module_name, _, attr = target.rpartition(".")
    try:
        return importlib.import_module(module_name), attr
    except ModuleNotFoundError:  # "package.Class.method"
        mod_name, _, cls = module_name.rpartition(".")
        return getattr(importlib.import_module(mod_name), cls), attr


def _dotted(target) -> str:
    if isinstance(target, str):
        return target
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not module or not name:
        raise TypeError(f"forbid() takes dotted names such as 'kvref.generate' or functions, got {target!r}")
    return f"{module}.{name}"


_MISSING = object()


@contextlib.contextmanager
def forbid(*targets) -> Iterator[None]:
    """While the block runs, calling any of ``targets`` (dotted names such as
    ``"kvref.generate"`` or ``"kvref.cache.StaticCache.update"``, or the functions themselves)
    fails: the student's function must do its own work rather than call the reference it is
    compared to. Every other name bound to the same function in ``kvref`` and its loaded
    submodules or in the notebook (``from kvref import generate``, ``import ... as g``) is
    blocked too. Everything is restored on exit."""
    saved: list[tuple[object, str, object]] = []
    try:
        for target in targets:
            name = _dotted(target)
            owner, attr = _resolve(name)
            original = getattr(owner, attr)

            def refuse(*args, _name=name, **kwargs):
                raise AssertionError(f"your code called {_name}; write this part yourself")

            places = [(owner, attr)]
            namespaces = [m for n, m in list(sys.modules.items()) if n == "kvref" or n.startswith("kvref.")]
            namespaces.append(sys.modules.get("__main__"))
            for ns in namespaces:
                if ns is None or ns is owner:
                    continue
                for key, value in list(vars(ns).items()):
                    if value is original:
                        places.append((ns, key))
            for obj, key in places:
                saved.append((obj, key, vars(obj).get(key, _MISSING)))  # the raw attribute (staticmethod, ...)
                setattr(obj, key, refuse)
        yield
    finally:
        for obj, key, raw in reversed(saved):
            if raw is _MISSING:  # was inherited from a base class
                delattr(obj, key)
            else:
                setattr(obj, key, raw)
