"""Chunked prefill: feed a long prompt C tokens at a time.

Prefill with a cache is already incremental: chunk i's queries attend to the K/V of chunks
0..i-1 (in the cache) and to their own (causally). So splitting the prompt changes nothing in
the result, only in the shape of each forward: the big temporaries of one step are

    attention scores  (B, H, C, S)     S = tokens cached so far + C
    MLP hidden        (B, C, d_ff)     (2 d_ff for SwiGLU's fused gate and up)
    logits            (B, C, V)        (only the last position's, with last_only)

and all of them shrink with C. That bounds the activation spike of a long prompt (one of the
OOM causes the course lists) and lets a serving engine mix prefill chunks with decodes under one
token budget per step (kvref/serve.py).

Measuring peak memory on CPU: ``peak_bytes`` runs a function under ``torch.profiler`` with
``profile_memory=True``, which records every allocation and free of the CPU allocator; the running
sum of those sizes, in time order, peaks at the most bytes the function held at once beyond what
was allocated before it began.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from .cache import KVCache
from .config import ModelConfig
from .model import Transformer


def chunked_prefill(model: Transformer, input_ids: torch.Tensor, cache: KVCache, chunk_size: int,
                    attention_mask: torch.Tensor | None = None, last_only: bool = False) -> torch.Tensor:
    """Run the prompt through ``model`` ``chunk_size`` tokens at a time; return the logits.

    (B, T, V) for every prompt position, or (B, 1, V) for the last one if ``last_only``
    (then each chunk computes only its last position's logits, as serving engines do).
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1; got {chunk_size!r}")
    T = input_ids.shape[1]
    out = []
    for start in range(0, T, chunk_size):
        mask = None if attention_mask is None else attention_mask[:, start:start + chunk_size]
        out.append(model(input_ids[:, start:start + chunk_size], cache=cache, attention_mask=mask,
                         last_only=last_only))
    return out[-1] if last_only else torch.cat(out, dim=1)


def peak_bytes(fn: Callable[[], object]) -> tuple[object, int]:
    """(fn(), the most bytes fn's allocations held at once on the CPU allocator).

    Uses the profiler's allocation records (its memory timeline); memory allocated before ``fn``
    started (weights, a preallocated cache) is not counted.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    try:
        from torch._C._profiler import _EventType

        stack, sizes = list(prof.profiler.kineto_results.experimental_event_tree()), []
        while stack:  # every allocation event in the tree of recorded ops
            node = stack.pop()
            stack.extend(node.children)
            if node.tag == _EventType.Allocation:
                sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
    except (ImportError, AttributeError) as e:  # the event tree is not a public API
        raise RuntimeError(f"this torch build does not expose allocation events ({e}); "
                           f"use activation_estimate() instead") from e
    held = peak = 0
    for _, size in sorted(sizes, key=lambda x: x[0]):
        held += size
        peak = max(peak, held)
    return result, peak


def prefill_step_peak(model: Transformer, input_ids: torch.Tensor, cache: KVCache, chunk_size: int) -> int:
    """Chunked prefill, measuring each chunk's forward alone: the largest peak of any one step."""
    worst = 0
    for start in range(0, input_ids.shape[1], chunk_size):
        chunk = input_ids[:, start:start + chunk_size]
        _, peak = peak_bytes(lambda: model(chunk, cache=cache, last_only=True))
        worst = max(worst, peak)
    return worst


def activation_estimate(cfg: ModelConfig, batch: int, chunk: int, past: int = 0, dtype: torch.dtype = torch.float32,
                        last_only: bool = True, scores_materialized: bool = True) -> dict[str, int]:
    """Bytes of the largest temporaries of one forward of ``chunk`` new tokens after ``past`` cached ones.

    ``scores_materialized``: the manual attention builds (B, H, C, S) scores, their fp32 softmax
    and the weights; a fused kernel (sdpa, FlashAttention) never materializes them.
    """
    b = torch.empty((), dtype=dtype).element_size()
    S = past + chunk
    mlp_width = cfg.d_ff * (1 if cfg.arch == "gpt2" else 2)
    parts = {
        "scores": batch * cfg.n_heads * chunk * S * b if scores_materialized else 0,
        "mlp_hidden": batch * chunk * mlp_width * b,
        "logits": batch * (1 if last_only else chunk) * cfg.vocab_size * b,
    }
    parts["largest"] = max(parts.values())
    return parts
