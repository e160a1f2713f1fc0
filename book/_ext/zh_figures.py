"""Glue a matplotlib figure twice: as drawn (English) and with its labels in Chinese (`<name>_zh`).

The pages execute once and both editions show the same outputs; only the figures' words differ. A page's
figure cell ends with `glue_fig("fig_x", fig)` (book/_ext/page_helpers.py: `glue_figure`, then close the figure)
instead of `glue("fig_x", fig, display=False)`. `glue_figure` glues the English figure under `fig_x`, swaps
every text of the figure (title, axis labels, tick labels, legend, annotations) for its Chinese label from
book/locale/zh_CN/figure_labels.yml and glues that under `fig_x_zh`.
The Chinese build (book/_ext/lang_switch.py) shows `fig_x_zh` wherever a page says `{glue:figure} fig_x`.

A label that has English words and no entry in the YAML file stops the page with a list of what to add, so a
new English label cannot slip into the Chinese edition. Numbers in a label may vary from run to run (measured
values): an entry may hold `{}` for each number, e.g. `"batch {}": "批大小 {}"`. Words needing no translation
(acronyms such as GQA, units such as MiB, dtypes such as fp16, anything with a digit) are left as they are.
Chinese needs a CJK font: Noto Sans CJK from Debian's fonts-noto-cjk where it is installed, else the Noto Sans SC
that `make js` fetches (pinned in book/_ext/js.lock.toml, see book/_ext/offline_js.py).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

import yaml

if __package__:  # pages import this module as _ext.zh_figures, the tests as zh_figures
    from . import offline_js
else:
    import offline_js

HERE = Path(__file__).resolve().parent
LABELS = HERE.parent / "locale" / "zh_CN" / "figure_labels.yml"
UNITS = {"tok", "ms", "us", "ns", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB", "log"}
MATH = re.compile(r"\$[^$]*\$")
NUMBER = r"([-+\u2212]?[\d][\d.,]*)"


class MissingFigureLabel(KeyError):
    """A figure label has English words and no Chinese entry in figure_labels.yml."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0])


def needs_translation(text: str) -> bool:
    """True when `text` has an English word: two or more letters, a lowercase one, no digit, not a unit.
    Math ($...$), acronyms (GQA, KV, LRU), dtypes (fp16), names with digits (Llama-2-7B), identifiers
    (n_rep, StaticCache) and numbers read the same in both editions."""
    for token in re.split(r"[\s()\[\]{},;:=/\"'+*<>|~]+", MATH.sub(" ", text)):
        word = token.strip(".!?-%")
        if (len(re.sub("[^A-Za-z]", "", word)) >= 2 and re.search("[a-z]", word) and not re.search(r"\d", word)
                and "_" not in word and not re.search("[a-z][A-Z]", word) and word not in UNITS):
            return True
    return False


@lru_cache(1)
def load_labels(path: Path = LABELS) -> dict[str, str]:
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    return {str(k): str(v) for k, v in (data or {}).items()}


def translate(text: str, labels: dict[str, str]) -> str | None:
    """The Chinese label for `text`, or None. Exact entries first, then entries with `{}` number slots."""
    if text in labels:
        return labels[text]
    for key, value in labels.items():
        if "{}" not in key:
            continue
        pattern = "^" + NUMBER.join(re.escape(part) for part in key.split("{}")) + "$"
        m = re.match(pattern, text)
        if m:
            parts = value.split("{}")
            return parts[0] + "".join(g + p for g, p in zip(m.groups(), parts[1:]))
    return None


@lru_cache(1)
def cjk_family() -> str:
    """Register the CJK font with matplotlib (a .ttc is not always in its font cache, a fetched one never) and
    name it: the system's Noto Sans CJK, else the Noto Sans SC that `make js` fetched."""
    from matplotlib import font_manager

    found = offline_js.cjk_fonts()
    if not found:
        raise RuntimeError("Chinese figure labels need a CJK font and none is installed or fetched: run `make js` "
                           "(it fetches the pinned Noto Sans SC), or apt-get install -y fonts-noto-cjk")
    for p in found:
        font_manager.fontManager.addfont(str(p))
    return font_manager.FontProperties(fname=str(found[0])).get_name()


