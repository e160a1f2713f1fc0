"""Speculative decoding: a cheap draft guesses k tokens, the target checks them all in one forward.

A decode step of a big model is memory-bound: it reads every weight to produce one token. Feeding
k + 1 tokens costs about the same read, so if a cheap *draft* proposes k tokens, one target forward
(the *verify* step, a short prefill) scores all of them:

    target cache holds x_1 .. x_{t-1};  x_t was chosen but not fed yet
    draft proposes d_1 .. d_k
    target(x_t, d_1, .., d_k)  ->  its choices c_0 .. c_k  (c_i follows d_i; c_0 follows x_t)
    accept the longest prefix with d_{i+1} == c_i  (n tokens), then emit c_n as well: the *bonus* token
    crop the target's cache to keep x_t, d_1 .. d_n; the draft's cache too

so every verify step emits between 1 and k + 1 tokens, and greedy output is exactly the target's own.
If each draft token is accepted with probability a, independently, a verify step emits on average
(1 - a^(k+1)) / (1 - a) tokens (Leviathan et al., 2023, eq. 1).

With sampling (temperature > 0), draft token d ~ q is accepted with probability min(1, p(d) / q(d)),
and a rejected one is replaced by a sample of norm(max(0, p - q)): the output is distributed exactly
as the target's own samples (Leviathan et al., 2023; Chen et al., 2023).

A linear-attention layer (kvref.linear_attn) keeps a state that cannot be cropped: for a model with
such layers the cache is snapshotted before the verify step and restored when a draft is rejected,
then the accepted tokens are fed again (``SpecStats.target_refeeds`` counts those forwards); the
draft's cache is snapshotted after its first forward of a round (when it holds only kept tokens).

``draft`` is another kvref model (same vocabulary, same device) with its own cache, or "ngram":
prompt lookup, the k tokens that followed the latest n-gram's earliest earlier occurrence in the
context (what HF's ``prompt_lookup_num_tokens`` does), which costs no model at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .cache import DynamicCache, KVCache, StaticCache
from .evict import SlidingWindowCache
from .model import Transformer
from .paged import PagedKVCache
from .quant import QuantizedCache

CACHE_KINDS = ("static", "dynamic", "paged", "window", "quantized")


@dataclass
class SpecStats:
    prompt_tokens: int
    new_tokens: int = 0
    proposed: int = 0  # draft tokens offered to the target
    accepted: int = 0  # of those, the ones the target kept
    target_forwards: int = 0  # prefill included
    draft_forwards: int = 0
    target_refeeds: int = 0  # forwards that fed accepted tokens again after a restore (linear layers only)
    seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per verify step (the prefill's token not counted): between 1 and k + 1."""
        steps = self.target_forwards - 1
        return (self.new_tokens - 1) / steps if steps else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else float("nan")


@dataclass
class SpecGeneration:
    tokens: torch.Tensor  # (1, T + N): the prompt followed by the new tokens
    stats: SpecStats


