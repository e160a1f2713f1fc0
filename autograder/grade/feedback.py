"""The feedback page a student gets back: the graded notebook without the hidden tests.

``redact`` puts the release's text back into every locked cell (so neither hidden tests nor mark
schemes leak) and trims huge outputs; ``feedback_html`` renders it with each graded cell's score,
self-contained (nothing loaded from the network).
"""

from __future__ import annotations

import re

import nbformat

from autograder.shared import notebooks

MAX_FEEDBACK_OUTPUT = 20_000  # characters of one output shown in a feedback page
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CELL_FRAME = re.compile(r"Cell In\[\d*\], line (\d+)")


def failing_line(traceback: list[str]) -> int | None:
    """The line of the cell itself where an error was raised: the first ``Cell In[n], line L``
    frame of IPython's traceback is the cell that ran (later ones are functions it called)."""
    for entry in traceback:
        m = CELL_FRAME.search(ANSI.sub("", entry))
        if m:
            return int(m[1])
    return None


def hidden_lines(source: str) -> set[int]:
    """1-based numbers of the lines of ``source`` inside hidden-test regions (markers included)."""
    out, inside = set(), False
    for i, line in enumerate(source.split("\n"), start=1):
        if notebooks.HIDDEN[0] in line:
            inside = True
        if inside:
            out.add(i)
        if notebooks.HIDDEN[1] in line:
            inside = False
    return out


def error_summary(out, full_source: str, hidden: bool) -> list[str]:
    """What a student may see of an error in a test cell: a visible assert's message and line,
    or only the message of a hidden one."""
    head = f"{out.ename}: {out.evalue}"
    line = failing_line(out.traceback)
    lines = full_source.split("\n")
    if line is not None and line not in hidden_lines(full_source) and 0 < line <= len(lines):
        return [head, f"(a visible test failed at line {line}: {lines[line - 1].strip()})"]
    if hidden:
        return [head + "  (a hidden test failed; its code is not shown)"]
    return [head]


def redact(graded: nbformat.NotebookNode, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The graded notebook as the student may see it: every locked cell shows the release's text
    (hidden tests and mark schemes gone), the traceback of a cell that holds hidden tests is
    reduced to its last line, long outputs are cut."""
    released = notebooks.cells_by_id(release)
    for cell in graded.cells:
        gid = notebooks.grade_id(cell)
        hidden, full = False, cell.source
        if gid in released and (notebooks.meta(released[gid]).get("locked") or notebooks.is_test(released[gid])):
            hidden = cell.source != released[gid].source
            cell.source = released[gid].source
        elif not gid:
            for markers in (notebooks.HIDDEN, notebooks.MARK_SCHEME):
                inside, outside, found = notebooks.split_regions(cell.source, markers)
                if found:
                    hidden, cell.source = True, "\n".join(outside)
        for out in cell.get("outputs", []):
            if out.output_type == "error" and hidden:
                out.traceback = error_summary(out, full, hidden)
            elif out.output_type == "error" and len(out.traceback) > 60:
                out.traceback = out.traceback[:10] + ["..."] + out.traceback[-20:]
            elif out.output_type == "stream" and len(out.text) > MAX_FEEDBACK_OUTPUT:
                out.text = out.text[:MAX_FEEDBACK_OUTPUT] + f"\n... [{len(out.text) - MAX_FEEDBACK_OUTPUT} more characters cut]"
            elif out.output_type in ("display_data", "execute_result"):
                for mime, value in list(out.get("data", {}).items()):
                    if isinstance(value, str) and len(value) > MAX_FEEDBACK_OUTPUT * 20:
                        out.data[mime] = "[output too large for the feedback page]" if mime.startswith("text") else ""
                        if not mime.startswith("text"):
                            del out.data[mime]
    return graded


_EXPORTER = None  # one per process: its compiled templates are reused by every page

# The classic page, with one change: a code cell's highlighted source is not passed through the
# HTML sanitiser again. Pygments escapes every character of the source (& < > " '), so that pass
# only costs time (about half a page's rendering); markdown and HTML outputs, which can carry
# HTML, are still sanitised by the template as before.
PAGE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{% block input %}
<div class="inner_cell">
    <div class="input_area">
{{ cell.source | highlight_code(metadata=cell.metadata) }}
    </div>
</div>
{%- endblock input %}
"""
IMG_WITHOUT_ALT = re.compile(r"<img(?![^>]*\balt=)")


def exporter():
    """nbconvert's HTML exporter (classic template, no prompts), made once per process. Its
    page is rendered by the template alone: nbconvert's second pass over the whole page with
    BeautifulSoup (for images without alt text, and the lab template's tab stops) is replaced
    by ``IMG_WITHOUT_ALT``, a regular expression."""
    global _EXPORTER
    if _EXPORTER is None:
        from nbconvert import HTMLExporter
        from nbconvert.exporters.templateexporter import TemplateExporter
        from nbconvert.filters.highlight import Highlight2HTML
        from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

        class PageExporter(HTMLExporter):
            def from_notebook_node(self, nb, resources=None, **kw):
                info = nb.metadata.get("language_info", {})
                lexer = info.get("pygments_lexer", info.get("name", None))
                self.register_filter("highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self))
                resources = self._init_resources(resources)
                self.register_filter("filter_data_type", WidgetsDataTypeFilter(
                    notebook_metadata=self._nb_metadata, parent=self, resources=resources))
                return TemplateExporter.from_notebook_node(self, nb, resources, **kw)

        _EXPORTER = PageExporter(template_name="classic")
        _EXPORTER.exclude_input_prompt = _EXPORTER.exclude_output_prompt = True
        _EXPORTER.raw_template = PAGE_TEMPLATE
    return _EXPORTER


def feedback_html(nb: nbformat.NotebookNode, cells: dict[str, tuple[float, float]], title: str) -> str:
    """A self-contained HTML page (no CDN): the notebook with each graded cell's score."""
    for cell in nb.cells:
        gid = notebooks.grade_id(cell)
        if gid in cells:
            s, m = cells[gid]
            cell.source = f"# [{gid}] score: {s:g} / {m:g}\n" + cell.source if cell.cell_type == "code" else \
                f"**[{gid}] score: {s:g} / {m:g}**\n\n" + cell.source
    body, _ = exporter().from_notebook_node(nb, resources={"metadata": {"name": title}})
    body = re.sub(r'<script[^>]*src="https?://[^"]*"[^>]*>\s*</script>', "", body)  # nothing from the network
    body = IMG_WITHOUT_ALT.sub('<img alt="No description has been provided for this image"', body)
    total = sum(s for s, _ in cells.values()), sum(m for _, m in cells.values())
    return body.replace("<body>", f"<body><h1>{title}: {total[0]:g} / {total[1]:g}</h1>", 1)


def warm_up() -> None:
    """Render a small page once, so that the templates, the syntax highlighter's and the HTML
    sanitiser's compiled patterns exist before the warm job server forks its jobs (each job
    would otherwise compile them again, about half a second)."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    error = new_output("error", ename="AssertionError", evalue="x", traceback=["\x1b[0;31mAssertionError\x1b[0m: x"])
    nb = new_notebook(cells=[new_markdown_cell("# A *page* with $x^2$ and `code`"),
                             new_code_cell("import torch\nassert 1 + 1 == 2, 'ok'  # a comment",
                                           outputs=[new_output("stream", name="stdout", text="1\n"), error])],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                "language_info": {"name": "python", "pygments_lexer": "ipython3"}})
    feedback_html(nb, {}, "warm-up")
