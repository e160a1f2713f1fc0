"""The memory ledger, one layer at a time: what each layer kind keeps, as a formula and in bytes.

With b bytes per number, S tokens in a sequence and B sequences, one layer holds

    full      2 * S * H_kv * D * b                          K and V of every token
    sliding   2 * min(S, W) * H_kv * D * b                  the W newest tokens (a ring)
    latent    S * (r + d_R) * b                             MLA: latent r = kv_lora_rank, RoPE key d_R
    sparse    S * ((r + d_R) * b + i)                       latent + an indexer key of i bytes; reads k rows
    csa       2 * (min(S, W) + S // m) * H_kv * D * b       DeepSeek-V4: the window, one compressed row per
                + (S // m) * i                              m = csa_rate tokens and its indexer key; reads k
    hca       2 * (min(S, W) + S // m) * H_kv * D * b       the window and one row per m = hca_rate tokens
    linear    H_v * d_k * d_v * s + C * (K - 1) * b         Gated DeltaNet: the state matrix per value head
                                                            (s bytes a number) plus the last K - 1 inputs of
                                                            its short convolution (C = 2 * H_k * d_k + H_v * d_v
                                                            channels), whatever S is (0 before the first token)
    shared    0                                             reads an earlier layer's K/V

times B. Where a model stores keys and values as one tensor (``k_is_v``, DeepSeek-V4) the factor 2 is 1;
the full layers may have their own H_kv and D (``global_n_kv_heads``, ``global_head_dim``, Gemma 4).
An indexer key (sparse, csa) is i = d_I * b bytes, as HF transformers stores it, or with
``index_key_dtype="fp8"`` d_I bytes plus one fp32 scale per 128 numbers, as DeepSeek's inference code and
vLLM store it. The linear state is s = b bytes a number unless ``linear_state_dtype`` says otherwise (HF
and many engines keep it in fp32). The compressed kinds leave out the few tokens (fewer than m) waiting to
be compressed, whose storage differs between implementations.

``kvref.kv_cache_bytes`` is the sum over layers and equals ``cache.nbytes`` of kvref's caches for the
kinds kvref runs. The linear state counts K - 1 convolution inputs (what the convolution needs; vLLM's
Mamba-style state keeps K - 1, HF's cache pads to K).
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig
from .kinds import kind_counts, kv_source, layer_kind
from .units import GiB, bytes_per_element

# The notebook's planner exercise covers these presets; PRESETS_2026 adds the year's new layer shapes.
CH10_PRESETS = ("llama-3.1-8b", "deepseek-v3", "deepseek-v3.2", "gemma-3-27b", "gpt-oss-120b", "qwen3-next-80b-a3b",
                "gemma-3n-e4b")
PRESETS_2026 = ("deepseek-v4-flash", "glm-5.2", "gemma-4-e4b")
PLANNER_PRESETS = CH10_PRESETS + PRESETS_2026
FP8_SCALE_GROUP = 128  # an fp8 indexer key carries one fp32 scale per 128 numbers (DeepSeek-V3.2-Exp model.py)


def _conv_channels(cfg: ModelConfig) -> int:
    """q, k and v all pass through Gated DeltaNet's short convolution: C = 2 * H_k * d_k + H_v * d_v."""
    keys = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    return 2 * keys + cfg.linear_num_value_heads * cfg.linear_value_head_dim


def _linear_state_bytes(cfg: ModelConfig, b: int) -> int:
    s = bytes_per_element(cfg.linear_state_dtype) if cfg.linear_state_dtype is not None else b
    state = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim  # one d_k x d_v per head
    return state * s + _conv_channels(cfg) * (cfg.linear_conv_kernel_dim - 1) * b


def index_key_bytes(cfg: ModelConfig, dtype: torch.dtype | str = torch.bfloat16) -> int:
    """Bytes of one indexer key (sparse and csa layers): d_I numbers in the cache's dtype, or in fp8 with an
    fp32 scale per 128 numbers when ``cfg.index_key_dtype == "fp8"``."""
    if cfg.index_key_dtype == "fp8":
        return cfg.index_head_dim + 4 * math.ceil(cfg.index_head_dim / FP8_SCALE_GROUP)
    return cfg.index_head_dim * bytes_per_element(dtype)


