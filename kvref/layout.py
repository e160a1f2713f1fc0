"""Which way round the linear weights lie in memory, (out, in) or (in, out): measured, not assumed.

A decode step at batch 1 reads every weight once. ``nn.Linear`` stores W as (out, in) and computes
``x @ W.T``; GPT-2's ``Conv1D`` (and so HF's GPT-2) stores it as (in, out) and computes ``x @ W``.
The same bytes, read in a different order by the same BLAS, can stream at different speeds, and which
order wins depends on the CPU and on the number of rows (docs/benchmarks.md, issue 28). So kvref times
both on the model's own weights, all of them in turn as in a real step (a working set far larger than
one matrix, which alone may fit in the cache and rank the layouts the other way), and keeps the faster.

Either way every weight keeps nn.Linear's (out, in) *shape*: the (in, out) layout stores the transposed
matrix contiguously and exposes it as a transposed view. ``F.linear``, ``state_dict`` and every test see
the same values; only the memory order that the matrix product reads changes.

    set_layout(model)              # "auto": time both (once per process, device and shape set), keep the faster
    set_layout(model, "in_out")    # or force one; KVREF_LAYOUT=out_in|in_out|auto does the same for load_hf
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn as nn

LAYOUTS = ("out_in", "in_out")
_chosen: dict[tuple, tuple[str, dict[str, float]]] = {}  # (device, dtype, shapes, rows) -> (layout, seconds)


def linear_layers(model: nn.Module) -> list[nn.Linear]:
    """Every nn.Linear of the model once (a tied lm_head shares the embedding's weight)."""
    seen, out = set(), []
    for m in model.modules():
        if isinstance(m, nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            out.append(m)
    return out


def layout_of(model: nn.Module) -> str:
    """"in_out" if the weights are stored transposed, else "out_in" (nn.Linear's own)."""
    layers = linear_layers(model)
    transposed = bool(layers) and not layers[0].weight.is_contiguous() and layers[0].weight.t().is_contiguous()
    return "in_out" if transposed else "out_in"


@torch.no_grad()
def relayout(model: nn.Module, layout: str) -> None:
    """Store every linear weight as ``layout``, in place, one matrix at a time (same shape, same values)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    for m in linear_layers(model):
        w = m.weight.data  # (out, in) as seen by F.linear, whatever the storage
        m.weight.data = w.contiguous() if layout == "out_in" else w.t().contiguous().t()


@torch.inference_mode()
def _one_pass(layers: list[nn.Linear], xs: dict[int, torch.Tensor], device: torch.device) -> float:
    """Seconds to run every layer once on ``rows`` new tokens: the matrix part of one decode step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for m in layers:
        m(xs[m.in_features])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def time_layouts(model: nn.Module, rows: int = 1, repeats: int = 3) -> dict[str, float]:
    """Median seconds of one pass over all linear layers, per layout; the runs alternate A B B A A B ...

    The model ends in the layout it had. Each weight is transposed once per switch (about a second
    for GPT-2-124M on one core), so the order snakes to switch once per repeat.
    """
    layers, start = linear_layers(model), layout_of(model)
    w = layers[0].weight
    xs = {m.in_features: torch.randn(rows, m.in_features, dtype=w.dtype, device=w.device) for m in layers}
    times: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    order = [start, *(k for k in LAYOUTS if k != start)]
    for r in range(repeats):
        for k in order if r % 2 == 0 else order[::-1]:
            relayout(model, k)
            _one_pass(layers, xs, w.device)  # first touch after the copy
            times[k].append(statistics.median(_one_pass(layers, xs, w.device) for _ in range(3)))
    relayout(model, start)
    return {k: statistics.median(t) for k, t in times.items()}


def choose_layout(model: nn.Module, rows: int = 1) -> tuple[str, dict[str, float]]:
    """The faster layout for ``rows`` new tokens per step, and the seconds measured; cached per process."""
    layers = linear_layers(model)
    w = layers[0].weight
    key = (str(w.device), w.dtype, tuple(tuple(m.weight.shape) for m in layers), rows)
    if key not in _chosen:
        times = time_layouts(model, rows)
        _chosen[key] = (min(times, key=times.get), times)
    return _chosen[key]


def set_layout(model: nn.Module, layout: str | None = None, rows: int = 1) -> str:
    """Store the weights as ``layout`` ("out_in", "in_out" or "auto"; None: $KVREF_LAYOUT, else "auto").

    "auto" times both for ``rows`` tokens per step (``choose_layout``). Returns the layout now in use.
    """
    layout = layout or os.environ.get("KVREF_LAYOUT") or "auto"
    if layout not in (*LAYOUTS, "auto"):
        raise ValueError(f"layout (or $KVREF_LAYOUT) must be 'auto', 'out_in' or 'in_out'; got {layout!r}")
    if not linear_layers(model):
        return "out_in"
    if layout == "auto":
        layout = choose_layout(model, rows)[0]
    relayout(model, layout)
    return layout
