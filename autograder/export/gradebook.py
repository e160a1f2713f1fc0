"""Grades back out: one row per student, the LMS import files, and the feedback pages in one zip.

``write_outputs`` writes the files of an OUT folder (``grade`` and ``merge ... -o FOLDER`` call it):
grades.csv, rows.json, students.json, answers.json, grading.json, and from the first two:

- ``gradebook.csv``: student, name, email, lms_id, section, a column per notebook, total,
  max_total, percent, flags (late, and each notebook not ``ok``);
- ``canvas_import.csv``: Canvas's gradebook import layout: Student, ID, SIS User ID,
  SIS Login ID, Section, then one column per assignment (named after the notebook: name the Canvas
  assignments so, or rename the header), and a "Points Possible" row;
- ``moodle_import.csv``: for Moodle's "Import grades from CSV": an identifier column (email
  address when the roster has one, else the participant id) and one grade column per notebook,
  mapped to grade items in Moodle's import form.

``python -m autograder feedback-zip OUT`` packs OUT/feedback into OUT/feedback.zip: one folder
per student (Moodle's ``<Full Name>_<participant id>_assignsubmission_file_`` naming for a Moodle
class, so its "upload multiple feedback files in a zip" finds each student).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import zipfile
from pathlib import Path

from autograder.record.results import ROWS_JSON, Row, Say, _stderr, read_csv, write_csv, write_rows
from autograder.record.review import save_answers


def _students(out: Path) -> dict[str, dict]:
    p = out / "students.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else {}


def _table(rows: list[Row]) -> tuple[list[str], dict[str, dict[str, Row]]]:
    stems = sorted({r.notebook for r in rows})
    by_student: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_student.setdefault(r.student, {})[r.notebook] = r
    return stems, by_student


def write_outputs(out: Path, rows: list[Row], info: dict, meta: dict, say: Say = _stderr) -> None:
    """Everything a graded OUT holds besides the feedback pages: the sheets from ``rows``, the
    students' names (``info``: {id: platforms.Student or its dict}) and ``meta`` as grading.json."""
    write_csv(rows, out / "grades.csv")
    write_rows(rows, out / ROWS_JSON)
    people = {sid: s if isinstance(s, dict) else dataclasses.asdict(s) for sid, s in info.items()}
    (out / "students.json").write_text(json.dumps(people, indent=1, sort_keys=True))
    save_answers(rows, out)
    write_all(out, say=say)
    (out / "grading.json").write_text(json.dumps(meta, indent=1))


def write_all(out: Path, say: Say = _stderr) -> None:
    """gradebook.csv, canvas_import.csv and moodle_import.csv from OUT/grades.csv."""
    out = Path(out)
    rows = read_csv(out / "grades.csv")
    info = _students(out)
    stems, by_student = _table(rows)
    maxima = {s: next(r.max_score for r in rows if r.notebook == s) for s in stems}
    with open(out / "gradebook.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", "name", "email", "lms_id", "section", *stems, "total", "max_total", "percent", "flags"])
        for sid, nbs in sorted(by_student.items()):
            s = info.get(sid, {})
            total, top = sum(r.score for r in nbs.values()), sum(maxima.values())
            flags = (["late"] if any(r.late for r in nbs.values()) else []) + [
                f"{stem}:{nbs[stem].status}" for stem in stems if stem in nbs and nbs[stem].status != "ok"]
            w.writerow([sid, s.get("name", ""), s.get("email", ""), s.get("lms_id", ""), s.get("section", ""),
                        *[f"{nbs[stem].score:g}" if stem in nbs else "" for stem in stems],
                        f"{total:g}", f"{top:g}", f"{100 * total / top:.1f}" if top else "", " ".join(flags)])
    with open(out / "canvas_import.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *stems])
        w.writerow(["Points Possible", "", "", "", "", *[f"{maxima[s]:g}" for s in stems]])
        for sid, nbs in sorted(by_student.items()):
            s = info.get(sid, {})
            sis = sid if sid != s.get("lms_id") else ""  # a roster id; a bare Canvas user id is no SIS id
            w.writerow([s.get("name") or sid, s.get("lms_id", ""), sis, s.get("email", ""), s.get("section", ""),
                        *[f"{nbs[stem].score:g}" if stem in nbs else "" for stem in stems]])
    by_email = bool(by_student) and all(info.get(sid, {}).get("email") for sid in by_student)
    with open(out / "moodle_import.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Email address" if by_email else "ID number", *stems])
        for sid, nbs in sorted(by_student.items()):
            s = info.get(sid, {})
            w.writerow([s["email"] if by_email else (s.get("lms_id") or sid),
                        *[f"{nbs[stem].score:g}" if stem in nbs else "" for stem in stems]])


def feedback_zip(out: Path, dest: Path | None = None, say: Say = _stderr) -> int:
    """Pack OUT/feedback/<student>/<notebook>.html into one zip, a folder per student."""
    out = Path(out)
    fb = out / "feedback"
    if not fb.is_dir():
        say(f"error: {fb} not found: run `python -m autograder grade SUBMISSIONS {out}` first")
        return 2
    dest = Path(dest) if dest else out / "feedback.zip"
    info = _students(out)
    meta = out / "grading.json"
    fmt = json.loads(meta.read_text()).get("format") if meta.is_file() else None
    count = 0
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for page in sorted(fb.glob("*/*.html")):
            sid = page.parent.name
            s = info.get(sid, {})
            folder = f"{s.get('name') or sid}_{s.get('lms_id') or sid}_assignsubmission_file_" if fmt == "moodle" else sid
            z.write(page, f"{folder}/{page.name}")
            count += 1
    if not count:
        say(f"error: no feedback pages in {fb}")
        return 1
    say(f"wrote {dest} ({count} page(s))")
    return 0
