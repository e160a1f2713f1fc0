"""Unit tests for kvref/grading.py, the helpers every graded test cell of the notebooks uses.

The same helpers are exercised inside a real notebook kernel, through nbgrader, by
tests/test_pipeline.py (the self-test assignment); here they run in-process, fast.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

import pytest
import torch
import torch.nn as nn

import kvref
from kvref import grading
from kvref.cache import StaticCache

# -- assert_close / assert_equal ----------------------------------------------------------------


def test_assert_close_passes_within_tolerance():
    x = torch.randn(2, 3)
    grading.assert_close(x + 5e-6, x, atol=1e-5)  # |error| = 5e-6 <= 1e-5
    grading.assert_close(x * (1 + 1e-3), x, atol=0.0, rtol=2e-3)  # relative error 1e-3 <= 2e-3


def test_assert_close_catches_tolerance():
    x = torch.zeros(2, 3)
    y = x.clone()
    y[1, 2] = 1e-3
    with pytest.raises(AssertionError, match=r"logits: max difference 0.001 at index \(1, 2\)"):
        grading.assert_close(y, x, atol=1e-5, what="logits")


def test_assert_close_catches_shape():
    with pytest.raises(AssertionError, match=r"keys: shape \(1, 2, 4, 8\), expected \(1, 2, 5, 8\)"):
        grading.assert_close(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 5, 8), what="keys")


def test_assert_close_catches_nan_and_inf():
    for bad in (float("nan"), float("inf")):
        x = torch.zeros(3)
        x[1] = bad
        with pytest.raises(AssertionError, match="NaN or inf"):
            grading.assert_close(x, torch.zeros(3), atol=1e9)  # any tolerance: a NaN is never close


def test_assert_close_wants_a_tensor():
    with pytest.raises(AssertionError, match="expected a torch.Tensor, got list"):
        grading.assert_close([0.0, 1.0], torch.tensor([0.0, 1.0]))


def test_assert_equal():
    grading.assert_equal(torch.tensor([1, 2]), torch.tensor([1, 2]))
    grading.assert_equal(3, 3)
    with pytest.raises(AssertionError, match="tokens: differs"):
        grading.assert_equal(torch.tensor([1, 3]), torch.tensor([1, 2]), what="tokens")
    with pytest.raises(AssertionError, match=r"tokens: expected a torch.Tensor of shape \(2,\), got list"):
        grading.assert_equal([1, 2], torch.tensor([1, 2]), what="tokens")
    with pytest.raises(AssertionError, match="rows: got 7, expected 8"):
        grading.assert_equal(7, 8, what="rows")
    with pytest.raises(AssertionError, match=r"shape \(1, 2\), expected \(2,\)"):
        grading.assert_equal(torch.tensor([[1, 2]]), torch.tensor([1, 2]))


def test_assert_equal_says_where_tensors_differ():
    """Like torch.testing: how many elements differ, the first differing index, both values there."""
    expected = torch.arange(24).reshape(2, 3, 4)
    got = expected.clone()
    got[1, 2, 3] = -1  # the last element, so "first" must be found by position, not by chance
    got[0, 1, 0] = 99
    with pytest.raises(AssertionError) as e:
        grading.assert_equal(got, expected, what="tokens")
    msg = str(e.value)
    assert "2 of 24 elements differ" in msg, msg
    assert "first at index (0, 1, 0): got 99, expected 4" in msg, msg
    assert "at index (1, 2, 3): got -1, expected 23" in msg, msg
    many = torch.zeros(100, dtype=torch.long)
    with pytest.raises(AssertionError, match=r"100 of 100 elements differ .*\(and 95 more\)"):
        grading.assert_equal(many + 1, many)
    with pytest.raises(AssertionError, match="differ"):  # NaN is never equal, as in torch.equal
        grading.assert_equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))


# -- RowCounter ---------------------------------------------------------------------------------


def test_row_counter_counts_rows_per_layer():
    k_proj, v_proj = nn.Linear(8, 4), nn.Linear(8, 4)
    x = torch.randn(3, 5, 8)  # (B, T, d): 15 rows
    with grading.RowCounter([k_proj, v_proj]) as rows:
        k_proj(x), v_proj(x)
        assert rows.rows == 15  # readable inside the block
        k_proj(x[:, -1:]), v_proj(x[:, -1:])  # one decode step: B rows
    assert rows.rows == 15 + 3


def test_row_counter_removes_hooks_and_restarts():
    lin = nn.Linear(8, 4)
    counter = grading.RowCounter([lin])
    with pytest.raises(RuntimeError):
        with counter:
            lin(torch.randn(2, 8))
            raise RuntimeError("student code crashed")
    assert len(lin._forward_hooks) == 0  # removed even though the block raised
    lin(torch.randn(10, 8))
    assert counter.rows == 2  # nothing counted outside the block
    with counter:
        lin(torch.randn(4, 8))
    assert counter.rows == 4  # a new `with` starts from zero


def test_row_counter_needs_layers():
    with pytest.raises(AssertionError, match="at least one layer"):
        grading.RowCounter([])


# -- forbid -------------------------------------------------------------------------------------


def test_forbid_blocks_the_reference_and_restores():
    original = kvref.generate
    with grading.forbid("kvref.generate"):
        with pytest.raises(AssertionError, match="your code called kvref.generate; write this part yourself"):
            kvref.generate(None, None)
    assert kvref.generate is original


def test_forbid_blocks_names_imported_into_main(monkeypatch):
    # A notebook did `from kvref import generate as g` (the kernel's namespace is __main__),
    # and a student function looks the name up at call time.
    main = sys.modules["__main__"]
    original = kvref.generate
    monkeypatch.setattr(main, "g", original, raising=False)
    exec("def student_generate():\n    return g(None, None)\n", vars(main))
    monkeypatch.setattr(main, "student_generate", vars(main)["student_generate"], raising=False)
    with grading.forbid("kvref.generate"):
        with pytest.raises(AssertionError, match="your code called kvref.generate"):
            main.student_generate()
        with pytest.raises(AssertionError):
            sys.modules["kvref.generate"].generate(None, None)  # the defining module too
    assert main.g is original and kvref.generate is original
    assert sys.modules["kvref.generate"].generate is original


def test_forbid_restores_after_an_error_and_takes_functions():
    original = kvref.generate
    with pytest.raises(ZeroDivisionError):
        with grading.forbid(kvref.generate):  # the function itself, not its name
            with pytest.raises(AssertionError):
                kvref.generate(None, None)
            1 / 0
    assert kvref.generate is original


def test_forbid_method_restores_the_class_attribute():
    raw = StaticCache.__dict__["update"]
    with grading.forbid("kvref.cache.StaticCache.update"):
        with pytest.raises(AssertionError, match="StaticCache.update"):
            StaticCache.update(None, 0, None, None)
    assert StaticCache.__dict__["update"] is raw


# -- time_limit ---------------------------------------------------------------------------------


def spin():
    while True:
        pass


def swallow_once():
    try:
        spin()
    except Exception:  # a student's over-broad except: the limit must still end the loop below
        pass
    spin()


def test_time_limit_interrupts_a_loop_in_a_called_function():
    t0 = time.monotonic()
    with pytest.raises(grading.GradingTimeout, match="longer than 0.2 s"):
        with grading.time_limit(0.2):
            spin()
    assert time.monotonic() - t0 < 5  # 0.2 s plus scheduling noise on a busy machine


def test_time_limit_survives_a_swallowed_timeout():
    with pytest.raises(grading.GradingTimeout):
        with grading.time_limit(0.2):  # fires at 0.2 s, is swallowed, fires again 1 s later
            swallow_once()


def test_time_limit_nested_keeps_the_outer_limit():
    with pytest.raises(grading.GradingTimeout, match="longer than 0.5 s"):
        with grading.time_limit(0.5):
            with grading.time_limit(10):
                pass  # the inner block ends at once ...
            spin()  # ... and the outer limit still holds
    with pytest.raises(grading.GradingTimeout, match="longer than 0.2 s"):
        with grading.time_limit(10):
            with grading.time_limit(0.2):
                spin()


def test_time_limit_is_off_afterwards():
    with grading.time_limit(0.1):
        pass
    time.sleep(0.3)  # no alarm left behind to fire here


# -- checked ------------------------------------------------------------------------------------


def test_checked_swallows_warnings_and_stderr(capfd):
    handler = logging.StreamHandler(sys.stderr)  # created before, like transformers' logger
    log = logging.getLogger("kvref-test-checked")
    log.addHandler(handler)
    try:
        with grading.checked(seconds=30):
            warnings.warn("a python warning")
            torch.nn.functional.softmax(torch.zeros(2, 3))  # torch: implicit dim is deprecated
            print("to sys.stderr", file=sys.stderr)
            os.write(2, b"to file descriptor 2, as C code writes\n")
            log.warning("a log record")
    finally:
        log.removeHandler(handler)
    assert capfd.readouterr().err == ""


def test_checked_restores_everything_and_lets_failures_through(capfd):
    stderr, filters = sys.stderr, list(warnings.filters)
    with pytest.raises(AssertionError, match="wrong answer"):
        with grading.checked(seconds=30):
            raise AssertionError("wrong answer")
    assert sys.stderr is stderr and warnings.filters == filters
    assert logging.root.manager.disable == logging.NOTSET
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_checked_has_a_time_limit():
    with pytest.raises(grading.GradingTimeout):
        with grading.checked(seconds=0.2):
            spin()


# -- assert_faster ------------------------------------------------------------------------------


def test_assert_faster_passes_for_a_clearly_faster_function():
    # 10x apart by construction; sleeping adds at most a millisecond or so of noise, so the
    # best-of-5 ratio stays far above 3 even on a loaded machine.
    ratio = grading.assert_faster(lambda: time.sleep(0.002), lambda: time.sleep(0.02), at_least=3.0)
    assert ratio >= 3.0


def test_assert_faster_fails_for_equal_functions():
    def same():
        time.sleep(0.005)

    # The same function twice: the ratio is about 1, never 3, in any of the rounds.
    calls = []
    with pytest.raises(AssertionError, match=r"only \d+\.\d\dx faster .* each of 3 rounds.* at least 3x"):
        grading.assert_faster(same, lambda: calls.append(same()), at_least=3.0)
    assert len(calls) == 3 * (1 + 5)  # measured again before failing: 3 rounds of a warm-up and 5 repeats


def test_assert_faster_measures_again_before_failing(monkeypatch):
    # The fast function is slower than the slow one in the first round only (a burst of load elsewhere):
    # measured again, a clearly faster function passes. With one round it would fail.
    delays = iter([0.03, 0.002, 0.002])
    fast_s = {"t": 0.0}
    one_round = grading.speedup

    def next_round(fast, slow, repeats):
        fast_s["t"] = next(delays)
        return one_round(fast, slow, repeats)

    monkeypatch.setattr(grading, "speedup", next_round)
    assert grading.assert_faster(lambda: time.sleep(fast_s["t"]), lambda: time.sleep(0.02), at_least=3.0) >= 3.0


def test_numbers_in_reads_numbers_in_any_wording():
    assert grading.numbers_in("5 rows asked for, max_len=4") == [5, 4]
    assert grading.numbers_in("chunk_size must be a positive int, got -2") == [-2]
    assert grading.numbers_in("got 2.5; 1,024 slots; rows 0-3 of layer_2") == [2.5, 1024, 0, 3, 2]
    assert grading.numbers_in("no number here") == []


def test_raises_checks_the_error_and_the_numbers_of_its_message():
    with grading.raises(ValueError, mentions=(5, 4), what="overflow"):
        raise ValueError("the cache would hold 5 rows; 4 fit")
    with grading.raises(ValueError, mentions=(-2,)):
        raise ValueError("chunk_size=-2 is not a positive int")
    # Each way to fail says which: a number missing, another error type, no error at all.
    with pytest.raises(AssertionError, match=r"overflow: the ValueError is right, but its message must give "
                                             r"the numbers 5, 4 \(in any words\); it says 'cache full'"):
        with grading.raises(ValueError, mentions=(5, 4), what="overflow"):
            raise ValueError("cache full")
    with pytest.raises(AssertionError, match="must give the number -2"):
        with grading.raises(ValueError, mentions=(-2,)):
            raise ValueError("got 2")  # the sign matters
    with pytest.raises(AssertionError, match="overflow: expected a ValueError, got IndexError: out of range"):
        with grading.raises(ValueError, what="overflow"):
            raise IndexError("out of range")
    with pytest.raises(AssertionError, match="expected a ValueError or KeyError, but nothing was raised"):
        with grading.raises((ValueError, KeyError)):
            pass
    with pytest.raises(grading.GradingTimeout):  # a time limit is never taken for the student's error
        with grading.raises(AssertionError):
            raise grading.GradingTimeout("too slow")

    class Broken(ValueError):
        def __str__(self):
            raise RuntimeError("no message")

    with pytest.raises(AssertionError, match="it says ''"):
        with grading.raises(ValueError, mentions=(1,)):
            raise Broken()


def test_assert_equal_names_the_axes():
    a, b = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    b[1, 2, 0] = 1.0
    with pytest.raises(AssertionError, match=r"at \(head 1, token 2, dim 0\): got 0.0, expected 1.0"):
        grading.assert_equal(a, b, what="keys", axes=("head", "token", "dim"))
    with pytest.raises(AssertionError, match=r"at index \(1, 2, 0\)"):  # no names, or not one per dimension
        grading.assert_equal(a, b, what="keys", axes=("head", "token"))
