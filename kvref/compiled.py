"""A decode step ``torch.compile`` can take whole: fixed shapes, tensors in, no Python bookkeeping.

``model(token, cache=cache)`` is written for reading: it checks its input, asks the cache how long
it is, builds the mask it needs, and lets the cache count slots. Each of those turns a tensor into
a Python value (``int(ids.max())``, ``bool(real.all())``) and breaks a compiled graph (6 breaks
per step in ``kvref.bench core``), and the attention over the filled slots only changes shape
every step. ``decode_step`` below is the same computation rearranged the gpt-fast way:

* K/V are written with ``index_put_`` at a slot given as a tensor, straight into the
  ``StaticCache``'s (L, B, H_kv, S_max, D) buffers, which live outside the compiled function.
  The write indexes the whole buffer (layer, row, head, slot), not a per-layer view
  ``k_buf[i]``: an in-place write into a view of a graph input is turned by the compiler into
  copies of the buffer (every layer's write copied whole buffers; docs/benchmarks.md has the
  cost); a write into the input itself stays a write of B * H_kv rows;
* attention reads all S_max slots, a (B, 1, 1, S_max) mask hiding the empty ones, so every
  step has the same shapes and one graph serves them all;
* checks and bookkeeping (capacity, ``cache.advance``, the work counter) run in
  ``CompiledDecoder.step``, outside the compiled region.

    dec = CompiledDecoder(model)                    # torch.compile(decode_step, fullgraph=True)
    tokens = dec.generate(ids, 32, cache)           # eager prefill, compiled decode, greedy

``fullgraph=True`` makes any graph break an error, so "zero graph breaks" is checked by running.

``freeze=True`` turns on inductor's freezing: the weights become constants of the compiled graph,
so the compiler may rewrite them once, ahead of time. On a CPU with MKL it repacks every fp32
weight for MKL's packed GEMM, which is what makes the compiled CPU step faster than eager (measured in
docs/benchmarks.md). The price: a second copy of the weights, and a compiled step that no longer
sees later changes to them (build a new ``CompiledDecoder`` after training or loading weights).
"""

from __future__ import annotations

import time

import torch

from .cache import StaticCache
from .generate import prefill
from .model import Transformer, apply_rope


