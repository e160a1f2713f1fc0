"""Where a decode step's time goes, kvref vs HF, and the two limits a decode step cannot pass.

Used by ``python -m kvref.bench decode`` (section 5). Two tables:

* the profile: ``torch.profiler`` around one whole ``generate`` of each library (kvref's static cache,
  HF's default), the prefill call excluded (a model call with more than one token per row); every
  matrix product (``addmm``/``mm`` not inside attention) is put under the block matrices or, when one of
  its operands has the vocabulary's size, under the output layer; attention is every
  ``scaled_dot_product_attention`` call; everything else is the rest of the step (small ops, Python,
  HF's generation loop; the profiler's own cost per op lands here too, more for the side with more ops).
  kvref and HF are profiled alternately, ``repeats`` times each; the table gives the medians per step;
* the limits, timed interleaved with unprofiled decode loops of both libraries (kvref's
  ``generate(...).stats.decode_s``, HF's steps timed by a stopping criterion that never stops): the rate
  at which one core streams the model's weights (the fastest of ``sum()`` and both product orders over
  every weight in turn, as a step reads them), which bounds batch-1 decode at rate / bytes per token;
  and the fp32 GEMM rate with 16 rows on the model's own matrices (the fastest of ``x @ W.T``,
  ``(W @ x.T).T`` with W (out, in), ``x @ W`` with W (in, out) and oneDNN's packed product), which bounds
  batch-16 decode at 16 tokens per pass over the matrices.
"""

from __future__ import annotations

import functools
import time

import torch

import kvref
from kvref.layout import choose_layout, linear_layers, set_layout

MATMUL = ("aten::addmm", "aten::mm", "mkldnn::_linear_pointwise")  # the last: kvref's "onednn" choice
ATTENTION = "aten::scaled_dot_product_attention"
PARTS = ("block matrices", "output layer", "attention", "everything else")


def _marked(model: torch.nn.Module):
    """Patch ``model.forward`` so that a prefill call (more than one token per row) is a named profiler range."""
    inner = model.forward

    @functools.wraps(inner)  # HF's generate reads the forward's signature
    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] > 1:
            with torch.profiler.record_function("prefill"):
                return inner(*args, **kwargs)
        return inner(*args, **kwargs)

    model.forward = forward
    return model


def _inside(e, names) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name in names:
            return True
        p = p.cpu_parent
    return False


def profile_steps(run, model: torch.nn.Module, vocab: int, steps: int) -> dict[str, float]:
    """Seconds per decode step in each of PARTS, from one profiled ``run()`` (a whole generate)."""
    _marked(model)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            with torch.profiler.record_function("generate"):
                run()
    finally:
        del model.forward  # the class's forward again
    events = prof.events()
    total = sum(e.cpu_time_total for e in events if e.name == "generate")
    prefill = sum(e.cpu_time_total for e in events if e.name == "prefill")
    parts = dict.fromkeys(PARTS, 0.0)
    for e in events:
        if e.name not in MATMUL and e.name != ATTENTION or _inside(e, ("prefill", ATTENTION, *MATMUL)):
            continue
        if e.name == ATTENTION:
            parts["attention"] += e.cpu_time_total
        elif any(vocab in s for s in e.input_shapes):
            parts["output layer"] += e.cpu_time_total
        else:
            parts["block matrices"] += e.cpu_time_total
    parts["everything else"] = total - prefill - sum(parts.values())
    return {k: v / 1e6 / steps for k, v in parts.items()}


def matrix_pass(model: torch.nn.Module, rows: int) -> tuple[callable, int, int]:
    """A run returning the seconds of the fastest pass over every linear weight with ``rows`` rows; the
    FLOPs and the bytes of one pass. The forms raced: ``x @ W.T`` and ``(W @ x.T).T`` with W (out, in),
    ``x @ W`` with W (in, out) and, for one row, a plain read ``W.sum()``, for more rows oneDNN's product
    on its reordered copy of W (more copies of the weights exist while this runs)."""
    mats = [m.weight.detach() for m in linear_layers(model)]  # (out, in) as F.linear sees them
    out_in = [w.contiguous() for w in mats]
    in_out = [w.t().contiguous() for w in mats]
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in mats}
    forms = [lambda: [xs[w.shape[1]] @ w.T for w in out_in],
             lambda: [(w @ xs[w.shape[1]].T).T.contiguous() for w in out_in],
             lambda: [xs[w.shape[0]] @ w for w in in_out]]
    if rows == 1:
        forms.append(lambda: [w.sum() for w in out_in])
    elif torch.backends.mkldnn.is_available():  # oneDNN's kernel on its reordered copies (kvref.layout "onednn")
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, batch_size=rows) for w in out_in]
        forms.append(lambda: [torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
                              for w, p in zip(out_in, packed)])

    def run() -> float:
        best = float("inf")
        for form in forms:
            t0 = time.perf_counter()
            form()
            best = min(best, time.perf_counter() - t0)
        return best

    return run, sum(2 * rows * w.numel() for w in mats), sum(w.numel() * w.element_size() for w in mats)


