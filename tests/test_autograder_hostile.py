"""The batch grader against hostile and broken submissions (autograder/batch.py, job.py, sandbox.py).

One class is graded once (module fixture ``batch``): a tiny dedicated assignment, 90_hostile,
handed in by one student per fixture below, plus the real 03_memory solution. Every fixture must
get a row with a score, a status and a reason; the batch completes; other students' results and
the gradebook stay intact; nothing is written outside OUT; hidden tests never reach a feedback
page; the kernel sees neither the instructor's files nor the network.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell

from autograder.shared import notebooks as nbs
from autograder.shared import sandbox
from autograder.batch import Settings, grade_batch, shard_of
from autograder.record.results import merge, read_csv
from autograder.commands import build_releases
from autograder.grade.course import Course

ROOT = Path(__file__).resolve().parents[1]
STEM = "90_hostile"
REAL = "03_memory"
CANARY = "HIDDEN-CANARY-7f3a"
SETTINGS = dict(cell_timeout=15, notebook_timeout=50, memory_mb=1536)
pytestmark = pytest.mark.slow  # one graded class of 21 students: about 1.5 min on 2 cores


def fixture_source() -> nbformat.NotebookNode:
    """The tiny assignment: two answers, two tests (one with a hidden test), 3 points."""
    cells = [
        new_markdown_cell("# Hostile-submission fixture"),
        nbs.nbgrader_cell("setup", "setup", "import kvref\nfrom kvref import grading\nfrom kvref.memory import kv_bytes_per_token"),
        nbs.nbgrader_cell("answer", "square", "def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"),
        nbs.nbgrader_cell("test", "test_square", (
            "with grading.checked(seconds=10):\n"
            "    assert square(3) == 9\n"
            "    ### BEGIN HIDDEN TESTS\n"
            f"    assert square(-4) == 16, 'negative numbers ({CANARY})'\n"
            "    ### END HIDDEN TESTS"), points=2),
        nbs.nbgrader_cell("answer", "per_token", (
            "def per_token(cfg):\n"
            "    ### BEGIN SOLUTION\n"
            "    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2  # K and V, fp16\n"
            "    ### END SOLUTION")),
        nbs.nbgrader_cell("test", "test_per_token", (
            "with grading.checked(seconds=10):\n"
            "    cfg = kvref.ModelConfig(arch='llama', n_layers=2, n_heads=4, n_kv_heads=2, d_model=64,\n"
            "                            vocab_size=256, max_seq_len=32)\n"
            "    with grading.forbid('kvref.memory.kv_bytes_per_token'):\n"
            "        got = per_token(cfg)\n"
            "    assert got == kv_bytes_per_token(cfg), got"), points=1),
    ]
    return nbs.course_notebook(cells)


def with_answer(nb, gid: str, code: str):
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for c in nb.cells:
        if nbs.grade_id(c) == gid:
            c.source = code
    return nb


GOOD_SQUARE = "def square(x):\n    return x * x"
PROBE = """
import glob, json, os
def readable(p):
    try:
        with open(p, 'rb') as f:
            f.read(1)
        return True
    except OSError:
        return False
candidates = {paths!r}
up = os.getcwd()
for _ in range(6):
    up = os.path.dirname(up)
    candidates += [os.path.join(up, 'gradebook.db'), os.path.join(up, 'source', '90_hostile', '90_hostile.ipynb')]
for top in ('/tmp', '/work', '/root', '/home'):
    candidates += glob.glob(top + '/*/gradebook.db') + glob.glob(top + '/*/*/gradebook.db') + glob.glob(top + '/*/solutions/*.ipynb')
found = sorted({{p for p in candidates if readable(p)}})
print('PROBE' + ':' + json.dumps(found) + ':END')
written = []
for p in {writes!r}:
    try:
        with open(p, 'w') as f:
            f.write('pwned')
        written.append(p)
    except OSError:
        pass
print('WROTE' + ':' + json.dumps(written) + ':END')
def square(x):
    for p in found:
        if p.endswith('.ipynb') or p.endswith('.db'):
            pass  # a real cheat would look for the hidden test here
    return x * x