def kv_row_bytes(cfg: ModelConfig, layer: int, dtype: torch.dtype | str = torch.float16) -> int:
    """Bytes of one token's K and V (one tensor where ``k_is_v``) in a full, sliding, csa or hca layer."""
    kind = layer_kind(cfg, layer)
    heads, dim = cfg.n_kv_heads, cfg.head_dim
    if kind == "full":
        heads, dim = cfg.global_n_kv_heads or heads, cfg.global_head_dim or dim
    return (1 if cfg.k_is_v else 2) * heads * dim * bytes_per_element(dtype)


def _compress_rate(cfg: ModelConfig, kind: str) -> int:
    return cfg.csa_rate if kind == "csa" else cfg.hca_rate


def per_token_bytes(cfg: ModelConfig, layer: int, dtype: torch.dtype | str = torch.float16) -> float:
    """Bytes one more token adds to ``layer`` once S is long (0 for sliding, linear and shared; a compressed
    layer adds a row every m tokens, so 1/m of one per token)."""
    kind, b = layer_kind(cfg, layer), bytes_per_element(dtype)
    if kind == "full":
        return kv_row_bytes(cfg, layer, dtype)
    if kind in ("latent", "sparse"):
        return (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * b + (index_key_bytes(cfg, dtype) if kind == "sparse" else 0)
    if kind in ("csa", "hca"):
        row = kv_row_bytes(cfg, layer, dtype) + (index_key_bytes(cfg, dtype) if kind == "csa" else 0)
        return row / _compress_rate(cfg, kind)
    return 0


def layer_kv_bytes(cfg: ModelConfig, layer: int, batch: int, seq_len: int,
                   dtype: torch.dtype | str = torch.float16) -> int:
    """Bytes layer ``layer`` holds for ``batch`` sequences of ``seq_len`` tokens (the table above)."""
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"layer must be in [0, {cfg.n_layers - 1}]; got {layer}")
    b, kind = bytes_per_element(dtype), layer_kind(cfg, layer)
    if kind == "full":
        return batch * seq_len * kv_row_bytes(cfg, layer, dtype)
    if kind == "sliding":
        return batch * min(seq_len, cfg.sliding_window) * kv_row_bytes(cfg, layer, dtype)
    if kind in ("latent", "sparse"):
        index = index_key_bytes(cfg, dtype) if kind == "sparse" else 0
        return batch * seq_len * ((cfg.kv_lora_rank + cfg.qk_rope_head_dim) * b + index)
    if kind in ("csa", "hca"):
        row, rows = kv_row_bytes(cfg, layer, dtype), seq_len // _compress_rate(cfg, kind)
        index = index_key_bytes(cfg, dtype) if kind == "csa" else 0
        return batch * (min(seq_len, cfg.sliding_window) * row + rows * (row + index))
    if kind == "linear":
        return batch * _linear_state_bytes(cfg, b) if seq_len > 0 else 0
    return 0  # shared


def layer_formula(cfg: ModelConfig, layer: int) -> str:
    """The formula of ``layer_kv_bytes`` for this layer, with its numbers, e.g.
    ``"2 * min(S, W) * H_kv * D * b  (W=1024, H_kv=16, D=128)"``."""
    kind = layer_kind(cfg, layer)
    two, kv = ("", "K = V, ") if cfg.k_is_v else ("2 * ", "")
    index = ("i" if cfg.index_key_dtype else "d_I * b")
    index_is = (f"i={index_key_bytes(cfg)} (d_I={cfg.index_head_dim} in fp8 and an fp32 scale)"
                if cfg.index_key_dtype else f"d_I={cfg.index_head_dim}")
    if kind in ("full", "sliding"):
        heads, dim = cfg.n_kv_heads, cfg.head_dim
        if kind == "full":
            heads, dim = cfg.global_n_kv_heads or heads, cfg.global_head_dim or dim
            return f"{two}S * H_kv * D * b  ({kv}H_kv={heads}, D={dim})"
        return f"{two}min(S, W) * H_kv * D * b  ({kv}W={cfg.sliding_window}, H_kv={heads}, D={dim})"
    if kind == "latent":
        return f"S * (r + d_R) * b  (r={cfg.kv_lora_rank}, d_R={cfg.qk_rope_head_dim})"
    if kind == "sparse":
        body = "S * (r + d_R + d_I) * b" if not cfg.index_key_dtype else "S * ((r + d_R) * b + i)"
        return (f"{body}, reads min(S, k) rows  (r={cfg.kv_lora_rank}, d_R={cfg.qk_rope_head_dim}, "
                f"{index_is}, k={cfg.index_topk})")
    if kind in ("csa", "hca"):
        m = _compress_rate(cfg, kind)
        body = f"{two}(min(S, W) + S // m) * H_kv * D * b"
        if kind == "csa":
            return (f"{body} + S // m * {index}, reads min(S // m, k) rows  ({kv}W={cfg.sliding_window}, m={m}, "
                    f"H_kv={cfg.n_kv_heads}, D={cfg.head_dim}, {index_is}, k={cfg.index_topk})")
        return f"{body}  ({kv}W={cfg.sliding_window}, m={m}, H_kv={cfg.n_kv_heads}, D={cfg.head_dim})"
    if kind == "linear":
        s = "s" if cfg.linear_state_dtype else "b"
        return (f"H_v * d_k * d_v * {s} + C * (K - 1) * b  (H_v={cfg.linear_num_value_heads}, "
                f"d_k={cfg.linear_key_head_dim}, "
                f"d_v={cfg.linear_value_head_dim}, C={_conv_channels(cfg)}, "
                f"K={cfg.linear_conv_kernel_dim}" + (f", s: {cfg.linear_state_dtype}" if cfg.linear_state_dtype else "")
                + ")")
    return f"0  (reads layer {kv_source(cfg, layer)})"


