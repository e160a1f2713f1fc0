"""Layer kinds: what each layer of a 2026 model keeps in its cache.

Older models cache the same thing in every layer (K and V of every token). Newer ones mix kinds,
written one per layer in ``ModelConfig.layer_types``:

    "full"       K and V of every token: 2 * S * H_kv * D numbers
    "sliding"    K and V of the ``sliding_window`` newest tokens only (a ring; Gemma 3, gpt-oss)
    "latent"     multi-head latent attention (MLA, DeepSeek-V2/V3): one compressed vector of
                 kv_lora_rank numbers plus one shared RoPE key of qk_rope_head_dim per token
    "sparse"     a latent cache plus a small indexer key per token; each query reads only the
                 index_topk best rows (DeepSeek Sparse Attention, V3.2): saves reads, not memory
    "linear"     linear attention (Gated DeltaNet, Qwen3-Next): a fixed-size state, whatever S is
    "shared:j"   no cache of its own: reads layer j's K/V (Gemma 3n, Cross-Layer Attention)

kvref runs "full", "sliding", "latent" and "shared"; "sparse" and "linear" are known to the memory
planner only (and top-k selection is taught on its own in ``kvref.select``).
"""

from __future__ import annotations

KINDS = ("full", "sliding", "latent", "sparse", "linear", "shared")
RUNNABLE = ("full", "sliding", "latent", "shared")
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim")
_SPARSE_FIELDS = ("index_topk", "index_head_dim")


def shared(j: int) -> str:
    """The layer kind "reads layer j's K/V", e.g. ``shared(19) == "shared:19"``."""
    return f"shared:{j}"


def layer_kind(cfg, layer: int) -> str:
    """The kind of ``layer`` ("full", "sliding", ..., "shared"), also for configs without layer_types."""
    if cfg.layer_types is None:  # the old configs: every layer caches everything (a window is only a mask)
        return "full"
    kind = cfg.layer_types[layer]
    return "shared" if kind.startswith("shared:") else kind


def kv_source(cfg, layer: int) -> int:
    """The layer whose K/V ``layer`` reads: itself, or j for a "shared:j" layer."""
    if cfg.layer_types is None or not cfg.layer_types[layer].startswith("shared:"):
        return layer
    return int(cfg.layer_types[layer].split(":", 1)[1])


def is_layered(cfg) -> bool:
    """Does this config need the per-layer path (kvref.layers), not the GPT-2/Llama one?"""
    return (cfg.layer_types is not None or cfg.arch == "gemma" or cfg.qk_norm or cfg.attn_scale is not None
            or cfg.rope_local_theta is not None or cfg.rope_scaling is not None)


def kind_counts(cfg) -> dict[str, int]:
    """How many layers of each kind, in KINDS order (kinds with no layer left out)."""
    kinds = [layer_kind(cfg, i) for i in range(cfg.n_layers)]
    return {k: kinds.count(k) for k in KINDS if k in kinds}


def validate(cfg) -> None:
    """Check the per-layer fields of a ModelConfig; one ValueError naming the field and its value."""
    if cfg.layer_types is None:
        return
    types = cfg.layer_types
    if not isinstance(types, tuple):
        raise ValueError(f"layer_types must be a tuple of strings; got {type(types).__name__}")
    if len(types) != cfg.n_layers:
        raise ValueError(f"layer_types has {len(types)} entries but n_layers is {cfg.n_layers}: one kind per layer")
    for i, t in enumerate(types):
        kind = "shared" if isinstance(t, str) and t.startswith("shared:") else t
        if kind not in KINDS:
            raise ValueError(f"layer_types[{i}] = {t!r} is not a layer kind kvref knows; allowed: "
                             f"{', '.join(k for k in KINDS if k != 'shared')} or 'shared:j' (j an earlier layer)")
        if kind == "shared":
            j = t.split(":", 1)[1]
            if not j.isdigit() or not int(j) < i:
                raise ValueError(f"layer_types[{i}] = {t!r}: a shared layer reads an earlier layer, 'shared:j' with "
                                 f"0 <= j < {i}")
            if types[int(j)].startswith("shared:") or types[int(j)] in ("linear",):
                raise ValueError(f"layer_types[{i}] = {t!r}: layer {j} is {types[int(j)]!r}; a shared layer must "
                                 f"read a layer that has K/V of its own (full, sliding, latent, sparse)")
    kinds = {layer_kind(cfg, i) for i in range(cfg.n_layers)}
    need = {"sliding": ("sliding_window",), "latent": _MLA_FIELDS, "sparse": _MLA_FIELDS + _SPARSE_FIELDS,
            "linear": _LINEAR_FIELDS}
    for kind, names in need.items():
        if kind in kinds:
            for name in names:
                v = getattr(cfg, name)
                if not isinstance(v, int) or v < 1:
                    raise ValueError(f"a {kind!r} layer needs {name} (an integer >= 1); got {v!r}")
    if {"latent", "sparse"} & kinds and cfg.qk_rope_head_dim % 2:
        raise ValueError(f"RoPE rotates pairs of channels: qk_rope_head_dim must be even; got {cfg.qk_rope_head_dim}")
    if cfg.q_lora_rank is not None and (not isinstance(cfg.q_lora_rank, int) or cfg.q_lora_rank < 1):
        raise ValueError(f"q_lora_rank must be None (plain q projection) or an integer >= 1; got {cfg.q_lora_rank!r}")
