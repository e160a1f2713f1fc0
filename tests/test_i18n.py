"""The Chinese edition: catalogs checked against the English sources, figures with Chinese labels, and the two
built editions linked page to page.

Fast tests use small synthetic catalogs and a three-line book in a temporary folder (the real catalogs are
checked once, by test_catalogs_are_translated_and_in_step). The built-page tests read the session's one book
build (tests/book_build.py), which holds both editions.
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

from book_build import built_book  # noqa: F401  (session fixture: the one book build)
from conftest import require_tool

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "book" / "_ext" / "i18n_tool.py"
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import i18n_check  # noqa: E402
import lang_switch  # noqa: E402
import page_fixes  # noqa: E402
import zh_figures  # noqa: E402

CJK = re.compile(r"[\u4e00-\u9fff]")


# ---------------------------------------------------------------- markup that must survive translation


@pytest.mark.parametrize("src,dst", [
    ("The cache of {glue:text}`n_layers` layers", "{glue:text}`n_layers` 层的缓存"),
    ("See {ref}`the table <tab-sizes>` and {doc}`05_paging`.", "见{ref}`表格 <tab-sizes>`和{doc}`05_paging`。"),
    ("See {ref}`tab-sizes`.", "见{ref}`表 <tab-sizes>`。"),  # a bare target may gain a title
    ("Keys $K$ and values $V$ of `kvref`", "`kvref` 的值 $V$ 和键 $K$"),  # order may change
    ("Read [the paper](https://arxiv.org/abs/2309.06180).", "阅读[论文](https://arxiv.org/abs/2309.06180)。"),
])
def test_markup_kept_passes(src, dst):
    assert i18n_check.markup_difference(src, dst) == ""


@pytest.mark.parametrize("src,dst,lost", [
    ("{glue:text}`n_layers` layers", "若干层", "{glue:text}->n_layers"),  # glue role dropped
    ("{glue:text}`n_layers` layers", "{glue:text}`n_layer` 层", "{glue:text}->n_layers"),  # key altered
    ("See {ref}`the table <tab-sizes>`.", "见{ref}`表格 <tab-size>`。", "{ref}->tab-sizes"),  # target
    ("See {doc}`05_paging`.", "见{doc}`分页`。", "{doc}->05_paging"),  # a bare target translated
    ("Keys $K_{t}$ here", "这里的键 $K_t$", "math:$K_{t}$"),  # math altered
    ("Set `use_cache=True`.", "设置 use_cache=True。", "code:use_cache=True"),  # code span dropped
    ("Read [it](https://arxiv.org/abs/1).", "阅读[它](https://arxiv.org/abs/2)。", "link:https://arxiv.org/abs/1"),
])
def test_markup_altered_is_reported(src, dst, lost):
    diff = i18n_check.markup_difference(src, dst)
    assert diff and lost in diff, diff


# ---------------------------------------------------------------- catalogs against templates (synthetic)


def write_catalog(path: Path, entries: dict[str, str], fuzzy: set[str] = frozenset()) -> Path:
    cat = Catalog(locale="zh_CN", fuzzy=True)  # the header entry is fuzzy, as sphinx-intl writes it: ignored
    for src, dst in entries.items():
        cat.add(src, dst, flags=("fuzzy",) if src in fuzzy else ())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        write_po(f, cat)
    return path


def kinds(problems) -> list[tuple[str, str]]:
    return sorted((p.kind, p.source) for p in problems)


def test_complete_catalog_passes(tmp_path):
    pot = write_catalog(tmp_path / "pot" / "book" / "p.pot", {"Hello": "", "The {glue:text}`n` rows": ""})
    po = write_catalog(tmp_path / "po" / "book" / "p.po", {"Hello": "你好", "The {glue:text}`n` rows": "{glue:text}`n` 行"})
    assert i18n_check.check_catalog(pot, po, "book/p.po") == []
    assert i18n_check.check_tree(tmp_path / "pot", tmp_path / "po") == []


def test_untranslated_fuzzy_missing_stale_and_markup_are_each_reported(tmp_path):
    pot = write_catalog(tmp_path / "pot" / "book" / "p.pot",
                        {"Done": "", "Empty": "", "Fuzzy": "", "New sentence": "", "Uses `x`": ""})
    write_catalog(tmp_path / "po" / "book" / "p.po",
                  {"Done": "完成", "Empty": "", "Fuzzy": "模糊", "Old sentence": "旧句子", "Uses `x`": "用 x"},
                  fuzzy={"Fuzzy"})
    problems = i18n_check.check_tree(tmp_path / "pot", tmp_path / "po")
    assert kinds(problems) == [("fuzzy", "Fuzzy"), ("markup", "Uses `x`"), ("stale", "Old sentence"),
                               ("untranslated", "Empty"), ("untranslated", "New sentence")]
    assert all(p.catalog == "book/p.po" for p in problems)
    text = i18n_check.report(problems)
    assert "book/p.po: untranslated: 'New sentence'" in text and "i18n check failed" in text


def test_a_page_without_a_catalog_is_all_untranslated(tmp_path):
    write_catalog(tmp_path / "pot" / "book" / "new_page.pot", {"A": "", "B": ""})
    (tmp_path / "po").mkdir()
    problems = i18n_check.check_tree(tmp_path / "pot", tmp_path / "po")
    assert kinds(problems) == [("untranslated", "A"), ("untranslated", "B")]


# ---------------------------------------------------------------- one set of terms


@pytest.mark.parametrize("text,where", [
    ("本章讨论共享前缀缓存。", "messages"), ("GiB 即千兆字节", "messages"), ("{} 个汇聚 token", "labels"),
    ("精确回忆", "labels"), ("症状", "labels"), ("尖峰", "labels"), ("tiny 模型", "labels"),
    ("首 token 时间", "labels"), ("每步 nats/位", "messages"), ("正常（前缀缓存）", "labels"), ("已用内存", "labels"),
    ("计算的行数少了 {glue:text}`r` 倍", "messages"), ("缓存缩小 $H / H_{kv}$ 倍", "messages"),
    ("它的 首 token 延迟", "messages"), ("\\text{step time} = L \\times \\text{launch time}", "messages"),
    # review 3 of the Chinese edition: chapter 10's drifted terms
    ("kvref 的一个 tiny MLA 模型", "messages"), ("本课程 tiny 训练模型", "messages"), ("在提示之后", "messages"),
    ("长提示时", "labels"), ("按层的种类拆分", "messages"), ("各层种类之和", "messages"),
    ("notebook 会让你写出这个规划器", "messages"), ("vLLM 的混合 KV 缓存管理器", "messages"),
])
def test_a_variant_a_space_or_english_display_math_is_refused(text, where):
    assert i18n_check.term_problems(text, where, i18n_check.load_variants()), text


@pytest.mark.parametrize("text,where", [
    ("前缀缓存与注意力汇聚点", "messages"), ("首 token 延迟随提示词增长", "messages"),
    ("主机内存中的缓存", "messages"),  # CPU memory is 内存 in prose; only the figures' memory is GPU memory
    ("这是正常的", "messages"), ("快 {glue:text}`r` 倍", "messages"), ("只有 MHA 的 1/{glue:text}`r`", "messages"),
    ("\\text{单步时间} = \\max(\\text{FLOPs} / F)", "messages"), ("头 $\\lfloor h / \\text{n\\_rep} \\rfloor$", "messages"),
    ("\\text{第 } i \\text{ 块的 token}", "messages"), ("长提示词时\n单步出现突刺", "labels"),
    ("`kvref.tiny_model()` 是微型模型", "messages"), ("按种类统计连续与分页两种方式下的槽位", "messages"),
    ("{download}`笔记本：10_modern_caches.ipynb <../notebooks/10_modern_caches.ipynb>`", "messages"),
    ("KV Cache（KV 缓存）", "messages"), ("各层类型之和", "messages"),
])
def test_the_glossary_terms_pass(text, where):
    assert i18n_check.term_problems(text, where, i18n_check.load_variants()) == [], text


def test_terms_are_checked_in_catalogs_and_figure_labels(tmp_path):
    pot = write_catalog(tmp_path / "pot" / "book" / "p.pot", {"Prefix caching": "", "Healthy": ""})
    write_catalog(tmp_path / "po" / "book" / "p.po", {"Prefix caching": "共享前缀缓存", "Healthy": "健康"})
    (tmp_path / "figure_labels.yml").write_text('"healthy": "正常"\n"computed": "计算"\n', encoding="utf-8")
    problems = i18n_check.check_tree(pot.parents[1], tmp_path / "po")
    assert [(p.catalog, p.kind, p.source) for p in problems] == [
        ("book/p.po", "terms", "Prefix caching"), ("figure_labels.yml", "terms", "healthy")]
    assert "term_variants.yml" in i18n_check.report(problems)


def test_real_catalogs_and_figure_labels_write_the_glossary_terms():
    """The term part of `make i18n-check` on the real files (no extraction needed: quick)."""
    variants = i18n_check.load_variants()
    locale = ROOT / "book" / "locale" / "zh_CN"
    problems = i18n_check.check_labels(locale / "figure_labels.yml", variants)
    for po in sorted((locale / "LC_MESSAGES").rglob("*.po")):
        problems += [i18n_check.Problem(po.name, "terms", m.id, d) for m in i18n_check.read_catalog(po)
                     if m.id and isinstance(m.string, str) for d in i18n_check.term_problems(m.string, "messages",
                                                                                              variants)]
    assert not problems, "\n".join(map(str, problems))
    # Chapter 1's with-cache panel labels its rows "computed": computed once, not recomputed (重新计算).
    assert zh_figures.load_labels()["computed"] == "计算"


# ---------------------------------------------------------------- glued words in Chinese sentences

GLUE_TEXT = re.compile(r"\{glue:text\}`([^`:]+)")  # {glue:text}`key` or {glue:text}`key:.1f`


read_glue = i18n_check.read_glue  # {key: text} of a page's <page>.glue.json (the executed page's glued values)


def english_glue(messages: list[str], glue: dict[str, str]) -> list[str]:
    """The glue keys that the Chinese `messages` show whose value has English words and no `_zh` twin."""
    keys = {key for text in messages for key in GLUE_TEXT.findall(text)}
    return sorted(k for k in keys if k in glue and k + "_zh" not in glue and zh_figures.needs_translation(glue[k]))


def chinese_messages(page: str) -> list[str]:
    po = ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / f"{page}.po"
    return [m.string for m in i18n_check.read_catalog(po) if m.id and isinstance(m.string, str)]


def test_english_glue_without_a_twin_is_found(tmp_path):
    glue_json = tmp_path / "p.glue.json"
    record = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "", "mime_prefix": "x/"}}}
    glue_json.write_text(json.dumps({k: {**record, "data": {"text/plain": v}} for k, v in {
        "recall": "'10 of 24'", "n": "3", "size": "'4.2 GiB'",
        "v": "'no measurable change (noise ±2 %)'", "v_zh": "'无可测变化（噪声 ±2 %）'"}.items()}), encoding="utf-8")
    glue = read_glue(glue_json)
    assert glue["recall"] == "10 of 24" and glue["n"] == "3"
    messages = ["召回 {glue:text}`recall`，共 {glue:text}`n:.0f` 个，{glue:text}`size`", "困惑度 {glue:text}`v`"]
    assert english_glue(messages, glue) == ["recall"]
    assert english_glue(messages, {**glue, "recall_zh": "10 / 24"}) == []


def test_a_space_where_a_glued_value_meets_chinese_text_is_found(tmp_path):
    """Chapter 2 read "并且 在约 B = 4 个序列时越过脊点": the message's space sat before a glued Chinese verdict.
    The check substitutes each glued value (its Chinese twin first) and reports the spaces that appear."""
    glue = {"verdict": "crosses the ridge at *B* = 4", "verdict_zh": "在约 *B* = 4 个序列时越过脊点", "n": "3",
            "kind": "sliding"}
    bad = "强度接近 2.0 FLOPs，并且 {glue:md}`verdict`；"
    assert i18n_check.glued_space_problems(bad, glue) == [
        "space between Chinese characters where a glued value meets the text: '且 在'"]
    assert i18n_check.glued_space_problems("强度接近 2.0 FLOPs，并且{glue:md}`verdict`；", glue) == []
    # numbers and English words keep their spaces; an unknown key is left alone
    assert i18n_check.glued_space_problems("缓存 {glue:text}`n:.0f` 个 {glue:text}`kind` 层与 {glue:text}`x` 行", glue) == []
    # the same through check_catalog, as `make i18n-check` runs it on a built book
    pot = write_catalog(tmp_path / "pot" / "book" / "02_x.pot", {bad.replace("，并且 ", " and "): ""})
    po = write_catalog(tmp_path / "po" / "book" / "02_x.po", {bad.replace("，并且 ", " and "): bad})
    problems = [p for p in i18n_check.check_catalog(pot, po, "book/x.po", glue=glue) if p.kind == "terms"]
    assert len(problems) == 1 and "且 在" in problems[0].detail


def test_read_glue_reads_text_and_markdown(tmp_path):
    glue_json = tmp_path / "p.glue.json"
    glue_json.write_text(json.dumps({"n": {"data": {"text/plain": "3"}},
                                     "v_zh": {"data": {"text/markdown": "在约 *B* = 4",
                                                       "text/plain": "<IPython.core.display.Markdown object>"}}}))
    assert i18n_check.read_glue(glue_json) == {"n": "3", "v_zh": "在约 *B* = 4"}


CHAPTER_OK = {**i18n_check.CHAPTER_HEADINGS, "You write:": "你要写：" + i18n_check.NOTEBOOK_MAP + "“1. 热身”（“1. Warm-up”）"}


@pytest.mark.parametrize("change, expect", [
    ({}, []),
    ({"Key takeaways": "要点"}, ["Key takeaways"]),  # chapter 10 wrote 要点 and 读完本章，你能够：
    ({"After this chapter you can:": "读完本章，你能够："}, ["After this chapter you can:"]),
    ({"You write:": "你要写三部分。"}, ["In the notebook"]),  # no map of the notebook's exercises
])
def test_every_chapter_has_the_standard_headings_and_the_notebook_map(tmp_path, change, expect):
    messages = {**CHAPTER_OK, **change}
    pot = write_catalog(tmp_path / "pot" / "book" / "13_new.pot", dict.fromkeys(messages, ""))
    po = write_catalog(tmp_path / "po" / "book" / "13_new.po", messages)
    problems = i18n_check.check_catalog(pot, po, "book/13_new.po")
    assert [p.source for p in problems if p.kind == "chapter"] == expect
    assert all(p.kind == "chapter" for p in problems)


def test_a_chapter_without_its_headings_fails_and_other_pages_are_not_chapters(tmp_path):
    pot = write_catalog(tmp_path / "pot" / "book" / "11_x.pot", {"Some text": ""})
    po = write_catalog(tmp_path / "po" / "book" / "11_x.po", {"Some text": "一些文字"})
    missing = {p.source for p in i18n_check.check_catalog(pot, po, "book/11_x.po") if p.kind == "chapter"}
    assert missing == set(i18n_check.CHAPTER_HEADINGS) | {"In the notebook"}
    assert i18n_check.check_catalog(pot, po, "book/engines.po") == []  # not a chapter: no rule
    assert "chapter" in i18n_check.report(i18n_check.check_catalog(pot, po, "book/11_x.po"))


def test_every_chapter_page_has_a_catalog_with_its_headings_and_notebook_map():
    """Quick and without extraction: every book/NN_*.md (however many there are) has its catalog, the
    standard headings translated as in every chapter, and the sentence that maps its notebook."""
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))
    assert len(chapters) >= 10
    problems = []
    for page in chapters:
        po = ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / f"{page.stem}.po"
        if not po.is_file():
            problems.append(f"{page.name}: no catalog {po.relative_to(ROOT)}")
            continue
        entries = {m.id: m for m in i18n_check.read_catalog(po) if m.id}
        problems += [str(p) for p in i18n_check.chapter_problems(f"book/{po.name}", entries)]
    assert not problems, "\n".join(problems)


def glued_without_twin(page: Path) -> dict[str, str]:
    """The glue_text(key, value) calls of a page's code that give no Chinese twin while their value's own
    words are English ({key pattern: the value's literal text}; a key built by an f-string becomes a pattern)."""
    import ast

    import jupytext

    code = "\n".join(c.source for c in jupytext.read(page).cells if c.cell_type == "code")
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    found = {}
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glue_text"
                and len(node.args) == 2 and not any(isinstance(a, ast.Starred) for a in node.args)):
            continue
        key, value = node.args
        parts = value.values if isinstance(value, ast.JoinedStr) else [value]
        words = " ".join(p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str))
        if zh_figures.needs_translation(words):
            pattern = (re.escape(key.value) if isinstance(key, ast.Constant) else
                       "".join(re.escape(p.value) if isinstance(p, ast.Constant) else r"\w+" for p in key.values))
            found[pattern] = words
    return found


