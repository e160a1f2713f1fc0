"""Check the Chinese catalogs against the English sources: every message translated, none fuzzy, and the markup
that must survive translation intact.

Compares the message templates that Sphinx's gettext builder extracts from the current English pages (*.pot)
with the catalogs in book/locale/zh_CN/LC_MESSAGES (*.po). A problem is:

- untranslated: a message of the current sources with an empty translation, or missing from its catalog (the
  English text changed and `make i18n-update` has not been run, or ran and left it empty);
- fuzzy: a translation sphinx-intl carried over from an older English text, flagged for review;
- stale: a translated message whose English text is gone from the sources (`make i18n-update` marks it obsolete);
- markup: the translation drops, adds or alters a glue role, a math span, a code span, a link target, a role's
  target or a footnote reference of its source. `{ref}`title <target>`` may translate its title, never
  its target; `{glue:text}`key`` and `{doc}`05_paging`` must stay exactly as they are;
- terms: a translation or a figure label (figure_labels.yml) writes a variant that term_variants.yml lists
  instead of the glossary's term, puts a space between two Chinese characters (also where a glued value meets
  the text, when the executed pages' glued values are at hand: `read_glue`, `glued_space_problems`), or keeps
  English words in the `\text{}` of display math;
- chapter: a chapter's catalog (every `NN_*.po`, however many chapters there are) lacks a standard heading or
  translates it otherwise than all chapters do (`CHAPTER_HEADINGS`), or has no message that maps the English
  notebook's exercises with the fixed sentence (`NOTEBOOK_MAP`).

Run by `make i18n-check` through book/_ext/i18n_tool.py; tests in tests/test_i18n.py.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml
from babel.messages.pofile import read_po

ROLE = re.compile(r"\{([A-Za-z][\w:.+-]*)\}(`+)(.+?)\2")  # {glue:text}`x`, {ref}`title <target>`
MATH = re.compile(r"(?<![\\$])\$(?!\$)[^$\n]+?\$")  # $...$ (not $$)
CODE = re.compile(r"(`+)(.+?)\1")  # `code`, ``code``
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"): the target
AUTOLINK = re.compile(r"<((?:https?|mailto|ftp):[^>\s]+)>")  # <https://...>
FOOTNOTE = re.compile(r"\[\^([^\]\s]+)\]")  # [^1]
VARIANTS = Path(__file__).resolve().parents[1] / "locale" / "zh_CN" / "term_variants.yml"
CJK = re.compile(r"[\u4e00-\u9fff]")
CJK_SPACE = re.compile(r"[\u4e00-\u9fff] +[\u4e00-\u9fff]")  # "它的 首" (Chinese sets no spaces between words)
TEXT = re.compile(r"\\text\{([^{}]*)\}")  # \text{step time}
GLUE_ROLE = re.compile(r"\{glue(?::(?:text|md))?\}`([^`:]+)(?::[^`]*)?`")  # {glue:text}`key:.1f`, {glue:md}`key`
CHAPTER_PO = re.compile(r"(?:^|/)\d\d_[^/]+\.po$")  # book/10_modern_caches.po: every chapter, whatever its number
# The headings every chapter has, and the one translation all chapters give them.
CHAPTER_HEADINGS = {"Learning objectives": "学习目标", "After this chapter you can:": "学完本章，你将能够：",
                    "In the notebook": "在笔记本中", "Key takeaways": "要点回顾", "Further reading": "延伸阅读"}
# How every chapter's "In the notebook" paragraph introduces the English notebook's exercises (each quoted with
# its English heading; tests/test_i18n.py checks the quotes against the notebook).
NOTEBOOK_MAP = "笔记本本身（说明、测试与报错信息）保持英文；其中的练习依次是："
MATH_WORDS = {"FLOPs", "hash"}  # words that stay English in a formula of either edition


@dataclass(frozen=True)
class Problem:
    catalog: str  # e.g. book/03_memory.po
    kind: str  # untranslated | fuzzy | stale | markup | terms | chapter
    source: str  # the English message
    detail: str = ""

    def __str__(self) -> str:
        text = " ".join(self.source.split())
        text = text if len(text) <= 100 else text[:97] + "..."
        return f"{self.catalog}: {self.kind}: {text!r}" + (f" ({self.detail})" if self.detail else "")


def role_key(name: str, body: str) -> str:
    """What a role must keep: its name and target. The target is what `<...>` closes the body with,
    or else the whole body (then the title is the target itself and may not change)."""
    m = re.fullmatch(r"(?s)(.*?)\s*<([^<>]+)>", body)
    return f"{{{name}}}->{m.group(2) if m else body}"


def markup(text: str) -> Counter:
    """The pieces of `text` a translation has to carry over unchanged (as a multiset: order may change)."""
    out: Counter = Counter()
    rest = text
    for m in ROLE.finditer(rest):
        out[role_key(m.group(1), m.group(3))] += 1
    rest = ROLE.sub(" ", rest)
    for m in CODE.finditer(rest):
        out["code:" + m.group(2)] += 1
    rest = CODE.sub(" ", rest)
    for m in MATH.finditer(rest):
        out["math:" + m.group(0)] += 1
    rest = MATH.sub(" ", rest)
    for pattern, tag in ((LINK, "link:"), (AUTOLINK, "link:"), (FOOTNOTE, "footnote:")):
        for m in pattern.finditer(rest):
            out[tag + m.group(1)] += 1
    return out


def markup_difference(source: str, translation: str) -> str:
    """'' when the markup agrees, else what is missing from / extra in the translation."""
    a, b = markup(source), markup(translation)
    if a == b:
        return ""
    parts = []
    if a - b:
        parts.append("missing or altered: " + ", ".join(sorted(a - b)))
    if b - a:
        parts.append("not in the source: " + ", ".join(sorted(b - a)))
    return "; ".join(parts)


def load_variants(path: Path = VARIANTS) -> list[dict]:
    """The entries of term_variants.yml, each with its `variant` compiled (none when the file is missing)."""
    entries = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else []
    return [{**e, "re": re.compile(e["variant"])} for e in entries or []]


def term_problems(text: str, where: str, variants: list[dict]) -> list[str]:
    """What is wrong with the words of one Chinese `text` (a message if `where` is "messages", else a figure
    label): listed variants, a space between two Chinese characters, English `\\text{}` words in display math."""
    out = []
    for v in variants:
        m = v["re"].search(text)
        if m and v.get("in", where) == where:
            out.append(f"writes {m.group(0)!r}: use {v['use']}")
    out += [f"space between Chinese characters: {m.group(0)!r}" for m in CJK_SPACE.finditer(text)]
    if where == "messages":  # inline $...$ is markup and stays as in the English source; display math is not
        english = {m.group(0) for m in TEXT.finditer(MATH.sub(" ", text)) if _english(m.group(1))}
        if english:
            out.append(f"display math keeps English words: {', '.join(sorted(english))}")
    return out


def _english(words: str) -> bool:
    """True when `words` (a `\\text{}` of math) are English: no Chinese, a word of two or more letters with a
    lowercase one (FLOPs and hash stay as they are)."""
    return not CJK.search(words) and any(len(w) > 1 and re.search("[a-z]", w) and w not in MATH_WORDS
                                         for w in re.findall(r"[A-Za-z]+", words))


def read_glue(glue_json: Path) -> dict[str, str]:
    """{key: text} of a page's glued values, from the `<page>.glue.json` that myst-nb writes next to the executed
    notebook (_build/jupyter_execute/book): what `{glue:text}` shows (a string's repr without its quotes)."""
    import ast
    import json

    out = {}
    for key, output in json.loads(glue_json.read_text(encoding="utf-8")).items():
        text = output.get("data", {}).get("text/markdown") or output.get("data", {}).get("text/plain", "")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out[key] = value if isinstance(value, str) else text
    return out


def with_glued_values(text: str, glue: dict[str, str]) -> str:
    """A Chinese message as its page shows it: each glue role replaced by its value, the Chinese twin
    (`key_zh`) where there is one, as the Chinese build shows it; roles of unknown keys are left as they are."""
    def value(m: re.Match) -> str:
        key = m.group(1)
        return glue.get(key + "_zh", glue.get(key, m.group(0)))
    return GLUE_ROLE.sub(value, text)


def glued_space_problems(text: str, glue: dict[str, str]) -> list[str]:
    """Spaces between two Chinese characters that appear only once the glued values are in place, e.g.
    "并且 {glue:md}`verdict`" where the verdict's Chinese twin starts with 在."""
    before = Counter(m.group(0) for m in CJK_SPACE.finditer(text))
    after = Counter(m.group(0) for m in CJK_SPACE.finditer(with_glued_values(text, glue)))
    return [f"space between Chinese characters where a glued value meets the text: {k!r}"
            for k in sorted(after - before)]


def chapter_problems(name: str, entries: dict) -> list[Problem]:
    """What a chapter's catalog (`name` matches CHAPTER_PO) must have: the standard headings, translated as in
    every chapter, and the sentence that maps the notebook's exercises."""
    problems = []
    for heading, zh in CHAPTER_HEADINGS.items():
        m = entries.get(heading)
        if m is None:
            problems.append(Problem(name, "chapter", heading, "every chapter has this heading"))
        elif _text(m.string).strip() and _text(m.string) != zh:
            problems.append(Problem(name, "chapter", heading, f"write {zh!r}, as every chapter does"))
    if not any(NOTEBOOK_MAP in _text(m.string) for m in entries.values()):
        problems.append(Problem(name, "chapter", "In the notebook",
                                f"no message maps the notebook's exercises: write {NOTEBOOK_MAP!r} and quote each "
                                "exercise's English heading beside its translation, as chapters 1-9 do"))
    return problems


def check_labels(path: Path, variants: list[dict]) -> list[Problem]:
    """The Chinese figure labels' words (figure_labels.yml: "English": "中文")."""
    labels = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return [Problem(path.name, "terms", en, detail) for en, zh in (labels or {}).items()
            for detail in term_problems(zh, "labels", variants)]


def _text(value) -> str:
    return value if isinstance(value, str) else (value[0] if value else "")


def read_catalog(path: Path):
    with open(path, "rb") as f:
        return read_po(f)


def check_catalog(pot: Path | None, po: Path | None, name: str, variants: list[dict] | None = None,
                  glue: dict[str, str] | None = None) -> list[Problem]:
    """Problems of one catalog `po` against its template `pot` (either may be None: missing); `glue`, the page's
    glued values where the executed pages are at hand, lets the check see where a value meets the text."""
    variants = load_variants() if variants is None else variants
    sources = [_text(m.id) for m in read_catalog(pot) if m.id] if pot else []
    entries = {_text(m.id): m for m in read_catalog(po) if m.id} if po else {}
    problems = []
    for src in sources:
        m = entries.get(src)
        dst = _text(m.string) if m is not None else ""
        if m is None:
            problems.append(Problem(name, "untranslated", src, "not in the catalog: run `make i18n-update`"))
        elif not dst.strip():
            problems.append(Problem(name, "untranslated", src))
        elif m.fuzzy:
            problems.append(Problem(name, "fuzzy", src, "check the translation, then remove the fuzzy flag"))
    wanted = set(sources)
    for src, m in entries.items():
        dst = _text(m.string)
        if src not in wanted:
            if dst.strip():
                problems.append(Problem(name, "stale", src, "no longer in the English sources: run "
                                        "`make i18n-update`"))
            continue
        if dst.strip():
            diff = markup_difference(src, dst)
            if diff:
                problems.append(Problem(name, "markup", src, diff))
            problems += [Problem(name, "terms", src, d) for d in term_problems(dst, "messages", variants)]
            if glue:
                problems += [Problem(name, "terms", src, d) for d in glued_space_problems(dst, glue)]
    if CHAPTER_PO.search(name):
        problems += chapter_problems(name, entries)
    return problems


def check_tree(pot_dir: Path, po_dir: Path, glue_dir: Path | None = None) -> list[Problem]:
    """Every template under `pot_dir` against the catalog of the same relative path under `po_dir`; with
    `glue_dir` (the executed pages' `<page>.glue.json`, _build/jupyter_execute/book) the glued values too."""
    pots = {p.relative_to(pot_dir).with_suffix(".po").as_posix(): p for p in sorted(pot_dir.rglob("*.pot"))}
    pos = {p.relative_to(po_dir).as_posix(): p for p in sorted(po_dir.rglob("*.po"))} if po_dir.is_dir() else {}
    variants = load_variants()
    problems = []
    for name in sorted(set(pots) | set(pos)):
        glue_json = glue_dir / f"{Path(name).stem}.glue.json" if glue_dir else None
        glue = read_glue(glue_json) if glue_json and glue_json.is_file() else None
        problems += check_catalog(pots.get(name), pos.get(name), name, variants, glue)
    return problems + check_labels(po_dir.parent / "figure_labels.yml", variants)


def report(problems: list[Problem]) -> str:
    if not problems:
        return "i18n check: every message is translated and keeps its markup."
    counts = Counter(p.kind for p in problems)
    lines = [str(p) for p in problems]
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    lines.append(f"i18n check failed: {summary}. Translate these messages in book/locale/zh_CN/LC_MESSAGES/ "
                 "(README: 'Updating the Chinese edition').")
    if counts["terms"]:
        lines.append("terms: write the glossary's term (book/glossary.md); book/locale/zh_CN/term_variants.yml "
                     "lists the variants the check refuses.")
    if counts["chapter"]:
        lines.append("chapter: every chapter's catalog has the standard headings, translated as in the others "
                     "(CHAPTER_HEADINGS in book/_ext/i18n_check.py), and maps its notebook's exercises.")
    return "\n".join(lines)
