"""Submissions as the platforms export them, turned into one folder per student.

    collect(SUBMISSIONS, fmt="auto") -> Intake(format, students={id: Entry(folder, late, name, ...)})

Formats (``--format``, recognised automatically by default):

- ``canvas``: Canvas "Download Submissions", one flat folder of
  ``<name>[_LATE]_<user id>_<submission id>_<original file name>``; a re-submitted file may carry
  ``-1``, ``-2`` before its extension. The id is the Canvas user id.
- ``moodle``: Moodle "Download all submissions", one folder per participant,
  ``<Full Name>_<participant id>_assignsubmission_file_/``. The id is the participant id.
- ``classroom``: GitHub Classroom, one cloned repository per student, ``<assignment>-<username>/``.
  The id is the username.
- ``folders``: ``<student>/<NN_topic>.ipynb``, the folder name is the id.

Canvas files are copied into per-student folders under ``work`` with their original names; the
other layouts are read where they are. ``apply_roster`` maps the platform ids to the roster's.
"""

from __future__ import annotations

import csv
import dataclasses
import re
import shutil
from pathlib import Path

from autograder.shared.rows import Say, _stderr

FORMATS = ("auto", "canvas", "moodle", "classroom", "folders")
CANVAS_RE = re.compile(r"^(?P<name>[^_]+?)(?P<late>_LATE|_late)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")
RESUBMIT_RE = re.compile(r"^(?P<stem>.+?)-(?P<n>\d+)(?P<ext>\.[A-Za-z0-9]+)$")  # 03_memory-1.ipynb
MOODLE_RE = re.compile(r"^(?P<name>.+)_(?P<pid>\d+)_assign(?:submission|feedback)_[a-z]+_?$")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")  # becomes a path and a CSV cell
# Where the student edition has notebooks, relative to a student's folder or repository: only
# files there can be the student's answer. solutions/, tests/ and every other place are ignored.
ANSWER_PLACES = ("", "notebooks")
ROSTER_FIELDS = ("id", "name", "email", "lms_id", "section")


@dataclasses.dataclass
class Entry:
    folder: Path
    late: bool = False
    name: str = ""
    lms_id: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Intake:
    format: str
    students: dict[str, Entry]


def _visible(p: Path) -> bool:
    return not p.name.startswith(".") and p.name != "__MACOSX"


def detect(root: Path) -> str:
    """The export format of the folder ``root`` (see the module docstring)."""
    entries = [p for p in root.iterdir() if _visible(p)]
    files = [p for p in entries if p.is_file()]
    dirs = [p for p in entries if p.is_dir()]
    if files and sum(bool(CANVAS_RE.match(p.name)) for p in files) * 2 > len(files):
        return "canvas"
    if dirs and all(MOODLE_RE.match(d.name) for d in dirs):
        return "moodle"
    if dirs and all((d / ".git").exists() or (d / "notebooks").is_dir() for d in dirs) and all("-" in d.name for d in dirs):
        return "classroom"
    return "folders"


def classroom_prefix(names: list[str]) -> str:
    """The ``<assignment>-`` part shared by every repository name (GitHub Classroom appends the
    username). With one repository the assignment cannot be told apart: up to its first ``-``."""
    if len(names) == 1:
        return names[0].split("-", 1)[0] + "-"
    prefix = names[0]
    for n in names[1:]:
        while not n.startswith(prefix):
            prefix = prefix[:-1]
    return prefix[:prefix.rfind("-") + 1] if "-" in prefix else ""