def test_no_chinese_message_shows_a_glued_english_literal():
    """Quick and without a build: a page's glue_text with English words in its own text and no Chinese twin,
    used by a Chinese message (the built-book test below reads the values themselves)."""
    problems = []
    for page in sorted((ROOT / "book").glob("[0-9][0-9]_*.md")):
        keys = {k for text in chinese_messages(page.stem) for k in GLUE_TEXT.findall(text)}
        for pattern, words in glued_without_twin(page).items():
            problems += [f"{page.name}: {k} ({words!r})" for k in keys if re.fullmatch(pattern, k)]
    assert not problems, "glued English in Chinese sentences: give glue_text a Chinese twin: " + "; ".join(problems)


@pytest.mark.slow
def test_chinese_messages_show_no_glued_english(built_book):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-6000:]
    executed = built_book.html.parent / "jupyter_execute" / "book"
    problems = []
    for glue_json in sorted(executed.glob("*.glue.json")):
        page = glue_json.name.removesuffix(".glue.json")
        glue = read_glue(glue_json)
        problems += [f"{page}: {k} = {glue[k]!r}: no Chinese twin" for k in english_glue(chinese_messages(page), glue)]
        # The Chinese twins write the glossary's terms too (e.g. nats/数字, not nats/位).
        problems += [f"{page}: {k} = {v!r}: {d}" for k, v in glue.items() if k.endswith("_zh")
                     for d in i18n_check.term_problems(v, "messages", i18n_check.load_variants())]
        # and no space between two Chinese characters where a glued value meets the text (chapter 2's "并且 在约")
        problems += [f"{page}: {d} in {t[:60]!r}" for t in chinese_messages(page)
                     for d in i18n_check.glued_space_problems(t, glue)]
    assert executed.is_dir() and not problems, "; ".join(problems)


