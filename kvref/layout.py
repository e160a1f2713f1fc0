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
    set_layout(model, "in_out")    # or force one; KVREF_LAYOUT=out_in|in_out|onednn|auto does the same for load_hf

A third choice, "onednn", keeps the storage and gives every ``Linear`` a second copy of its weight that
oneDNN has reordered for its own GEMM kernel (``Linear.pack``). On an AMD EPYC, where MKL's fp32 GEMM
does not take its fastest path, oneDNN's runs the 4-64-row products of batched decode about 2x faster
(docs/benchmarks.md, issue 37). "auto" races it only for more than one row: a one-row step is bound by
reading the weights, which packing cannot read faster, and the copy costs as much memory again.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn as nn

LAYOUTS = ("out_in", "in_out")
PACKED = "onednn"  # storage unchanged + oneDNN's reordered copy of each weight
CHOICES = (*LAYOUTS, PACKED)
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


def can_pack(model: nn.Module) -> bool:
    """Can every linear layer keep a oneDNN copy (kvref's Linear, fp32 on a CPU, oneDNN built in)?"""
    layers = linear_layers(model)
    return (bool(layers) and torch.backends.mkldnn.is_available() and all(
        hasattr(m, "pack") and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32 for m in layers))


def choice_of(model: nn.Module) -> str:
    """"onednn" if the layers hold packed copies, else the storage (``layout_of``)."""
    layers = linear_layers(model)
    return PACKED if layers and getattr(layers[0], "packed", None) is not None else layout_of(model)


@torch.no_grad()
def relayout(model: nn.Module, layout: str, rows: int = 1) -> None:
    """Store every linear weight as ``layout``, in place, one matrix at a time (same shape, same values).

    "onednn" keeps the storage and packs a copy of each weight for ``rows`` rows; the other two drop the copies.
    """
    if layout not in CHOICES:
        raise ValueError(f"layout must be one of {CHOICES}; got {layout!r}")
    if layout == PACKED and not can_pack(model):
        raise ValueError("layout 'onednn' needs fp32 weights on a CPU, kvref's Linear layers and a torch built "
                         "with oneDNN (torch.backends.mkldnn.is_available()); use 'out_in' or 'in_out'")
    for m in linear_layers(model):
        if layout == PACKED:
            m.pack(rows)
            continue
        if getattr(m, "packed", None) is not None:
            m.unpack()
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


def candidates(model: nn.Module, rows: int) -> tuple[str, ...]:
    """What "auto" races for ``rows`` rows: both storages, and oneDNN's packed copies for more than one row."""
    return CHOICES if rows > 1 and can_pack(model) else LAYOUTS


def time_layouts(model: nn.Module, rows: int = 1, repeats: int = 3) -> dict[str, float]:
    """Median seconds of one pass over all linear layers, per candidate; the runs alternate A B C C B A ...

    The model ends as it was. Each weight is transposed (or packed) once per switch (about a second
    for GPT-2-124M on one core), so the order snakes to switch once per repeat. The packed copies
    are made from the storage the model starts in.
    """
    layers, start, storage = linear_layers(model), choice_of(model), layout_of(model)
    w = layers[0].weight
    xs = {m.in_features: torch.randn(rows, m.in_features, dtype=w.dtype, device=w.device) for m in layers}
    kinds = candidates(model, rows)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    order = [start, *(k for k in kinds if k != start)] if start in kinds else list(kinds)
    for r in range(repeats):
        for k in order if r % 2 == 0 else order[::-1]:
            if k == PACKED:
                relayout(model, storage)
            relayout(model, k, rows)
            _one_pass(layers, xs, w.device)  # first touch after the copy
            times[k].append(statistics.median(_one_pass(layers, xs, w.device) for _ in range(3)))
    relayout(model, storage)
    if start == PACKED:
        relayout(model, PACKED, rows)
    return {k: statistics.median(t) for k, t in times.items()}


def choose_layout(model: nn.Module, rows: int = 1) -> tuple[str, dict[str, float]]:
    """The fastest choice for ``rows`` new tokens per step, and the seconds measured; cached per process."""
    layers = linear_layers(model)
    w = layers[0].weight
    key = (str(w.device), w.dtype, tuple(tuple(m.weight.shape) for m in layers), rows)
    if key not in _chosen:
        times = time_layouts(model, rows)
        _chosen[key] = (min(times, key=times.get), times)
    return _chosen[key]


def set_layout(model: nn.Module, layout: str | None = None, rows: int = 1) -> str:
    """Store the weights as ``layout`` ("out_in", "in_out", "onednn" or "auto"; None: $KVREF_LAYOUT, else "auto").

    "auto" times the candidates for ``rows`` tokens per step (``choose_layout``). "onednn" keeps the
    storage the weights have and packs a copy of each for ``rows`` rows. Returns the choice now in use.
    """
    layout = layout or os.environ.get("KVREF_LAYOUT") or "auto"
    if layout not in (*CHOICES, "auto"):
        raise ValueError(f"layout (or $KVREF_LAYOUT) must be 'auto', 'out_in', 'in_out' or 'onednn'; got {layout!r}")
    if not linear_layers(model):
        return "out_in"
    if layout == "auto":
        layout = choose_layout(model, rows)[0]
    relayout(model, layout, rows)
    return layout
