"""The built book works with no network: every script, stylesheet and font it loads is served from the build,
from pinned npm tarballs whose sha512 is the one in book/_ext/js.lock.toml.

The page checks read the one shared book build (tests/book_build.py); the fetch checks run without it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from book_build import built_book  # noqa: F401  (session fixture: the one book build)

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "book" / "_ext" / "js.lock.toml"
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import offline_js  # noqa: E402  (the fetch script / Sphinx extension under test)


# ---------------------------------------------------------------- the lock file and the fetched tarballs


def lock_packages() -> list[dict]:
    return tomllib.loads(LOCK.read_text())["package"]


def sri_sha512(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def test_lock_pins_the_three_packages_exactly():
    pkgs = {p["name"]: p for p in lock_packages()}
    assert set(pkgs) == {"requirejs", "@jupyter-widgets/html-manager", "mathjax"}
    for name, p in pkgs.items():
        assert p["version"].count(".") == 2 and p["version"].replace(".", "").isdigit(), f"{name}: not an exact version"
        # A sha512 digest is 64 bytes: 88 characters of base64.
        assert p["integrity"].startswith("sha512-") and len(p["integrity"]) == len("sha512-") + 88, name
    # ipywidgets 8 state (controls model 2.0.0) needs html-manager 1.x; 0.x only reads ipywidgets 7 state.
    assert pkgs["@jupyter-widgets/html-manager"]["version"].startswith("1.")
    # Sphinx 7 is written for MathJax 3 (its default URL is mathjax@3/es5/tex-mml-chtml.js).
    assert pkgs["mathjax"]["version"].startswith("3.")


@pytest.mark.slow
def test_fetched_tarballs_match_lock(built_book):
    # `make book` fetched them (make js); check them here with our own hashing, not the fetch script's.
    for p in lock_packages():
        pkg = offline_js.load_lock()[p["name"]]
        assert pkg.tarball.is_file(), f"{pkg.tarball} missing after `make book`"
        data = pkg.tarball.read_bytes()
        assert sri_sha512(data) == p["integrity"], f"{pkg.tarball} does not match {LOCK.name}"
        # And the entry script served to pages is the tarball's file, byte for byte.
        with tarfile.open(pkg.tarball, "r:gz") as tf:
            original = tf.extractfile(f"package/{p['entry']}").read()
        assert (pkg.unpacked / p["entry"]).read_bytes() == original


def test_fetch_rejects_a_tarball_whose_hash_differs(tmp_path, monkeypatch):
    pkg = offline_js.load_lock()["requirejs"]
    monkeypatch.setattr(offline_js, "TARBALLS", tmp_path)

    def fake_npm_pack(p):  # what a tampered registry or mirror would hand over
        p.tarball.write_bytes(b"not the pinned tarball")
        return p.tarball

    monkeypatch.setattr(offline_js, "npm_pack", fake_npm_pack)
    with pytest.raises(offline_js.OfflineJSError, match="integrity mismatch for requirejs@"):
        offline_js.verified_tarball(pkg)
    assert not pkg.tarball.exists(), "a tarball that failed the check must not stay where the build reads it"


def test_fetch_without_npm_says_so(tmp_path, monkeypatch):
    pkg = offline_js.load_lock()["mathjax"]
    monkeypatch.setattr(offline_js, "TARBALLS", tmp_path)  # empty cache: npm would be needed
    monkeypatch.setattr(offline_js.shutil, "which", lambda name: None)
    with pytest.raises(offline_js.OfflineJSError, match="npm is needed"):
        offline_js.verified_tarball(pkg)


def test_unpack_keeps_only_listed_regular_files(tmp_path, monkeypatch):
    monkeypatch.setattr(offline_js, "STATIC", tmp_path / "static")
    tgz = tmp_path / "evil.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        for name, data in [("package/dist/embed-amd.js", b"ok"), ("package/dist/other.js", b"not listed"),
                           ("package/../../escape.js", b"outside")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    pkg = offline_js.Package("x", "1.0.0", "sha512-" + "A" * 88, ("dist/*.js",), "dist/embed-amd.js")
    offline_js.unpack(pkg, tgz)
    files = sorted(p.relative_to(pkg.unpacked).as_posix() for p in pkg.unpacked.rglob("*") if p.is_file())
    assert files == [".integrity", "dist/embed-amd.js", "dist/other.js"]
    assert not (tmp_path / "escape.js").exists() and not list(tmp_path.rglob("escape.js"))


def test_build_stops_with_a_hint_when_the_files_are_not_fetched(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sphinx.errors import ExtensionError

    monkeypatch.setattr(offline_js, "STATIC", tmp_path / "static")  # nothing unpacked there
    config = SimpleNamespace(html_static_path=[], mathjax_path="https://cdn.example/mathjax.js", nb_ipywidgets_js={})
    with pytest.raises(ExtensionError, match="make js"):
        offline_js.configure(None, config)
    assert config.mathjax_path.startswith("https://"), "nothing may be configured when the check fails"


def test_extension_points_pages_at_local_copies(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(offline_js, "problem_with_unpacked", lambda pkg: None)  # as after `make js`
    config = SimpleNamespace(html_static_path=["_static"], mathjax_path="https://cdn.example/mathjax.js",
                             nb_ipywidgets_js={"https://cdn.example/require.js": {}})
    offline_js.configure(None, config)
    assert config.mathjax_path == offline_js.load_lock()["mathjax"].url
    assert list(config.nb_ipywidgets_js) == [offline_js.load_lock()["requirejs"].url,
                                             offline_js.load_lock()["@jupyter-widgets/html-manager"].url]
    assert str(offline_js.STATIC) in config.html_static_path and "_static" in config.html_static_path


# ---------------------------------------------------------------- the built pages


class Resources(HTMLParser):
    """Collects what a page makes the browser fetch: scripts, stylesheets/preloads/icons, images, frames."""

    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str]] = []  # (tag, url)
        self.scripts: list[str] = []  # src of each external <script>, in page order
        self.has_widget_state = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            if a.get("src"):
                self.urls.append(("script", a["src"]))
                self.scripts.append(a["src"])
            if a.get("type") == "application/vnd.jupyter.widget-state+json":
                self.has_widget_state = True
        elif tag == "link" and a.get("href"):
            rel = set((a.get("rel") or "").lower().split())
            if rel & {"stylesheet", "preload", "modulepreload", "icon", "shortcut"}:
                self.urls.append((f"link rel={a.get('rel')}", a["href"]))
        elif tag in ("img", "iframe", "source", "video", "audio", "embed") and a.get("src"):
            self.urls.append((tag, a["src"]))


def pages(html: Path) -> list[Path]:
    """Every page a reader can open, in both editions (English in html/, Chinese in html/zh/): the chapters and
    the generated pages (search, index), not theme templates."""
    found = []
    for edition in (html, html / "zh"):
        found += sorted(edition.glob("*.html")) + sorted((edition / "book").glob("*.html"))
    return [p for p in found if p.name != "index.html"]  # index.html is only a meta-refresh redirect


def parse(page: Path) -> Resources:
    r = Resources()
    r.feed(page.read_text())
    return r


def is_remote(url: str) -> bool:
    return bool(urlsplit(url).scheme) or url.startswith("//")


@pytest.mark.slow
def test_pages_load_nothing_from_the_network(built_book):
    # A build that failed on a warning still wrote its pages (--keep-going): check them anyway;
    # test_setup.py::test_book_builds reports the failure itself.
    checked = pages(built_book.html)
    assert any(p.parent.name == "book" for p in checked), f"no book pages were built:\n{built_book.log[-4000:]}"
    assert any(p.parent.parent.name == "zh" for p in checked), f"no Chinese pages were built:\n{built_book.log[-4000:]}"
    remote = [(p.relative_to(built_book.html).as_posix(), tag, url)
              for p in checked for tag, url in parse(p).urls if is_remote(url)]
    assert not remote, f"pages load resources from the network (fails offline): {remote}"


@pytest.mark.slow
def test_local_resources_exist_in_the_build(built_book):
    missing = []
    for page in pages(built_book.html):
        for tag, url in parse(page).urls:
            if is_remote(url) or url.startswith("data:"):
                continue
            target = (page.parent / unquote(urlsplit(url).path)).resolve()
            if not target.is_file():
                missing.append((page.name, tag, url))
    assert not missing, f"pages reference files the build does not contain: {missing}"


@pytest.mark.slow
def test_math_and_widget_scripts_are_the_pinned_copies(built_book):
    pins = offline_js.load_lock()
    mathjax = f"_static/{pins['mathjax'].url}"
    require = f"_static/{pins['requirejs'].url}"
    embed = f"_static/{pins['@jupyter-widgets/html-manager'].url}"

    intro = parse(built_book.html / "book" / "intro.html")  # its symbol table is all math
    assert any(urlsplit(s).path.endswith(mathjax) for s in intro.scripts), f"intro.html does not load {mathjax}"

    widget_pages = 0
    for page in pages(built_book.html):
        r = parse(page)
        if not r.has_widget_state:
            continue
        widget_pages += 1
        paths = [urlsplit(s).path for s in r.scripts]
        i_req = next((i for i, s in enumerate(paths) if s.endswith(require)), None)
        i_emb = next((i for i, s in enumerate(paths) if s.endswith(embed)), None)
        assert i_req is not None and i_emb is not None, f"{page.name} has widgets but not {require} + {embed}"
        assert i_req < i_emb, f"{page.name}: require.js must load before embed-amd.js"
    if widget_pages == 0:
        pytest.skip("no built page has an ipywidget yet (nothing more to check)")