# ---------------------------------------------------------------- tables: one per edition

GLUE_MD_DIRECTIVE = re.compile(r"^```\{glue:md\} (\S+)", re.M)


def table_glue(page: Path) -> tuple[list[str], dict[str, int], list[int]]:
    """A page's code, read without running it: the lines that display Markdown directly, {key: number of
    editions} of its glue_md calls (2 when a Chinese twin is given), and the lines of glue_md calls with none."""
    import ast

    import jupytext

    code = "\n".join(c.source for c in jupytext.read(page).cells if c.cell_type == "code")
    code = "\n".join(line if not line.lstrip().startswith(("%", "!")) else "" for line in code.splitlines())
    direct, glued, lone = [], {}, []
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None)
        if name == "display" and any(isinstance(a, ast.Call) and getattr(a.func, "id", None) == "Markdown"
                                     for a in node.args):
            direct.append(node.lineno)
        if name == "glue_md" and node.args and isinstance(node.args[0], ast.Constant):
            rest = node.args[1:]
            twins = len(rest) >= 2 or any(isinstance(a, ast.Starred) for a in rest)
            glued[node.args[0].value] = 2 if twins else 1
            if not twins:
                lone.append(node.lineno)
    return direct, glued, lone


def test_tables_are_glued_once_per_edition():
    """Quick and without a build: a table the reader reads as page text is glued with a Chinese twin and
    shown by `{glue:md}` (a cell that displays Markdown shows the same English table in both editions)."""
    problems = []
    for page in sorted((ROOT / "book").glob("[0-9][0-9]_*.md")):
        direct, glued, lone = table_glue(page)
        problems += [f"{page.name}: code line {n} displays Markdown directly: glue it with glue_md" for n in direct]
        problems += [f"{page.name}: glue_md at code line {n} has no Chinese twin" for n in lone]
        shown = GLUE_MD_DIRECTIVE.findall(page.read_text(encoding="utf-8"))
        problems += [f"{page.name}: {{glue:md}} {k} is never glued by glue_md" for k in shown if k not in glued]
        problems += [f"{page.name}: {k} is glued and never shown" for k in glued if k not in shown]
    assert not problems, "; ".join(problems)


