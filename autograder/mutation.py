"""Mutation score of a chapter's tests: ``python -m autograder mutants [NN_topic ...]``.

Every mutant of every answer cell (``mutants.py``) is graded in-process with the instructor
source's own test cells, visible and hidden, as nbgrader would run them: cells in order, errors in
ordinary cells do not stop the run, a test cell that raises or writes to stderr loses its points.

Speed: one walker process runs the notebook top to bottom once (which is also the check that the
solution passes); when it reaches an answer cell it forks one child per mutant, which runs the mutated
cell and the rest of the notebook and stops at the first test cell that fails, or after the last test cell
(what follows, a demonstration or an ungraded stretch check, cannot change a verdict). The prefix is never
recomputed, and every mutant starts from a copy of exactly the state the real cell would see.

A mutant is *killed* when some test cell fails (it loses points), *survived* when all pass, and
*equivalent* when it is listed in ``mutants_equivalent.toml`` with the reason its behaviour cannot
differ from the solution's. ``--check N`` grades N mutants per chapter through the real autograder
as well (nbgrader in a kernel) and fails if the two verdicts differ.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import sys
import tempfile
import time
import tomllib
import types
from dataclasses import dataclass, field
from pathlib import Path

from autograder.shared import notebooks as nbs
from autograder.shared.mutants import Mutant, mutate_cell

EQUIVALENT_FILE = Path(__file__).with_name("mutants_equivalent.toml")
TARGET = 0.9  # share of the non-equivalent mutants that must lose points

STRETCH_HEADING = nbs.STRETCH_HEADING


def chapter_mutants(source: nbs.NotebookNode) -> list[tuple[int, Mutant]]:
    """(cell index, mutant) for every answer cell of an instructor source, in cell order.

    The optional stretch exercise at the end (``## Stretch (optional, ungraded): ...``) carries no points,
    so no test cell grades it: its answer cells are left out."""
    found = []
    for i, c in enumerate(source.cells):
        if c.cell_type == "markdown" and STRETCH_HEADING.search(c.source):
            break
        if c.cell_type == "code" and nbs.is_answer(c):
            found += [(i, m) for m in mutate_cell(c.source, nbs.grade_id(c))]
    return found


def load_equivalent(path: Path = EQUIVALENT_FILE) -> dict[str, dict[str, str]]:
    """{stem: {mutant key: reason}} from the committed file (empty if it does not exist)."""
    if not path.is_file():
        return {}
    with open(path, "rb") as f:
        return {stem: dict(v) for stem, v in tomllib.load(f).items()}


# -- running cells in-process -------------------------------------------------------------------


def _run_cell(source: str, ns: dict, graded: bool) -> str | None:
    """Run one cell in ``ns``; None if fine, else why it failed (graded cells: any error or stderr)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))
    err = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stderr(err):
                exec(compile(code, "<cell>", "exec"), ns)
            failure = None
        except BaseException as e:  # noqa: BLE001  (student code may raise anything)
            failure = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        written = err.getvalue() + sink.read().decode(errors="replace")
    if failure is None and graded and written.strip():
        failure = f"wrote to stderr: {written.strip()[:200]}"
    return failure if graded or failure is None else None


def _last_test(cells: list) -> int:
    """Index of the last test cell (-1: none). The cells after it (demonstrations, ungraded stretch checks) cannot
    change a verdict: only a test cell's failure is one (``_run_cell``). So no run goes past it."""
    return max((i for i, c in enumerate(cells) if c.cell_type == "code" and nbs.is_test(c)), default=-1)


def _run_from(cells: list, start: int, ns: dict, replaced: dict[int, str]) -> str | None:
    """Run cells[start:] up to the last test cell (those in ``replaced`` with its source instead of their own);
    the first failing test cell as "grade_id: why", or None if every test cell passes."""
    for i in range(start, _last_test(cells) + 1):
        cell = cells[i]
        if cell.cell_type != "code":
            continue
        why = _run_cell(replaced.get(i, cell.source), ns, nbs.is_test(cell))
        if why is not None:
            return f"{nbs.grade_id(cell)}: {why}"
    return None


