"""A class graded in shards, joined into one OUT folder: ``merge SHARD_OUT... -o FOLDER``.

FOLDER gets what ``grade`` writes for the whole class on one machine: grades.csv, rows.json,
students.json, answers.json, gradebook.csv, canvas_import.csv, moodle_import.csv, grading.json and
feedback/<student>/<NN_topic>.html, with the same contents apart from times, worker counts and
paths. ``feedback-zip``, ``review`` and ``report`` then work on FOLDER as on a single machine's OUT.
``merge ... -o file.csv`` writes the sheet alone (``results.merge``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autograder.export.gradebook import write_outputs
from autograder.record.results import ROWS_JSON, Row, Say, Shards, _stderr, gather, merged_line, read_rows, refuse, summary


def full_rows(shards: Shards) -> list[Row]:
    """The checked rows of the sheets, with their per-test results, time and free-text answers from
    each shard's rows.json where it has one (grades.csv carries only the sheet's columns)."""
    full: dict[tuple[str, str], Row] = {}
    for folder in shards.folders.values():
        if (folder / ROWS_JSON).is_file():
            full.update({(r.student, r.notebook): r for r in read_rows(folder / ROWS_JSON)})
    out = []
    for key, row in shards.rows.items():
        r = full.get(key)
        same = r is not None and (r.score, r.max_score, r.status, r.late) == (row.score, row.max_score, row.status,
                                                                            row.late)
        out.append(r if same else row)
    return out


def merged_meta(shards: Shards) -> dict:
    """grading.json of the whole class: the shards' settings, summed counts, their times side by side."""
    metas = [shards.metas[k] for k in sorted(shards.metas)]
    first = metas[0]
    meta = {key: first[key] for key in ("format", "isolation", "kernels", "settings") if key in first}
    meta.update({"class": {"students": shards.students, "notebooks": shards.stems}, "shard": "1/1",
                 "isolated": all(m.get("isolated", False) for m in metas),
                 "canary": all(m.get("canary", False) for m in metas),
                 "workers": sum(m.get("workers", 0) for m in metas),
                 "seconds": max(m.get("seconds", 0.0) for m in metas),
                 "graded": sum(m.get("graded", 0) for m in metas), "rows": len(shards.rows)})
    for key in ("per_notebook_seconds", "per_notebook_timing"):
        meta[key] = {name: v for m in metas for name, v in sorted(m.get(key, {}).items())}
    meta["merged_from"] = {f"{k}/{shards.n}": str(shards.folders[k]) for k in sorted(shards.folders)}
    return meta


def merge_into(inputs: list[Path], dest: Path, say: Say = _stderr) -> int:
    """Write the OUT folder of the whole class into ``dest`` from the OUT folders of its shards.
    Exit status 1, nothing written, when the shards do not hold the whole class exactly once (see
    ``results.gather``) or ``dest`` is one of them."""
    dest = Path(dest).resolve()
    shards, problems = gather(inputs)
    if shards is not None:
        for k, folder in shards.folders.items():
            if dest == folder.resolve() or folder.resolve() in dest.parents:
                problems.append(f"-o {dest} is shard {k}/{shards.n}'s folder {folder} (or inside it): "
                                f"merge into a folder of its own")
    if dest.exists() and not dest.is_dir():
        problems.append(f"-o {dest} is a file: give a folder, or a name ending in .csv for the sheet alone")
    if shards is None or problems:
        return refuse(problems, dest, say)
    dest.mkdir(parents=True, exist_ok=True)
    rows = full_rows(shards)
    info: dict[str, dict] = {}
    answers: dict[str, dict] = {}
    for folder in shards.folders.values():
        for name, into in (("students.json", info), ("answers.json", answers)):
            if (folder / name).is_file():
                into.update(json.loads((folder / name).read_text(encoding="utf-8")))
        pages = folder / "feedback"
        for student in sorted(p.name for p in pages.iterdir() if p.is_dir()) if pages.is_dir() else []:
            shutil.copytree(pages / student, dest / "feedback" / student, dirs_exist_ok=True)
    for r in rows:  # a shard without rows.json: its free-text answers come from its answers.json
        r.manual = r.manual or answers.get(f"{r.student}/{r.notebook}", {})
    write_outputs(dest, rows, info, merged_meta(shards), say=say)
    say(summary(rows) if rows else "no rows")
    say(merged_line(shards, inputs, dest) + " (grades.csv, gradebook, LMS import files, feedback pages, ...)")
    return 0