def test_table_glue_finds_direct_markdown_and_lone_tables(tmp_path):
    page = tmp_path / "01_x.md"
    page.write_text("```{code-cell} ipython3\ndisplay(Markdown(t))\nglue_md('a', en)\n"
                    "glue_md('b', en, zh)\nglue_md('c', *(t(l) for l in ('en', 'zh')))\n```\n", encoding="utf-8")
    assert table_glue(page) == ([1], {"a": 1, "b": 2, "c": 2}, [2])


def test_md_table_refuses_a_row_of_the_wrong_width(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "book"))
    from _ext import page_helpers

    assert page_helpers.md_table(["a", "b"], [[1, "x"]]) == "| a | b |\n| --- | --- |\n| 1 | x |"
    assert page_helpers.md_table(["a", "b"], [[1, "x"]], align="rc").splitlines()[1] == "| ---: | :---: |"
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        page_helpers.md_table(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="one of l, r, c per column"):
        page_helpers.md_table(["a", "b"], [[1, "x"]], align="lrr")


class _Tables(HTMLParser):
    """The text of each table cell in a page, without code and math (which stay as written)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.cell: list[str] | None = None
        self.skip: list[str] = []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if self.skip or tag in ("code", "pre", "script", "style") or "math" in classes:
            self.skip.append(tag)
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if self.skip:
            if self.skip[-1] == tag:
                self.skip.pop()
        elif tag in ("td", "th") and self.cell is not None:
            self.cells.append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None and not self.skip:
            self.cell.append(data)


# An English word in a Chinese table: lowercase, four letters or more, not part of a name, path or unit
# (Llama-2-7B, tok/s, fp16). "token" and "logits" are the English words the Chinese text keeps, as
# Chinese engineers write them (and as the Chinese prose of the book does).
ENGLISH_WORD = re.compile(r"(?<![\w./-])[a-z]{4,}(?![\w/-])")
KEPT_ENGLISH = {"token", "tokens", "logit", "logits"}


def english_in_tables(html: str) -> list[str]:
    p = _Tables()
    p.feed(html)
    return sorted({w for c in p.cells for w in ENGLISH_WORD.findall(c)} - KEPT_ENGLISH)


def test_english_in_tables_skips_code_math_and_names():
    html = ("<table><tr><th>步 <code>cache=None</code></th><td><span class='math'>\\text{bytes}</span></td>"
            "<td>Llama-2-7B fp16 tok/s token</td><td>无缓存 cached rows</td></tr></table><p>outside tables</p>")
    assert english_in_tables(html) == ["cached", "rows"]


@pytest.mark.slow
def test_chinese_tables_are_chinese(built_book):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-6000:]
    zh = built_book.html / "zh" / "book"
    problems = {p.name: w for p in sorted(zh.glob("*.html")) if (w := english_in_tables(p.read_text(encoding="utf-8")))}
    assert zh.is_dir() and not problems, f"English words in the Chinese edition's tables: {problems}"


# ---------------------------------------------------------------- catalogs clean for gettext's own tools


def msgfmt_check(po: Path) -> str:
    """`msgfmt -c` on a catalog: '' when it passes without a warning, else what it said."""
    require_tool("gettext", ("msgfmt",), "apt-get install -y gettext")
    proc = subprocess.run(["msgfmt", "-c", "-o", "/dev/null", str(po)], capture_output=True, text=True)
    return "" if proc.returncode == 0 and not proc.stderr.strip() else proc.stderr.strip() or "failed"


def test_tidy_catalog_makes_what_sphinx_intl_writes_pass_msgfmt(tmp_path):
    import io

    import i18n_tool

    # What sphinx-intl (Babel) writes: placeholders in the header, python-format on "% of", brace format on glue.
    po = write_catalog(tmp_path / "p.po", {"Half (50 % of it)": "一半（50 % 的它）", "{glue:text}`n` rows": "{glue:text}`n` 行"})
    raw = po.read_text(encoding="utf-8")
    assert "python-format" in raw and "FULL NAME" in raw and msgfmt_check(po), "Babel no longer writes these"
    po.write_text(i18n_tool.tidy_catalog(raw), encoding="utf-8")
    tidy = po.read_text(encoding="utf-8")
    assert msgfmt_check(po) == "", tidy[:600]
    assert "format" not in tidy and "#, fuzzy" not in tidy and "Last-Translator: The kvref course authors" in tidy
    # The next `make i18n-update` reads and writes it with Babel again (which puts the flags back): same result.
    again = io.BytesIO()
    write_po(again, read_po(io.BytesIO(tidy.encode())), width=76)
    assert i18n_tool.tidy_catalog(again.getvalue().decode()) == tidy


def test_catalogs_pass_msgfmt_check():
    bad = {po.name: msgfmt_check(po) for po in sorted((ROOT / "book" / "locale").rglob("*.po"))}
    assert bad and not any(bad.values()), {k: v for k, v in bad.items() if v}


# ---------------------------------------------------------------- the notebooks' headings in the Chinese text

QUOTED_HEADING = re.compile(r"”（“([^”]+)”）")  # “中文标题”（“English heading”）


def notebook_headings(notebook: Path) -> set[str]:
    """A notebook's markdown headings as a reader finds them, without `#`, backticks and math dollars."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    lines = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    return {re.sub(r"[`$]", "", line.lstrip("#").strip()) for text in lines for line in text.splitlines()
            if line.startswith("#")}