class StepClock:
    """A StoppingCriteria for HF's generate that never stops it and notes the time of each call (once a token)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.stamps, self.stamps[1:])]


def section(model, hf, prompt: int, new: int, repeats: int, log, batches=(1, 16)) -> list[str]:
    """Section 5's markdown: the profile per batch, then the limits with kvref's and HF's decode against them."""
    from transformers import StoppingCriteriaList

    from .core import bytes_per_decode_token, prompt_ids
    from .timing import interleave, med, table

    V, prof, limits, layouts = model.cfg.vocab_size, {}, [], []
    for B in batches:
        layout = set_layout(model, None, rows=B)  # $KVREF_LAYOUT, else the faster for B rows
        seconds = choose_layout(model, B)[1]  # cached: the timing that chose it (or, if forced, this one)
        layouts.append(f"B={B}: {layout} (" + ", ".join(f"{k} {1e3 * s:.1f} ms" for k, s in seconds.items()) + ")")
        ids = prompt_ids(B, prompt, V, seed=B)
        clock = StepClock()

        def ours() -> list[float]:
            return kvref.generate(model, ids, new, cache="static").stats.decode_s

        def theirs() -> list[float]:
            clock.stamps.clear()
            with torch.inference_mode():
                hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                            min_new_tokens=new, pad_token_id=hf.config.eos_token_id,
                            stopping_criteria=StoppingCriteriaList([clock]))
            return clock.steps()

        log(f"profile of the decode step, B={B}: {repeats} alternating repeats")
        p = interleave({"kvref": lambda: profile_steps(ours, model, V, new - 1),
                        "HF": lambda: profile_steps(theirs, hf, V, new - 1)}, repeats)
        prof[B] = {side: {k: med([r[k] for r in runs]) for k in PARTS} for side, runs in p.items()}
        probe, flops, nbytes = matrix_pass(model, B)
        log(f"limits, B={B}: {repeats} interleaved repeats")
        t = interleave({"probe": probe, "kvref": lambda: med(ours()), "HF": lambda: med(theirs())}, repeats)
        if B == 1:  # bytes per token over the rate the weights streamed at
            w_bytes, kv_bytes = bytes_per_decode_token(model, prompt + new / 2)
            rate = f"{nbytes / med(t['probe']) / 1e9:.1f} GB/s"
            bound = [(w_bytes + kv_bytes) / (nbytes / s) for s in t["probe"]]  # seconds per token, each repeat
            what = "weight streaming (fastest of sum() and both product orders, all weights in turn)"
        else:  # B tokens per pass over the matrices
            rate, bound = f"{flops / med(t['probe']) / 1e9:.0f} GFLOP/s", t["probe"]
            what = f"fp32 GEMM, {B} rows, the model's matrices (fastest of the dense forms and oneDNN's packed one)"
        row = [f"B={B}", what, rate, f"{B / med(bound):.1f}"]
        for side in ("kvref", "HF"):
            row += [f"{B / med(t[side]):.1f}", f"{med(bound) / med(t[side]):.0%}"]
        limits.append(row)
    head = ["per decode step, ms (profiled)"] + [f"B={B} {side}" for B in batches for side in ("kvref", "HF")]
    rows = [[part] + [f"{1e3 * prof[B][side][part]:.2f}" for B in batches for side in ("kvref", "HF")]
            for part in PARTS]
    rows.append(["step"] + [f"{1e3 * sum(prof[B][side].values()):.2f}" for B in batches for side in ("kvref", "HF")])
    gemm = ("block matrices", "output layer")
    bounds = []
    for B in batches:
        k, h = prof[B]["kvref"], prof[B]["HF"]
        kg, hg = sum(k[p] for p in gemm), sum(h[p] for p in gemm)
        bounds.append([f"B={B}", f"{sum(h.values()) / sum(k.values()):.2f}x", f"{sum(h.values()) / kg:.2f}x",
                       f"{hg / kg:.2f}x", f"{kg / sum(k.values()):.0%} / {hg / sum(h.values()):.0%}"])
    bound_table = table(["batch", "HF step / kvref step (profiled)", "bound: HF step / kvref's matrix products "
                         "(kvref's other work at zero)", "HF's matrix products / kvref's", "matrix share kvref / HF"],
                        bounds)
    return [table(head, rows), "", bound_table, "", "kvref's weight layout, chosen by timing one pass over its linear weights: "
            + "; ".join(layouts) + ". HF's GPT-2 Conv1D weights are (in, out); its lm_head is (out, in).", "",
            table(["batch", "limit", "measured", "bound tok/s", "kvref decode tok/s", "kvref / bound",
                   "HF decode tok/s", "HF / bound"], limits), ""]
