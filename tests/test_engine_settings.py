"""Every engine setting a book page names in code must be listed in book/engines.md.

A chapter that tells a reader to set `--foo` or `foo_bar` in vLLM, SGLang or llama.cpp
sends them to a page of checked settings; this test keeps that page complete. It reads
the prose of every page (code cells left out), takes the code spans that name a setting,
and fails, naming page and span, when engines.md's tables do not list it.
"""
import re
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parent.parent / "book"
ENGINES = BOOK / "engines.md"

# A line about one of these engines makes its snake_case code spans settings.
ENGINE_WORDS = re.compile(r"vLLM|SGLang|llama\.cpp|llama-server", re.I)
# A code span, or a role's target ({glue:text}`x`), matched left to right in pairs.
SPAN_OR_ROLE = re.compile(r"(\{[^}\s]+\})?`([^`\n]+)`")


def spans(line: str) -> list[str]:
    """The plain code spans of a line (role targets left out)."""
    return [m.group(2).strip() for m in SPAN_OR_ROLE.finditer(line) if not m.group(1)]
SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
# snake_case spans in engine lines that are not settings: a model's config keys, a metric
# field, torch dtypes, an engine's internal variable, and kvref's own names.
NOT_SETTINGS = {"kv_lora_rank", "qk_rope_head_dim", "cached_tokens", "float8_e4m3fn",
                "float8_e5m2", "v_trans", "max_running", "token_budget", "plan_memory",
                "size_swa"}


def prose_lines(text: str):
    """The page's lines outside fenced code cells and directives."""
    fence = None
    for line in text.splitlines():
        m = re.match(r"^(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)
                continue
            if line.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield line


def named_settings(text: str) -> set[str]:
    """The engine settings named in code spans of a page's prose."""
    found = set()
    for line in prose_lines(text):
        engine_line = bool(ENGINE_WORDS.search(line))
        for span in spans(line):
            if span.startswith("-") and re.match(r"^--?[a-z]", span):
                found.add(span.split()[0].split("=")[0])
            elif engine_line:
                name = span.split("=")[0].strip()
                if SNAKE.fullmatch(name) and name not in NOT_SETTINGS:
                    found.add(name)
    return found


def listed_settings(text: str) -> set[str]:
    """The code spans in engines.md's table rows: the settings and the values they take."""
    listed = set()
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            listed.update(spans(line))
    return listed


PAGES = sorted(p for p in BOOK.glob("*.md") if p.name != "engines.md")


def test_engines_page_lists_settings():
    listed = listed_settings(ENGINES.read_text())
    assert {"gpu_memory_utilization", "-c", "--mem-fraction-static", "use_cache"} <= listed


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_setting_is_listed(page):
    listed = listed_settings(ENGINES.read_text())
    missing = sorted(named_settings(page.read_text()) - listed)
    assert not missing, (f"{page.name} names engine settings that book/engines.md does not "
                         f"list: {missing}; add a row (name, meaning, default, source)")


def test_an_unlisted_setting_fails():
    """The check itself: a made-up flag and a made-up vLLM option are caught."""
    page = "Set `--kv-made-up 3` and, in vLLM, `made_up_option=2`.\n"
    missing = named_settings(page) - listed_settings(ENGINES.read_text())
    assert missing == {"--kv-made-up", "made_up_option"}