def test_in_the_notebook_messages_quote_the_english_headings():
    """The notebooks stay English: where a Chinese "In the notebook" paragraph names their sections, it quotes each
    English heading beside its translation, so a reader finds it; each quoted heading is one of the notebook's."""
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]_*.md"))  # every chapter, however many there are
    assert len(chapters) >= 10
    for page in chapters:
        listing = [t for t in chinese_messages(page.stem) if i18n_check.NOTEBOOK_MAP in t]
        assert listing, f"{page.stem}.po: no message maps the notebook's exercises ({i18n_check.NOTEBOOK_MAP!r})"
        quoted = [q for t in listing for q in QUOTED_HEADING.findall(t)]
        headings = notebook_headings(ROOT / "notebooks" / f"{page.stem}.ipynb")
        assert len(quoted) >= 3, f"{page.stem}.po: the notebook's sections are named without their English headings"
        missing = [q for q in quoted if q not in headings]
        assert not missing, f"{page.stem}.po: quoted headings not in notebooks/{page.stem}.ipynb: {missing}"


# ---------------------------------------------------------------- the real tools on a tiny book


TINY_CONFIG = "title: Tiny\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: 'off'\n"
TINY_TOC = "format: jb-book\nroot: book/intro\n"


def run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300)


def fill(po_path: Path, translate) -> None:
    with open(po_path, "rb") as f:
        cat = read_po(f)
    for m in cat:
        if m.id:
            m.string = translate(m.id)
            m.flags.discard("fuzzy")
    with open(po_path, "wb") as f:
        write_po(f, cat)


@pytest.mark.slow
def test_update_then_check_fails_on_an_untranslated_change(tmp_path):
    book = tmp_path / "tiny"
    (book / "book").mkdir(parents=True)
    (book / "_config.yml").write_text(TINY_CONFIG)
    (book / "_toc.yml").write_text(TINY_TOC)
    page = book / "book" / "intro.md"
    page.write_text("# The cache\n\nEach step reads $K$ and `kv_cache` once.\n\nDecode is memory bound.\n")
    po = book / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / "intro.po"

    assert run_tool("update", "--book", str(book)).returncode == 0
    assert po.is_file(), "sphinx-intl update wrote no catalog"
    first = run_tool("check", "--book", str(book))
    assert first.returncode == 1 and "book/intro.po: untranslated: 'Decode is memory bound.'" in first.stdout

    zh = {"The cache": "缓存", "Each step reads $K$ and `kv_cache` once.": "每步读取一次 $K$ 和 `kv_cache`。",
          "Decode is memory bound.": "解码受内存带宽限制。"}
    fill(po, zh.__getitem__)
    ok = run_tool("check", "--book", str(book))
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # The English text changes and nobody translates it: the check names the new message.
    page.write_text(page.read_text().replace("Decode is memory bound.", "Decode is bound by memory bandwidth."))
    changed = run_tool("check", "--book", str(book))
    assert changed.returncode == 1
    assert "book/intro.po: untranslated: 'Decode is bound by memory bandwidth.'" in changed.stdout
    # After `make i18n-update` the old translation comes back fuzzy (needs review): still a failure.
    assert run_tool("update", "--book", str(book)).returncode == 0
    fuzzy = run_tool("check", "--book", str(book))
    assert fuzzy.returncode == 1 and "'Decode is bound by memory bandwidth.'" in fuzzy.stdout, fuzzy.stdout

    # A translation that drops a code span fails even when nothing is untranslated.
    zh["Decode is bound by memory bandwidth."] = "解码受内存带宽限制。"
    zh["Each step reads $K$ and `kv_cache` once."] = "每步读取一次 $K$ 和 kv_cache。"
    fill(po, lambda s: zh.get(s, "x"))
    broken = run_tool("check", "--book", str(book))
    assert broken.returncode == 1 and "markup" in broken.stdout and "code:kv_cache" in broken.stdout


@pytest.mark.slow
def test_catalogs_are_translated_and_in_step():
    """`make i18n-check` on the real catalogs: a change to the English text that is not translated fails."""
    proc = run_tool("check")
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]


# ---------------------------------------------------------------- figures with Chinese labels


def test_needs_translation():
    assert zh_figures.needs_translation("context length")
    assert zh_figures.needs_translation("batch 16 (tok/s)")
    for neutral in ["GQA", "MiB", "fp16", "Llama-2-7B", "$T$", "1,024", "K/V", "tok/s", ""]:
        assert not zh_figures.needs_translation(neutral), neutral


def test_translate_exact_and_with_numbers():
    labels = {"context length": "上下文长度", "batch {}": "批大小 {}", "{} steps of {}": "{} 步，共 {}"}
    assert zh_figures.translate("context length", labels) == "上下文长度"
    assert zh_figures.translate("batch 16", labels) == "批大小 16"
    assert zh_figures.translate("3 steps of 1,024", labels) == "3 步，共 1,024"
    assert zh_figures.translate("batch size", labels) is None


def test_every_label_of_a_figure_is_swapped_or_reported():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4], label="with cache")
    ax.set(xlabel="context length", ylabel="GiB", title="untranslated title")
    ax.legend()
    try:
        with pytest.raises(zh_figures.MissingFigureLabel, match="untranslated title"):
            zh_figures.chinese_texts(fig, {"with cache": "有缓存", "context length": "上下文长度"})
        changes = zh_figures.chinese_texts(
            fig, {"with cache": "有缓存", "context length": "上下文长度", "untranslated title": "标题"})
        assert sorted(zh for _, _, zh in changes) == sorted(["有缓存", "上下文长度", "标题"])
    finally:
        plt.close(fig)


