"""Timing helpers the benchmarks share: interleaved repeats, medians with their spread, a markdown table, a
section that reports its own failure instead of ending the run, and the CPU's name for the table's heading."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def interleave(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each run returns seconds; call them round-robin ``repeats`` times; all times per run."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(run())
    return times


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float], scale: float = 1e3, unit: str = "ms") -> str:
    return f"{scale * med(xs):.2f} {unit} ({scale * min(xs):.2f}-{scale * max(xs):.2f})"


def ratio_spread(a: list[float], b: list[float]) -> str:
    """median(a)/median(b), with the range of the per-repeat ratios a_i / b_i (paired, interleaved)."""
    r = [x / y for x, y in zip(a, b)]
    return f"{med(a) / med(b):.2f}x (per-repeat {min(r):.2f}-{max(r):.2f})"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def error_line(e: Exception, limit: int) -> str:
    """The exception's type and the first line of its message, cut at ``limit`` characters."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:limit]}"


def guarded(title: str, section: Callable[[], list[str]]) -> list[str]:
    """A section's markdown lines, or, if it raises, its title and the error (the other sections still run)."""
    try:
        return section()
    except Exception as e:  # e.g. a compiler that fails on this machine: report it, do not lose the rest
        return [f"{title}\n", f"**failed**: {error_line(e, 300)}", ""]


def cpu_name() -> str:
    """The CPU's model name as lscpu prints it (from /proc/cpuinfo; the platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown CPU"
