"""`make pdf`: the whole book, in book order, in one PDF with a bookmark per page.

The print itself needs headless Chromium (Debian's `chromium`; `.ci/run` installs it where it is missing).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
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
    on_disk = sorted(f"book/{p.stem}" for p in (ROOT / "book").glob("[0-9][0-9]_*.md"))  # however many there are
    assert chapters == sorted(chapters) == on_disk, (chapters, on_disk)
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


def printed(built_book, out: Path, edition: str = "", pages: list[str] | None = None):
    """(the PDF's reader, its page count) for the built book's `edition` ("" English, "zh") printed to `out`."""
    from pypdf import PdfReader

    require_tool("Chromium", ("chromium", "chromium-browser", "google-chrome"), "apt-get install -y chromium",
                 need_all=False)
    assert built_book.returncode == 0, built_book.log[-3000:]
    n = pdf.build_pdf(built_book.html / edition, out, pages)
    return PdfReader(out), n


@pytest.mark.slow
def test_book_prints_to_one_pdf(built_book, tmp_path):  # noqa: F811
    reader, n = printed(built_book, tmp_path / "book.pdf")
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


@pytest.mark.slow
def test_chinese_edition_prints_with_chinese_bookmarks(built_book, tmp_path):  # noqa: F811
    # Three pages are enough to show the edition's own titles and text reach the PDF (the whole edition is
    # what `make pdf` prints, with the same function).
    reader, _ = printed(built_book, tmp_path / "book-zh.pdf", "zh", ["book/intro", "book/03_memory", "book/glossary"])
    titles = [item.title for item in reader.outline]
    cjk = re.compile(r"[\u4e00-\u9fff]")
    assert len(titles) == 3 and all(cjk.search(t) for t in titles), titles
    assert titles[2] == "术语表", titles
    starts = [reader.get_destination_page_number(item) for item in reader.outline]
    text = "".join(p.extract_text() for p in reader.pages[starts[1]:starts[2]])
    assert len(cjk.findall(text)) > 500 and "kvref" in text  # Chinese prose and the code, as text
    # Copied or searched, the PDF's text is the page's: ideographs, not the Kangxi radicals drawn the same.
    assert not re.findall(r"[\u2e80-\u2fdf]", text), "the PDF maps glyphs back to radicals (book/_ext/print_font.py)"


def test_make_pdf_prints_both_editions():
    rule = (ROOT / "Makefile").read_text().split("\npdf:", 1)[1].split("\n\n", 1)[0]
    assert "--html $(abspath $(BUILD_DIR))/_build/html --out" in rule and "book.pdf" in rule
    assert "_build/html/zh --out $(abspath $(BUILD_DIR))/_build/book-zh.pdf" in rule


def test_print_font_maps_each_glyph_back_to_its_ideograph(tmp_path):
    # The radical ⽤ (U+2F64) and the ideograph 用 (U+7528) share a glyph in Noto's CJK fonts; the copy keeps the
    # ideograph's entry and drops the radical's, so a PDF can map the glyph back to one character only: 用.
    from fontTools.ttLib import TTCollection, TTFont

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import offline_js
    import print_font

    source = (offline_js.system_cjk_fonts() or offline_js.fetched_faces())[0]

    def cmap(path):  # {code point: glyph id} (glyph names are made up from the cmap when the font has none)
        font = TTCollection(path).fonts[0] if path.suffix == ".ttc" else TTFont(path)
        return {c: font.getGlyphID(g) for c, g in font.getBestCmap().items()}

    before, after = cmap(source), cmap(print_font.derive(source, tmp_path / source.name))
    assert before[0x2F64] == before[0x7528]  # the reason for the copy, on this font
    assert 0x2F64 not in after and after[0x7528] == before[0x7528]
    assert not [c for c in after if 0x2E80 <= c <= 0x2FDF]
    assert {c: g for c, g in before.items() if not 0x2E80 <= c <= 0x2FDF} == after
    conf = print_font.fontconfig([source], tmp_path).read_text()
    assert f"<dir>{tmp_path / 'print'}</dir>" in conf and f"<glob>{source}</glob>" in conf