def test_glue_figure_glues_a_chinese_twin_and_leaves_the_figure_english(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import myst_nb

    drawn = {}

    def fake_glue(name, fig, display=True):  # what the page would show: the texts as drawn now
        fig.canvas.draw()
        ax = fig.axes[0]
        drawn[name] = [ax.get_title(), *(t.get_text() for t in ax.get_yticklabels())]

    monkeypatch.setattr(myst_nb, "glue", fake_glue)
    fig, ax = plt.subplots()
    ax.set_yticks([0, 1], ["K/V heads", "query heads"])  # fixed tick labels: redrawn from the formatter
    ax.set_title("GQA")  # language-neutral: no entry needed
    try:
        zh_figures.glue_figure("fig_t", fig, {"K/V heads": "K/V 头", "query heads": "查询头"})
        assert drawn == {"fig_t": ["GQA", "K/V heads", "query heads"], "fig_t_zh": ["GQA", "K/V 头", "查询头"]}
        fig.canvas.draw()
        assert [t.get_text() for t in ax.get_yticklabels()] == ["K/V heads", "query heads"]
    finally:
        plt.close(fig)


def test_glue_text_glues_a_chinese_twin_only_when_given(monkeypatch):
    """A page glues a computed sentence once per edition (`name`, `name_zh`); a number, once for both."""
    import myst_nb

    monkeypatch.syspath_prepend(str(ROOT / "book"))  # the pages import `_ext.page_helpers` from book/
    from _ext import page_helpers

    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.update({name: (value, display)}))
    page_helpers.glue_text("n", 3)
    page_helpers.glue_text("same", "the same", "完全相同")
    assert glued == {"n": (3, False), "same": ("the same", False), "same_zh": ("完全相同", False)}


def test_words_joins_a_list_in_each_editions_words(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "book"))
    from _ext.page_helpers import words

    assert words(["int8", "fp8", "int4"]) == "int8, fp8 and int4"
    assert words(["int8", "fp8", "int4"], "zh") == "int8、fp8 和 int4"
    assert words(["10 %", "50 %"], "zh") == "10 % 和 50 %"
    assert (words(["int2"]), words(["int2"], "zh")) == ("int2", "int2")
    assert (words([]), words([], "zh")) == ("none", "无")


def test_label_file_entries_are_chinese():
    labels = zh_figures.load_labels()
    assert labels, f"{zh_figures.LABELS} is empty"
    # Chinese, or kept as it is on purpose (model names, `token`, which Chinese technical text keeps too).
    not_chinese = [en for en, zh in labels.items() if not CJK.search(zh) and zh != en]
    assert not not_chinese, f"entries whose label is neither Chinese nor the English kept as is: {not_chinese[:10]}"
    slots = [en for en, zh in labels.items() if en.count("{}") != zh.count("{}")]
    assert not slots, f"entries whose number slots {{}} differ between English and Chinese: {slots}"


def test_cjk_font_has_the_chinese_glyphs():
    # The system's Noto Sans CJK, else the Noto Sans SC that `make js` fetched: without one the labels are boxes.
    from matplotlib.ft2font import FT2Font

    fonts = zh_figures.offline_js.cjk_fonts()
    assert fonts, "no CJK font installed or fetched: `make js` fetches one where the system has none"
    assert zh_figures.cjk_family()
    font = FT2Font(str(fonts[0]))
    assert all(font.get_char_index(ord(c)) for c in "键值缓存预填充解码显存块表"), fonts[0]


def test_chromium_finds_a_chinese_font():
    # Chromium (screenshots, `make pdf`) finds Chinese glyphs through fontconfig, with the environment pdf.py
    # gives it (which adds the fetched font where the system has none).
    require_tool("fontconfig", ("fc-list",), "apt-get install -y fontconfig (it comes with chromium)")
    fc = subprocess.run(["fc-list", ":lang=zh-cn", "family"], capture_output=True, text=True,
                        env=zh_figures.offline_js.chromium_env())
    assert fc.stdout.strip(), "fontconfig knows no Chinese font: Chinese pages would show empty boxes"


# ---------------------------------------------------------------- figure alt texts


def page_alt_texts() -> list[str]:
    """The `:alt:` texts of the book's pages (one line each), in page order."""
    return [line.removeprefix(":alt: ") for page in sorted((ROOT / "book").glob("*.md"))
            for line in page.read_text(encoding="utf-8").splitlines() if line.startswith(":alt: ")]


def test_every_figure_alt_text_has_a_chinese_translation():
    alts, zh = page_alt_texts(), lang_switch.load_alt_texts()
    assert len(alts) >= 35
    missing = [a for a in alts if a not in zh]
    assert not missing, f"alt texts with no entry in {lang_switch.ALT_TEXTS.name}: {missing}"
    stale = sorted(set(zh) - set(alts))
    assert not stale, f"entries of {lang_switch.ALT_TEXTS.name} that no page has any more: {stale}"
    variants = i18n_check.load_variants()
    for en, text in zh.items():
        assert len(CJK.findall(text)) > len(text) / 3, f"not translated: {en!r}"
        assert not i18n_check.term_problems(text, "labels", variants), (text, i18n_check.term_problems(
            text, "labels", variants))


def test_the_chinese_build_swaps_alt_texts_and_names_a_missing_one():
    from docutils import nodes
    from docutils.utils import new_document

    doc = new_document("page")
    doc += nodes.figure("", nodes.image(uri="a.png", alt="A bar chart"))
    doc += nodes.image(uri="b.png", alt="A new line chart")
    doc += nodes.image(uri="c.png")  # no alt text: nothing to translate
    missing = lang_switch.chinese_alt_texts(doc, {"A bar chart": "一张条形图"})
    assert [i.get("alt") for i in doc.findall(nodes.image)] == ["一张条形图", "A new line chart", None]
    assert missing == ["A new line chart"]


@pytest.mark.slow
def test_chinese_pages_have_chinese_alt_texts(built_book):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-6000:]
    english = []
    for page in sorted((built_book.html / "zh" / "book").glob("*.html")):
        for alt in re.findall(r'<img [^>]*alt="([^"]+)"', page.read_text(encoding="utf-8")):
            if not CJK.search(alt):
                english.append(f"{page.name}: {alt[:80]}")
    assert not english, english


