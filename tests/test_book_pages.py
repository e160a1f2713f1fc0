"""Every chapter page has the shape a reader relies on, and every figure can be read without seeing it.

Source checks (fast): learning objectives at the top, "In the notebook", key takeaways, further reading with links
as the last section, at least one figure glued with alt text, code lines short enough for the page.
Built-page checks (the session's one book build): each image has a real alt text and exists in the build, no
glued sentence of chapter 6 prints a signed change of 0.00 % (a direction inside the noise), and every page ran
once, before the build (book/_ext/execute_pages.py), which then executed none itself.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from book_build import built_book  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from execute_pages import executable_pages, toc_pages  # noqa: E402  (the notebook pages of _toc.yml, all pages)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
MAX_CODE_LINE = 88  # the code column of a page shows about 88 characters before it scrolls


def sections(text: str) -> list[tuple[str, str]]:
    """(title, body) of each `## ` section, in page order (code cells may hold '## ' lines: skip them)."""
    out, title, body, in_code = [], None, [], False
    for line in text.splitlines():
        if line.startswith("```"):  # an opening or closing fence
            in_code = not in_code
        if not in_code and line.startswith("## "):
            if title is not None:
                out.append((title, "\n".join(body)))
            title, body = line[3:].strip(), []
        elif title is not None:
            body.append(line)
    if title is not None:
        out.append((title, "\n".join(body)))
    return out


def bullets(body: str) -> list[str]:
    return [line for line in body.splitlines() if re.match(r"^[-*] \S", line)]


def code_cells(text: str) -> list[list[str]]:
    cells, cur = [], None
    for line in text.splitlines():
        if cur is None and line.startswith("```{code-cell}"):
            cur = []
        elif cur is not None and line.strip() == "```":
            cells.append(cur)
            cur = None
        elif cur is not None:
            cur.append(line)
    return cells


def test_chapters_are_numbered_from_one_without_gaps():
    assert len(CHAPTERS) >= 10, [p.name for p in CHAPTERS]
    assert [p.name[:2] for p in CHAPTERS] == [f"{i:02d}" for i in range(1, len(CHAPTERS) + 1)], [p.name for p in CHAPTERS]


def test_readme_lists_every_chapter_in_order():
    """The README's chapter table is where a newcomer looks first: one row per chapter, numbered as the pages."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| `(\d\d_\w+)`", readme, flags=re.M)
    assert rows == [(str(int(p.name[:2])), p.stem) for p in CHAPTERS], (
        f"README's chapter table lists {rows}; the book has {[p.stem for p in CHAPTERS]}")


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_has_objectives_notebook_takeaways_reading(page):
    secs = sections(page.read_text())
    titles = [t for t, _ in secs]
    for needed in ["Learning objectives", "In the notebook", "Key takeaways", "Further reading"]:
        assert needed in titles, f"{page.name}: no '## {needed}' section (sections: {titles})"
    body = dict(secs)
    assert titles[0] == "Learning objectives", f"{page.name}: the objectives come first, not after {titles[0]!r}"
    assert 3 <= len(bullets(body["Learning objectives"])) <= 5, f"{page.name}: 3-5 learning objectives"
    assert 3 <= len(bullets(body["Key takeaways"])) <= 6, f"{page.name}: 3-6 key takeaways"
    assert titles[-1] == "Further reading", f"{page.name}: further reading is the last section, not {titles[-1]!r}"
    links = re.findall(r"\]\((https?://[^)\s]+)\)", body["Further reading"])
    assert len(links) >= 2, f"{page.name}: further reading has {len(links)} links, wants at least 2"
    assert "notebooks/" in body["In the notebook"], f"{page.name}: 'In the notebook' links the notebook"


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_has_a_figure_with_alt_text(page):
    figures = re.findall(r"```\{glue:figure\}[^\n]*\n((?::[^\n]*\n)*)", page.read_text())
    alts = [m.group(1).strip() for opts in figures for m in [re.search(r"^:alt:(.*)$", opts, re.M)] if m]
    assert alts, f"{page.name}: no {{glue:figure}} with an :alt: text"
    assert all(len(a.split()) >= 5 for a in alts), f"{page.name}: an alt text says too little: {alts}"


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_code_lines_fit_the_page(page):
    long = [line for cell in code_cells(page.read_text()) for line in cell if len(line) > MAX_CODE_LINE]
    assert not long, f"{page.name}: {len(long)} code lines over {MAX_CODE_LINE} characters, e.g. {long[0]!r}"


def test_sections_parser_sees_through_code_cells():
    text = "# T\n## A\n- a\n```{code-cell} ipython3\n## not a section\n```\n## B\ntext\n"
    assert [t for t, _ in sections(text)] == ["A", "B"]


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append({k: v or "" for k, v in attrs})


@pytest.mark.slow
@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_built_figures_have_alt_text_and_exist(built_book, page):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-3000:]
    for html in (built_book.html / "book" / f"{page.stem}.html", built_book.html / "zh" / "book" / f"{page.stem}.html"):
        parser = _Images()
        parser.feed(html.read_text())
        assert parser.images, f"{html}: no figure in the built page"
        for img in parser.images:
            alt, src = img.get("alt", ""), img.get("src", "")
            # myst-nb gives an un-glued plt.show() figure its file name as alt text: that is not a description.
            # Five words, or in the Chinese edition (figure_alt.yml) ten Chinese characters (no spaces between words).
            described = len(alt.split()) >= 5 or len(re.findall(r"[\u4e00-\u9fff]", alt)) >= 10
            assert described and not alt.endswith((".png", ".svg", ".jpg")), \
                f"{html}: image {src} has no description (alt={alt!r})"
            assert (html.parent / src).resolve().is_file(), f"{html}: image {src} is missing from the build"


@pytest.mark.slow
def test_chapter6_prints_no_signed_zero_change(built_book):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-3000:]
    text = re.sub(r"<[^>]+>", "", (built_book.html / "book" / "06_quantization.html").read_text())
    # "+0.00 %", "-0.00 %" or "−0.00 %" states a direction the measurement cannot show.
    zeros = re.findall(r".{0,60}[+\-\u2212]0\.00\s?%.{0,20}", text)
    assert not zeros, f"chapter 6 states a signed change of 0.00 %: {zeros[:3]}"


@pytest.mark.slow
def test_pages_ran_once_before_the_build(built_book):  # noqa: F811
    """`make book` runs the pages in parallel first (book/_ext/execute_pages.py); both builds then take every page
    from the cache: one run of each page, and no kernel started by Sphinx itself."""
    assert built_book.returncode == 0, built_book.log[-3000:]
    ran = set(re.findall(r"^execute_pages: (\S+\.md) executed in ", built_book.stdout, re.M))
    expected = {p.relative_to(ROOT).as_posix() for p in executable_pages()}
    pages = [f"{name}.md" for name in toc_pages(ROOT / "_toc.yml")]
    with_code = {p for p in pages if "```{code-cell}" in (ROOT / p).read_text(encoding="utf-8")}
    assert with_code and with_code <= expected, f"pages with code that would not run first: {with_code - expected}"
    assert ran == expected, (f"ran before the build: {sorted(ran)}; notebooks: {sorted(expected)}\n"
                             f"{built_book.stdout[-3000:]}")
    again = re.findall(r"(\S+\.md): Executing notebook", built_book.log)
    assert not again, f"the build executed {again} again: the cache did not match the run before it"
