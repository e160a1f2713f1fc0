"""Helpers shared by the book's pages: glue a value in the words of each edition, a figure in both;
label a log axis readably.

Both editions show the outputs of one execution (book/_ext/lang_switch.py): where a glue key `name` has a twin
`name_zh`, the Chinese build shows the twin. So a sentence computed by a page is glued twice, in English under
`name` and in Chinese under `name_zh`, from the same numbers:

    glue_text("hf_runs", n_runs)                                   # a number: the same in both editions
    glue_text("same", "the same", "完全相同")                       # words: one per edition
    glue_text("models", words(names), words(names, "zh"))          # a list in each edition's words

A function that words a result takes the language (`lang="en"` or `"zh"`) and looks its words up in a small
table {"en": ..., "zh": ...}, so its logic (the thresholds, the numbers) exists once. `glue_fig` glues a
matplotlib figure with its Chinese twin (book/_ext/zh_figures.py) and closes it.

A table the reader reads as page text is glued the same way, as Markdown, once per edition, and shown by a
`{glue:md}` directive below its cell (the cell itself displays nothing):

    glue_md("tbl_steps", md_table(header["en"], rows["en"]), md_table(header["zh"], rows["zh"]))

    ```{glue:md} tbl_steps
    :format: myst
    ```
"""

from __future__ import annotations

from .zh_figures import glue_figure  # pages import this module as _ext.page_helpers

# A list in words: (separator, before the last item, an empty list)
LIST_WORDS = {"en": (", ", " and ", "none"), "zh": ("、", " 和 ", "无")}


def glue_text(name: str, en, zh=None) -> None:
    """Glue `en` as `name` (not displayed) and, when `zh` is given, `zh` as `name + "_zh"`."""
    from myst_nb import glue

    glue(name, en, display=False)
    if zh is not None:
        glue(name + "_zh", zh, display=False)


def glue_md(name: str, en: str, zh: str | None = None) -> None:
    """Glue the Markdown `en` as `name` and `zh` as `name + "_zh"` (not displayed: a `{glue:md}` shows it)."""
    from IPython.display import Markdown
    from myst_nb import glue

    glue(name, Markdown(en), display=False)
    if zh is not None:
        glue(name + "_zh", Markdown(zh), display=False)


def md_table(header: list[str], rows: list[list], align: str = "") -> str:
    """A Markdown table: `header` names the columns, each row gives one cell per column (str() of each);
    `align` gives a column's alignment by letter, l, r or c ("lrr": numbers right of a label), default l."""
    if any(len(r) != len(header) for r in rows):
        raise ValueError(f"md_table: every row needs {len(header)} cells (one per column of {header}), "
                         f"got rows of {sorted({len(r) for r in rows})}")
    if len(align) > len(header) or set(align) - set("lrc"):
        raise ValueError(f"md_table: align {align!r} needs one of l, r, c per column ({len(header)} at most)")
    rule = [{"l": "---", "r": "---:", "c": ":---:"}[a] for a in align.ljust(len(header), "l")]
    cells = [header, rule] + [[str(c) for c in r] for r in rows]
    return "\n".join("| " + " | ".join(r) + " |" for r in cells)


def glue_fig(name: str, fig) -> None:
    """Glue `fig` as `name` and, with its labels in Chinese, as `name + "_zh"`; then close it."""
    import matplotlib.pyplot as plt

    glue_figure(name, fig)
    plt.close(fig)


def words(items: list[str], lang: str = "en") -> str:
    """`items` as a list in words: "a, b and c" ("a、b 和 c"); one item as it is; none: "none" ("无")."""
    sep, last, empty = LIST_WORDS[lang]
    if len(items) < 2:
        return items[0] if items else empty
    return sep.join(items[:-1]) + last + items[-1]


def listing(items: list[str], lang: str = "en") -> str:
    """`items` separated as each edition lists them ("a, b" / "a、b"); none: "none" ("无")."""
    sep, _, empty = LIST_WORDS[lang]
    return sep.join(items) or empty


def readable_log_axis(axis) -> None:
    """Label a log axis at 1, 2 and 5 times each power of ten, as plain numbers."""
    from matplotlib import ticker

    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())
