"""The CJK font Chromium prints and shoots the Chinese pages with, made safe for copying and searching.

Noto's CJK fonts draw a Kangxi radical (U+2F00-U+2FDF) and its ideograph (用 U+7528 and ⽤ U+2F64) with the same
glyph. A PDF maps each glyph back to one character, and Chromium picks the lowest code point: text copied from
(or searched in) the printed Chinese edition then holds radicals where the page has ideographs, so searching the
PDF for 用户 finds nothing. The copies made here drop the radicals' entries from the font's character map (the
page text has none), so each glyph maps back to its ideograph. Chromium sees only these copies (fontconfig
rejects the originals), and nothing else changes: same glyphs, same family names.

    env = dict(os.environ, FONTCONFIG_FILE=str(fontconfig(sources, folder)))
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

RADICALS = (0x2E80, 0x2FDF)  # CJK Radicals Supplement and Kangxi Radicals


def drop_radicals(font) -> int:
    """Remove the radicals' code points from every character map of a fontTools TTFont; return how many."""
    removed = 0
    for table in font["cmap"].tables:
        kept = {c: g for c, g in table.cmap.items() if not RADICALS[0] <= c <= RADICALS[1]}
        removed += len(table.cmap) - len(kept)
        table.cmap = kept
    return removed


def derive(source: Path, target: Path) -> Path:
    """`target`: `source` (.ttf, .otf or a .ttc collection) without the radicals' code points; made once."""
    from fontTools.ttLib import TTCollection, TTFont

    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Only the character maps change: lazy loading and no recalculated bounding boxes leave every other table
    # as raw bytes, copied through (decompiling and recompiling a CJK font's 65,535 CFF glyphs took minutes).
    opts = dict(lazy=True, recalcBBoxes=False, recalcTimestamp=False)
    font = TTCollection(source, **opts) if source.suffix.lower() == ".ttc" else TTFont(source, **opts)
    for face in getattr(font, "fonts", [font]):
        drop_radicals(face)
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".part")  # two processes may derive at once
    os.close(fd)
    font.save(partial)
    os.replace(partial, target)
    return target


def fontconfig(sources: list[Path], folder: Path) -> Path:
    """A fontconfig file for Chromium: the system's set-up, the derived copies of `sources` in `folder`, and the
    `sources` themselves rejected (so the copies are the ones used)."""
    copies = folder / "print"
    for source in sources:
        derive(source, copies / source.name)
    rejects = "".join(f"      <glob>{s}</glob>\n" for s in sources)
    conf = folder / "fonts.conf"
    fd, partial = tempfile.mkstemp(dir=folder, suffix=".part")
    os.close(fd)
    Path(partial).write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
        '  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>\n'
        f"  <dir>{copies}</dir>\n"
        f"  <selectfont>\n    <rejectfont>\n{rejects}    </rejectfont>\n  </selectfont>\n"
        f"  <cachedir>{folder / 'fc-cache'}</cachedir>\n</fontconfig>\n", encoding="utf-8")
    os.replace(partial, conf)
    return conf
