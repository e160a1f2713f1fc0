"""The memory ledger: how many bytes the KV cache takes, and how much of it a GPU can hold.

Every layer keeps one key and one value vector per token per K/V head, so

    KV bytes = 2 * L * B * S * H_kv * D * bytes_per_element

(2 for K and V). For an MHA model H_kv * D is the hidden size; GQA/MQA models store fewer heads
and the formula must use H_kv, not the hidden size. Worked example (the course's running one):
llama-2-7b is 32 layers of 32 heads of 128 = 4096 hidden, so in fp16 one token costs
2 * 32 * 4096 * 2 B = 512 KiB, and a 4096-token sequence 2 GiB. Twice that at 8K, eight times at
batch 8. The weights (6.74 B parameters) take another 12.6 GiB, so a 24 GiB card has about 11 GiB
left, minus what activations need: enough for ~5 such sequences, not for 8.

``kv_cache_bytes`` reproduces ``cache.nbytes`` of every kvref cache to the byte; ``plan_memory``
turns the ledger around and answers deployment questions (largest batch, longest context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import ModelConfig

# Per-layer kinds (chapter 10) live in kvref.planner, below this ledger; their names are importable from here too.
from .planner import (CH10_PRESETS, PLANNER_PRESETS, PRESETS_2026, index_key_bytes,  # noqa: F401
                      kv_bytes_by_kind, kv_row_bytes, latent_vs_heads, layer_formula, layer_kv_bytes,
                      mla_decode_read_bytes, per_token_bytes, planner_rows, planner_table)
from .units import DTYPES, GiB, as_dtype, bytes_per_element  # noqa: F401  (the ledger's names)


def _per_layer(cfg: ModelConfig) -> bool:
    """Does this config need the per-layer sum (kvref.planner): layer kinds, or layers of their own shape?"""
    from .kinds import PLANNER_ONLY_FIELDS

    return cfg.layer_types is not None or any(getattr(cfg, n) not in (None, False) for n in PLANNER_ONLY_FIELDS)


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype | str = torch.float16) -> int | float:
    """Bytes one token adds to the cache across all layers: 2 * L * H_kv * D * bytes.

    With per-layer kinds (``cfg.layer_types``): what one more token adds once S is long, i.e. the
    full, latent and sparse layers, and a compressed (csa, hca) layer's row every m tokens, 1/m of it per
    token (a float where that is not a whole number of bytes); sliding, linear and shared layers stop
    growing (see layer_kv_bytes).
    """
    if not _per_layer(cfg):
        return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_element(dtype)
    total = sum(per_token_bytes(cfg, i, dtype) for i in range(cfg.n_layers))
    return int(total) if total == int(total) else total


def kv_cache_bytes(cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype | str = torch.float16, *,
                   block_size: int | None = None, kv_bits: int | None = None, group_size: int | None = None,
                   residual: int = 0) -> int:
    """Bytes of K/V for ``batch`` sequences of ``seq_len`` tokens each; equals ``cache.nbytes``.

    Plain (StaticCache at its max_len, DynamicCache at its length):
        2 * L * batch * seq_len * H_kv * D * bytes_per_element(dtype).
    ``block_size`` (PagedKVCache): blocks are handed out whole, so each sequence is rounded up to a
        multiple of ``block_size`` tokens; a pool of N blocks is ``batch=1, seq_len=N * block_size``.
    ``kv_bits`` (QuantizedCache(bits, group_size, residual)): ``dtype`` is then the compute dtype,
        and the bill is kvref.quant.quantized_kv_bytes: int codes (8 bits: 1 byte, 4 bits: half a
        byte per element), one scale and one zero point in ``dtype`` per group of ``group_size``
        elements (default head_dim; keys grouped per channel over tokens, values per token over
        channels), and the newest tokens (``residual`` of them, plus an unfinished key group) in
        full precision.
    """
    _check_counts(batch, seq_len)
    if _per_layer(cfg):
        if block_size is not None or kv_bits is not None:
            raise ValueError("block_size and kv_bits are modelled for configs without layer_types only; "
                             f"this one has layer kinds {sorted(set(cfg.layer_types or ('full',)))}"
                             " or per-layer shapes (k_is_v, global_head_dim, global_n_kv_heads)")
        # per-layer kinds: the bill is a sum over layers (kvref.planner)
        return sum(layer_kv_bytes(cfg, i, batch, seq_len, dtype) for i in range(cfg.n_layers))
    if kv_bits is not None:
        if block_size is not None:
            raise ValueError("block_size and kv_bits together are not modelled; give one or the other")
        from .quant import BITS, quantized_kv_bytes  # the quantized cache owns its formula

        if kv_bits not in BITS:
            raise ValueError(f"kv_bits must be one of {BITS}; got {kv_bits!r}")
        if group_size is not None and (not isinstance(group_size, int) or group_size < 1 or cfg.head_dim % group_size):
            raise ValueError(f"group_size must divide head_dim={cfg.head_dim} (or be None = head_dim); got {group_size!r}")
        if not isinstance(residual, int) or residual < 0:
            raise ValueError(f"residual (tokens kept in full precision) must be an integer >= 0; got {residual!r}")
        return quantized_kv_bytes(cfg, batch, seq_len, as_dtype(dtype), kv_bits, group_size, residual)
    if block_size is not None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1; got {block_size!r}")
        seq_len = block_size * math.ceil(seq_len / block_size)
    return batch * seq_len * kv_bytes_per_token(cfg, dtype)


def _check_counts(batch: int, seq_len: int) -> None:
    for name, v in (("batch", batch), ("seq_len", seq_len)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0; got {v!r}")


def param_count(cfg: ModelConfig) -> int:
    """Parameters of ``Transformer(cfg)``, counted from the shape alone (no weights needed)."""
    if cfg.layered:
        raise ValueError("param_count counts GPT-2/Llama shapes only; this config has per-layer kinds or Gemma/Qwen3 "
                         "options (layer_types, qk_norm, ...): pass weights=<bytes> to plan_memory instead")
    d, H, H_kv, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    gpt2 = cfg.arch == "gpt2"
    attn = d * (H + 2 * H_kv) * D + H * D * d  # qkv and output projection
    attn += (H + 2 * H_kv) * D * cfg.qkv_bias + d * gpt2  # their biases
    mlp = (2 * d * F + F + d) if gpt2 else 3 * d * F  # up/down (+biases) or gate/up/down
    norm = 2 * d if gpt2 else d  # LayerNorm has a bias, RMSNorm does not
    total = cfg.n_layers * (attn + mlp + 2 * norm) + norm  # + the final norm
    total += cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)  # embedding (+ untied lm_head)
    return total + (cfg.max_seq_len * d if gpt2 else 0)  # learned positions


def weight_bytes(cfg: ModelConfig, dtype: torch.dtype | str = torch.float16) -> int:
    """Bytes of the weights: parameter count x bytes per element (llama-2-7b fp16: 12.6 GiB)."""
    return param_count(cfg) * bytes_per_element(dtype)


@dataclass
class MemoryPlan:
    """What fits on one device. All sizes in bytes; ``explain()`` says it in one sentence."""

    device_bytes: int
    weight_bytes: int
    reserve_bytes: int  # activations, temporary buffers, allocator slack
    kv_budget_bytes: int  # what is left for the KV cache (0 if the weights alone do not fit)
    bytes_per_token: int
    kv_tokens: int  # tokens of K/V that fit in the budget (all sequences together)
    batch: int
    seq_len: int
    need_bytes: int  # KV bytes for `batch` sequences of `seq_len` tokens
    max_batch: int  # most sequences of `seq_len` tokens that fit
    max_seq_len: int  # longest context that fits at `batch` (also capped by the model's max_seq_len)
    model_max_seq_len: int

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.kv_budget_bytes

    def explain(self) -> str:
        g = lambda x: f"{x / GiB:.2f} GiB"  # noqa: E731
        seqs = lambda n: f"{n} sequence{'s' * (n != 1)}"  # noqa: E731
        head = (f"to serve {seqs(self.batch)} of {self.seq_len} tokens you need {g(self.need_bytes)} of KV cache "
                f"(+ {g(self.weight_bytes)} weights + {g(self.reserve_bytes)} reserve = "
                f"{g(self.need_bytes + self.weight_bytes + self.reserve_bytes)}); you have {g(self.device_bytes)}")
        if self.kv_budget_bytes <= 0:
            return head + ", which does not even hold the weights and the reserve."
        cap = " (the model's limit)" if self.max_seq_len == self.model_max_seq_len else ""
        verdict = "it fits" if self.fits else "it does not fit"
        if self.seq_len > self.model_max_seq_len:
            verdict += f" in memory, but the model only takes {self.model_max_seq_len} tokens"
        return (f"{head}, leaving {g(self.kv_budget_bytes)} for {self.kv_tokens} tokens of KV: "
                f"{verdict}; at most {seqs(self.max_batch)} of "
                f"{self.seq_len} tokens, or {seqs(self.batch)} of up to {self.max_seq_len} tokens{cap}.")


def plan_memory(cfg: ModelConfig, device_bytes: int, *, batch: int = 1, seq_len: int | None = None,
                dtype: torch.dtype | str = torch.float16, weights: int | None = None, reserve_bytes: int = 0,
                **cache_kind) -> MemoryPlan:
    """Plan a deployment: device memory - weights - reserve = KV budget, then what fits in it.

    ``weights`` defaults to ``weight_bytes(cfg, dtype)``; ``seq_len`` to the model's max_seq_len.
    ``cache_kind`` (block_size=..., or kv_bits=..., group_size=..., residual=...) is passed on to
    ``kv_cache_bytes``, so the plan accounts for paging or quantization (int8 halves fp16's bill).

        >>> plan_memory(ModelConfig.preset("llama-2-7b"), 24 * GiB, batch=8, seq_len=4096).explain()
    """
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    weights = weight_bytes(cfg, dtype) if weights is None else weights
    size = lambda b, s: kv_cache_bytes(cfg, b, s, dtype, **cache_kind)  # noqa: E731
    need = size(batch, seq_len)
    budget = max(device_bytes - weights - reserve_bytes, 0)
    per_seq = size(1, seq_len)
    lo, hi = 0, cfg.max_seq_len  # the longest context at this batch: a binary search on a monotone size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(batch, mid) <= budget else (lo, mid - 1)
    return MemoryPlan(
        device_bytes=device_bytes, weight_bytes=weights, reserve_bytes=reserve_bytes, kv_budget_bytes=budget,
        bytes_per_token=kv_bytes_per_token(cfg, dtype), kv_tokens=budget // max(kv_bytes_per_token(cfg, dtype), 1),
        batch=batch, seq_len=seq_len, need_bytes=need, max_batch=budget // per_seq if per_seq else 0,
        max_seq_len=lo, model_max_seq_len=cfg.max_seq_len,
    )


def preset_table(seq_len: int = 4096, dtype: torch.dtype | str = torch.float16) -> str:
    """A markdown table of KV bytes per token and per ``seq_len``-token sequence for every preset."""
    from .config import PRESETS

    rows = ["| preset | L | H_kv x D | KV / token | KV at %d tokens |" % seq_len, "|---|---|---|---|---|"]
    for name, cfg in PRESETS.items():
        rows.append(f"| {name} | {cfg.n_layers} | {cfg.n_kv_heads} x {cfg.head_dim} | "
                    f"{kv_bytes_per_token(cfg, dtype) / 1024:.0f} KiB | "
                    f"{kv_cache_bytes(cfg, 1, seq_len, dtype) / GiB:.3f} GiB |")
    return "\n".join(rows)