def expected_tokens_per_step(a: float, k: int) -> float:
    """Mean tokens a verify step emits when each draft is accepted with probability a: (1 - a^(k+1)) / (1 - a)."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def make_cache(model: Transformer, kind: str, max_len: int, k: int) -> KVCache:
    """A rollback-ready cache of ``kind`` for one row of up to ``max_len`` tokens (rings get slack k)."""
    cfg = model.cfg
    if kind in ("static", "dynamic") and cfg.layer_types is not None:
        from .layers import LayeredCache

        return LayeredCache(cfg, 1, max_len, dtype=model.dtype, device=model.device, static=kind == "static",
                            slack=k)
    if kind == "static":
        return StaticCache(cfg, 1, max_len, dtype=model.dtype, device=model.device)
    if kind == "dynamic":
        return DynamicCache()
    if kind == "paged":
        return PagedKVCache(cfg, num_blocks=-(-max_len // 16) + 1, block_size=16, dtype=model.dtype,
                            device=model.device)
    if kind == "window":
        if cfg.sliding_window is None:
            raise ValueError("cache='window' needs a model with cfg.sliding_window set")
        return SlidingWindowCache(cfg.sliding_window, slack=k)
    if kind == "quantized":
        return QuantizedCache(bits=8, residual=max(32, k))
    raise ValueError(f"cache must be one of {CACHE_KINDS} or a KVCache instance; got {kind!r}")


def _rolls_back_by_snapshot(cache) -> bool:
    """True for a cache with linear-attention layers: it restores a snapshot instead of cropping."""
    from .layers import LayeredCache

    return isinstance(cache, LayeredCache) and "linear" in cache.groups


def ngram_draft(tokens: list[int], k: int, max_ngram: int = 2) -> list[int]:
    """Prompt lookup: for n = max_ngram .. 1, find the earliest earlier occurrence of the last n tokens
    and propose (up to) the k tokens that followed it; [] when nothing matches."""
    L = len(tokens)
    for n in range(min(max_ngram, L - 1), 0, -1):
        tail = tokens[L - n:]
        for start in range(0, L - n):  # the tail itself (start = L - n) has no continuation
            if tokens[start:start + n] == tail:
                return tokens[start + n:min(start + n + k, L)]
    return []


def _check(target: Transformer, draft, input_ids: torch.Tensor, max_new_tokens: int, k: int,
           temperature: float, cache) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (draft tokens per verify step) must be an integer >= 1; got {k!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1; got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy); got {temperature}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError("input_ids must be a (1, T) integer tensor: speculative decoding here runs one sequence")
    if isinstance(draft, Transformer):
        if draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"the draft's vocabulary ({draft.cfg.vocab_size} tokens) differs from the target's "
                             f"({target.cfg.vocab_size}): draft tokens must mean the same thing to both")
        if draft.device != target.device:
            raise ValueError(f"the draft is on {draft.device} but the target is on {target.device}; "
                             f"move both to one device")
    elif draft != "ngram":
        raise ValueError(f"draft must be a kvref Transformer or 'ngram'; got {type(draft).__name__}")
    need = input_ids.shape[1] + max_new_tokens + k  # the last verify may feed k tokens past the end
    if need > target.cfg.max_seq_len:
        raise ValueError(f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) + k ({k}) = {need} "
                         f"exceeds max_seq_len={target.cfg.max_seq_len}")
    if isinstance(cache, SlidingWindowCache) and cache.slack < k - 1:
        raise ValueError(f"a ring with slack {cache.slack} can drop {cache.slack + 1} tokens; verifying k={k} drafts "
                         f"drops up to {k}: build it with slack >= {k - 1}")
    if isinstance(cache, QuantizedCache) and cache.residual < k:
        raise ValueError(f"a QuantizedCache drops only full-precision tokens: residual must be >= k={k}; "
                         f"got {cache.residual}")


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)


@torch.inference_mode()
def generate(target: Transformer, input_ids: torch.Tensor, max_new_tokens: int, draft: Transformer | str = "ngram",
             k: int = 4, cache: str | KVCache = "static", temperature: float = 0.0, seed: int | None = None,
             max_ngram: int = 2) -> SpecGeneration:
    """Speculative decoding of one sequence (1, T): exactly ``max_new_tokens`` new tokens.

    ``cache``: a kind (see CACHE_KINDS; the draft gets the same kind) or a KVCache for the target (reset
    first; the draft then gets a dynamic one). Greedy (temperature 0): the target's own greedy tokens.
    """
    _check(target, draft, input_ids, max_new_tokens, k, temperature, cache)
    dev = target.device
    input_ids = input_ids.to(dev)
    T = input_ids.shape[1]
    max_len = T + max_new_tokens + k
    if isinstance(cache, KVCache):
        cache.reset()
        t_cache, d_kind = cache, "dynamic"
    else:
        t_cache, d_kind = make_cache(target, cache, max_len, k), cache
    use_model = isinstance(draft, Transformer)
    d_cache = make_cache(draft, d_kind, max_len, k) if use_model else None
    t_snaps, d_snaps = _rolls_back_by_snapshot(t_cache), _rolls_back_by_snapshot(d_cache)
    gen = torch.Generator(device=dev).manual_seed(seed) if seed is not None else None
    greedy = temperature == 0.0

    def pick(probs_or_logits: torch.Tensor) -> int:
        if greedy:
            return int(probs_or_logits.argmax())
        return int(torch.multinomial(probs_or_logits, 1, generator=gen))

    stats = SpecStats(prompt_tokens=T)
    t0 = time.perf_counter()
    logits = target(input_ids, cache=t_cache, last_only=True)[0, -1]  # (V,)
    stats.target_forwards += 1
    tokens = input_ids[0].tolist()
    tokens.append(pick(logits if greedy else _probs(logits, temperature)))
    d_len = 0  # tokens the draft's cache holds (a prefix of `tokens`)
    while len(tokens) - T < max_new_tokens:
        kk = min(k, max_new_tokens - (len(tokens) - T) - 1)  # never emit past max_new_tokens
        drafts, q = [], []  # proposed tokens and, when sampling, the draft's distributions
        d_snap = None
        if kk and use_model:
            for i in range(kk):
                feed = torch.tensor([(tokens + drafts)[d_len:]], device=dev)  # what the draft has not read yet
                d_logits = draft(feed, cache=d_cache, last_only=True)[0, -1]
                stats.draft_forwards += 1
                d_len += feed.shape[1]
                if i == 0 and d_snaps:  # the draft holds exactly the kept tokens: the point to come back to
                    d_snap = d_cache.snapshot()
                dist = d_logits if greedy else _probs(d_logits, temperature)
                drafts.append(pick(dist))
                q.append(dist)
        elif kk:
            drafts = ngram_draft(tokens, kk, max_ngram)
        held = len(tokens) - 1  # the target holds every token but the last
        feed = torch.tensor([tokens[-1:] + drafts], device=dev)  # (1, 1 + len(drafts)): the verify step
        t_snap = t_cache.snapshot() if t_snaps else None
        t_logits = target(feed, cache=t_cache)[0]  # (1 + len(drafts), V)
        stats.target_forwards += 1
        n, extra = _verify(t_logits, drafts, q, temperature, gen, pick)
        stats.proposed += len(drafts)
        stats.accepted += n
        if t_snap is None:
            t_cache.crop(held + 1 + n)  # keep the fed last token and the n accepted drafts
        elif n < len(drafts):  # a state cannot be cropped: back to before the verify, then the kept tokens again
            t_cache.restore(t_snap)
            target(feed[:, :1 + n], cache=t_cache, last_only=True)
            stats.target_refeeds += 1
        tokens += drafts[:n] + [extra]
        if use_model and d_len > held + 1 + n:  # the draft forgets its rejected guesses too
            if d_snap is not None:
                d_cache.restore(d_snap)
                d_len = held + 1  # its next round's first forward reads the accepted tokens again
            else:
                d_len = held + 1 + n
                d_cache.crop(d_len)
    stats.seconds = time.perf_counter() - t0
    stats.new_tokens = len(tokens) - T
    return SpecGeneration(tokens=torch.tensor([tokens], device=dev), stats=stats)


def _verify(t_logits: torch.Tensor, drafts: list[int], q: list[torch.Tensor], temperature: float, gen, pick):
    """How many drafts the target accepts (n) and the token it emits after them."""
    if temperature == 0.0:
        choice = t_logits.argmax(dim=-1).tolist()  # the target's own next token after each prefix
        n = 0
        while n < len(drafts) and drafts[n] == choice[n]:
            n += 1
        return n, choice[n]  # the bonus token: the target's choice after the accepted prefix
    p = _probs(t_logits, temperature)  # (1 + len(drafts), V)
    for i, d in enumerate(drafts):
        q_i = q[i] if q else torch.nn.functional.one_hot(torch.tensor(d), p.shape[-1]).float().to(p.device)
        accept = min(1.0, float(p[i, d] / q_i[d]))
        if float(torch.rand((), generator=gen, device=p.device)) >= accept:
            residual = (p[i] - q_i).clamp(min=0)  # norm(max(0, p - q)): what p has that q over-proposed away
            return i, pick(residual / residual.sum())
    return len(drafts), pick(p[len(drafts)])