def kv_bytes_by_kind(cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype | str = torch.float16
                     ) -> dict[str, int]:
    """Bytes summed per layer kind (the stacks of chapter 10's figure); the values sum to kv_cache_bytes."""
    out = dict.fromkeys(kind_counts(cfg), 0)
    for i in range(cfg.n_layers):
        out[layer_kind(cfg, i)] += layer_kv_bytes(cfg, i, batch, seq_len, dtype)
    return out


def planner_rows(names: tuple[str, ...] = PLANNER_PRESETS, seq_lens: tuple[int, ...] = (8192, 131072),
                 dtype: torch.dtype | str = torch.bfloat16) -> list[dict]:
    """One row per preset and distinct per-layer formula: preset, kind, layers, formula, and
    ``bytes`` {seq_len: bytes of all those layers for one sequence, or None past the model's context
    (``max_seq_len``): a length the model was not built for is not planned}; then a "total" row per preset."""
    rows = []
    for name in names:
        cfg = ModelConfig.preset(name)
        groups: dict[str, list[int]] = {}
        for i in range(cfg.n_layers):
            formula = layer_formula(cfg, i)
            groups.setdefault(formula, []).append(i)
        fits = {s: s <= cfg.max_seq_len for s in seq_lens}
        for formula, layers in groups.items():
            rows.append({"preset": name, "kind": layer_kind(cfg, layers[0]), "layers": len(layers), "formula": formula,
                         "bytes": {s: sum(layer_kv_bytes(cfg, i, 1, s, dtype) for i in layers) if fits[s] else None
                                   for s in seq_lens}})
        rows.append({"preset": name, "kind": "total", "layers": cfg.n_layers, "formula": "",
                     "bytes": {s: _total(cfg, s, dtype) if fits[s] else None for s in seq_lens}})
    return rows


def _total(cfg: ModelConfig, seq_len: int, dtype) -> int:
    return sum(layer_kv_bytes(cfg, i, 1, seq_len, dtype) for i in range(cfg.n_layers))


def planner_table(names: tuple[str, ...] = PLANNER_PRESETS, seq_lens: tuple[int, ...] = (8192, 131072),
                  dtype: torch.dtype | str = torch.bfloat16) -> str:
    """planner_rows as a markdown table (GiB per sequence; "past its context" where S > max_seq_len)."""
    head = "| preset | kind | layers | per-layer formula | " + " | ".join(f"S={s}" for s in seq_lens) + " |"
    lines = [head, "|" + "---|" * (4 + len(seq_lens))]
    for r in planner_rows(names, seq_lens, dtype):
        cells = " | ".join("past its context" if r["bytes"][s] is None else f"{r['bytes'][s] / GiB:.3f} GiB"
                           for s in seq_lens)
        kind = "**total**" if r["kind"] == "total" else r["kind"]
        lines.append(f"| {r['preset']} | {kind} | {r['layers']} | {r['formula']} | {cells} |")
    return "\n".join(lines)


# -- MLA: bytes read per decode step ------------------------------------------------------------------------
MLA_FORMS = ("naive", "absorbed")


