"""Set-up on a fresh machine: the README's prerequisites are Python 3.11, make and npm.

A missing prerequisite stops `make book` / `make test` in seconds with one line that says what to install
(the `prerequisites` target, before any package is installed). The Chinese figures need a CJK font: where the
system has none, `make js` fetches the pinned Noto Sans SC (book/_ext/js.lock.toml, sha512-checked, cached in
.cache/fonts) and matplotlib and Chromium use it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import offline_js  # noqa: E402


def tools_dir(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """A PATH folder holding only `names` (links to the real tools)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in names:
        (folder / name).symlink_to(shutil.which(name))
    return folder


def run_make(target: str, path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([shutil.which("make"), "-C", str(ROOT), target, *args], capture_output=True, text=True,
                          env=dict(os.environ, PATH=str(path)), timeout=60)
    return proc, time.monotonic() - t0


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_a_missing_python_stops_at_once_in_one_line(tmp_path):
    path = tools_dir(tmp_path, ("make", "bash", "sh"))
    proc, seconds = run_make("book", path, "PYTHON=python3.11-not-here")
    assert proc.returncode != 0
    assert error_lines(proc) == ["error: python3.11-not-here not found: install Python 3.11 "
                                 "(or run make PYTHON=/path/to/python3.11)"], proc.stderr
    assert seconds < 20  # no venv, no pip: a shell check


def test_an_old_python_is_named_with_its_version(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\n[ \"$1\" = -c ] && case \"$2\" in *version_info*) exit 1;; "
                    "*python_version*) echo 3.9.2; exit 0;; esac\nexit 0\n")
    fake.chmod(0o755)
    path = tools_dir(tmp_path, ("make", "bash", "sh"))
    proc, _ = run_make("test", path, f"PYTHON={fake}")
    assert proc.returncode != 0 and len(error_lines(proc)) == 1, proc.stderr
    assert "is Python 3.9.2; the course needs >= 3.11" in proc.stderr


def test_missing_npm_is_one_line_when_something_must_be_fetched(monkeypatch, tmp_path):
    monkeypatch.setattr(offline_js, "TARBALLS", tmp_path / "empty")  # nothing cached: npm would be needed
    monkeypatch.setattr(offline_js.shutil, "which", lambda name: None)
    problems = offline_js.prerequisites()
    assert len(problems) == 1 and "npm is needed" in problems[0] and "apt-get install -y npm" in problems[0]
    assert "mathjax@" in problems[0]


def test_npm_is_not_needed_once_everything_is_cached(monkeypatch):
    # After one `make js` (as on this machine: the book tests built it) the set-up runs offline and without npm.
    subprocess.run([sys.executable, str(ROOT / "book" / "_ext" / "offline_js.py")], check=True,
                   capture_output=True, timeout=300)
    monkeypatch.setattr(offline_js.shutil, "which", lambda name: None)
    assert offline_js.prerequisites() == []


def test_without_a_system_cjk_font_the_fetched_one_draws_chinese(tmp_path, monkeypatch):
    # Act as a machine without fonts-noto-cjk: `make js` fetches the pinned font, matplotlib draws Chinese with
    # it (no missing-glyph warning), and Chromium's fontconfig sees it.
    env = dict(os.environ, KV_COURSE_IGNORE_SYSTEM_CJK="1", MPLBACKEND="Agg")
    subprocess.run([sys.executable, str(ROOT / "book" / "_ext" / "offline_js.py")], check=True, env=env,
                   capture_output=True, timeout=600)
    script = f"""
import sys, warnings
sys.path.insert(0, {str(ROOT / "book" / "_ext")!r})
import matplotlib.pyplot as plt
import zh_figures
fonts = zh_figures.offline_js.cjk_fonts()
assert fonts and str(fonts[0]).startswith({str(offline_js.FONTS)!r}), fonts
family = zh_figures.cjk_family()
fig, ax = plt.subplots()
ax.set_title("键值缓存：预填充与解码", fontfamily=["DejaVu Sans", family])
with warnings.catch_warnings():
    warnings.simplefilter("error")  # matplotlib warns 'Glyph ... missing from font(s)' for a box
    fig.savefig({str(tmp_path / "zh.png")!r})
print(family)
"""
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "Noto Sans SC"
    if shutil.which("fc-list"):
        monkeypatch.setenv("KV_COURSE_IGNORE_SYSTEM_CJK", "1")
        fc = subprocess.run(["fc-list", ":lang=zh-cn", "family"], env=offline_js.chromium_env(),
                            capture_output=True, text=True)
        assert "Noto Sans SC" in fc.stdout, fc.stdout


@pytest.mark.parametrize("missing", ["Chromium", "Slurm"])
def test_a_missing_optional_tool_skips_with_one_line(missing, tmp_path):
    # Outside CI, a test needing Chromium or Slurm skips (every such test with the same line); under CI it fails.
    test = tmp_path / "test_x.py"
    test.write_text("from conftest import require_tool\n"
                    "def test_a():\n    require_tool(%r, ('no-such-tool-a',), 'apt-get install -y x')\n"
                    "def test_b():\n    require_tool(%r, ('no-such-tool-a',), 'apt-get install -y x')\n"
                    % (missing, missing))
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-q", "-p", "no:cacheprovider", str(test)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert proc.returncode == 0 and len(skipped) == 1, proc.stdout
    assert "SKIPPED [2]" in skipped[0] and f"{missing} is not installed" in skipped[0]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                          cwd=tmp_path, env=dict(env, CI="true"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "2 failed" in proc.stdout, proc.stdout
