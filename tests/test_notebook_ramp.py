"""The shape every graded notebook follows (solutions/NN_topic.ipynb, the instructor sources).

Conventions (docs/CONVENTIONS.md, "Notebooks"):

- Every hidden check names the rule it tests with a comment line `# rule: <slug>` inside the
  `### BEGIN HIDDEN TESTS` block, and the same slug appears in a `# rule: <slug>` line OUTSIDE any hidden
  block (a visible check on other data) somewhere in the same notebook. So a student whose visible
  tests pass has met every graded rule at least once.
- Every exercise heading (`## N. Title`) states its time: the cell holds `Estimated time: about M min`.
  Exercise 1 is a warm-up (`## 1. Warm-up: ...`).
- One stretch exercise per notebook (`## Stretch (optional, ungraded): ...`, with the time too), after every
  graded cell, with a solution cell and its own visible check; it carries no points.
- Nothing is given away: no book page defines (def/class) a function or class that a solution cell asks
  the student to write, and no three consecutive non-trivial solution lines appear in a page's code cell.

Each rule is shown to fire on a small synthetic notebook, so the checks can fail.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from autograder.shared import notebooks as nbs

ROOT = Path(__file__).resolve().parents[1]
STEMS = sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))

RULE = re.compile(r"^\s*#\s*rule:\s*([a-z0-9][a-z0-9-]*)\s*$", re.M)
EXERCISE = re.compile(r"^##\s+(\d+)\.\s+(.*)$", re.M)
STRETCH = re.compile(r"^##\s+Stretch \(optional, ungraded\):", re.M)
TIME = re.compile(r"Estimated time: about (\d+) min")
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")


def blocks(source: str, markers: tuple[str, str]) -> tuple[list[str], str]:
    """(each region between the markers, as text; everything outside them, as text)."""
    begin, end = markers
    inside, outside, cur = [], [], None
    for line in source.split("\n"):
        if begin in line:
            cur = []
        elif end in line and cur is not None:
            inside.append("\n".join(cur))
            cur = None
        else:
            (outside if cur is None else cur).append(line)
    return inside, "\n".join(outside)


def rules(nb) -> tuple[set[str], set[str], list[str]]:
    """(hidden slugs, visible slugs, grade ids of hidden blocks that name no rule)."""
    hidden, visible, unnamed = set(), set(), []
    for cell in nb.cells:
        if cell.cell_type != "code" or not nbs.is_test(cell):
            continue
        secret, public = blocks(cell.source, HIDDEN)
        for block in secret:
            found = RULE.findall(block)
            hidden.update(found)
            if not found:
                unnamed.append(nbs.grade_id(cell))
        visible.update(RULE.findall(public))
    return hidden, visible, unnamed


def shape_problems(nb) -> list[str]:
    problems = []
    heads = [(c, m) for c in nb.cells if c.cell_type == "markdown" for m in EXERCISE.finditer(c.source)]
    if not heads:
        problems.append("no exercise heading '## 1. ...'")
    for cell, m in heads:
        if not TIME.search(cell.source):
            problems.append(f"exercise {m.group(1)} ({m.group(2)!r}) states no 'Estimated time: about M min'")
    if heads and not re.match(r"Warm-up\b", heads[0][1].group(2)):
        problems.append(f"exercise 1 is not a warm-up: {heads[0][1].group(2)!r}")
    stretch = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and STRETCH.search(c.source)]
    if len(stretch) != 1:
        problems.append(f"{len(stretch)} stretch sections (want exactly one '## Stretch (optional, ungraded): ...')")
    else:
        i = stretch[0]
        if not TIME.search(nb.cells[i].source):
            problems.append("the stretch exercise states no 'Estimated time: about M min'")
        after = nb.cells[i + 1:]
        if any(nbs.is_test(c) and nbs.meta(c).get("points") for c in after):
            problems.append("a graded cell with points comes after the stretch heading (it must be ungraded)")
        if not any(nbs.is_answer(c) for c in after):
            problems.append("the stretch exercise has no solution cell")
        if not any(c.cell_type == "code" and "assert" in c.source and not nbs.is_answer(c) for c in after):
            problems.append("the stretch exercise has no visible check (a code cell with assert)")
    return problems


def solution_names_and_lines(nb) -> tuple[set[str], list[list[str]]]:
    names, regions = set(), []
    for cell in nb.cells:
        if cell.cell_type != "code" or not nbs.is_answer(cell):
            continue
        secret, _ = blocks(cell.source, SOLUTION)
        try:
            tree = ast.parse(cell.source.replace("### BEGIN SOLUTION", "").replace("### END SOLUTION", ""))
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])
        names.update(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
        for block in secret:
            lines = [ln.strip() for ln in block.splitlines()]
            regions.append([ln for ln in lines if len(ln) >= 20 and not ln.startswith("#")])
    return names, regions


def solution_returns(nb) -> set[str]:
    """Formulas (two or more arithmetic operations; spaces removed) that a solution region returns in one line."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and nbs.is_answer(cell):
            for block in blocks(cell.source, SOLUTION)[0]:
                for m in re.finditer(r"^\s*return\s+(.+?)\s*(#.*)?$", block, re.M):
                    try:
                        tree = ast.parse(m.group(1), mode="eval")
                    except SyntaxError:
                        continue
                    if sum(isinstance(n, ast.BinOp) for n in ast.walk(tree)) >= 2:
                        found.add(re.sub(r"\s+", "", m.group(1)))
    return found


