"""Checks on the course set-up: pinned dependencies, book config, README, and a full book build."""

from __future__ import annotations

import functools
import http.server
import importlib.metadata
import os
import re
import socket
import subprocess
import sys
import threading
import time
import venv
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from book_build import built_book  # noqa: F401  (session fixture: the one book build)

ROOT = Path(__file__).resolve().parents[1]
PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


def normalise(name: str) -> str:
    """PEP 503 name normalisation: Jupyter_Book, jupyter.book -> jupyter-book."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines() -> list[str]:
    lines = []
    for raw in (ROOT / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def environment_pip_lines() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one `pip:` section"
    return [str(x).strip() for x in pip_sections[0]]


def pins() -> dict[str, str]:
    """{normalised name: version} for the exact pins (test_requirements_are_exact_pins flags the rest)."""
    out = {}
    for line in requirement_lines():
        m = PIN_RE.match(line)
        if m:
            out[normalise(m.group(1))] = m.group(2)
    return out


# (a) requirements.txt and environment.yml agree


def test_environment_yml_pins_equal_requirements():
    req, env = requirement_lines(), environment_pip_lines()
    assert sorted(env) == sorted(req), (
        f"only in requirements.txt: {sorted(set(req) - set(env))}; "
        f"only in environment.yml: {sorted(set(env) - set(req))}"
    )
    assert len(set(req)) == len(req), "requirements.txt has duplicate lines"


def test_environment_yml_python_is_311():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert "python=3.11" in conda and "pip" in conda


# (b) every requirement is an exact pin, and the key ones are what the course is built on


def test_requirements_are_exact_pins():
    lines = requirement_lines()
    assert lines, "requirements.txt is empty"
    bad = [line for line in lines if not PIN_RE.match(line)]
    assert not bad, f"not exact `name==version` pins: {bad}"
    names = [normalise(PIN_RE.match(line).group(1)) for line in lines]
    assert len(set(names)) == len(names), f"a package is pinned twice: {names}"


def test_key_pins():
    p = pins()
    assert p.get("torch") == "2.13.0"
    assert p.get("jupyter-book") == "1.0.4.post1"
    assert re.fullmatch(r"0\.9\.\d+", p.get("nbgrader", "")), f"nbgrader must be 0.9.x, got {p.get('nbgrader')}"


# (c) the running interpreter has exactly the pinned versions


@pytest.mark.parametrize("name", sorted(pins()))
def test_installed_version_matches_pin(name):
    wanted = pins()[name]
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{name} is pinned in requirements.txt but not installed in {sys.prefix}")
    # PEP 440 `==`: a pin without a local label also accepts e.g. torch 2.13.0+cpu.
    assert SpecifierSet(f"=={wanted}").contains(installed, prereleases=True), (
        f"{name}: installed {installed}, pinned {wanted} (run `make venv`)"
    )


# (d) table of contents and book pages


def toc_files(node) -> list[str]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("root", "file") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(toc_files(item))
    return found


def resolve_page(entry: str) -> Path | None:
    base = ROOT / entry
    if base.suffix in (".md", ".ipynb"):
        return base if base.is_file() else None
    for suffix in (".md", ".ipynb"):
        if base.with_suffix(suffix).is_file():
            return base.with_suffix(suffix)
    return None


def test_toc_lists_existing_files_only():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assert toc["format"] == "jb-book"
    assert toc["root"] == "book/intro"
    entries = toc_files(toc)
    missing = [e for e in entries if resolve_page(e) is None]
    assert not missing, f"_toc.yml lists pages that do not exist: {missing}"
    assert len(set(entries)) == len(entries), f"_toc.yml lists a page twice: {entries}"


def test_every_book_page_is_in_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = {resolve_page(e) for e in toc_files(toc)}
    pages = sorted((ROOT / "book").glob("*.md"))
    assert pages, "book/ has no pages"
    absent = [p.relative_to(ROOT).as_posix() for p in pages if p not in listed]
    assert not absent, f"book pages missing from _toc.yml (they would not be built): {absent}"


def split_front_matter(text: str) -> tuple[dict | None, str]:
    if not text.startswith("---\n"):
        return None, text
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end]), text[end + len("\n---\n") :]


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "book").glob("*.md")))
def test_book_page_header(page):
    text = (ROOT / "book" / page).read_text()
    meta, body = split_front_matter(text)
    if meta is not None:
        rep = meta["jupytext"]["text_representation"]
        assert rep["extension"] == ".md" and rep["format_name"] == "myst", f"{page}: not a MyST notebook header"
        assert meta["kernelspec"]["name"] == "python3", f"{page}: kernelspec must be python3"
    else:
        assert "{code-cell}" not in text, f"{page} has code cells but no jupytext header, so they would not run"
    first = next((line for line in body.splitlines() if line.strip()), "")
    assert first.startswith("# "), f"{page}: the first line after any header must be the `# Title`"


# (e) README tells a newcomer the two commands


def test_readme_has_setup_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make book" in readme
    assert "make test" in readme


# (f) the book builds exactly as `make book` builds it, warnings as errors


@pytest.mark.slow
def test_book_builds(built_book):
    # The build is shared with tests/test_book_offline.py (tests/book_build.py: one build per session).
    assert built_book.returncode == 0, f"book build failed (exit {built_book.returncode}):\n{built_book.log[-6000:]}"

    html = built_book.html
    chapter = html / "book" / "01_motivation.html"
    assert (html / "book" / "intro.html").is_file()
    assert chapter.is_file(), f"missing {chapter}"
    assert f"First chapter: {chapter}" in built_book.stdout, "make book must print the first chapter's absolute path"

    page = chapter.read_text()
    # Executed output, not just source: these strings only exist in the printed output.
    assert "Same tokens with and without the cache: True" in page
    assert re.search(r"K/V rows computed per layer without the cache: \d+", page)
    assert "Traceback" not in page


@pytest.mark.slow
def test_no_page_shows_stderr(built_book):
    """A warning a cell writes to stderr (a missing font glyph, a deprecation) shows on the page as a red box of
    log text: a reader of either edition must never see one. myst-nb marks such outputs `output stderr`."""
    assert built_book.returncode == 0
    pages = sorted(built_book.html.glob("book/*.html")) + sorted(built_book.html.glob("zh/book/*.html"))
    assert len(pages) >= 22, "both editions' chapters should be there"
    noisy = [str(p.relative_to(built_book.html)) for p in pages if "output stderr" in p.read_text()]
    assert not noisy, f"pages showing a cell's stderr: {noisy}"


def test_pyproject_dependencies_match_the_pins():
    """pip install . must get what kvref imports, at the versions requirements.txt pins: an open
    torch range resolves to the newest torch, a multi-GB CUDA build on Linux."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    got = {}
    for d in deps:
        m = PIN_RE.match(d)
        assert m, f"pyproject dependency {d!r} is not an exact pin"
        got[normalise(m.group(1))] = m.group(2)
    assert {"torch", "numpy", "safetensors", "tqdm"} <= set(got), got
    p = pins()
    assert {k: v for k, v in got.items() if p.get(k) != v} == {}, "pyproject pins differ from requirements.txt"
    assert "jupyterlab" in p, "JupyterLab is the students' tool: pin it in requirements.txt"


