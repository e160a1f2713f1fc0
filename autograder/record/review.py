"""Manual grading of free-text answers: the pages a person reads, and their points merged back.

    python -m autograder grade SUBMISSIONS OUT            # free-text answers: status needs_review
    python -m autograder review OUT                       # OUT/review/<NN_topic>-<question>.html + review.csv
    (fill in the points and comment columns of OUT/review/review.csv)
    python -m autograder grade SUBMISSIONS OUT --manual OUT/review/review.csv

A free-text question is an nbgrader answer cell that carries points (``grade`` and ``solution``
both true, a markdown cell). nbgrader cannot score it; ``grade`` keeps the automatic points and
marks the row ``needs_review``; ``review`` shows, per question, the prompt, the rubric (the
instructor source's cell) and every student's answer; ``--manual`` adds the points, turns the row
``ok`` once every question of it has points, and puts the comments into the feedback page.
"""

from __future__ import annotations

import csv
import html
import json
import re
from pathlib import Path

from autograder.shared import notebooks
from autograder.record.results import Row, Say, _stderr

REVIEW_FIELDS = ["student", "notebook", "question", "max_points", "points", "comment"]
ANSWERS = "answers.json"  # OUT/answers.json: the free-text answers of the last grade run
BLOCK = re.compile(r"<!--kv-review-->.*?<!--/kv-review-->", re.S)


def save_answers(rows: list[Row], out: Path) -> None:
    """OUT/answers.json: {"student/notebook": {question: {max_score, answer}}} for rows waiting for review."""
    data = {f"{r.student}/{r.notebook}": r.manual for r in rows if r.manual}
    (out / ANSWERS).write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")


def read_review(path: Path) -> dict[tuple[str, str, str], tuple[float, str]]:
    """{(student, notebook, question): (points, comment)} of the rows of a review.csv that have points."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("student", "notebook", "question", "points") if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected {', '.join(REVIEW_FIELDS)}")
        out = {}
        for i, row in enumerate(reader, start=2):
            text = (row.get("points") or "").strip()
            if not text:
                continue
            try:
                points = float(text)
            except ValueError:
                raise ValueError(f"{path}, line {i}: points must be a number, got {text!r}") from None
            out[(row["student"], row["notebook"], row["question"])] = (points, (row.get("comment") or "").strip())
    return out


def apply(rows: list[Row], marks: dict[tuple[str, str, str], tuple[float, str]], feedback_dir: Path) -> list[str]:
    """Add the reviewed points to ``rows`` (in place) and the comments to the feedback pages.
    Returns warnings (points out of range, marks for answers that are not there)."""
    warnings, used = [], set()
    for r in rows:
        if not r.manual:
            continue
        done, notes = [], []
        for gid, q in r.manual.items():
            key = (r.student, r.notebook, gid)
            if key not in marks:
                continue
            used.add(key)
            points, comment = marks[key]
            if not 0 <= points <= q["max_score"]:
                warnings.append(f"warning: review.csv: {r.student}/{r.notebook} {gid}: {points:g} points is not "
                                f"between 0 and {q['max_score']:g}; ignored")
                continue
            r.score += points
            done.append(gid)
            notes.append((gid, points, q["max_score"], comment))
        if notes:
            r.reason = "; ".join([f"reviewed: " + "; ".join(f"{g} {p:g}/{m:g}" + (f" ({c})" if c else "")
                                                            for g, p, m, c in notes)] + [x for x in [r.reason] if x])
        if len(done) == len(r.manual):
            r.status = "ok"
        page = feedback_dir / r.student / f"{r.notebook}.html"
        if notes and page.is_file():
            block = "".join(f"<p><b>{html.escape(g)}: {p:g} / {m:g}</b> {html.escape(c)}</p>" for g, p, m, c in notes)
            text = BLOCK.sub("", page.read_text(encoding="utf-8"))
            text = text.replace("</h1>", f"</h1><!--kv-review--><h2>Reviewer's comments</h2>{block}<!--/kv-review-->", 1)
            page.write_text(text, encoding="utf-8")
    for key in sorted(set(marks) - used):
        warnings.append(f"warning: review.csv: no free-text answer {key[2]} of {key[0]}/{key[1]} in this run; ignored")
    return warnings


def _prompt_and_rubric(source: notebooks.NotebookNode, gid: str) -> tuple[str, str]:
    cells = source.cells
    for i, cell in enumerate(cells):
        if notebooks.grade_id(cell) == gid:
            prompt = next((c.source for c in reversed(cells[:i]) if c.cell_type == "markdown"), "")
            return prompt, cell.source
    return "", ""


def review(out: Path, solutions: Path, say: Say = _stderr) -> int:
    """OUT/review/<notebook>-<question>.html (prompt, rubric, every answer) and OUT/review/review.csv;
    points already filled in an existing review.csv are kept."""
    out = Path(out)
    answers_file = out / ANSWERS
    if not answers_file.is_file():
        say(f"error: {answers_file} not found: run `python -m autograder grade SUBMISSIONS {out}` first")
        return 2
    data = json.loads(answers_file.read_text(encoding="utf-8"))
    dest = out / "review"
    dest.mkdir(exist_ok=True)
    sheet = dest / "review.csv"
    kept = read_review(sheet) if sheet.is_file() else {}
    questions: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for key, manual in sorted(data.items()):
        student, stem = key.split("/", 1)
        for gid, q in manual.items():
            questions.setdefault((stem, gid), []).append((student, q))
    rows = []
    for (stem, gid), items in sorted(questions.items()):
        path = Path(solutions) / f"{stem}.ipynb"
        prompt, rubric = _prompt_and_rubric(notebooks.read(path), gid) if path.is_file() else ("", "")
        parts = [f"<h1>{html.escape(stem)}: {html.escape(gid)} ({len(items)} answer(s))</h1>",
                 "<h2>Question</h2>", f"<pre>{html.escape(prompt)}</pre>",
                 "<h2>Rubric (instructor source)</h2>", f"<pre>{html.escape(rubric)}</pre>"]
        for student, q in items:
            parts += [f"<h3 id='{html.escape(student)}'>{html.escape(student)} (max {q['max_score']:g})</h3>",
                      f"<pre style='white-space:pre-wrap'>{html.escape(q['answer'])}</pre>"]
            points, comment = kept.get((student, stem, gid), ("", ""))
            rows.append([student, stem, gid, f"{q['max_score']:g}", points if points == "" else f"{points:g}", comment])
        page = dest / f"{stem}-{gid}.html"
        page.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><title>review</title></head><body>"
                        + "\n".join(parts) + "</body></html>", encoding="utf-8")
        say(f"wrote {page}")
    with open(sheet, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(REVIEW_FIELDS)
        w.writerows(rows)
    say(f"wrote {sheet} ({len(rows)} answer(s) to review; fill in points and comment, then "
        f"`python -m autograder grade SUBMISSIONS {out} --manual {sheet}`)")
    return 0
