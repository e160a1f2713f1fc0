"""The class report: what a graded class got wrong, at a glance.

    python -m autograder report OUT        # OUT/report/index.html, its figures (PNG) and OUT/report/tests.csv

The page opens offline (no script, no font or style from the network; the figures are PNG files
beside it, drawn with matplotlib's Agg renderer). It shows the count of each status per notebook,
the students who need help, the time per notebook, per notebook a score histogram and the pass rate
of every test (hardest first) with the message failing students saw most often, and the progress of
the free-text review. The numbers come from ``report_stats.py``; OUT may be a merged folder.
"""

from __future__ import annotations

import html
import statistics
from pathlib import Path

from autograder.report.report_stats import (HELP_LOWEST, ClassData, Helped, Question, TestStat, load, needs_help, review_progress,
                           status_counts, test_stats, write_tests_csv)
from autograder.record.results import ROWS_JSON, STATUSES, Say, _stderr

STATUS_NAMES = {"ok": "graded", "late": "late", "missing": "missing", "invalid": "invalid", "timeout": "timeout",
                "error": "error", "needs_review": "manual pending"}
NOT_GRADED = ("missing", "invalid", "timeout", "error")
STYLE = """body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}
td.n,th.n{text-align:right}tr.low td{background:#fde2e2}img{max-width:100%}.bar{background:#eee;width:10em}
.bar span{display:block;background:#4a8;height:1em}code{font-size:90%}nav a{margin-right:1em}"""


def esc(x) -> str:
    return html.escape(str(x))


def table(head: list[str], body: list[list], numeric: set[int] = frozenset(), classes: list[str] | None = None) -> str:
    cls = lambda i: ' class="n"' if i in numeric else ""  # noqa: E731
    rows = [f"<tr>{''.join(f'<th{cls(i)}>{esc(h)}</th>' for i, h in enumerate(head))}</tr>"]
    for j, line in enumerate(body):
        tr = f'<tr class="{classes[j]}">' if classes and classes[j] else "<tr>"
        rows.append(tr + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(line)) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


# -- figures ---------------------------------------------------------------------------------------


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # drawn with Agg; no pyplot, no display

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def score_histogram(data: ClassData, stem: str, path: Path) -> None:
    rows = [r for r in data.rows if r.notebook == stem]
    top = max(r.max_score for r in rows)
    whole = top <= 30 and all(float(r.score).is_integer() for r in rows)
    bins = [b - 0.5 for b in range(int(top) + 2)] if whole else [top * i / 10 for i in range(11)]
    fig, ax = _figure(6, 3)
    graded = [r.score for r in rows if r.status not in NOT_GRADED]
    other = [r.score for r in rows if r.status in NOT_GRADED]
    ax.hist([graded, other], bins=bins, stacked=True, color=["#4a8", "#d66"],
            label=["graded", "not graded (" + ", ".join(NOT_GRADED) + ")"])
    ax.set(xlabel=f"score (of {top:g})", ylabel="students", title=f"{stem}: scores")
    ax.yaxis.get_major_locator().set_params(integer=True)
    fig.legend(fontsize=8, loc="outside lower center", ncols=2)
    fig.savefig(path)


def pass_rate_bars(stats: list[TestStat], stem: str, path: Path) -> None:
    mine = [s for s in stats if s.notebook == stem]  # hardest first, drawn top to bottom
    fig, ax = _figure(7, 0.8 + 0.32 * len(mine))
    ys = list(range(len(mine)))[::-1]
    rates = [100 * s.pass_rate for s in mine]
    ax.barh(ys, rates, color=["#d66" if r < 50 else "#e9a23b" if r < 80 else "#4a8" for r in rates])
    ax.set_yticks(ys, [s.test for s in mine], fontsize=8)
    for y, s, r in zip(ys, mine, rates):
        ax.text(min(r, 100) + 1, y, f"{r:.0f}% ({s.passed}/{s.students})", va="center", fontsize=8)
    ax.set(xlim=(0, 118), xlabel="students who passed (%)", title=f"{stem}: pass rate per test, hardest first")
    fig.savefig(path)


def seconds(data: ClassData, stem: str) -> list[float]:
    """The time of every notebook of ``stem`` that went to a kernel (not missing, not refused as invalid)."""
    return [r.seconds for r in data.rows if r.notebook == stem and r.seconds and r.status not in ("missing", "invalid")]


def time_boxes(data: ClassData, path: Path) -> bool:
    stems = [s for s in data.notebooks if seconds(data, s)]
    if not stems:
        return False
    fig, ax = _figure(7, 0.8 + 0.45 * len(stems))
    ax.boxplot([seconds(data, s) for s in stems][::-1],
               orientation="horizontal", tick_labels=stems[::-1])
    ax.set(xlabel="seconds to grade one notebook", title="time per notebook")
    fig.savefig(path)
    return True


# -- the page --------------------------------------------------------------------------------------


def status_section(data: ClassData) -> str:
    counts = status_counts(data.rows)
    keys = list(STATUSES) + ["late"]
    body = [[esc(stem)] + [c[k] for k in keys] for stem, c in counts.items()]
    body.append(["<b>all</b>"] + [sum(c[k] for c in counts.values()) for k in keys])
    return table(["notebook"] + [STATUS_NAMES[k] for k in keys], body, set(range(1, len(keys) + 1)))


def help_section(people: list[Helped]) -> str:
    if not people:
        return "<p>Nobody.</p>"
    body = [[esc(h.student), esc(h.name), f"{h.total:g} / {h.max_total:g}", f"{h.percent:.0f}%",
             esc("; ".join(h.problems))] for h in people]
    return table(["student", "name", "total", "percent", "missing, timed out or not graded"], body, {2, 3},
                 ["low" if h.problems else "" for h in people])


