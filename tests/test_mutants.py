"""The mutation machinery (autograder/shared/mutants.py, autograder/mutation.py) and the determinism of grading.

- the mutator: each operator gives the mutants it should, only inside solution regions, every mutant
  parses and differs from the solution, keys are unique and stable;
- autograder/mutants_equivalent.toml names only mutants that exist, each with a reason;
- the in-process grader kills what a test catches (errors and stderr both), and agrees with the
  real autograder (nbgrader) on a sample of one chapter's mutants;
- the same grade every time: the cells that measure speed give the same verdicts 3 times in a row
  for a correct solution and the timing-sensitive wrong answers, with a CPU hog running beside them.
The full sweep is a script: `python -m autograder mutants` (see docs/mutation.md).
"""

from __future__ import annotations

import ast
import multiprocessing
import os
from pathlib import Path

import nbformat
import pytest

from autograder.shared import notebooks as nbs
from autograder.shared.mutants import mutate_cell, solution_lines
from autograder.mutation import (EQUIVALENT_FILE, autograde_mutants, chapter_mutants, grade_cells, grade_mutants,
                                 grade_variants, load_equivalent, sample)

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"

CELL = '''def f(x, n=2, mode="causal"):
    """Scaffolding outside the markers is never mutated: a + b."""
    keep = x + 1
    ### BEGIN SOLUTION
    y = x[1:n] * 2  # a comment that stays
    z = torch.cat([y, y], dim=1).float()
    if n < 3 and mode == "causal":
        z = g(y, z, keepdim=True)
    return z
    ### END SOLUTION
'''


def changes(op: str) -> set[str]:
    return {m.change for m in mutate_cell(CELL, "f") if m.op == op}


def test_each_operator():
    assert changes("arith") == {"x[1:n] * 2 -> x[1:n] / 2"}
    assert changes("compare") == {"n < 3 -> n <= 3", 'mode == "causal" -> mode != \'causal\''}
    assert {"1 -> 2", "1 -> 0", "n -> n + 1", "n -> n - 1"} <= changes("index")
    assert "z = g(y, z, keepdim=True) -> pass" in changes("drop")
    assert any("g(z, y" in c for c in changes("args"))
    assert changes("dim") == {"1 -> 0"}
    assert any(c.endswith("dim=1)") for c in changes("cast"))  # .float() dropped
    assert changes("mode") == {"\"causal\" -> 'none'"}
    assert changes("default") == {"True -> False"}  # a constant keyword argument; the def line is scaffolding


def test_only_solution_lines_change_and_every_mutant_parses():
    lines = solution_lines(CELL)
    original = CELL.split("\n")
    mutants = mutate_cell(CELL, "f")
    assert len({m.key for m in mutants}) == len(mutants), "keys must be unique"
    normal = ast.unparse(ast.parse(CELL))
    for m in mutants:
        ast.parse(m.source)
        assert ast.unparse(ast.parse(m.source)) != normal, m.key
        got = m.source.split("\n")
        head, tail = original[:min(lines) - 1], original[max(lines):]  # scaffolding and markers around the region
        assert got[:len(head)] == head and got[len(got) - len(tail):] == tail, m.key
        assert "# a comment that stays" in m.source and "### END SOLUTION" in m.source


def test_no_markers_no_mutants():
    assert mutate_cell("def f(x):\n    return x + 1\n", "f") == []
    assert mutate_cell("%magic\n### BEGIN SOLUTION\nx = (\n", "f") == []  # does not parse: nothing


def test_mutants_are_stable():
    first = [m.key for m in mutate_cell(CELL, "f")]
    assert first == [m.key for m in mutate_cell(CELL, "f")]


def test_equivalent_mutants_exist_and_have_reasons():
    # Every entry names a mutant the mutator produces today (else it is stale), with a one-line reason.
    equivalent = load_equivalent()
    assert EQUIVALENT_FILE.is_file()
    for stem, entries in equivalent.items():
        keys = {m.key for _, m in chapter_mutants(nbs.read(SOLUTIONS / f"{stem}.ipynb"))}
        for key, reason in entries.items():
            assert key in keys, f"{stem}: {key!r} is not a mutant any more (remove it from {EQUIVALENT_FILE.name})"
            assert isinstance(reason, str) and len(reason) > 10 and "\n" not in reason, (stem, key)


def tiny_notebook(test_source: str) -> nbformat.NotebookNode:
    return nbs.course_notebook([
        nbs.nbgrader_cell("setup", "setup", "import sys\nfrom kvref import grading"),
        nbs.nbgrader_cell("answer", "add", "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"),
        nbs.nbgrader_cell("test", "test_add", test_source, points=1),
    ])


def test_stretch_answer_cells_are_not_mutated():
    # The ungraded stretch exercise at the end carries no points: no test could kill its mutants.
    nb = tiny_notebook("assert add(2, 3) == 5")
    nb.cells += [nbformat.v4.new_markdown_cell("## Stretch (optional, ungraded): more\nEstimated time: about 10 min"),
                 nbs.nbgrader_cell("answer", "stretch_mul",
                                   "def mul(a, b):\n    ### BEGIN SOLUTION\n    return a * b\n    ### END SOLUTION")]
    found = chapter_mutants(nb)
    assert found and {m.key.split(":")[0] for _, m in found} == {"add"}


