"""Generation in named stages: ``prefill`` the prompt, then ``decode_one_token`` until done.

``generate(..., cache=None)`` re-runs the whole sequence every step: the baseline the course
measures the cache against. Both paths count the K/V rows they compute (``model.kv_rows``):

    with a cache:    B * (T + N - 1)              (prompt once, then one row per new token but the last)
    without a cache: B * (N * T + N * (N - 1) / 2) (step i recomputes all T + i rows)

for a (B, T) prompt and N new tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .cache import DynamicCache, KVCache, StaticCache
from .model import Transformer

CACHE_KINDS = ("static", "dynamic", None)


@dataclass
class GenerationStats:
    batch: int
    prompt_tokens: int  # T (padded width)
    new_tokens: int  # N per row
    ttft_s: float  # prefill + choosing the first token
    decode_s: list[float] = field(default_factory=list)  # one latency per decode step
    kv_rows_per_layer: int = 0  # K/V rows computed in each layer (the deterministic work measure)

    @property
    def total_s(self) -> float:
        return self.ttft_s + sum(self.decode_s)

    @property
    def tokens_per_s(self) -> float:
        """New tokens (all rows) per second of wall time, prefill included."""
        return self.batch * self.new_tokens / self.total_s

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second in the decode loop alone (what a chat user sees after the first token)."""
        return self.batch * len(self.decode_s) / sum(self.decode_s) if self.decode_s else float("nan")


@dataclass
class Generation:
    tokens: torch.Tensor  # (B, T + N): the prompt followed by the new tokens
    stats: GenerationStats


def make_cache(model: Transformer, kind: str | None, batch: int, max_len: int) -> KVCache | None:
    cfg = model.cfg
    if kind in ("static", "dynamic") and cfg.layer_types is not None:  # per-layer kinds: storage per layer
        from .layers import LayeredCache

        return LayeredCache(cfg, batch, max_len if kind == "static" else None, dtype=model.dtype, device=model.device,
                            static=kind == "static")
    if kind == "static":
        return StaticCache(model.cfg, batch, max_len, dtype=model.dtype, device=model.device)
    if kind == "dynamic":
        return DynamicCache()
    if kind is None:
        return None
    raise ValueError(f"cache must be one of {CACHE_KINDS} or a KVCache instance; got {kind!r}")


def prefill(model: Transformer, input_ids: torch.Tensor, cache: KVCache | None,
            attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Run the whole prompt at once, filling the cache; return the last position's logits (B, V)."""
    return model(input_ids, cache=cache, attention_mask=attention_mask, last_only=True)[:, -1]


def decode_one_token(model: Transformer, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Feed one new token per row (B,) through the model; return its logits (B, V)."""
    return model(token[:, None], cache=cache, last_only=True)[:, -1]


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row from logits (B, V): greedy when temperature is 0."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _check_args(model: Transformer, input_ids: torch.Tensor, max_new_tokens: int, temperature: float,
                top_k: int | None, cache) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1; got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy); got {temperature}")
    V = model.cfg.vocab_size
    if top_k is not None and not (isinstance(top_k, int) and 1 <= top_k <= V):
        raise ValueError(f"top_k must be None or an integer in [1, {V}]; got {top_k!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a (B, T) integer tensor")
    T, limit = input_ids.shape[1], model.cfg.max_seq_len
    if isinstance(cache, StaticCache):
        limit = min(limit, cache.max_len)
    if T + max_new_tokens > limit:
        raise ValueError(
            f"prompt ({T} tokens, left padding included) + max_new_tokens ({max_new_tokens}) = "
            f"{T + max_new_tokens} exceeds the {limit} tokens the model/cache can hold; "
            f"ask for at most {max(limit - T, 0)} new tokens or shorten the prompt"
        )


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def generate(
    model: Transformer,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    cache: str | KVCache | None = "static",
    attention_mask: torch.Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int | None = None,
    eos_id: int | None = None,
) -> Generation:
    """Continue each row of ``input_ids`` (B, T) by up to ``max_new_tokens`` tokens.

    ``cache``: "static" (preallocated), "dynamic" (grows by cat), None (no cache: recompute
    everything each step), or a cache object (it is reset first). Left-pad ragged prompts and
    pass ``attention_mask`` (B, T) with 0 on the padding. Rows that emit ``eos_id`` keep
    emitting it; generation stops early once every row has.
    """
    _check_args(model, input_ids, max_new_tokens, temperature, top_k, cache)
    device = model.device
    input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    B, T = input_ids.shape
    if isinstance(cache, KVCache):
        cache.reset()
    else:
        cache = make_cache(model, cache, B, T + max_new_tokens)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    rows_before = model.kv_rows
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    out = [input_ids]

    def choose(logits: torch.Tensor) -> torch.Tensor:
        nonlocal finished
        nxt = sample(logits, temperature, top_k, generator)  # (B,)
        if eos_id is not None:
            nxt = torch.where(finished, torch.full_like(nxt, eos_id), nxt)
            finished = finished | (nxt == eos_id)
        out.append(nxt[:, None])
        return nxt

    t0 = _sync(device)
    nxt = choose(prefill(model, input_ids, cache, attention_mask))
    stats = GenerationStats(batch=B, prompt_tokens=T, new_tokens=1, ttft_s=_sync(device) - t0)

    mask = attention_mask
    for _ in range(max_new_tokens - 1):
        if eos_id is not None and bool(finished.all()):
            break
        t0 = time.perf_counter()
        if cache is not None:
            logits = decode_one_token(model, nxt, cache)
        else:  # the baseline: run the whole sequence again
            seq = torch.cat(out, dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(nxt[:, None], dtype=mask.dtype)], dim=1)
            logits = prefill(model, seq, None, mask)
        nxt = choose(logits)
        stats.decode_s.append(_sync(device) - t0)
        stats.new_tokens += 1
    stats.kv_rows_per_layer = model.kv_rows - rows_before
    return Generation(tokens=torch.cat(out, dim=1), stats=stats)