def time_section(data: ClassData, dest: Path) -> str:
    if not time_boxes(data, dest / "time.png"):
        return "<p>No timing recorded (cached rows keep the time of their first grading).</p>"
    body = []
    for stem in data.notebooks:
        secs = seconds(data, stem)
        if secs:
            body.append([esc(stem), len(secs), f"{statistics.median(secs):.1f}", f"{max(secs):.1f}",
                         f"{sum(secs):.0f}"])
    return ('<img src="time.png" alt="time per notebook">'
            + table(["notebook", "timed", "median s", "max s", "total s"], body, {1, 2, 3, 4}))


def notebook_section(data: ClassData, stats: list[TestStat], stem: str, dest: Path) -> str:
    rows = [r for r in data.rows if r.notebook == stem]
    top = max(r.max_score for r in rows)
    mean = sum(r.score for r in rows) / len(rows)
    parts = [f'<h2 id="nb-{esc(stem)}">{esc(stem)}</h2>',
             f"<p>{len(rows)} student(s), mean score {mean:.2f} of {top:g}.</p>"]
    score_histogram(data, stem, dest / f"scores-{stem}.png")
    parts.append(f'<img src="scores-{esc(stem)}.png" alt="score histogram of {esc(stem)}">')
    mine = [s for s in stats if s.notebook == stem]
    if not mine:
        parts.append("<p>No per-test results for this notebook.</p>")
        return "\n".join(parts)
    pass_rate_bars(stats, stem, dest / f"tests-{stem}.png")
    parts.append(f'<img src="tests-{esc(stem)}.png" alt="pass rate per test of {esc(stem)}">')
    body = []
    for s in mine:
        message, count = s.top_failure()
        body.append([f"<code>{esc(s.test)}</code>", f"{s.points:g}", f"{s.passed}/{s.students}",
                     f"{100 * s.pass_rate:.0f}%", esc(message) + (f" ({count} of {s.students - s.passed})" if count else "")])
    parts.append(table(["test", "points", "passed", "pass rate", "most frequent message of the failing students"],
                       body, {1, 2, 3}))
    return "\n".join(parts)


def review_section(questions: list[Question]) -> str:
    body = []
    for q in questions:
        done = 100 * q.reviewed / q.answers if q.answers else 100
        body.append([esc(q.notebook), f"<code>{esc(q.question)}</code>", q.answers, q.reviewed, q.answers - q.reviewed,
                     f'<div class="bar"><span style="width:{done:.0f}%"></span></div>'])
    return ("<p>Answers with points in review/review.csv (see <code>python -m autograder review</code>).</p>"
            + table(["notebook", "question", "answers", "reviewed", "pending", "progress"], body, {2, 3, 4}))


def write_page(data: ClassData, stats: list[TestStat], people: list[Helped], questions: list[Question],
               dest: Path) -> Path:
    students = len({r.student for r in data.rows})
    meta = data.meta
    source = f", {len(meta['merged_from'])} shard(s) merged" if meta.get("merged_from") else ""
    nav = ['<a href="#status">statuses</a>', '<a href="#help">who needs help</a>', '<a href="#time">time</a>']
    nav += [f'<a href="#nb-{esc(s)}">{esc(s)}</a>' for s in data.notebooks]
    nav += ['<a href="#review">free-text review</a>'] if questions else []
    parts = [f"<h1>Class report: {esc(data.out.name)}</h1>",
             f"<p>{students} student(s) x {len(data.notebooks)} notebook(s){esc(source)}; per-test results: "
             f"{'yes' if data.per_test else 'no (' + ROWS_JSON + ' missing: grade again)'}. "
             f"Pass rates count the students whose notebook was graded; the numbers are in "
             f'<a href="tests.csv">tests.csv</a>.</p>', "<nav>" + " ".join(nav) + "</nav>",
             '<h2 id="status">Statuses</h2>', status_section(data),
             '<h2 id="help">Students who need help</h2>',
             f"<p>The {HELP_LOWEST} lowest totals (ties included), and anyone with a notebook missing, invalid, "
             f"timed out or not graded (highlighted).</p>", help_section(people),
             '<h2 id="time">Time per notebook</h2>', time_section(data, dest)]
    parts += [notebook_section(data, stats, stem, dest) for stem in data.notebooks]
    if questions:
        parts += ['<h2 id="review">Free-text review</h2>', review_section(questions)]
    page = dest / "index.html"
    page.write_text("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>Class report</title>"
                    f"<style>{STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n",
                    encoding="utf-8")
    return page


def report(out: Path, say: Say = _stderr) -> int:
    """Write OUT/report/index.html, its figures and OUT/report/tests.csv. Exit status 0, or 2 when OUT
    holds no grades."""
    try:
        data = load(out)
    except ValueError as e:
        say(f"error: {e}")
        return 2
    dest = data.out / "report"
    dest.mkdir(parents=True, exist_ok=True)
    stats = test_stats(data.rows)
    write_tests_csv(stats, dest / "tests.csv")
    write_page(data, stats, needs_help(data), review_progress(data.out), dest)
    if not data.per_test:
        say(f"warning: {data.out / ROWS_JSON} not found (graded by an older version): no per-test results; "
            f"grade again into the same OUT (unchanged notebooks come from the cache)")
    say(f"wrote {dest / 'index.html'} and {dest / 'tests.csv'} ({len(stats)} test(s), "
        f"{len({r.student for r in data.rows})} student(s))")
    return 0
