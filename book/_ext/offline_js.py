"""Serve the book's third-party JavaScript from the build itself, so pages work with no network.

Out of the box, a page with math loads MathJax from a CDN, and a page with ipywidgets loads require.js and the
widget manager (@jupyter-widgets/html-manager, embed-amd.js) from CDNs: opened offline, formulas stay raw TeX and
widgets show nothing. This file does two jobs:

- Run as a script (`make js`, which `make book` runs first): fetch each package pinned in js.lock.toml with
  `npm pack` (the tarball only: no dependency tree, no install scripts) into .cache/js/tarballs/, check it
  against the sha512 integrity in the lock, and unpack only the files the lock lists into .cache/js/static/npm/.
  Nothing fetched is committed (.cache/ is gitignored). Cached tarballs are re-checked on every run, and npm is
  only needed when one is missing. The lock's `[[font]]` entries are fetched the same way, into .cache/fonts/,
  but only where the system has no CJK font: the Chinese edition's figures need one (book/_ext/zh_figures.py),
  and so does Chromium when it prints Chinese pages (`chromium_env()` points fontconfig at the fetched font).
- Loaded by Sphinx (`sphinx: local_extensions` in _config.yml): add .cache/js/static to `html_static_path`
  (so the files land in _build/html/_static/npm/...) and point `mathjax_path` and myst-nb's `nb_ipywidgets_js`
  at those local copies. The build stops with a clear error if the files are missing or stale. It also serves
  static/mathjax-hub-shim.js (ours): the widget manager calls the MathJax 2 API, the book loads MathJax 3.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOCK = HERE / "js.lock.toml"
OWN_STATIC = HERE / "static"  # our own small scripts (committed), served from _static/ too
MATHJAX_SHIM = "mathjax-hub-shim.js"  # lets the widget manager's MathJax 2 calls work with MathJax 3
CACHE = ROOT / ".cache" / "js"
FONTS = ROOT / ".cache" / "fonts"  # fetched CJK fonts, used only where the system has none
# Debian's fonts-noto-cjk: preferred when present, so figures look the same on every Debian machine.
SYSTEM_CJK_FONTS = (
    Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc"),
    Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc"),
)
# Set to 1 to act as if the system had no CJK font (how the fetched font is tested on a machine that has one).
IGNORE_SYSTEM_CJK = "KV_COURSE_IGNORE_SYSTEM_CJK"
TARBALLS = CACHE / "tarballs"
STATIC = CACHE / "static"  # an html_static_path entry: its contents are copied into _build/html/_static/
MARKER = ".integrity"  # written into each unpacked folder; Sphinx does not copy dot files
FETCH_HINT = "run `make js` (needs npm and access to the npm registry)"


class OfflineJSError(RuntimeError):
    """Fetching, checking or serving the pinned JavaScript failed; the message says what to do."""


@dataclass(frozen=True)
class Package:
    name: str  # npm name, e.g. "@jupyter-widgets/html-manager"
    version: str
    integrity: str  # "sha512-<base64>", as `npm view NAME@VERSION dist.integrity` prints it
    files: tuple[str, ...]  # globs relative to the tarball's package/ folder
    entry: str  # the script pages load (a font: its regular face), relative to package/
    kind: str = "js"  # "js": served by the pages; "font": for figures and printing, never served

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def dirname(self) -> str:
        """Folder (and tarball) name, spelled as `npm pack` spells it: jupyter-widgets-html-manager-1.0.15."""
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}"

    @property
    def tarball(self) -> Path:
        return TARBALLS / f"{self.dirname}.tgz"

    @property
    def unpacked(self) -> Path:
        return (FONTS if self.kind == "font" else STATIC / "npm") / self.dirname

    @property
    def url(self) -> str:
        """Where the entry script is served, relative to _static/ (what Sphinx's add_js_file expects)."""
        return f"npm/{self.dirname}/{self.entry}"


def load_lock(path: Path = LOCK, kind: str = "js") -> dict[str, Package]:
    """{npm name: Package} of the lock's [[package]] (kind "js") or [[font]] (kind "font") entries, with a
    clear error for a malformed entry."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise OfflineJSError(f"cannot read the JavaScript lock file {path}: {e}") from e
    table = "package" if kind == "js" else "font"
    packages = {}
    for i, entry in enumerate(data.get(table, [])):
        missing = {"name", "version", "integrity", "files", "entry"} - set(entry)
        if missing:
            raise OfflineJSError(f"{path}: [[{table}]] #{i + 1} lacks {sorted(missing)}")
        if not str(entry["integrity"]).startswith("sha512-"):
            raise OfflineJSError(f"{path}: {entry['name']}: integrity must be the registry's sha512-... string")
        pkg = Package(entry["name"], entry["version"], entry["integrity"], tuple(entry["files"]), entry["entry"],
                      kind)
        packages[pkg.name] = pkg
    needed = ("requirejs", "@jupyter-widgets/html-manager", "mathjax") if kind == "js" else ()
    for name in needed:
        if name not in packages:
            raise OfflineJSError(f"{path}: no [[package]] named {name!r}; the book needs it")
    if kind == "font" and not packages:
        raise OfflineJSError(f"{path}: no [[font]] entry; the Chinese figures need a CJK font where the system has none")
    return packages


def integrity_of(path: Path) -> str:
    """Subresource-integrity string of a file, in npm's format: sha512-<base64 digest>."""
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


# ---------------------------------------------------------------- fetching (make js)


NPM_HINT = "install Node.js and npm (Debian: apt-get install -y npm)"


def npm_pack(pkg: Package) -> Path:
    """Download pkg's registry tarball (no dependencies, no scripts) to pkg.tarball."""
    npm = shutil.which("npm")
    if npm is None:
        raise OfflineJSError(f"npm is needed to fetch {pkg.spec} but is not on PATH: {NPM_HINT}, then run `make js`")
    TARBALLS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TARBALLS) as tmp:
        cmd = [npm, "pack", pkg.spec, "--json", "--ignore-scripts", "--pack-destination", tmp,
               "--no-fund", "--no-audit", "--no-update-notifier", "--loglevel=error"]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise OfflineJSError(f"`npm pack {pkg.spec}` failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        try:
            filename = json.loads(proc.stdout)[0]["filename"]
        except (ValueError, LookupError) as e:
            raise OfflineJSError(f"`npm pack {pkg.spec}` printed no tarball name:\n{proc.stdout[-2000:]}") from e
        # npm >= 9 names scoped tarballs jupyter-widgets-html-manager-1.0.15.tgz; older npm prefixes the scope.
        (Path(tmp) / filename.lstrip("@").replace("/", "-")).replace(pkg.tarball)
    return pkg.tarball


def verified_tarball(pkg: Package) -> Path:
    """The cached tarball of pkg, fetched if missing; fails unless its sha512 is the lock's."""
    if pkg.tarball.is_file() and integrity_of(pkg.tarball) == pkg.integrity:
        return pkg.tarball
    stale = pkg.tarball.is_file()
    npm_pack(pkg)
    got = integrity_of(pkg.tarball)
    if got != pkg.integrity:
        bad = pkg.tarball.with_suffix(".tgz.rejected")
        pkg.tarball.replace(bad)
        raise OfflineJSError(
            f"integrity mismatch for {pkg.spec}: {LOCK.name} says {pkg.integrity}, the registry tarball "
            f"(kept as {bad}) has {got}. If you changed the version on purpose, set integrity to the output "
            f"of `npm view {pkg.spec} dist.integrity`; otherwise do not use this tarball."
            + (" (The cached tarball did not match either.)" if stale else "")
        )
    return pkg.tarball


def unpack(pkg: Package, tarball: Path) -> None:
    """Extract the files pkg.files selects (regular files only, no paths outside) into pkg.unpacked."""
    tmp = pkg.unpacked.with_name(pkg.unpacked.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    matched = {pattern: 0 for pattern in pkg.files}
    with tarfile.open(tarball, "r:gz") as tf:
        for member in tf.getmembers():
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or len(parts) < 2 or ".." in parts or member.name.startswith("/"):
                continue
            rel = "/".join(parts[1:])  # drop npm's top folder (package/)
            hits = [p for p in pkg.files if fnmatch.fnmatchcase(rel, p)]
            if not hits:
                continue
            for p in hits:
                matched[p] += 1
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tf.extractfile(member).read())
    unmatched = [p for p, n in matched.items() if n == 0]
    if unmatched or not (tmp / pkg.entry).is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise OfflineJSError(f"{pkg.spec}: no file in the tarball matches {unmatched or [pkg.entry]} ({LOCK})")
    (tmp / MARKER).write_text(pkg.integrity + "\n")
    shutil.rmtree(pkg.unpacked, ignore_errors=True)
    tmp.replace(pkg.unpacked)


def problem_with_unpacked(pkg: Package) -> str | None:
    """Why pkg's unpacked files cannot be served as pinned (None if they can)."""
    marker = pkg.unpacked / MARKER
    if not marker.is_file():
        return f"{pkg.spec} is not unpacked in {pkg.unpacked}"
    if marker.read_text().strip() != pkg.integrity:
        return f"{pkg.unpacked} was unpacked from another tarball than {LOCK.name} pins"
    if not (pkg.unpacked / pkg.entry).is_file():
        return f"{pkg.unpacked / pkg.entry} is missing"
    return None


def ensure(pkg: Package) -> None:
    """pkg's pinned files unpacked from its checked tarball (fetched only if missing)."""
    tarball = verified_tarball(pkg)
    if problem_with_unpacked(pkg) is None:
        print(f"{pkg.kind}: {pkg.spec} ok")
    else:
        unpack(pkg, tarball)
        print(f"{pkg.kind}: {pkg.spec} unpacked into {pkg.unpacked.relative_to(ROOT)}")


def fetch_all(lock: Path = LOCK) -> None:
    """Make .cache/js/static/ hold exactly the pinned files (a no-op when it already does); fetch the pinned CJK
    font into .cache/fonts/ where the system has none."""
    packages = load_lock(lock).values()
    for pkg in packages:
        ensure(pkg)
    # Folders of versions no longer pinned would still be served: remove them.
    keep = {pkg.unpacked.name for pkg in packages}
    for old in (STATIC / "npm").iterdir():
        if old.name not in keep:
            shutil.rmtree(old)
    system = system_cjk_fonts()
    if system:
        print(f"font: system CJK font {system[0]}")
        return
    for pkg in load_lock(lock, kind="font").values():
        ensure(pkg)
    write_fontconfig()


# ---------------------------------------------------------------- the CJK font (Chinese figures, printing)


def system_cjk_fonts() -> list[Path]:
    """Debian's Noto Sans CJK files, if installed (and not ignored on purpose, see IGNORE_SYSTEM_CJK)."""
    if os.environ.get(IGNORE_SYSTEM_CJK) == "1":
        return []
    return [p for p in SYSTEM_CJK_FONTS if p.is_file()]


def fetched_cjk_fonts(lock: Path = LOCK) -> list[Path]:
    """The pinned CJK font's regular face, once `make js` has fetched and checked it (else [])."""
    return [pkg.unpacked / pkg.entry for pkg in load_lock(lock, kind="font").values()
            if problem_with_unpacked(pkg) is None]


def cjk_fonts() -> list[Path]:
    """The font files the Chinese figures use: the system's CJK font, else the fetched one."""
    return system_cjk_fonts() or fetched_cjk_fonts()


def fetched_faces(lock: Path = LOCK) -> list[Path]:
    """Every face of the fetched CJK font (regular and bold: headings are bold), once fetched and checked."""
    return [f for pkg in load_lock(lock, kind="font").values() if problem_with_unpacked(pkg) is None
            for f in sorted(pkg.unpacked.rglob("*")) if f.suffix.lower() in (".ttf", ".otf", ".ttc")]


def write_fontconfig() -> Path:
    """A fontconfig file for Chromium's Chinese pages: the system's set-up and the CJK font (the system's, else
    the fetched one), as copies whose text a PDF maps back to ideographs (book/_ext/print_font.py)."""
    try:
        from . import print_font
    except ImportError:  # run as a script, or imported from book/_ext on sys.path
        import print_font

    return print_font.fontconfig(system_cjk_fonts() or fetched_faces(), FONTS)


def chromium_env() -> dict[str, str]:
    """Environment for a Chromium that prints or shoots Chinese pages: fontconfig sees the CJK font (the
    system's, else the fetched one) as the print-safe copies of book/_ext/print_font.py."""
    env = dict(os.environ)
    if system_cjk_fonts() or fetched_cjk_fonts():
        env["FONTCONFIG_FILE"] = str(write_fontconfig())
    return env


# ---------------------------------------------------------------- prerequisites (make, before anything else)


def prerequisites() -> list[str]:
    """What `make book` / `make test` cannot do without and is missing, one line each (checked in seconds)."""
    problems = []
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        problems.append(f"{sys.executable} cannot create a virtual environment: install python3-venv "
                        "(Debian: apt-get install -y python3-venv)")
    lacking = [pkg.spec for pkg in load_lock().values() if not pkg.tarball.is_file()]
    if not system_cjk_fonts():
        lacking += [pkg.spec for pkg in load_lock(kind="font").values() if not pkg.tarball.is_file()]
    if lacking and shutil.which("npm") is None:
        problems.append(f"npm is needed to fetch {', '.join(lacking)} (pinned in {LOCK.relative_to(ROOT)}): "
                        f"{NPM_HINT}")
    return problems


# ---------------------------------------------------------------- Sphinx extension


def configure(app, config) -> None:
    """config-inited: serve the pinned copies and point MathJax and the widget scripts at them."""
    from sphinx.errors import ExtensionError

    try:
        packages = load_lock()
    except OfflineJSError as e:
        raise ExtensionError(str(e)) from e
    problems = [p for p in map(problem_with_unpacked, packages.values()) if p]
    if problems:
        raise ExtensionError(
            "the book serves its JavaScript (MathJax, require.js, the ipywidgets manager) itself, "
            f"but {'; '.join(problems)}: {FETCH_HINT}."
        )
    config.html_static_path = [*config.html_static_path, str(STATIC), str(OWN_STATIC)]
    config.mathjax_path = packages["mathjax"].url
    # Order matters: require.js must be loaded before embed-amd.js (dicts keep insertion order).
    config.nb_ipywidgets_js = {
        packages["requirejs"].url: {},
        packages["@jupyter-widgets/html-manager"].url: {},
    }


def setup(app):
    app.connect("config-inited", configure)
    # After MathJax (priority 500, deferred too): deferred scripts run in page order, before the widgets render.
    app.add_js_file(MATHJAX_SHIM, priority=501, loading_method="defer")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    try:
        if sys.argv[1:] == ["--prerequisites"]:
            problems = prerequisites()
            sys.exit("\n".join(f"error: {p}" for p in problems) if problems else 0)
        fetch_all()
    except OfflineJSError as e:
        sys.exit(f"error: {e}")
