"""Small fixes to the HTML pages that Jupyter Book 1.0.4 / Sphinx 7.4 write (no content changes).

- Each inline script that an extension registers after the builder starts (sphinx-togglebutton's
  `var togglebuttonSelector = ...`, sphinx-thebe's `const THEBE_JS_URL = ...`) is written twice: Sphinx 7.4
  re-adds the registry's scripts with filename '' next to the builder's copy with filename None, and the two
  do not compare equal. The second `const` throws "Identifier 'THEBE_JS_URL' has already been declared" in
  every page. Drop exact duplicates before the page is rendered.
- static/print.css (ours, served from _static/ by offline_js): how a page prints, and so how `make pdf` looks
  (text column only, code wrapped, widgets hidden in favour of the static figure beside each).
- The Chinese search index: Sphinx 7.4's `SearchChinese.stem` (sphinx/search/zh.py) asks `word in self.latin_terms`
  of a list that every page's text extends, once per word it indexes, so the Chinese build spent 7 of its 34 s
  there. `fast_chinese_stem` gives the same answer from a set kept in step with that list.
- What a code cell prints is not prose to translate: the gettext builder would otherwise extract the tables and
  sentences a cell displays as Markdown (nb_render_markdown_format: myst), so every re-measured number would
  become a new untranslated message of the Chinese edition. Both editions show the same executed outputs.
"""

from __future__ import annotations

import os

from docutils import nodes
from sphinx.transforms import SphinxTransform


class OutputsAreNotTranslated(SphinxTransform):
    """Mark every text node inside a cell's output as untranslatable (before Sphinx's Locale transform, 20)."""

    default_priority = 10

    def apply(self, **kwargs) -> None:
        for box in self.document.findall(nodes.container):
            if "cell_output" not in box.get("classes", []):
                continue
            for node in box.findall(nodes.TextElement):
                node["translatable"] = False


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen, kept = set(), []
    for js in scripts:
        attrs = getattr(js, "attributes", {})
        key = (os.fspath(getattr(js, "filename", js) or ""), getattr(js, "priority", None),
               tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key not in seen:
            seen.add(key)
            kept.append(js)
    scripts[:] = kept


def fast_chinese_stem() -> None:
    """Replace SearchChinese.stem by one with the same results that looks words up in a set."""
    from sphinx.search import zh

    if getattr(zh.SearchChinese.stem, "kvref_fast", False):
        return

    def stem(self, word: str) -> str:
        terms = self.latin_terms  # the list split() extends (a class attribute in Sphinx 7.4)
        seen, known = getattr(self, "_kvref_terms", (0, set()))
        if len(terms) < seen:  # shortened or replaced: start again
            seen, known = 0, set()
        known.update(terms[seen:])
        self._kvref_terms = (len(terms), known)
        lower = word.lower()
        stemmed = self.stemmer.stemWord(lower)
        # Sphinx's rule: a Latin term of 3+ letters that stemming would cut below 3 stays whole (acronyms).
        return lower if word in known and len(word) >= 3 and len(stemmed) < 3 else stemmed

    stem.kvref_fast, stem.original = True, zh.SearchChinese.stem
    zh.SearchChinese.stem = stem


def setup(app):
    # Late (priority 900): after the other extensions have added this page's scripts.
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)
    app.add_css_file("print.css", media="print")
    app.add_transform(OutputsAreNotTranslated)
    fast_chinese_stem()
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
