"""`make pdf`: the whole book, in book order, in one PDF with a bookmark per page.

The print itself needs headless Chromium (Debian's `chromium`; `.ci/run` installs it where it is missing).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
from conftest import require_tool
from book_build import built_book  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("book_pdf", ROOT / "book" / "_ext" / "pdf.py")
pdf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pdf)


def test_pages_follow_the_toc():
    pages = pdf.toc_pages()
    assert pages[0] == "book/intro"
    chapters = [p for p in pages if re.match(r"book/\d\d_", p)]
    assert chapters == sorted(chapters) and len(chapters) == 10, chapters
    assert pages[-1] == "book/glossary"


def test_missing_chromium_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pdf.PdfError, match="apt-get install -y chromium"):
        pdf.find_chromium()


def test_unbuilt_book_is_one_clear_error(tmp_path, capsys):
    assert pdf.main(["--html", str(tmp_path), "--out", str(tmp_path / "b.pdf")]) == 1
    err = capsys.readouterr().err
    assert "make book" in err and "book/intro" in err
    assert not (tmp_path / "b.pdf").exists()


@pytest.mark.slow
def test_book_prints_to_one_pdf(built_book, tmp_path):  # noqa: F811
    from pypdf import PdfReader

    require_tool("Chromium", ("chromium", "chromium-browser", "google-chrome"), "apt-get install -y chromium",
                 need_all=False)
    assert built_book.returncode == 0, built_book.log[-3000:]
    out = tmp_path / "book.pdf"
    n = pdf.build_pdf(built_book.html, out)
    reader = PdfReader(out)
    assert len(reader.pages) == n
    titles = [item.title for item in reader.outline]
    pages = pdf.toc_pages()
    assert len(titles) == len(pages), titles
    assert titles[1].startswith("Why cache"), titles  # chapter 1's heading, in book order
    assert titles[-1] == "Glossary", titles
    starts = [reader.get_destination_page_number(item) for item in reader.outline]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), starts  # each page starts anew
    # Prose, math and code all reach the paper (MathJax ran before printing; the text is not an image).
    text = "".join(p.extract_text() for p in reader.pages[starts[3]:starts[4]])  # chapter 3
    assert "The memory bill" in text and "kvref" in text
    assert n >= 4 * len(pages)  # a chapter is several printed pages; one page each means the prints failed