def decode_step(model: Transformer, token: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor,
                k_buf: torch.Tensor, v_buf: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """One new token per row (B,) at positions ``pos`` (B,), written to slot ``slot`` (1,); logits (B, V).

    k_buf, v_buf (L, B, H_kv, S_max, D) are updated in place; ``real`` (B, S_max) marks the slots
    holding real tokens (slot ``slot`` included); slots after ``slot`` are never attended.
    """
    cfg = model.cfg
    B, S_max = real.shape
    H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dev = real.device
    visible = real & (torch.arange(S_max, device=dev) <= slot)  # (B, S_max): stale slots hidden
    mask = visible[:, None, None, :]  # (B, 1, 1, S_max)
    rows = torch.arange(B, device=dev)[:, None, None], torch.arange(H_kv, device=dev)[None, :, None]  # (B,1,1), (1,H_kv,1)
    at = slot.view(1, 1, 1)  # (1, 1, 1): with the layer index these address (B, H_kv, 1) rows of a buffer
    x = model.tok_emb(token[:, None])  # (B, 1, d_model)
    rope = None
    if model.pos_emb is not None:
        x = x + model.pos_emb(pos[:, None])
    else:
        rope = (model.rope_cos[pos][:, None, None].to(x.dtype), model.rope_sin[pos][:, None, None].to(x.dtype))
    for i, block in enumerate(model.blocks):
        attn = block.attn
        q, k, v = attn.qkv(block.norm1(x)).split([H * D, H_kv * D, H_kv * D], dim=-1)
        q = q.view(B, 1, H, D).transpose(1, 2)  # (B, H, 1, D)
        k = k.view(B, 1, H_kv, D).transpose(1, 2)  # (B, H_kv, 1, D)
        v = v.view(B, 1, H_kv, D).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        layer = torch.tensor(i, device=dev)
        k_buf.index_put_((layer, *rows, at), k)  # the cache's own buffer, written in place: (B, H_kv, 1, D)
        v_buf.index_put_((layer, *rows, at), v)
        y = attn.attend(q, k_buf[i], v_buf[i], mask)  # (B, H, 1, D) over all S_max slots
        x = x + attn.proj(y.transpose(1, 2).reshape(B, 1, H * D))
        x = x + block.mlp(block.norm2(x))
    return model.lm_head(model.norm(x))[:, -1]  # (B, V)


class CompiledDecoder:
    """``decode_step`` compiled once per (model, batch, S_max); checks and bookkeeping stay outside.

    ``mode``: None (inductor's default) or "reduce-overhead" (CUDA graphs on a GPU). ``backend``:
    "inductor", or "eager" to trace without generating code (fast; for checking graph breaks).
    ``compile=False`` runs ``decode_step`` eagerly (the same rearranged step, no compiler).
    ``freeze=True``: weights are constants of the compiled graph (see the module docstring).
    """

    def __init__(self, model: Transformer, mode: str | None = None, backend: str = "inductor",
                 compile: bool = True, freeze: bool = False) -> None:
        if model.cfg.sliding_window is not None:
            raise ValueError("CompiledDecoder does not implement sliding-window attention; use model(..., cache=)")
        self.model = model
        if freeze and (mode is not None or backend != "inductor"):
            raise ValueError(f"freeze=True needs backend='inductor' and mode=None; got backend={backend!r}, mode={mode!r}")
        # freezing is also named in options: it makes this compiled function differ from an unfrozen one,
        # which dynamo would otherwise reuse for it (both compile decode_step); inductor reads it in step()
        extra = {"options": {"freezing": True}} if freeze else {"mode": mode}
        self.fn = torch.compile(decode_step, fullgraph=True, dynamic=False, backend=backend, **extra) \
            if compile else decode_step
        self.static_address = mode == "reduce-overhead"
        self.freeze = freeze  # read when the first call compiles (inductor takes it from its global config)
        self._marked: set[int] = set()

    @torch.inference_mode()
    def step(self, token: torch.Tensor, cache: StaticCache) -> torch.Tensor:
        """Feed one token per row (B,) after what ``cache`` holds; return the logits (B, V)."""
        model = self.model
        if type(cache) is not StaticCache:
            raise ValueError(f"CompiledDecoder needs a kvref.StaticCache (fixed buffers); got {type(cache).__name__}")
        if cache.length == 0:
            raise ValueError("the cache is empty: run the prompt through kvref.prefill first")
        B = token.shape[0]
        cache.check(model.cfg, B, 1, model.dtype, model.device)  # capacity, batch, dtype: outside the graph
        if self.static_address and id(cache) not in self._marked:  # CUDA graphs: replay reads these addresses
            torch._dynamo.mark_static_address(cache.k)
            torch._dynamo.mark_static_address(cache.v)
            self._marked.add(id(cache))
        slot = cache.length
        cache._real[:, slot] = True  # the new token is real (no padding inside the decode loop)
        with torch._inductor.config.patch(freezing=self.freeze):
            logits = self.fn(model, token, cache.next_pos, torch.tensor([slot], device=token.device),
                             cache.k, cache.v, cache._real)
        cache.advance(torch.ones(B, 1, dtype=torch.bool, device=token.device))
        model.kv_rows += B
        return logits

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, cache: StaticCache,
                 times: list[float] | None = None) -> torch.Tensor:
        """Greedy: eager prefill, then ``max_new_tokens - 1`` compiled steps. Returns (B, T + N).

        ``cache`` is reset first; pass a list as ``times`` to get each decode step's seconds.
        """
        cache.reset()
        out = [input_ids, prefill(self.model, input_ids, cache).argmax(-1)[:, None]]
        for _ in range(max_new_tokens - 1):
            t0 = time.perf_counter()
            out.append(self.step(out[-1][:, 0], cache).argmax(-1)[:, None])
            if times is not None:
                if out[-1].device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        return torch.cat(out, dim=1)


def graph_breaks(model: Transformer, cache: StaticCache, token: torch.Tensor) -> int:
    """Graph breaks ``torch._dynamo.explain`` finds in one ``decode_step`` (the cache is not advanced)."""
    slot = cache.length
    args = (model, token, cache.next_pos, torch.tensor([slot], device=token.device), cache.k.clone(),
            cache.v.clone(), cache._real.clone())  # clones: explain runs the step, the cache stays as it was
    args[6][:, slot] = True
    with torch.inference_mode():
        return torch._dynamo.explain(decode_step)(*args).graph_break_count