"""
NETWORK = """
import socket
reached = []
for host, port in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 53)]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        reached.append(f'{{host}}:{{port}}')
    except OSError:
        pass
print('NET' + ':' + ','.join(reached) + ':END')
def square(x):
    return x * x
"""


class Listener:
    """A TCP server on the host's loopback that records every connection."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.hits += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


def make_class(tmp: Path, listener_port: int) -> tuple[Path, Path, dict]:
    """solutions/ (90_hostile + the real 03_memory) and submissions/<student>/..."""
    solutions, subs = tmp / "solutions", tmp / "submissions"
    solutions.mkdir()
    src = fixture_source()
    nbformat.write(src, str(solutions / f"{STEM}.ipynb"))
    shutil.copyfile(ROOT / "solutions" / f"{REAL}.ipynb", solutions / f"{REAL}.ipynb")
    course = Course(tmp / "release-course", {STEM: solutions / f"{STEM}.ipynb"})
    release = build_releases(course, {STEM: solutions / f"{STEM}.ipynb"})[STEM]
    solved = nbs.fill_answers(release, src)
    secret = {"solutions": str(solutions / f"{STEM}.ipynb"), "real_solution": str(ROOT / "solutions" / f"{REAL}.ipynb"),
              "other_student": str(subs / "good" / f"{STEM}.ipynb"), "repo_git": str(ROOT / ".git" / "HEAD")}
    # the host /tmp path is unique to this run: a file left by another run (or another session's
    # unsandboxed experiment) must not fail this one, and two runs at once must not see each other's
    host_tmp = f"/tmp/kvref-pwned-{uuid.uuid4().hex[:12]}.txt"
    writes = [str(subs / "pwned.txt"), str(ROOT / "pwned.txt"), host_tmp, str(tmp / "pwned.txt")]

    def put(student: str, nb=None, name: str = f"{STEM}.ipynb", raw: bytes | None = None):
        d = subs / student
        d.mkdir(parents=True, exist_ok=True)
        if raw is not None:
            (d / name).write_bytes(raw)
        else:
            (d / name).write_text(nbformat.writes(nb), encoding="utf-8")

    put("good", solved)
    put("syntax", with_answer(solved, "square", "def square(x)\n    return x * x"))
    put("loop", with_answer(solved, "square", "while True:\n    pass"))
    put("stubborn", with_answer(solved, "square", (
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass")))
    put("membomb", with_answer(solved, "square", (
        "hog = []\nwhile True:\n    hog.append(bytearray(64 * 2**20))")))
    put("dies", with_answer(solved, "square", "import os\nos.kill(os.getpid(), 9)"))  # a crash (segfault, os._exit)
    deleted = nbformat.from_dict(json.loads(json.dumps(solved)))
    deleted.cells = [c for c in deleted.cells if nbs.grade_id(c) != "test_square"]
    put("deleted", deleted)
    edited = nbformat.from_dict(json.loads(json.dumps(solved)))
    for c in edited.cells:
        if nbs.grade_id(c) == "test_square":
            c.source = "pass  # all good"
    put("edited", with_answer(edited, "square", "def square(x):\n    return 0"))  # the restored test must catch it
    copied = nbformat.from_dict(json.loads(json.dumps(solved)))
    i = next(k for k, c in enumerate(copied.cells) if nbs.grade_id(c) == "test_square")
    copy = nbformat.from_dict(json.loads(json.dumps(copied.cells[i])))
    copy.id = "copied01"
    copied.cells.insert(i + 1, copy)
    put("copied", copied)
    (subs / "missing").mkdir()
    (subs / "missing" / "README.txt").write_text("I forgot to upload it")
    put("renamed", solved, name=f"{STEM} (1).ipynb")
    put("notjson", raw=b"\x89PNG this is not a notebook")
    wrong_kernel = nbformat.from_dict(json.loads(json.dumps(solved)))
    wrong_kernel.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    put("kernel", wrong_kernel)
    put("huge", with_answer(solved, "square", "for i in range(400_000):\n    print('x' * 100)\n" + GOOD_SQUARE))
    put("noisy", with_answer(solved, "square", (
        "import sys, warnings, os\nprint('debug noise', file=sys.stderr)\nos.write(2, b'C-level noise\\n')\n"
        "def square(x):\n    warnings.warn('noisy square')\n    print('inside', file=sys.stderr)\n    return x * x")))
    put("cheat", with_answer(solved, "per_token", (
        "def per_token(cfg):\n    return kvref.memory.kv_bytes_per_token(cfg)")))
    put("snoop", with_answer(solved, "square", PROBE.format(paths=list(secret.values()), writes=writes)))
    put("network", with_answer(solved, "square", NETWORK.format(port=listener_port)))
    real_release = nbs.read(ROOT / "notebooks" / f"{REAL}.ipynb")
    put("real", nbs.fill_answers(real_release, nbs.read(ROOT / "solutions" / f"{REAL}.ipynb")), name=f"{REAL}.ipynb")
    return solutions, subs, {"writes": writes, "secret": secret}


def tree(path: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in path.rglob("*") if p.is_file()} if path.exists() else {}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    listener = Listener()
    try:
        solutions, subs, info = make_class(tmp, listener.port)
        out = tmp / "out"
        before_subs, before_root = tree(subs), tree(ROOT / "solutions")
        lines: list[str] = []
        env_before = dict(os.environ)
        t0 = time.perf_counter()
        status = grade_batch(subs, out, solutions, workers=2, settings=Settings(**SETTINGS),
                             notebook_names=[STEM, REAL], say=lines.append, canary=False)  # canary: test_course_loop
        seconds = time.perf_counter() - t0
        env_after = dict(os.environ)
        time.sleep(1.5)  # a connection attempt still in flight would land by now
    finally:
        listener.close()
    rows = {(r.student, r.notebook): r for r in read_csv(out / "grades.csv")}
    return dict(tmp=tmp, out=out, subs=subs, solutions=solutions, status=status, rows=rows, log="\n".join(lines),
                seconds=seconds, hits=listener.hits, info=info, before_subs=before_subs, after_subs=tree(subs),
                before_root=before_root, after_root=tree(ROOT / "solutions"), env_before=env_before,
                env_after=env_after)


def test_grading_leaves_the_graders_environment_as_it_was(batch):
    # Two worker threads that each swapped os.environ in and out (set, start a job, restore) could
    # restore each other's values: the warm servers' sockets stayed set in the grader's process.
    changed = {k for k in set(batch["env_before"]) | set(batch["env_after"])
               if batch["env_before"].get(k) != batch["env_after"].get(k)}
    assert not changed, f"grade_batch changed the grader's environment: {sorted(changed)}"


def row(batch, student, notebook=STEM):
    r = batch["rows"].get((student, notebook))
    assert r is not None, f"no row for {student}/{notebook}:\n{batch['log'][-3000:]}"
    return r


def feedback(batch, student, notebook=STEM) -> str:
    page = batch["out"] / "feedback" / student / f"{notebook}.html"
    assert page.is_file(), f"no feedback page for {student}"
    return html.unescape(re.sub(r"<[^>]*>", "", page.read_text(encoding="utf-8")))


def sandboxed(batch) -> bool:
    return json.loads((batch["out"] / "grading.json").read_text())["isolated"]


def test_batch_completes_with_a_row_for_everyone(batch):
    assert batch["status"] == 0, batch["log"][-3000:]
    students = {p.name for p in batch["subs"].iterdir() if p.is_dir()}
    assert {s for s, _ in batch["rows"]} == students
    assert len(batch["rows"]) == 2 * len(students)  # every student x both notebooks
    with open(batch["out"] / "grades.csv", newline="") as f:
        assert next(csv.reader(f)) == ["student", "notebook", "score", "max_score", "status", "reason", "late"]
    for r in batch["rows"].values():
        assert r.status in ("ok", "missing", "invalid", "timeout", "error") and r.score <= r.max_score
        if r.status != "ok" or r.score < r.max_score:
            assert r.reason, f"{r.student}/{r.notebook}: lost points without a reason"
    assert batch["seconds"] < 240, f"the hostile batch took {batch['seconds']:.0f} s"
    print(f"\n[hostile batch] {len(batch['rows'])} rows in {batch['seconds']:.0f} s\n{batch['log'][-2500:]}")


@pytest.mark.parametrize("student", ["good", "deleted", "copied", "renamed", "kernel", "huge", "noisy", "snoop",
                                     "network"])
def test_full_marks_survive_repairs_and_noise(batch, student):
    r = row(batch, student)
    assert (r.status, r.score, r.max_score) == ("ok", 3, 3), f"{r}"


def test_real_chapter_in_the_same_batch(batch):
    r = row(batch, "real", REAL)
    points = nbs.max_points(nbs.read(ROOT / "solutions" / f"{REAL}.ipynb"))
    assert (r.status, r.score, r.max_score) == ("ok", points, points), r
    assert row(batch, "good", REAL).status == "missing"


@pytest.mark.parametrize("student,status,score,words", [
    ("syntax", "ok", 1, "SyntaxError"),  # test_square lost, test_per_token kept
    ("loop", "ok", 1, "CellTimeoutError"),
    ("stubborn", "timeout", 0, "ignored the interrupt"),
    ("membomb", "ok", 1, "MemoryError"),
    ("dies", "error", 0, "the kernel died"),  # nothing after the crash ran, so nothing can be credited
    ("edited", "ok", 1, "edited locked cell(s) 'test_square'"),
    ("missing", "missing", 0, "no 90_hostile.ipynb"),
    ("notjson", "invalid", 0, "not JSON"),
    ("cheat", "ok", 2, "your code called kvref.memory.kv_bytes_per_token"),
])
def test_broken_submission_gets_score_status_and_reason(batch, student, status, score, words):
    r = row(batch, student)
    assert (r.status, r.score) == (status, score) and words in r.reason, r


@pytest.mark.parametrize("student,words", [("deleted", "deleted cell(s) 'test_square' restored"),
                                           ("copied", "grade id 'test_square' on 2 cells"),
                                           ("renamed", "renamed: graded 90_hostile (1).ipynb"),
                                           ("kernel", "kernel 'ir' replaced by python3")])
def test_repairs_are_reported(batch, student, words):
    assert words in row(batch, student).reason


def test_huge_output_is_capped(batch):
    page = batch["out"] / "feedback" / "huge" / f"{STEM}.html"
    assert page.stat().st_size < 2_000_000, page.stat().st_size


def test_feedback_never_shows_hidden_tests_or_solutions(batch):
    source = fixture_source()
    answers = nbs.squash("\n".join(c.source for c in source.cells if nbs.is_answer(c)))
    hidden = [n for n in nbs.secret_needles(source) if n not in answers]  # lines only the hidden test has
    assert any("square(-4)" in n for n in hidden), hidden
    pages = list((batch["out"] / "feedback").rglob(f"{STEM}.html"))
    assert len(pages) >= 10, pages
    for page in pages:
        text = nbs.squash(html.unescape(re.sub(r"<[^>]*>", "", page.read_text(encoding="utf-8"))))
        assert CANARY not in text, f"hidden test in {page}"
        assert "BEGIN HIDDEN TESTS" not in text, page
        assert not [n for n in hidden if n in text], f"hidden test lines in {page}"
    real = nbs.secret_needles(nbs.read(ROOT / "solutions" / f"{REAL}.ipynb"))
    text = nbs.squash(feedback(batch, "real", REAL))
    hidden = [n for n in real if n in text and n not in nbs.squash(
        "\n".join(c.source for c in nbs.read(ROOT / "solutions" / f"{REAL}.ipynb").cells if nbs.is_answer(c)))]
    assert not hidden, f"hidden test lines in the feedback of {REAL}: {hidden[:5]}"


def test_inputs_gradebook_and_repository_untouched(batch):
    assert batch["after_subs"] == batch["before_subs"]
    assert batch["after_root"] == batch["before_root"]
    for p in batch["info"]["writes"]:
        assert not Path(p).exists(), f"student code wrote {p}"
    assert not (batch["out"] / ".work").exists()


def test_sandbox_hides_instructor_files(batch):
    if not sandboxed(batch):
        pytest.skip("user namespaces unavailable here: the fallback is tested below")
    m = re.search(r"PROBE:(.*?):END", feedback(batch, "snoop"))
    assert m, "the probe did not run"
    assert json.loads(m[1]) == [], f"student code could read {m[1]}"
    w = re.search(r"WROTE:(.*?):END", feedback(batch, "snoop"))
    assert w, "the probe did not run"
    # Writes under /tmp land in the sandbox's private tmpfs: allowed there, never on the host.
    for p in json.loads(w[1]):
        assert p.startswith("/tmp/") and not Path(p).exists(), f"student code wrote {p} on the host"


def test_sandbox_has_no_network(batch):
    if not sandboxed(batch):
        pytest.skip("user namespaces unavailable here: the fallback is tested below")
    m = re.search(r"NET:(.*?):END", feedback(batch, "network"))
    assert m and m[1] == "", f"student code reached {m and m[1]}"
    assert batch["hits"] == 0, "student code connected to a server on the grader's loopback"


def test_rerun_is_cached_and_force_regrades(batch, tmp_path):
    out = batch["out"]
    lines: list[str] = []
    keep = ["good", "notjson", "missing"]
    subs = tmp_path / "subs"
    for s in keep:
        shutil.copytree(batch["subs"] / s, subs / s)
    first = tmp_path / "out"
    shutil.copytree(out, first)
    assert grade_batch(subs, first, batch["solutions"], workers=2, settings=Settings(**SETTINGS),
                       notebook_names=[STEM], say=lines.append, canary=False) == 0
    # Nothing is graded again: every handed-in notebook is a cache hit (a count, not a clock,
    # so a loaded machine cannot fail it); "missing" has nothing handed in, so no line of its own.
    hits = sorted(m[1] for line in lines if (m := re.search(rf"\s(\w+)/{STEM}: .*\(cached\)$", line)))
    assert hits == ["good", "notjson"], lines
    rows = {(r.student, r.notebook): r for r in read_csv(first / "grades.csv")}
    assert rows[("good", STEM)].score == 3 and rows[("notjson", STEM)].status == "invalid"


def test_shards_partition_the_class_and_merge(batch, tmp_path):
    students = sorted({s for s, _ in batch["rows"]})
    shards = {k: [s for s in students if shard_of(s, 3) == k] for k in (1, 2, 3)}
    assert sorted(sum(shards.values(), [])) == students
    for k in shards:  # split the real grade sheet by shard, then join it again
        path = tmp_path / f"s{k}" / "grades.csv"
        path.parent.mkdir()
        with open(batch["out"] / "grades.csv") as f, open(path, "w") as g:
            lines = f.readlines()
            g.write(lines[0] + "".join(l for l in lines[1:] if shard_of(next(csv.reader([l]))[0], 3) == k))
        meta = json.loads((batch["out"] / "grading.json").read_text())  # names the class the merge expects
        (path.parent / "grading.json").write_text(json.dumps(dict(meta, shard=f"{k}/3")))
    assert merge([tmp_path / f"s{k}" for k in (1, 2, 3)], tmp_path / "all.csv", say=lambda m: None) == 0
    assert (tmp_path / "all.csv").read_text() == (batch["out"] / "grades.csv").read_text()
    assert merge([tmp_path / "s1", tmp_path / "s1"], tmp_path / "dup.csv", say=lambda m: None) == 1


def test_zip_export_and_cli_shard(batch, tmp_path):
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(batch["subs"] / "good" / f"{STEM}.ipynb", f"course-export/good/{STEM}.ipynb")
        z.write(batch["subs"] / "notjson" / f"{STEM}.ipynb", f"course-export/notjson/{STEM}.ipynb")
        z.writestr("../evil.txt", "path traversal")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "autograder", "grade", str(archive), str(out), "--solutions",
           str(batch["solutions"]), "--notebooks", STEM, "--shard", "1/1", "--cell-timeout", "15",
           "--notebook-timeout", "50", "--memory", "1536", "--workers", "2", "--no-canary"]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {(r.student, r.notebook): r for r in read_csv(out / "grades.csv")}
    assert rows[("good", STEM)].score == 3 and rows[("notjson", STEM)].status == "invalid"
    assert not (tmp_path / "evil.txt").exists()
    assert "notebook" in proc.stderr and "isolation:" in proc.stderr  # the summary table


def test_fallback_without_namespaces_is_reported(batch, tmp_path, monkeypatch):
    monkeypatch.setenv("KVREF_SANDBOX", "off")
    subs = tmp_path / "subs"
    shutil.copytree(batch["subs"] / "good", subs / "good")
    lines: list[str] = []
    assert grade_batch(subs, tmp_path / "out", batch["solutions"], workers=1, settings=Settings(**SETTINGS),
                       notebook_names=[STEM], say=lines.append, canary=False) == 0
    meta = json.loads((tmp_path / "out" / "grading.json").read_text())
    assert meta["isolated"] is False and "OFF" in meta["isolation"]
    assert any(l.startswith("isolation: OFF") for l in lines), lines
    assert read_csv(tmp_path / "out" / "grades.csv")[0].score == 3


def test_wall_clock_limit_per_notebook(batch, tmp_path):
    # A notebook whose every cell is within the per-cell limit (15 s) but which runs 3 s in all: only the
    # per-notebook limit (1 s) can stop it. (The good notebook alone no longer takes a second: warm kernels.)
    subs = tmp_path / "subs"
    good = nbs.read(batch["subs"] / "good" / f"{STEM}.ipynb")
    (subs / "slow").mkdir(parents=True)
    nbformat.write(with_answer(good, "square", "import time\ntime.sleep(3)\n\ndef square(x):\n    return x * x"),
                   str(subs / "slow" / f"{STEM}.ipynb"))
    settings = Settings(**dict(SETTINGS, notebook_timeout=1))
    assert grade_batch(subs, tmp_path / "out", batch["solutions"], workers=1, settings=settings,
                       notebook_names=[STEM], say=lambda m: None, canary=False) == 0
    r = read_csv(tmp_path / "out" / "grades.csv")[0]
    assert (r.status, r.score) == ("timeout", 0) and "limit per notebook" in r.reason, r


SPIN = "while True: pass"
SPIN_IGNORING = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"


@pytest.mark.parametrize("isolate,code,status", [
    (False, SPIN, 128 + signal.SIGXCPU),
    (True, SPIN, 128 + signal.SIGXCPU),
    (True, SPIN_IGNORING, 128 + signal.SIGKILL),  # the hard limit, 2 CPU-seconds later
])
def test_cpu_seconds_limit_stops_a_spinning_kernel(tmp_path, isolate, code, status):
    """The backstop behind the wall-clock limits: RLIMIT_CPU ends a process that only spins,
    with or without the namespaces, even one that ignores SIGXCPU."""
    if isolate and not sandbox.probe([])[0]:
        pytest.skip("user namespaces unavailable here: the limits-only mode is the other case")
    policy = {"isolate": isolate, "cpu_s": 1, "ro": sandbox.readonly_paths(ROOT), "rw": [str(tmp_path)],
              "cwd": str(tmp_path)}
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    t0 = time.perf_counter()
    p = subprocess.run(sandbox.command(tmp_path / "policy.json", [sys.executable, "-c", code]),
                       capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == status, (p.returncode, p.stderr[-300:])
    assert time.perf_counter() - t0 < 60  # a few CPU-seconds, however busy the machine (not the 120 s timeout)