# ---------------------------------------------------------------- the language switch


def test_switch_urls_point_at_the_twin_page():
    assert lang_switch.switch_url("book/03_memory", chinese=False) == "../zh/book/03_memory.html"
    assert lang_switch.switch_url("book/03_memory", chinese=True) == "../../book/03_memory.html"
    assert lang_switch.switch_url("search", chinese=False) == "zh/search.html"
    assert lang_switch.switch_url("search", chinese=True) == "../search.html"


def test_chinese_glue_reads_the_zh_twin():
    data = {"fig_a": "en", "fig_a_zh": "zh", "fig_b": "only"}
    assert lang_switch.use_chinese_glue(data) == {"fig_a": "zh", "fig_a_zh": "zh", "fig_b": "only"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.switch: str | None = None
        self.lang: str | None = None
        self.images: list[str] = []
        self.in_article = 0
        self.article_text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.lang = a.get("lang")
        if tag == "a" and "lang-switch" in (a.get("class") or "").split():
            self.switch = a.get("href")
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])
        if tag == "article":
            self.in_article += 1

    def handle_endtag(self, tag):
        if tag == "article" and self.in_article:
            self.in_article -= 1

    def handle_data(self, data):
        if self.in_article:
            self.article_text.append(data)


def read_page(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def edition_pages(html: Path) -> list[Path]:
    return [p for p in sorted(html.glob("*.html")) + sorted((html / "book").glob("*.html"))
            if p.name != "index.html"]


@pytest.mark.slow
def test_both_editions_are_built_and_switch_links_resolve_both_ways(built_book):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-6000:]
    en, zh = built_book.html, built_book.html / "zh"
    assert "Chinese edition:" in built_book.stdout
    en_pages = edition_pages(en)
    assert en_pages and [p.relative_to(en) for p in en_pages] == [p.relative_to(zh) for p in edition_pages(zh)]
    for page in en_pages + edition_pages(zh):
        href = read_page(page).switch
        assert href, f"{page.relative_to(en)}: no language switch"
        assert not urlsplit(href).scheme and not href.startswith("/"), f"{page}: switch link not relative: {href}"
        twin = (page.parent / href).resolve()
        assert twin.is_file(), f"{page.relative_to(en)}: switch points at {href}, which is not built"
        back = read_page(twin).switch
        assert (twin.parent / back).resolve() == page.resolve(), f"{twin}: its switch does not lead back"
        assert (zh in twin.parents) != (zh in page.parents), f"{page}: the switch stays in its own edition"


@pytest.mark.slow
def test_chinese_pages_are_chinese(built_book):  # noqa: F811
    assert built_book.returncode == 0, built_book.log[-6000:]
    zh = built_book.html / "zh" / "book"
    for page in sorted(zh.glob("*.html")):
        p = read_page(page)
        assert p.lang == "zh-CN", f"{page.name}: <html lang={p.lang!r}>"
        text = "".join(p.article_text)
        assert len(CJK.findall(text)) >= 20, f"zh/book/{page.name}: the article has (almost) no Chinese text"
    # Figures: each chapter's Chinese page shows figures of its own (labels in Chinese), not the English images.
    for page in sorted((built_book.html / "book").glob("[0-9][0-9]_*.html")):
        en_bytes = {(page.parent / s).resolve().read_bytes() for s in read_page(page).images}
        zh_page = zh / page.name
        zh_bytes = {(zh_page.parent / s).resolve().read_bytes() for s in read_page(zh_page).images}
        assert zh_bytes and zh_bytes - en_bytes, f"zh/book/{page.name} shows only the English figures"


def test_chinese_build_config_names_its_catalogs_and_the_shared_cache(tmp_path):
    sys.path.insert(0, str(TOOL.parent))
    import i18n_tool

    cfg = i18n_tool.chinese_config(tmp_path / "cache")
    sphinx = cfg["sphinx"]["config"]
    assert sphinx["language"] == "zh_CN" and sphinx["gettext_compact"] is False
    assert Path(sphinx["locale_dirs"][0]) == ROOT / "book" / "locale"
    assert cfg["execute"] == {**cfg["execute"], "execute_notebooks": "cache", "cache": str(tmp_path / "cache")}
    # The generated file lives in the build folder: extension paths must not depend on where it is.
    assert all(Path(p).is_absolute() and Path(p).is_dir() for p in cfg["sphinx"]["local_extensions"].values())
    assert CJK.search(cfg["title"]), f"the Chinese edition's title is {cfg['title']!r}"
    captions = [part["caption"] for part in i18n_tool.chinese_toc()["parts"]]
    assert captions and all(CJK.search(c) for c in captions), captions


# ---------------------------------------------------------------- search in the Chinese edition


def glossary_terms() -> list[str]:
    """The glossary's Chinese terms written in Chinese characters only (book/glossary.md: each entry's second
    line), without the English in brackets and the dagger; "分组大小与残差窗口" gives two terms."""
    text = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    terms = []
    for block in re.findall(r"```\{glossary\}\n(.*?)```", text, re.S):
        lines = [line for line in block.splitlines() if line and not line.startswith(" ")]
        for zh in lines[1::2]:
            zh = re.sub(r"（[^）]*）|†", "", zh).strip()
            terms += [t for t in zh.split("与") if len(t) >= 2 and all(CJK.match(c) for c in t)]
    return terms


def search_terms() -> list[str]:
    import i18n_tool

    return i18n_tool.SEARCH_TERMS.read_text(encoding="utf-8").split()


def test_chinese_build_indexes_the_course_terms_for_search(tmp_path):
    import i18n_tool

    cfg = i18n_tool.chinese_config(tmp_path / "cache")
    assert cfg["sphinx"]["config"]["html_search_options"] == {"dict": str(i18n_tool.SEARCH_TERMS)}
    terms = search_terms()
    missing = sorted(set(glossary_terms()) - set(terms))
    assert not missing, f"glossary terms missing from {i18n_tool.SEARCH_TERMS.name}: {missing}"
    for t in ["预填充", "解码步", "前缀缓存", "注意力汇聚点", "显存碎片", "块表", "滑动窗口", "环形缓冲区"]:
        assert t in terms, t