def test_in_process_grader_kills_what_a_test_catches():
    nb = tiny_notebook("with grading.checked(seconds=10):\n    assert add(2, 3) == 5")
    found = chapter_mutants(nb)
    verdicts = grade_mutants(nb, found, timeout=60, say=lambda s: None)
    assert {m.change: verdicts[m.key] is not None for _, m in found} == {"a + b -> a - b": True, "return a + b -> pass": True}


def test_in_process_grader_counts_stderr_as_lost_points():
    # nbgrader scores a test cell that writes to stderr as 0; the in-process grader must agree.
    assert grade_cells(tiny_notebook("assert add(2, 3) == 5")) == {"test_add": True}
    assert grade_cells(tiny_notebook("print('noise', file=sys.stderr)\nassert add(2, 3) == 5")) == {"test_add": False}


def test_in_process_grader_stops_after_the_last_test_cell(tmp_path):
    # What follows the last test cell (a demonstration, an ungraded stretch check) cannot change a verdict, so
    # the in-process grader does not run it: here a cell that would leave a mark on disk and then kill the run.
    mark = tmp_path / "ran"
    nb = tiny_notebook("assert add(2, 3) == 5")
    nb.cells.append(nbformat.v4.new_code_cell(f"open({str(mark)!r}, 'w').close()\nimport os\nos._exit(3)"))
    right = "def add(a, b):\n    return b + a"  # passes every test: its run goes on to the end
    wrong = "def add(a, b):\n    return a - b"
    verdicts = grade_variants(nb, {"right": {1: right}, "wrong": {1: wrong}}, timeout=60, say=lambda s: None)
    assert verdicts["right"] is None and verdicts["wrong"].startswith("test_add:"), verdicts
    assert grade_cells(nb) == {"test_add": True}
    assert not mark.exists()
    # ... while a cell before a test cell still runs, as the autograder runs it.
    nb.cells.append(nbs.nbgrader_cell("test", "test_add_again", "assert add(1, 1) == 2", points=1))
    assert grade_cells(nb, {"test_add"}) == {"test_add": True} and not mark.exists()
    with pytest.raises(RuntimeError, match="did not finish"):
        grade_cells(nb)
    assert mark.exists()


@pytest.mark.slow
def test_in_process_verdicts_agree_with_the_real_autograder():
    # A sample of one chapter's mutants (survivors first), graded in-process and by nbgrader in a kernel.
    stem = "03_memory"
    source = nbs.read(SOLUTIONS / f"{stem}.ipynb")
    found = [m for _, m in chapter_mutants(source)]
    picked = sample(found, 3, {m.key: "x" for m in found[::4]})  # a spread of kinds, no full sweep here
    verdicts = grade_mutants(source, [(i, m) for i, m in chapter_mutants(source) if m in picked], say=lambda s: None)
    real = autograde_mutants(stem, SOLUTIONS / f"{stem}.ipynb", picked)
    assert {k: v is not None for k, v in verdicts.items()} == real
    assert any(real.values()), "the sample should hold at least one mutant that loses points"


# -- the same grade every time ----------------------------------------------------------------------

# Chapter -> (the cells that depend on speed or on what timers cover, the timing-sensitive wrong answers).
TIMING = {
    "01_motivation": ({"test_generate_speed", "test_generate_work"}, ["decode_feeds_whole_sequence"]),
    "02_prefill_decode": ({"test_generate_stats"}, ["ttft_excludes_prefill", "decode_feeds_whole_sequence"]),
}
REPEATS = 3  # each run of 01's solution takes ~7 s beside a hog that holds a core: the suite's CPU is its bound


def _hog(stop) -> None:
    while not stop.is_set():  # one core busy the whole time, as another student's job would be
        sum(i * i for i in range(10_000))


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(TIMING))
def test_same_grade_every_time_under_load(stem):
    tests, wrong_names = TIMING[stem]
    source = nbs.read(SOLUTIONS / f"{stem}.ipynb")
    wrong = nbs.load_wrong_answers(ROOT / "tests" / "wrong_answers" / f"{stem}.py")
    students = {"solution": source} | {n: nbs.apply_wrong(source, wrong[n], n) for n in wrong_names}
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    hog = ctx.Process(target=_hog, args=(stop,), daemon=True)
    hog.start()
    try:
        results = {name: [grade_cells(nb, tests) for _ in range(REPEATS)] for name, nb in students.items()}
    finally:
        stop.set()
        hog.join(5)
    for name, runs in results.items():
        assert all(r == runs[0] for r in runs), f"{stem} {name}: verdicts changed between runs: {runs}"
    assert all(results["solution"][0].values()), results["solution"][0]
    for name in wrong_names:
        assert not all(results[name][0].values()), f"{name} passed every timing cell: {results[name][0]}"