def chinese_texts(fig, labels: dict[str, str] | None = None) -> list[tuple[object, str, str]]:
    """(artist, English, Chinese) for every text of `fig` that changes; raises MissingFigureLabel."""
    from matplotlib.text import Text

    labels = load_labels() if labels is None else labels
    fig.canvas.draw()  # tick labels get their text when the figure is drawn
    changes, missing = [], []
    for t in fig.findobj(Text):
        text = t.get_text()
        if not text.strip():
            continue
        zh = translate(text, labels)
        if zh is None and needs_translation(text):
            missing.append(text)
        elif zh is not None and zh != text:
            changes.append((t, text, zh))
    if missing and os.environ.get("ZH_FIGURE_LABELS_COLLECT"):  # gather all at once (maintainers)
        with open(os.environ["ZH_FIGURE_LABELS_COLLECT"], "a", encoding="utf-8") as f:
            f.writelines(json.dumps(m, ensure_ascii=False) + "\n" for m in dict.fromkeys(missing))
    elif missing:
        rel = LABELS.relative_to(HERE.parents[1])
        raise MissingFigureLabel(f"figure labels with no Chinese entry in {rel}: "
                                 + "; ".join(repr(m) for m in dict.fromkeys(missing))
                                 + ' (add `"English": "中文"` lines; `{}` stands for a number)')
    return changes


def fixed_tick_labels(fig) -> list:
    """The containers of fixed tick labels (`set_xticks(ticks, labels)`): a FixedFormatter's list, or the
    {tick: label} dict behind the FuncFormatter that matplotlib 3.10 makes. Drawing the figure writes these
    labels into the tick texts again, so they are swapped there too."""
    import functools

    from matplotlib.ticker import FixedFormatter, FuncFormatter

    found = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for fmt in (axis.get_major_formatter(), axis.get_minor_formatter()):
                if isinstance(fmt, FixedFormatter):
                    found.append(fmt.seq)
                elif (isinstance(fmt, FuncFormatter) and isinstance(fmt.func, functools.partial)
                      and fmt.func.args and isinstance(fmt.func.args[0], dict)):
                    found.append(fmt.func.args[0])
    return found


def _swap(container, mapping: dict[str, str]) -> None:
    keys = container.keys() if isinstance(container, dict) else range(len(container))
    for k in keys:
        container[k] = mapping.get(str(container[k]), container[k])


def glue_figure(name: str, fig, labels: dict[str, str] | None = None) -> None:
    """Glue `fig` as `name` (English) and, with its labels in Chinese, as `name + "_zh"`."""
    from myst_nb import glue

    changes = chinese_texts(fig, labels)  # first: a missing label stops before anything is glued
    glue(name, fig, display=False)
    ticks = [(c, c.copy()) for c in fixed_tick_labels(fig)]
    for container, _ in ticks:
        _swap(container, {en: zh for _, en, zh in changes})
    family = ["DejaVu Sans", cjk_family()]  # Latin glyphs as in English, CJK ones from Noto
    # A label with math is drawn by mathtext, whose plain-text parts take only the FIRST family:
    # Noto first there (it has Latin glyphs too), else every Chinese character is a dummy box.
    math_family = family[::-1]
    old_families = []
    for t, _, zh in changes:
        old_families.append(t.get_fontfamily())
        t.set_text(zh)
        t.set_fontfamily(math_family if "$" in zh else family)
    glue(name + "_zh", fig, display=False)
    for (t, en, _), fam in zip(changes, old_families):  # leave the figure as the page drew it
        t.set_text(en)
        t.set_fontfamily(fam)
    for container, original in ticks:
        container.clear()
        container.update(original) if isinstance(container, dict) else container.extend(original)
