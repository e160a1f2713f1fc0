"""`make pdf`: one printable PDF of the whole book, from the built HTML pages (each edition: the Makefile
prints _build/html to _build/book.pdf and the Chinese edition, _build/html/zh, to _build/book-zh.pdf).

Headless Chromium prints each page listed in _toc.yml (in book order) with the book's print style
(book/_ext/static/print.css: text column only, code wrapped, widgets replaced by the static figure
beside them), and pypdf joins the pages into one file with a bookmark per chapter, named by the page's own
title (so the Chinese edition's bookmarks are Chinese). It reads only
local files: MathJax and the other scripts are served from the build itself.

    python book/_ext/pdf.py [--html _build/html] [--out _build/book.pdf]

Prerequisite: Debian's `chromium` (`apt-get install -y chromium`); the script says so if it is missing. Chinese
pages print with the system's CJK font, else with the one `make js` fetched (fontconfig pointed at .cache/fonts).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import offline_js  # noqa: E402  (chromium_env: the fetched CJK font where the system has none)

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-quic", "--no-pdf-header-footer",
    # MathJax typesets after load: give the page (virtual) time before printing.
    "--virtual-time-budget=15000",
]


class PdfError(RuntimeError):
    """What went wrong, in one sentence a reader can act on."""


def toc_pages(toc: Path = ROOT / "_toc.yml") -> list[str]:
    """Page names in book order: the root, then every `file:` entry of _toc.yml."""
    import yaml  # PyYAML comes with jupyter-book

    data = yaml.safe_load(toc.read_text())
    pages = [data["root"]]

    def walk(node) -> None:
        if isinstance(node, dict):
            if "file" in node:
                pages.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(data.get("parts", data.get("chapters", [])))
    return pages


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise PdfError("`make pdf` needs headless Chromium, which is not installed: "
                   "run `apt-get install -y chromium` (Debian) and try again")


def print_page(chromium: str, html: Path, out: Path, profile: Path) -> None:
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--print-to-pdf={out}", html.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=offline_js.chromium_env())
    if proc.returncode != 0 or not out.exists() or out.stat().st_size == 0:
        raise PdfError(f"Chromium could not print {html} (exit {proc.returncode}): {proc.stderr[-500:]}")


def build_pdf(html_dir: Path, out: Path, pages: list[str] | None = None) -> int:
    """Print every page of the built book (or the `pages` given, in that order) into `out`; return the
    number of PDF pages."""
    from pypdf import PdfReader, PdfWriter

    html_dir, pages = html_dir.resolve(), pages or toc_pages()
    missing = [p for p in pages if not (html_dir / f"{p}.html").exists()]
    if missing:
        raise PdfError(f"no built page for {', '.join(missing)} under {html_dir}: run `make book` first")
    chromium = find_chromium()
    writer = PdfWriter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i, page in enumerate(pages):
            part = tmp / f"{i:02d}.pdf"
            print_page(chromium, html_dir / f"{page}.html", part, tmp / "profile")
            reader = PdfReader(part)
            first = len(writer.pages)
            for p in reader.pages:
                writer.add_page(p)
            title = _title(html_dir / f"{page}.html") or page
            writer.add_outline_item(title=title, page_number=first)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        writer.write(f)
    return len(writer.pages)


def _title(html: Path) -> str | None:
    """The page's <title> without the book's name after the separator."""
    import re

    m = re.search(r"<title>(.*?)</title>", html.read_text(errors="replace"), re.S)
    if not m:
        return None
    return re.split(r"\s+(?:&#8212;|—)\s+", m.group(1).strip())[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html", help="the built book")
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "book.pdf", help="the PDF to write")
    args = ap.parse_args(argv)
    try:
        n = build_pdf(args.html, args.out)
    except PdfError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({n} pages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
