"""`python -m autograder merge`: the whole class exactly once, or exit 1 with the missing students named; into a
folder (`-o FOLDER`), everything a single-machine `grade` writes.

The shards here are written the way `make grade ... SHARD=K/N` writes them (grades.csv and the grading.json
that names the shard and the class) but with made-up scores, so these tests take a second; the real thing,
graded shards of a Slurm array job, is tests/test_slurm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from generated_class import make_rows, write_out

from autograder.batch import grade_batch, shard_of
from autograder.commands import SOLUTIONS
from autograder.grade.course import ROOT
from autograder.export.gradebook import feedback_zip
from autograder.export.merging import merge_into
from autograder.report.report import report
from autograder.record.results import Row, merge, read_csv, write_csv
from autograder.record.review import review

N = 3
STEMS = ["03_memory", "05_paging"]


def roster() -> list[str]:
    """Students such that every one of the N shards holds two of them (an empty shard would test nothing)."""
    picked: dict[int, list[str]] = {k: [] for k in range(1, N + 1)}
    i = 0
    while any(len(v) < 2 for v in picked.values()):
        name = f"student{i:02d}"
        if len(picked[shard_of(name, N)]) < 2:
            picked[shard_of(name, N)].append(name)
        i += 1
    return sorted(sum(picked.values(), []))


STUDENTS = roster()


def write_shard(folder: Path, k: int, students: list[str] = STUDENTS, stems: list[str] = STEMS, n: int = N) -> list[Row]:
    mine = [s for s in students if shard_of(s, n) == k]
    rows = [Row(s, stem, float(len(s) % 4), 3.0) for s in mine for stem in stems]
    folder.mkdir(parents=True)
    write_csv(rows, folder / "grades.csv")
    (folder / "grading.json").write_text(json.dumps({"shard": f"{k}/{n}",
                                                     "class": {"students": students, "notebooks": stems}}))
    return rows


def quiet_merge(inputs: list[Path], output: Path) -> tuple[int, str]:
    said: list[str] = []
    return merge(inputs, output, say=said.append), "\n".join(said)


def test_complete_shards_merge_into_the_whole_class(tmp_path):
    rows = sum((write_shard(tmp_path / f"shard-{k}", k) for k in range(1, N + 1)), [])
    status, said = quiet_merge([tmp_path / f"shard-{k}" for k in range(1, N + 1)], tmp_path / "grades.csv")
    assert status == 0, said
    merged = [(r.student, r.notebook, r.score) for r in read_csv(tmp_path / "grades.csv")]
    assert merged == sorted((r.student, r.notebook, r.score) for r in rows)
    assert len(merged) == len(STUDENTS) * len(STEMS)  # every student and notebook, once


@pytest.mark.parametrize("failure", ["no folder", "empty folder", "rows lost"])
def test_a_failed_shard_is_refused_with_its_students_named(tmp_path, failure):
    for k in (1, 3):
        write_shard(tmp_path / f"shard-{k}", k)
    lost = [s for s in STUDENTS if shard_of(s, N) == 2]
    if failure == "empty folder":  # the task could not write its output folder
        (tmp_path / "shard-2").mkdir()
    elif failure == "rows lost":  # a sheet that lacks one student's rows
        write_shard(tmp_path / "shard-2", 2)
        lines = (tmp_path / "shard-2" / "grades.csv").read_text().splitlines(keepends=True)
        (tmp_path / "shard-2" / "grades.csv").write_text("".join(l for l in lines if not l.startswith(lost[0])))
        lost = lost[:1]
    inputs = sorted(tmp_path.glob("shard-*"))  # what `merge graded/shard-*` gets
    status, said = quiet_merge(inputs, tmp_path / "grades.csv")
    assert status == 1
    assert not (tmp_path / "grades.csv").exists()  # never a smaller sheet
    assert f"shard 2/{N}" in said and f"no grades for {len(lost)} student(s): {', '.join(lost)}" in said, said
    others = set(STUDENTS) - set(lost)
    assert not any(s in said for s in others), said  # only the lost ones are named


def test_shards_given_twice_or_from_different_classes_are_refused(tmp_path):
    for k in range(1, N + 1):
        write_shard(tmp_path / f"a{k}", k)
    status, said = quiet_merge([tmp_path / "a1", tmp_path / "a2", tmp_path / "a3", tmp_path / "a1"],
                               tmp_path / "x.csv")
    assert status == 1 and "shard 1/3 is given twice" in said and not (tmp_path / "x.csv").exists()
    write_shard(tmp_path / "other3", 3, students=STUDENTS + ["latecomer"])
    status, said = quiet_merge([tmp_path / "a1", tmp_path / "a2", tmp_path / "other3"], tmp_path / "x.csv")
    assert status == 1 and "different classes" in said and not (tmp_path / "x.csv").exists()
    write_shard(tmp_path / "four1", 1, n=4)
    status, said = quiet_merge([tmp_path / "four1", tmp_path / "a2", tmp_path / "a3"], tmp_path / "x.csv")
    assert status == 1 and "different classes" in said


def test_a_sheet_without_its_grading_json_is_refused(tmp_path):
    for k in range(1, N + 1):
        write_shard(tmp_path / f"shard-{k}", k)
    (tmp_path / "shard-2" / "grading.json").unlink()
    status, said = quiet_merge([tmp_path / f"shard-{k}" / "grades.csv" for k in range(1, N + 1)],
                               tmp_path / "grades.csv")
    assert status == 1 and "grading.json" in said and not (tmp_path / "grades.csv").exists()


def test_cli_merge_exit_status_and_message(tmp_path):
    write_shard(tmp_path / "shard-1", 1)
    write_shard(tmp_path / "shard-3", 3)
    proc = subprocess.run([sys.executable, "-m", "autograder", "merge", str(tmp_path / "shard-1"),
                           str(tmp_path / "shard-3"), "-o", str(tmp_path / "grades.csv")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1
    for s in STUDENTS:
        assert (s in proc.stderr) == (shard_of(s, N) == 2), proc.stderr
    assert "Traceback" not in proc.stderr


def test_grading_into_an_unwritable_out_fails_cleanly(tmp_path):
    """A task whose OUT cannot be made stops before grading with one error line and exit 1 (so Slurm
    records the task FAILED). A file in the way stands in for an unwritable folder: root writes anywhere."""
    subs = tmp_path / "subs" / "alice"
    subs.mkdir(parents=True)
    (tmp_path / "out").write_text("in the way")
    said: list[str] = []
    assert grade_batch(tmp_path / "subs", tmp_path / "out" / "shard-2", SOLUTIONS, workers=1, shard="2/3",
                       say=said.append) == 1
    assert len(said) == 1 and said[0].startswith("error: cannot write the results to"), said


# -- merge SHARD_OUT... -o FOLDER: everything a single-machine grade writes --------------------------------

SAME_FILES = ["grades.csv", "rows.json", "students.json", "answers.json", "gradebook.csv", "canvas_import.csv",
              "moodle_import.csv"]


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def sharded_class(tmp_path: Path) -> tuple[Path, list[Path]]:
    """The generated class (tests/generated_class.py) written once whole, once as N shards."""
    rows = make_rows()
    write_out(tmp_path / "single", rows)
    shards = []
    for k in range(1, N + 1):
        mine = [r for r in rows if shard_of(r.student, N) == k]
        assert mine, f"shard {k}/{N} of the generated class is empty: it would test nothing"
        write_out(tmp_path / f"shard-{k}", mine, f"{k}/{N}")
        shards.append(tmp_path / f"shard-{k}")
    return tmp_path / "single", shards


def test_merge_into_a_folder_equals_the_single_machine_folder(tmp_path):
    single, shards = sharded_class(tmp_path)
    said: list[str] = []
    assert merge_into(shards, tmp_path / "merged", say=said.append) == 0, said
    merged = tmp_path / "merged"
    for name in SAME_FILES:
        assert (merged / name).read_bytes() == (single / name).read_bytes(), name
    assert files_under(merged / "feedback") == files_under(single / "feedback")
    meta, single_meta = (json.loads((f / "grading.json").read_text()) for f in (merged, single))
    for key in ("class", "shard", "format", "settings", "rows", "per_notebook_seconds"):
        assert meta[key] == single_meta[key], key
    assert sorted(meta["merged_from"]) == [f"{k}/{N}" for k in range(1, N + 1)]
    # What instructors run next works on the merged folder as on the single one.
    for out in (single, merged):
        assert feedback_zip(out, say=lambda m: None) == 0
        assert review(out, SOLUTIONS, say=lambda m: None) == 0
        assert report(out, say=lambda m: None) == 0
    for name in ("review/review.csv", "report/tests.csv"):
        assert (merged / name).read_text() == (single / name).read_text(), name
    pages = [(f / "report" / "index.html").read_text() for f in (merged, single)]
    assert len({p[p.index('<h2 id="status">'):] for p in pages}) == 1  # all but the title and the shard count
    with zipfile.ZipFile(merged / "feedback.zip") as a, zipfile.ZipFile(single / "feedback.zip") as b:
        assert {n: a.read(n) for n in a.namelist()} == {n: b.read(n) for n in b.namelist()}


def test_merge_into_a_folder_refuses_an_incomplete_class_or_a_shard_folder(tmp_path):
    _, shards = sharded_class(tmp_path)
    before = files_under(shards[0])
    said: list[str] = []
    status = merge_into(shards[:1] + shards[2:], tmp_path / "merged", say=said.append)
    assert status == 1 and not (tmp_path / "merged").exists()
    assert f"shard 2/{N}" in "\n".join(said)
    said.clear()
    assert merge_into(shards, shards[0], say=said.append) == 1 and "shard 1/3's folder" in "\n".join(said), said
    assert files_under(shards[0]) == before


def test_cli_merge_writes_a_folder_or_a_sheet(tmp_path):
    single, shards = sharded_class(tmp_path)
    for target in ("merged", "merged.csv"):
        proc = subprocess.run([sys.executable, "-m", "autograder", "merge", *map(str, shards), "-o",
                               str(tmp_path / target)], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "merged.csv").read_text() == (single / "grades.csv").read_text()  # today's behaviour
    assert (tmp_path / "merged" / "gradebook.csv").read_text() == (single / "gradebook.csv").read_text()