def _child(cells, start, ns, replaced, write_fd) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        why = _run_from(cells, start, ns, replaced)
        os.write(write_fd, json.dumps({"failed": why}).encode())
    finally:
        os._exit(0)


def _wait(pid: int, read_fd: int, timeout: float) -> dict:
    """What the child reported, or a failure if it died or ran past ``timeout``."""
    deadline, chunks = time.monotonic() + timeout, []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"failed": f"timeout after {timeout:g} s"}
        ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
        if ready:
            data = os.read(read_fd, 65536)
            if not data:
                break
            chunks.append(data)
    _, status = os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks))
    except json.JSONDecodeError:
        return {"failed": f"the run died (status {status})"}


def _fork_run(cells, start, ns, replaced, timeout) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(cells, start, ns, replaced, w)
    os.close(w)
    try:
        return _wait(pid, r, timeout)
    finally:
        os.close(r)


def _walker(source_nb, todo: dict[int, list[tuple[str, dict[int, str]]]], timeout: float, out_fd: int) -> None:
    """Run the notebook once, as the autograder would, up to its last test cell (its verdict is the baseline,
    reported last); before a cell that variants change, fork one run of each variant from there."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch  # noqa: PLC0415  (only in the walker: the command itself stays light)
    torch.set_num_threads(1)
    main = types.ModuleType("__main__")  # grading.forbid looks for the student's names in __main__
    sys.modules["__main__"] = main
    ns = main.__dict__
    cells = source_nb.cells
    t0, base = time.monotonic(), None
    end = max([_last_test(cells), *todo]) + 1  # as far as a verdict, or the start of a variant, lies
    for i, cell in enumerate(cells[:end]):
        for key, replaced in todo.get(i, []):
            t1 = time.monotonic()
            res = _fork_run(cells, i, ns, replaced, timeout)
            res.update(key=key, seconds=round(time.monotonic() - t1, 2))
            os.write(out_fd, (json.dumps(res) + "\n").encode())
            t0 += time.monotonic() - t1  # the baseline's own time excludes its variants'
        if cell.cell_type == "code":
            why = _run_cell(cell.source, ns, nbs.is_test(cell))
            if why is not None and base is None:
                base = f"{nbs.grade_id(cell)}: {why}"
    os.write(out_fd, (json.dumps({"baseline": {"failed": base}, "seconds": time.monotonic() - t0}) + "\n").encode())


def grade_variants(source_nb, variants: dict[str, dict[int, str]], timeout: float = 300,
                   say=print) -> dict[str, str | None]:
    """{name: the first failing test cell, or None if it passes every test} for variants of an instructor
    source, each {cell index: its new source} (a mutant, or a wrong answer changing several cells), graded
    in-process. Raises if the source itself does not pass every test in-process."""
    todo: dict[int, list[tuple[str, dict[int, str]]]] = {}
    for key, replaced in variants.items():
        if not replaced:
            raise ValueError(f"{key}: a variant changes at least one cell")
        todo.setdefault(min(replaced), []).append((key, replaced))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                _walker(source_nb, todo, timeout, w)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    verdicts: dict[str, str | None] = {}
    baseline = None
    with os.fdopen(r, "rb") as pipe:
        for line in pipe:
            msg = json.loads(line)
            if "baseline" in msg:
                baseline = msg
                continue
            verdicts[msg["key"]] = msg["failed"]
            say(f"  {'killed  ' if msg['failed'] else 'SURVIVED'} {msg['seconds']:6.1f} s  {msg['key']}")
    os.waitpid(pid, 0)
    if baseline is None:
        raise RuntimeError("the in-process run of the solution stopped before its end")
    if baseline["baseline"]["failed"]:
        raise RuntimeError(f"the solution itself fails in-process: {baseline['baseline']['failed']}")
    say(f"  solution passes in-process in {baseline['seconds']:.1f} s; {len(variants)} variants")
    for key in variants:
        verdicts.setdefault(key, "the walker stopped before this variant")
    return verdicts


def answer_variants(source_nb, answers: dict, kind: str = "wrong answer") -> tuple[dict[str, dict[int, str]], dict[str, str]]:
    """The variants of an instructor source that tests/wrong_answers/NN_topic.py (or right_answers/) describe,
    {name: {cell index: new source}}, and {name: why it does not apply} for those whose text is not there."""
    variants, errors = {}, {}
    for name, subs in answers.items():
        try:
            changed = nbs.apply_wrong(source_nb, subs, f"{kind} {name!r}")
        except ValueError as e:
            errors[name] = str(e)
            continue
        variants[name] = {i: c.source for i, (c, old) in enumerate(zip(changed.cells, source_nb.cells))
                          if c.source != old.source}
        if not variants[name]:
            errors[name] = f"{kind} {name!r} leaves every cell as it was"
            del variants[name]
    return variants, errors


def grade_mutants(source_nb, mutants: list[tuple[int, Mutant]], timeout: float = 300,
                  say=print) -> dict[str, str | None]:
    """{mutant key: the first failing test cell, or None if it passes every test}, graded in-process.
    Raises if the unmutated solution does not pass every test in-process."""
    return grade_variants(source_nb, {m.key: {i: m.source} for i, m in mutants}, timeout, say)


def grade_cells(source_nb, tests: set[str] | None = None, timeout: float = 300) -> dict[str, bool]:
    """{grade_id: passed} for the test cells of a notebook (all, or only ``tests``; the others are
    skipped), every cell up to the last of them run in order in a forked child, as the autograder runs them."""
    wanted = [i for i, c in enumerate(source_nb.cells) if c.cell_type == "code" and nbs.is_test(c)
              and (tests is None or nbs.grade_id(c) in tests)]
    cells = source_nb.cells[:max(wanted, default=-1) + 1]  # what follows cannot change a verdict
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.environ["OMP_NUM_THREADS"] = "1"
            import torch  # noqa: PLC0415
            torch.set_num_threads(1)
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            passed = {}
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                for cell in cells:
                    if cell.cell_type != "code":
                        continue
                    if nbs.is_test(cell):
                        if tests is None or nbs.grade_id(cell) in tests:
                            passed[nbs.grade_id(cell)] = _run_cell(cell.source, main.__dict__, True) is None
                    else:
                        _run_cell(cell.source, main.__dict__, False)
            os.write(w, json.dumps({"failed": None, "passed": passed}).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        res = _wait(pid, r, timeout)
    finally:
        os.close(r)
    if "passed" not in res:
        raise RuntimeError(f"the run did not finish: {res['failed']}")
    return res["passed"]


# -- the real autograder on a sample ---------------------------------------------------------------


def autograde_mutants(stem: str, source_path: Path, mutants: list[Mutant], workers: int = 1) -> dict[str, bool]:
    """{mutant key: loses points} through nbgrader, each mutant submitted as a student."""
    from autograder.commands import build_releases  # noqa: PLC0415
    from autograder.grade.course import Course  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="kvcourse-mutants-") as tmp:
        course = Course(Path(tmp) / "course", {stem: source_path})
        released = build_releases(course, {stem: source_path})[stem]
        solved = nbs.fill_answers(released, nbs.read(source_path))
        names = {}
        for k, m in enumerate(mutants):
            nb = nbs.fill_answers(released, nbs.read(source_path))
            nbs.cells_by_id(nb)[m.grade_id].source = m.source
            names[f"mutant{k}"] = m.key
            course.submit(stem, f"mutant{k}", nb)
        course.submit(stem, "solution", solved)
        course.autograde_all(workers=workers)
        scores = course.scores(stem)
        if scores["solution"].score != scores["solution"].max_score:
            raise RuntimeError(f"{stem}: the solution lost points in the real autograder")
        return {key: scores[s].score < scores[s].max_score for s, key in names.items()}


def sample(mutants: list[Mutant], n: int, verdicts: dict[str, str | None]) -> list[Mutant]:
    """Up to n mutants, survivors first (where the two graders would most likely disagree), then
    killed ones spread over the cell, deterministically."""
    survived = [m for m in mutants if verdicts.get(m.key) is None]
    killed = [m for m in mutants if verdicts.get(m.key) is not None]
    picked = survived[:max(1, n // 2)]
    step = max(1, len(killed) // max(1, n - len(picked)))
    picked += killed[::step][:n - len(picked)]
    return picked[:n]


# -- the report ------------------------------------------------------------------------------------


@dataclass
class ChapterResult:
    stem: str
    total: int = 0
    equivalent: int = 0
    killed: int = 0
    survivors: list[str] = field(default_factory=list)
    stale_equivalent: list[str] = field(default_factory=list)
    equivalent_killed: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        live = self.total - self.equivalent
        return self.killed / live if live else 1.0


def summarize(stem: str, mutants: list[Mutant], verdicts: dict[str, str | None],
              equivalent: dict[str, str]) -> ChapterResult:
    res = ChapterResult(stem, total=len(mutants))
    keys = {m.key for m in mutants}
    res.stale_equivalent = sorted(k for k in equivalent if k not in keys)
    for m in mutants:
        if m.key in equivalent:
            res.equivalent += 1
            if verdicts.get(m.key) is not None:
                res.equivalent_killed.append(m.key)  # listed as equivalent, yet a test catches it: wrong entry
        elif verdicts.get(m.key) is not None:
            res.killed += 1
        else:
            res.survivors.append(m.key)
    return res


def table(results: list[ChapterResult]) -> str:
    lines = ["| chapter | mutants | equivalent | killed | survived | killed / non-equivalent |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.stem} | {r.total} | {r.equivalent} | {r.killed} | {len(r.survivors)} | {r.score:.0%} |")
    return "\n".join(lines)


def run(stems: list[str], solutions: Path, check: int = 0, timeout: float = 300, json_out: Path | None = None,
        say=print) -> int:
    """The ``mutants`` command. Exit status 1 if a chapter is below TARGET, an equivalent entry is
    stale or wrong, or the real autograder disagrees with the in-process verdict."""
    from autograder.commands import solution_files  # noqa: PLC0415

    files = solution_files(solutions)
    unknown = [s for s in stems if s not in files]
    if unknown:
        say(f"error: no such chapter {unknown}; choose from {sorted(files)}")
        return 2
    equivalent = load_equivalent()
    results, status, record = [], 0, {}
    for stem in stems or sorted(files):
        source = nbs.read(files[stem])
        found = chapter_mutants(source)
        say(f"{stem}:")
        t0 = time.monotonic()
        verdicts = grade_mutants(source, found, timeout=timeout, say=say)
        res = summarize(stem, [m for _, m in found], verdicts, equivalent.get(stem, {}))
        say(f"  {time.monotonic() - t0:.0f} s; {res.killed}/{res.total - res.equivalent} killed ({res.score:.0%})")
        record[stem] = verdicts
        for key in res.survivors:
            say(f"  survivor: {key}")
        for key in res.stale_equivalent:
            say(f"  error: {key} is listed as equivalent but no longer exists (remove it)")
        for key in res.equivalent_killed:
            say(f"  error: {key} is listed as equivalent but a test catches it (remove it)")
        status |= bool(res.stale_equivalent or res.equivalent_killed or res.score < TARGET)
        if check:
            picked = sample([m for _, m in found], check, verdicts)
            real = autograde_mutants(stem, files[stem], picked)
            for m in picked:
                agree = real[m.key] == (verdicts[m.key] is not None)
                say(f"  real autograder {'agrees' if agree else 'DISAGREES'}: loses points={real[m.key]}  {m.key}")
                status |= not agree
        results.append(res)
    if json_out:
        Path(json_out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    say("\n" + table(results))
    return status