def collect(root: Path, fmt: str = "auto", work: Path | None = None, say: Say = _stderr) -> Intake:
    """One ``Entry`` per student of the export in the folder ``root``. Raises ``ValueError`` for an
    unknown format or a folder that is not in the format asked for."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    found = detect(root) if fmt == "auto" else fmt
    students: dict[str, Entry] = {}

    def add(sid: str, entry: Entry, what: str) -> None:
        if not ID_RE.match(sid):
            say(f"skipped {what}: a student id is letters, digits and _ . @ - (starting with a letter or digit)")
        elif sid in students:
            say(f"skipped {what}: a second submission for {sid}")
        else:
            students[sid] = entry

    if found == "canvas":
        if work is None:
            raise ValueError("a Canvas export needs a work folder to sort the files into")
        newest: dict[tuple[str, str], int] = {}  # (user id, file name) -> submission id copied
        for p in sorted(p for p in root.iterdir() if _visible(p)):
            m = CANVAS_RE.match(p.name) if p.is_file() else None
            if not m:
                say(f"skipped {p.name}: not a Canvas submission file (<name>[_LATE]_<user id>_<submission id>_<file>)")
                continue
            uid, name = m["uid"], m["file"]
            entry = students.setdefault(uid, Entry(work / "canvas" / uid, name=m["name"], lms_id=uid))
            r = RESUBMIT_RE.match(name)
            if r:
                entry.notes.append(f"re-submitted file {name} graded as {r['stem']}{r['ext']}")
                name = r["stem"] + r["ext"]
            entry.late = entry.late or bool(m["late"])
            sid = int(m["sid"])
            if (uid, name) in newest:
                entry.notes.append(f"two files named {name}: graded the one of the later submission")
                if sid < newest[(uid, name)]:
                    continue
            entry.folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, entry.folder / name)
            newest[(uid, name)] = sid
    elif found == "moodle":
        for d in sorted(p for p in root.iterdir() if _visible(p)):
            m = MOODLE_RE.match(d.name) if d.is_dir() else None
            if not m:
                say(f"skipped {d.name}: not a Moodle submission folder (<Full Name>_<id>_assignsubmission_file_)")
                continue
            if m["pid"] in students:  # online text and file submissions of one participant
                continue
            add(m["pid"], Entry(d, name=m["name"], lms_id=m["pid"]), d.name)
        for sid, entry in students.items():  # every folder of the participant (file, onlinetext)
            siblings = [d for d in root.iterdir() if d.is_dir() and (m := MOODLE_RE.match(d.name)) and m["pid"] == sid]
            if len(siblings) > 1:
                merged = (work or root) / "moodle" / sid
                for d in siblings:
                    shutil.copytree(d, merged, dirs_exist_ok=True)
                entry.folder = merged
    elif found == "classroom":
        repos = sorted(p for p in root.iterdir() if _visible(p) and p.is_dir())
        prefix = classroom_prefix([r.name for r in repos])
        for r in repos:
            user = r.name[len(prefix):] if r.name.startswith(prefix) else r.name
            add(user, Entry(r, name=user, lms_id=user), r.name)
    else:
        for d in sorted(p for p in root.iterdir() if _visible(p)):
            if not d.is_dir():
                say(f"skipped {d}: expected one folder per student")
            else:
                add(d.name, Entry(d, lms_id=d.name), str(d))
    return Intake(found, students)


def candidate_files(folder: Path) -> tuple[list[Path], list[str]]:
    """The files of a student's folder that may be an answer (at the top or under notebooks/),
    and notes on the notebooks found elsewhere (never graded: solutions/, tests/, ...)."""
    keep, ignored = [], []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if not p.is_file() or any(s.startswith(".") or s == "__MACOSX" for s in rel.parts):
            continue
        if "/".join(rel.parts[:-1]) in ANSWER_PLACES:
            keep.append(p)
        elif p.suffix.lower() == ".ipynb":
            ignored.append(f"ignored {rel} (not where the student edition keeps notebooks: "
                           f"only the top and notebooks/ are graded)")
    return keep, ignored


# -- roster -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Student:
    id: str
    name: str = ""
    email: str = ""
    lms_id: str = ""
    section: str = ""


def read_roster(path: Path) -> list[Student]:
    """roster.csv with the header ``id,name,email,lms_id,section`` (only ``id`` is required)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        if "id" not in header:
            raise ValueError(f"{path}: the roster needs a header with the column id "
                             f"(columns: {', '.join(ROSTER_FIELDS)}), got {header}")
        unknown = [h for h in header if h not in ROSTER_FIELDS]
        if unknown:
            raise ValueError(f"{path}: unknown roster column(s) {unknown}; allowed: {', '.join(ROSTER_FIELDS)}")
        out, seen = [], set()
        for i, row in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
            if not row.get("id"):
                raise ValueError(f"{path}, line {i}: empty id")
            if not ID_RE.match(row["id"]):
                raise ValueError(f"{path}, line {i}: id {row['id']!r} must be letters, digits and _ . @ -")
            if row["id"] in seen:
                raise ValueError(f"{path}, line {i}: id {row['id']!r} appears twice")
            seen.add(row["id"])
            out.append(Student(**{k: row.get(k, "") for k in ROSTER_FIELDS}))
    return out


def apply_roster(intake: Intake, roster: list[Student]) -> tuple[dict[str, Entry], dict[str, Student]]:
    """Submissions keyed by roster id (matched by LMS id, id or email/username), plus every roster
    student. A submission nobody on the roster matches keeps its platform id and says so."""
    by_key: dict[str, Student] = {}
    for s in roster:
        for key in (s.lms_id, s.id, s.email, s.email.split("@")[0] if s.email else ""):
            if key:
                by_key.setdefault(key.lower(), s)
    out: dict[str, Entry] = {}
    info = {s.id: s for s in roster}
    for pid, entry in intake.students.items():
        s = by_key.get(pid.lower())
        if s is None:
            entry.notes.append(f"{pid} is not on the roster")
            out[pid] = entry
            info[pid] = Student(pid, entry.name, "", entry.lms_id, "")
        else:
            out[s.id] = entry
    return out, info