# (g) the CPU build of torch: scripts/torch_cpu.py, which `make venv` runs before the pinned requirements


def run_torch_cpu(tmp_path: Path, python: str, **env_extra: str) -> tuple[subprocess.CompletedProcess, float]:
    """scripts/torch_cpu.py run by ``python`` (a bare venv: no torch, no pip, nothing downloaded)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVREF_TORCH")}
    env.update(env_extra)
    t0 = time.monotonic()
    p = subprocess.run([python, str(ROOT / "scripts" / "torch_cpu.py"), str(ROOT / "requirements.txt")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    return p, time.monotonic() - t0


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    where = tmp_path_factory.mktemp("bare") / "venv"
    venv.create(where, with_pip=False)
    return str(where / "bin" / "python")


def test_torch_cpu_falls_back_in_one_line_when_the_index_hangs(tmp_path, bare_python):
    """An index that accepts the connection and never answers (the worst case: no error, no reply) costs the
    timeout, never a hang, and the set-up goes on with one line saying why."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel completes the handshake; nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu"
        p, seconds = run_torch_cpu(tmp_path, bare_python, KVREF_TORCH="cpu", KVREF_TORCH_INDEX=url,
                                   KVREF_TORCH_TIMEOUT="2")
    finally:
        silent.close()
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"torch: {url} did not answer (waited at most 2 s), so torch==2.13.0 comes "
                                     f"from the default index (on Linux the CUDA build, several GB, unless a local "
                                     f"CPU wheel is found)"], p.stdout
    assert seconds < 2 + 8, f"the fallback took {seconds:.1f} s"  # 2 s of timeout; the rest is Python's start


def test_torch_cpu_says_so_when_the_install_fails(tmp_path, bare_python):
    """The index answers but pip cannot install (here: the venv has no pip): one more line, exit status 0."""
    (tmp_path / "whl" / "cpu" / "torch").mkdir(parents=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
        p, _ = run_torch_cpu(tmp_path, bare_python, KVREF_TORCH="cpu", KVREF_TORCH_INDEX=url)
    finally:
        server.shutdown()
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == f"torch: installing the CPU build of torch==2.13.0 from {url}", p.stdout
    assert p.stdout.splitlines()[-1].startswith("torch: the CPU build could not be installed (pip exited 1)"), p.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CUDA build is PyPI's torch on Linux only")
def test_torch_cpu_leaves_the_cuda_build_to_a_gpu_machine(tmp_path, bare_python):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (fake / "nvidia-smi").chmod(0o755)
    p, _ = run_torch_cpu(tmp_path, bare_python, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}",
                         KVREF_TORCH_INDEX="http://127.0.0.1:9/never-asked")
    assert p.returncode == 0 and p.stdout.splitlines() == [
        "torch: an NVIDIA GPU is present, so torch==2.13.0 comes from the default index (the CUDA build; "
        "KVREF_TORCH=cpu for the CPU build)"], p.stdout + p.stderr


def test_torch_cpu_does_nothing_when_the_pin_is_installed(tmp_path):
    """This environment has torch at the pin (a local CPU wheel here): no line, no network."""
    p, _ = run_torch_cpu(tmp_path, sys.executable, KVREF_TORCH="cpu", KVREF_TORCH_INDEX="http://127.0.0.1:9/no")
    assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr


@pytest.mark.parametrize("makefile", ["Makefile", "docs/student/Makefile"])
def test_make_venv_installs_the_cpu_torch_before_the_pins(makefile):
    """`make venv` (course and student edition) runs scripts/torch_cpu.py before `pip install -r requirements.txt`,
    so the pinned install finds torch already there."""
    p = subprocess.run(["make", "-n", "-B", "-f", str(ROOT / makefile), "venv"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    script = [i for i, line in enumerate(lines) if "scripts/torch_cpu.py requirements.txt" in line]
    pinned = [i for i, line in enumerate(lines) if "pip install -r requirements.txt" in line]
    assert script and pinned and script[0] < pinned[0], p.stdout