def mla_decode_read_bytes(cfg: ModelConfig, seq_len: int, form: str, dtype: torch.dtype | str = torch.bfloat16,
                          batch: int = 1) -> dict[str, int]:
    """Bytes one decode step reads in the attention of every latent (or sparse) layer, S = ``seq_len`` keys.

    Both forms read the latent cache once (``cache``: B * S * (r + d_R)) and the up-projection
    W_UKV (``weights``: H * (d_nope + d_v) * r). The naive form multiplies every cached latent by
    it, writing per-head keys and values that attention then reads (``expanded``:
    B * S * H * (d_nope + d_R + d_v)); the absorbed form folds W_UK into the query and W_UV into the
    output, so attention reads the latent rows directly (``expanded`` = 0).
    Counted by kvref.mla's ``reads`` argument too (tests compare the two).
    """
    if form not in MLA_FORMS:
        raise ValueError(f"form must be one of {MLA_FORMS}; got {form!r}")
    layers = sum(layer_kind(cfg, i) in ("latent", "sparse") for i in range(cfg.n_layers))
    if not layers:
        raise ValueError("this config has no latent (MLA) layers")
    H, r, dR, dn, dv = cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
    b = bytes_per_element(dtype)
    out = {"cache": batch * seq_len * (r + dR), "weights": H * (dn + dv) * r,
           "expanded": batch * seq_len * H * (dn + dR + dv) if form == "naive" else 0}
    out = {k: v * b * layers for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def latent_vs_heads(cfg: ModelConfig, dtype: torch.dtype | str = torch.bfloat16, n_kv_heads: int = 8
                    ) -> dict[str, int]:
    """Cache bytes per token (all layers) of an MLA config against MHA and GQA of the same width:
    K of d_nope + d_R and V of d_v per head, for H heads ("mha") or ``n_kv_heads`` ("gqa")."""
    layers = sum(layer_kind(cfg, i) in ("latent", "sparse") for i in range(cfg.n_layers))
    per_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim
    b = bytes_per_element(dtype)
    return {"mla": layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * b,
            "gqa": layers * n_kv_heads * per_head * b, "mha": layers * cfg.n_heads * per_head * b}


# -- tensor parallelism: the cache one rank holds ---------------------------------------------------------
TP_KINDS = ("full", "sliding", "latent", "sparse")  # shared layers hold nothing on any rank


def kv_heads_per_rank(n_kv_heads: int, world_size: int) -> int:
    """K/V heads one of W tensor-parallel ranks keeps: H_kv / W, or one replica once W > H_kv
    (vLLM: ``max(1, num_kv_heads // tp_size)``)."""
    return max(1, n_kv_heads // world_size)


def per_rank_kv_bytes(cfg: ModelConfig, world_size: int, batch: int, seq_len: int,
                      dtype: torch.dtype | str = torch.float16) -> int:
    """Bytes of cache on each of ``world_size`` tensor-parallel ranks (every rank holds the same amount).

    full, sliding: the rank's K/V heads, max(1, H_kv // W) of H_kv: the bytes shrink with W until W = H_kv,
                   then stay (each K/V head is replicated on W / H_kv ranks);
    latent, sparse: MLA's latent serves every head, so it is not split: every rank keeps it whole.
    Other kinds (linear, csa, hca) are refused. W must divide H and either divide H_kv or be a multiple of it.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    if cfg.n_heads % world_size:
        raise ValueError(f"world_size {world_size} must divide the {cfg.n_heads} query heads")
    total = 0
    for i in range(cfg.n_layers):
        kind, b = layer_kind(cfg, i), layer_kv_bytes(cfg, i, batch, seq_len, dtype)
        if kind in ("latent", "sparse") or kind.startswith("shared"):
            total += b  # the latent is whole on every rank; a shared layer holds 0
        elif kind in ("full", "sliding"):
            heads = (cfg.global_n_kv_heads or cfg.n_kv_heads) if kind == "full" else cfg.n_kv_heads
            if heads % world_size and world_size % heads:
                raise ValueError(f"world_size {world_size} must divide H_kv={heads} or be a multiple of it "
                                 f"(layer {i})")
            total += b // heads * kv_heads_per_rank(heads, world_size)
        else:
            raise ValueError(f"layer {i} is {kind!r}; per-rank bytes cover the kinds {TP_KINDS} (and shared)")
    return total
