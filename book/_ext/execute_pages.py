"""Execute the book's pages a few at a time, into the jupyter-cache that `jupyter-book build` then reads.

    python book/_ext/execute_pages.py --cache DIR [--jobs N] [--timeout S] [PAGE.md ...]   (run by `make book`)

Jupyter Book 1.x executes a page while Sphinx reads it, one page after the other: on a 2-core machine one core
waits while the other runs a kernel. This runs the pages' kernels in parallel first (N at a time, default: the
number of CPUs), each page in its own fresh kernel in the page's folder, exactly as the build would (myst-nb's
reader, jupyter-cache's executor, the same time limit, errors not allowed), and stores every page that ran to the
end in the cache. The build then finds each page in the cache (its log says "Using cached notebook") and executes
nothing. A page that fails here is not stored: the build executes it again and reports the error as usual, so
this script only ever saves time. It prints one line per page.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pdf import toc_pages  # noqa: E402  (the pages in book order)


def executable_pages(root: Path = ROOT) -> list[Path]:
    """The pages of the table of contents that the build executes: MyST notebooks (a jupytext header with a
    kernelspec), with or without code cells."""
    from myst_nb.core.read import is_myst_markdown_notebook

    files = [root / f"{page}.md" for page in toc_pages(root / "_toc.yml")]
    return [f for f in files if f.is_file() and is_myst_markdown_notebook(f.read_text(encoding="utf-8"))]


def config_timeout(config: Path = ROOT / "_config.yml") -> int:
    """The time limit per cell that the build uses: execute.timeout in _config.yml."""
    import yaml  # PyYAML comes with jupyter-book

    return int(yaml.safe_load(config.read_text(encoding="utf-8"))["execute"]["timeout"])


def execute(path: Path, timeout: int) -> tuple[Path, str | None, float, str | None]:
    """Run one page in a fresh kernel: (page, the executed notebook as JSON text or None, seconds, why it failed
    or None)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution
    from myst_nb.core.read import read_myst_markdown_notebook

    nb = read_myst_markdown_notebook(path.read_text(encoding="utf-8"), add_source_map=True, path=path)
    result = single_nb_execution(nb, cwd=str(path.parent), allow_errors=False, timeout=timeout, meta_override=True)
    if result.err is not None:
        return path, None, result.time, f"{type(result.err).__name__}: {str(result.err).strip()[-300:]}"
    return path, nbformat.writes(nb), result.time, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True, help="the jupyter-cache folder the build reads")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="pages executed at the same time")
    ap.add_argument("--timeout", type=int, default=config_timeout(),
                    help="seconds a cell may run (default: _config.yml's execute.timeout, as the build)")
    ap.add_argument("pages", nargs="*", type=Path, help="only these pages (default: every notebook page of _toc.yml)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1; got {args.jobs}")
    pages = [p.resolve() for p in args.pages] or executable_pages()
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        ap.error(f"no such page: {', '.join(missing)}")
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(args.cache))
    t0 = time.perf_counter()
    # spawn: each worker starts clean (no forked copy of this process's ZMQ or sqlite state)
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(pages)) or 1, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(execute, page, args.timeout) for page in pages]
        for done in as_completed(futures):
            page, text, seconds, error = done.result()
            name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
            if error is not None:
                print(f"execute_pages: {name} failed after {seconds:.1f} s (the build runs it again and reports it): "
                      f"{error}", flush=True)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(nbformat.reads(text, as_version=4), str(page),
                                                      data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            print(f"execute_pages: {name} executed in {seconds:.1f} s", flush=True)
    print(f"execute_pages: {len(pages)} pages, {args.jobs} at a time, in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