def page_code(text: str) -> tuple[set[str], list[str]]:
    defined, lines = set(), []
    cur = None
    for line in text.splitlines():
        if cur is None and line.startswith("```{code-cell}"):
            cur = []
        elif cur is not None and line.strip() == "```":
            lines.extend(ln.strip() for ln in cur)
            defined.update(re.findall(r"^(?:def|class)\s+([A-Za-z_]\w*)", "\n".join(cur), re.M))
            cur = None
        elif cur is not None:
            cur.append(line)
    return defined, lines


def given_away(nb, pages: dict[str, str]) -> list[str]:
    names, regions = solution_names_and_lines(nb)
    found = []
    for page, text in pages.items():
        defined, lines = page_code(text)
        for name in sorted(names & defined):
            found.append(f"{page} defines {name}(), which a solution cell asks for")
        joined = "\n".join(lines)
        squashed = re.sub(r"[ \t]+", "", joined)
        for expr in sorted(solution_returns(nb)):
            if expr in squashed:
                found.append(f"{page} prints the expression a solution returns: {expr}")
        for region in regions:
            for k in range(len(region) - 2):
                run = "\n".join(region[k:k + 3])
                if run in joined:
                    found.append(f"{page} prints three solution lines in a row, from {region[k]!r}")
                    break
    return found


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "book").glob("*.md"))}


@pytest.mark.parametrize("stem", STEMS)
def test_every_hidden_rule_has_a_visible_check(stem):
    hidden, visible, unnamed = rules(nbs.read(ROOT / "solutions" / f"{stem}.ipynb"))
    assert not unnamed, f"{stem}: hidden blocks that name no '# rule: <slug>': {unnamed}"
    assert hidden <= visible, f"{stem}: rules graded only by hidden checks: {sorted(hidden - visible)}"


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_climbs_warm_up_times_stretch(stem):
    problems = shape_problems(nbs.read(ROOT / "solutions" / f"{stem}.ipynb"))
    assert not problems, f"{stem}: " + "; ".join(problems)


@pytest.mark.parametrize("stem", STEMS)
def test_no_book_page_gives_the_exercise_away(stem, pages):
    found = given_away(nbs.read(ROOT / "solutions" / f"{stem}.ipynb"), pages)
    assert not found, f"{stem}: " + "; ".join(found)


# --- the checks can fail ---------------------------------------------------------------------------


def _nb(*cells):
    return nbs.course_notebook(list(cells))


def _md(text):
    return nbformat.v4.new_markdown_cell(text)


def test_rule_check_fires_on_a_hidden_only_rule():
    test = nbs.nbgrader_cell(
        "test", "t1",
        "# rule: shape\nassert 1\n### BEGIN HIDDEN TESTS\n# rule: refuse-full\nassert 1\n### END HIDDEN TESTS\n", 1)
    hidden, visible, unnamed = rules(_nb(test))
    assert hidden - visible == {"refuse-full"} and not unnamed
    bare = nbs.nbgrader_cell("test", "t2", "assert 1\n### BEGIN HIDDEN TESTS\nassert 1\n### END HIDDEN TESTS\n", 1)
    assert rules(_nb(bare))[2] == ["t2"]


def test_shape_check_fires():
    good = _nb(
        _md("## 1. Warm-up: count\nEstimated time: about 5 min"),
        nbs.nbgrader_cell("answer", "a1", "### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"),
        nbs.nbgrader_cell("test", "t1", "assert x == 1\n", 1),
        _md("## Stretch (optional, ungraded): more\nEstimated time: about 20 min"),
        nbs.nbgrader_cell("answer", "a2", "### BEGIN SOLUTION\ny = 2\n### END SOLUTION\n"),
        nbformat.v4.new_code_cell("assert y == 2"),
    )
    assert shape_problems(good) == []
    no_time = _nb(*[_md("## 1. Warm-up: count")] + good.cells[1:])
    assert any("Estimated time" in p for p in shape_problems(no_time))
    not_warm = _nb(*[_md("## 1. Count\nEstimated time: about 5 min")] + good.cells[1:])
    assert any("warm-up" in p for p in shape_problems(not_warm))
    no_stretch = _nb(*good.cells[:3])
    assert any("stretch" in p for p in shape_problems(no_stretch))
    graded_stretch = _nb(*good.cells[:5] + [nbs.nbgrader_cell("test", "t2", "assert y == 2\n", 1)])
    assert any("ungraded" in p for p in shape_problems(graded_stretch))


def test_give_away_check_fires():
    sol = nbs.nbgrader_cell("answer", "a1", (
        "def cached_attention(q, k, v):\n    ### BEGIN SOLUTION\n"
        "    scores = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5\n"
        "    weights = torch.softmax(scores, dim=-1)\n"
        "    out = weights @ v  # (B, H, T, D)\n"
        "    return out\n    ### END SOLUTION\n"))
    nb = _nb(sol)
    page = "```{code-cell} ipython3\ndef cached_attention(q, k, v):\n    return q\n```\n"
    assert any("defines cached_attention" in f for f in given_away(nb, {"p.md": page}))
    lines = ("```{code-cell} ipython3\nscores = q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5\n"
             "weights = torch.softmax(scores, dim=-1)\nout = weights @ v  # (B, H, T, D)\n```\n")
    assert any("three solution lines" in f for f in given_away(nb, {"p.md": lines}))
    assert given_away(nb, {"p.md": "```{code-cell} ipython3\nprint(1)\n```\n"}) == []
    formula = nbs.nbgrader_cell("answer", "a2", (
        "def rows(B, T, N):\n    ### BEGIN SOLUTION\n    return B * (T + N - 1)\n    ### END SOLUTION\n"))
    check = "```{code-cell} ipython3\nassert got == B*(T + N - 1)\n```\n"
    assert any("expression a solution returns" in f for f in given_away(_nb(formula), {"p.md": check}))
