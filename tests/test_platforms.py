"""Intake of the platforms' exports (autograder/intake/platforms.py), on generated fixtures: no grading,
no kernel, so these run in a second. Every export shape the README names is laid out here."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder.intake import platforms
from autograder.intake.intake import match_files

ROOT = Path(__file__).resolve().parents[1]
STEM = "03_memory"
NB = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def write(path: Path, text: str = NB) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_canvas_flat_export(tmp_path):
    root = tmp_path / "export"
    write(root / f"doejane_1001_5001_{STEM}.ipynb")
    write(root / f"roesmith_LATE_1002_5002_{STEM}-1.ipynb")  # late, and a re-submitted file name
    write(root / f"leekim_1003_5003_{STEM}.ipynb", NB.replace("[]", '[{"cell_type": "raw", "metadata": {}, "source": "old"}]'))
    write(root / f"leekim_1003_5009_{STEM}-2.ipynb", NB.replace("[]", '[{"cell_type": "raw", "metadata": {}, "source": "new"}]'))
    write(root / "notes.txt", "not a submission")
    said: list[str] = []
    assert platforms.detect(root) == "canvas"
    intake = platforms.collect(root, "auto", tmp_path / "work", said.append)
    assert intake.format == "canvas" and sorted(intake.students) == ["1001", "1002", "1003"]
    jane, roe, lee = (intake.students[k] for k in ("1001", "1002", "1003"))
    assert (jane.name, jane.late, roe.late) == ("doejane", False, True)
    assert sorted(p.name for p in roe.folder.iterdir()) == [f"{STEM}.ipynb"]  # the -1 is gone
    assert any("re-submitted" in n and f"{STEM}-1.ipynb" in n for n in roe.notes), roe.notes
    assert '"new"' in (lee.folder / f"{STEM}.ipynb").read_text()  # the later submission id wins
    assert any("notes.txt" in s for s in said), said


def test_moodle_folders(tmp_path):
    root = tmp_path / "export"
    write(root / "Jane Doe_4711_assignsubmission_file_" / f"{STEM}.ipynb")
    write(root / "Kim Lee_4712_assignsubmission_file_" / f"{STEM} (1).ipynb")
    write(root / "Kim Lee_4712_assignsubmission_onlinetext_" / "onlinetext.html", "<p>hi</p>")
    assert platforms.detect(root) == "moodle"
    intake = platforms.collect(root, "auto", tmp_path / "work", lambda m: None)
    assert sorted(intake.students) == ["4711", "4712"]
    assert intake.students["4711"].name == "Jane Doe"
    found, _ = match_files(intake.students["4712"].folder, [STEM], {STEM: set()})
    assert found[STEM][0].name == f"{STEM} (1).ipynb"  # the file folder merged with the online text one


def test_classroom_repositories_never_grade_solutions_or_tests(tmp_path):
    """The gap issue 12 found: a student repository that still holds solutions/ was graded 13/13."""
    root = tmp_path / "export"
    write(root / "kv-week3-alice" / "notebooks" / f"{STEM}.ipynb", NB.replace("[]", '[{"cell_type": "raw", "metadata": {}, "source": "mine"}]'))
    write(root / "kv-week3-alice" / "solutions" / f"{STEM}.ipynb")
    (root / "kv-week3-alice" / ".git").mkdir()
    write(root / "kv-week3-bob-smith" / "solutions" / f"{STEM}.ipynb")  # only the instructor's copy
    write(root / "kv-week3-bob-smith" / "tests" / "wrong_answers" / "x.ipynb")
    (root / "kv-week3-bob-smith" / "notebooks").mkdir()
    assert platforms.detect(root) == "classroom"
    intake = platforms.collect(root, "auto", tmp_path / "work", lambda m: None)
    assert sorted(intake.students) == ["alice", "bob-smith"]  # usernames: the assignment prefix removed
    found, ignored = match_files(intake.students["alice"].folder, [STEM], {STEM: set()})
    assert found[STEM][0].parent.name == "notebooks" and '"mine"' in found[STEM][0].read_text()
    assert any(f"solutions/{STEM}.ipynb" in i for i in ignored), ignored
    found, ignored = match_files(intake.students["bob-smith"].folder, [STEM], {STEM: set()})
    assert found == {}, found  # not even by name or grade ids
    assert any("solutions/" in i for i in ignored) and any("tests/" in i for i in ignored), ignored


def test_folder_per_student_and_forced_format(tmp_path):
    root = tmp_path / "export"
    write(root / "alice" / f"{STEM}.ipynb")
    write(root / "alice" / "solutions" / f"{STEM}.ipynb")
    assert platforms.detect(root) == "folders"
    intake = platforms.collect(root, "folders", tmp_path / "work", lambda m: None)
    found, ignored = match_files(intake.students["alice"].folder, [STEM], {STEM: set()})
    assert found[STEM][0].parent.name == "alice" and ignored
    with pytest.raises(ValueError, match="--format must be one of"):
        platforms.collect(root, "blackboard")


def test_roster_maps_ids_and_lists_everyone(tmp_path):
    root = tmp_path / "export"
    write(root / f"doejane_1001_5001_{STEM}.ipynb")
    write(root / f"stranger_1099_5002_{STEM}.ipynb")
    roster = write(tmp_path / "roster.csv", "id,name,email,lms_id,section\n"
                                            "s1,Jane Doe,jane@uni.example,1001,A\ns2,Kim Lee,kim@uni.example,1003,B\n")
    intake = platforms.collect(root, "auto", tmp_path / "work", lambda m: None)
    entries, info = platforms.apply_roster(intake, platforms.read_roster(roster))
    assert sorted(entries) == ["1099", "s1"] and sorted(info) == ["1099", "s1", "s2"]
    assert info["s2"].section == "B" and "s2" not in entries  # on the roster, handed in nothing
    assert any("not on the roster" in n for n in entries["1099"].notes)


@pytest.mark.parametrize("text,words", [
    ("name,email\nx,y\n", "needs a header with the column id"),
    ("id,name,phone\ns1,a,1\n", "unknown roster column"),
    ("id,name\ns1,a\ns1,b\n", "appears twice"),
    ("id,name\n../x,a\n", "must be letters"),
])
def test_bad_roster_is_one_clear_error(tmp_path, text, words):
    with pytest.raises(ValueError, match=words):
        platforms.read_roster(write(tmp_path / "roster.csv", text))


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([sys.executable, "-m", "autograder", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


def test_usage_errors_are_one_line(tmp_path, capsys):
    subs = tmp_path / "subs"
    write(subs / "alice" / f"{STEM}.ipynb")
    (tmp_path / "out.txt").write_text("a file")
    cases = [
        ([str(subs), str(tmp_path / "out.txt")], "is a file"),
        ([str(subs), str(subs / "graded")], "is inside SUBMISSIONS"),
        ([str(subs), str(tmp_path / "o1"), "--shard", "3/2"], "--shard takes K/N"),
        ([str(subs), str(tmp_path / "o2"), "--workers", "0"], "--workers must be at least 1"),
        ([str(tmp_path / "nope"), str(tmp_path / "o3")], "does not exist"),
        ([str(subs), str(tmp_path / "o4"), "--roster", str(write(tmp_path / "r.csv", "name\nx\n"))], "column id"),
    ]
    from autograder.__main__ import main

    for args, words in cases:  # in this process: the CLI's own code path, without a second torch import
        assert main(["grade", *args]) == 2, args
        err = capsys.readouterr().err
        assert words in err and len([l for l in err.splitlines() if l.strip()]) == 1, (args, err[-500:])
    assert not (subs / "graded").exists()


def test_canvas_export_without_notebooks_exits_1(tmp_path):
    """Issue 12: a class the grader cannot read used to give exit 0 and an empty grades.csv."""
    archive = tmp_path / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("doejane_1001_5001_answers.pdf", b"%PDF-1.4")
        z.writestr("roesmith_LATE_1002_5002_notes.txt", "text")
    p = cli("grade", str(archive), str(tmp_path / "out"))
    assert p.returncode == 1, p.stderr[-800:]
    assert "nothing to grade" in p.stderr and "canvas" in p.stderr, p.stderr[-800:]