def test_jieba_keeps_each_course_term_one_word():
    jieba = pytest.importorskip("jieba")  # pinned in requirements.txt: Sphinx's Chinese search needs it
    import i18n_tool

    plain, course = jieba.Tokenizer(), jieba.Tokenizer()
    course.load_userdict(str(i18n_tool.SEARCH_TERMS))
    split = [t for t in search_terms() if list(plain.cut(t)) != [t]]
    assert "预填充" in split  # what the index held before: the test would notice the dictionary missing
    for term in search_terms():
        assert list(course.cut(term)) == [term], term
        # Sphinx indexes the words of cut_for_search: the term itself must be one of them inside a sentence.
        assert term in course.cut_for_search(f"我们看{term}的时候发现问题"), term


SEARCH_ALL = """<!DOCTYPE html><html><body><pre id="out"></pre><script>
// One frame per term, each the book's own search page; every 200 ms the finished searches' result links are
// written below as JSON (a search has finished when Sphinx wrote its summary line, with or without results).
const terms = %s, frames = {};
for (const t of terms) {
  frames[t] = document.body.appendChild(document.createElement("iframe"));
  frames[t].src = %s + "?q=" + encodeURIComponent(t);
}
setInterval(() => {
  const got = {};
  for (const t of terms) {
    const d = frames[t].contentDocument, summary = d && d.querySelector("p.search-summary");
    got[t] = summary && summary.innerText ? [...d.querySelectorAll("ul.search a")].map(a => a.getAttribute("href")) : null;
  }
  document.getElementById("out").textContent = JSON.stringify(got);
}, 200);
</script></body></html>"""


def chromium_search_all(html: Path, terms: list[str], work: Path) -> dict[str, list[str]]:
    """{term: the pages (relative to `html`) that the built search page lists for it}, all terms searched in one
    headless Chromium (a frame each; `--allow-file-access-from-files` lets the page read its frames)."""
    chromium = next(shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c))
    work.mkdir(parents=True, exist_ok=True)
    page = work / "search_all.html"
    page.write_text(SEARCH_ALL % (json.dumps(terms, ensure_ascii=False), json.dumps((html / "search.html").as_uri())),
                    encoding="utf-8")
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           f"--virtual-time-budget={10000 + 300 * len(terms)}", f"--user-data-dir={work / 'profile'}",
                           "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=300, env=zh_figures.offline_js.chromium_env())
    out = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S)
    assert proc.returncode == 0 and out and out.group(1), proc.stderr[-2000:]
    found = json.loads(html_lib.unescape(out.group(1)))
    unfinished = [t for t in terms if found.get(t) is None]
    assert not unfinished, f"the search page had not finished for {unfinished} when Chromium stopped"
    return {t: sorted(set(re.sub(r"[#?].*", "", link) for link in found[t])) for t in terms}


def chromium_search(html: Path, term: str, work: Path) -> list[str]:
    """The pages (relative to `html`) that the built search page lists for `term`, in headless Chromium."""
    return chromium_search_all(html, [term], work)[term]


def test_a_browser_search_finds_chinese_terms_on_a_tiny_chinese_book(tmp_path):
    require_tool("Chromium", ("chromium", "chromium-browser", "google-chrome"), "apt-get install -y chromium",
                 need_all=False)
    pytest.importorskip("jieba")
    import i18n_tool

    book = tmp_path / "tiny"
    (book / "book").mkdir(parents=True)
    (book / "_config.yml").write_text(TINY_CONFIG + "sphinx:\n  config:\n    language: zh_CN\n"
                                      f"    html_search_options:\n      dict: {i18n_tool.SEARCH_TERMS}\n")
    (book / "_toc.yml").write_text(TINY_TOC + "chapters:\n- file: book/a\n- file: book/b\n")
    (book / "book" / "intro.md").write_text("# 首页\n\n这是一本小书。\n", encoding="utf-8")
    (book / "book" / "a.md").write_text("# 第一章\n\n请求先经过预填充，再进入解码步。\n", encoding="utf-8")
    (book / "book" / "b.md").write_text("# 第二章\n\n这里讲环形缓冲区，以及填充的数据。\n", encoding="utf-8")
    proc = subprocess.run([i18n_tool.jupyter_book(), "build", str(book)], capture_output=True, text=True,
                          timeout=300)
    html = book / "_build" / "html"
    assert proc.returncode == 0 and (html / "searchindex.js").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert chromium_search(html, "预填充", tmp_path / "p") == ["book/a.html"]  # not b's 填充
    assert chromium_search(html, "解码步", tmp_path / "p") == ["book/a.html"]
    assert chromium_search(html, "环形缓冲区", tmp_path / "p") == ["book/b.html"]


@pytest.mark.slow
def test_a_browser_search_for_each_course_term_finds_the_chapters_using_it(built_book, tmp_path):  # noqa: F811
    require_tool("Chromium", ("chromium", "chromium-browser", "google-chrome"), "apt-get install -y chromium",
                 need_all=False)
    assert built_book.returncode == 0, built_book.log[-6000:]
    zh = built_book.html / "zh"
    texts = {p.relative_to(zh).as_posix(): "".join(read_page(p).article_text) for p in sorted(zh.glob("book/*.html"))}
    terms = search_terms()
    found = chromium_search_all(zh, terms, tmp_path / "search")
    for term in terms:
        using = {page for page, text in texts.items() if term in text}
        assert using <= set(found[term]), f"search for {term}: {sorted(using - set(found[term]))} use it and are not listed"


def test_the_faster_chinese_stemmer_gives_sphinx_own_answers():
    """book/_ext/page_fixes.py replaces Sphinx's SearchChinese.stem (a list lookup per word, quadratic) by a set
    lookup: every word of a few pages, split as the index splits them, stems exactly as Sphinx's own method does."""
    from sphinx.search import zh

    page_fixes.fast_chinese_stem()
    fast = zh.SearchChinese.stem
    assert fast.kvref_fast and fast.original is not fast
    search = zh.SearchChinese({})
    texts = ["键值缓存 KV cache 的 GQA 与 MQA：decoding reads the cache", "PagedAttention 把 KV 分成 blocks",
             "the API of vLLM and SGLang; RoPE, MLA, H2O, FP8 and int4 caches", "每步 decode 读 KV 一次 (ops)"]
    for text in texts:
        words = search.split(text)
        assert [fast(search, w) for w in words] == [fast.original(search, w) for w in words], text
    # both branches of Sphinx's rule occur: a kept acronym-like term and an ordinary stemmed one
    assert fast(search, "ops") == fast.original(search, "ops") == "ops"
    assert fast(search, "caches") == fast.original(search, "caches") == "cach"
