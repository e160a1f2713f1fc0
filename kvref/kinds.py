"""Layer kinds: what each layer of a 2026 model keeps in its cache.

Older models cache the same thing in every layer (K and V of every token). Newer ones mix kinds,
written one per layer in ``ModelConfig.layer_types``:

    "full"       K and V of every token: 2 * S * H_kv * D numbers
    "sliding"    K and V of the ``sliding_window`` newest tokens only (a ring; Gemma 3, gpt-oss)
    "latent"     multi-head latent attention (MLA, DeepSeek-V2/V3): one compressed vector of
                 kv_lora_rank numbers plus one shared RoPE key of qk_rope_head_dim per token
    "sparse"     a latent cache plus a small indexer key per token; each query reads only the
                 index_topk best rows (DeepSeek Sparse Attention, V3.2): saves reads, not memory
    "csa"        compressed sparse attention (DeepSeek-V4): the window's K/V, one compressed row per
                 csa_rate tokens and an indexer key per compressed row; a query reads index_topk of them
    "hca"        heavily compressed attention (DeepSeek-V4): the window's K/V and one compressed row per
                 hca_rate tokens, all of which a query reads
    "linear"     linear attention (Gated DeltaNet, Qwen3-Next): a fixed-size state, whatever S is
    "shared:j"   no cache of its own: reads layer j's K/V (Gemma 3n and Gemma 4, Cross-Layer Attention)

kvref runs "full", "sliding", "latent", "shared" and "linear" (kvref.linear_attn); "sparse", "csa" and "hca"
are known to the memory planner only (and top-k selection is taught on its own in ``kvref.select``). So are three fields of
2026's models: ``k_is_v`` (one tensor is key and value, cached once), ``global_head_dim`` and
``global_n_kv_heads`` (the full layers' own width, Gemma 4).
"""

from __future__ import annotations

KINDS = ("full", "sliding", "latent", "sparse", "csa", "hca", "linear", "shared")
RUNNABLE = ("full", "sliding", "latent", "shared", "linear")
_MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim")
_SPARSE_FIELDS = ("index_topk", "index_head_dim")
PLANNER_ONLY_FIELDS = ("k_is_v", "global_head_dim", "global_n_kv_heads")  # shapes kvref's model does not run
INDEX_KEY_DTYPES = (None, "fp8")


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
            or cfg.rope_local_theta is not None or cfg.rope_scaling is not None
            or any(getattr(cfg, name) not in (None, False) for name in PLANNER_ONLY_FIELDS))


def check_runnable(cfg) -> None:
    """One ValueError when kvref can plan this config's memory but not run it (a kind or a field it does not run)."""
    for i in range(cfg.n_layers):
        if layer_kind(cfg, i) not in RUNNABLE:
            raise ValueError(f"layer_types[{i}] = {cfg.layer_types[i]!r}: kvref plans the memory of this kind but "
                             f"does not run it; runnable kinds: {', '.join(RUNNABLE)}")
    set_fields = [name for name in PLANNER_ONLY_FIELDS if getattr(cfg, name) not in (None, False)]
    if set_fields:
        raise ValueError(f"{', '.join(set_fields)}: kvref plans the memory of such layers but does not run them; "
                         f"leave {' and '.join(set_fields)} unset to build a model")


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
            "linear": _LINEAR_FIELDS, "csa": ("sliding_window", "csa_rate") + _SPARSE_FIELDS,
            "hca": ("sliding_window", "hca_rate")}
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


def validate_storage(cfg) -> None:
    """Check the fields that say how a layer stores what it keeps (any config, with or without layer_types)."""
    if not isinstance(cfg.k_is_v, bool):
        raise ValueError(f"k_is_v must be True or False; got {cfg.k_is_v!r}")
    for name in ("global_head_dim", "global_n_kv_heads"):
        v = getattr(cfg, name)
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be None (as the other layers) or an integer >= 1; got {v!r}")
    if cfg.global_n_kv_heads is not None and cfg.n_heads % cfg.global_n_kv_heads:
        raise ValueError(f"n_heads ({cfg.n_heads}) must be a multiple of global_n_kv_heads ({cfg.global_n_kv_heads})")
    if cfg.index_key_dtype not in INDEX_KEY_DTYPES:
        raise ValueError(f"index_key_dtype must be one of {INDEX_KEY_DTYPES}; got {cfg.index_key_dtype!r}")
    if cfg.linear_state_dtype is not None:
        from .units import bytes_per_element

        try:
            bytes_per_element(cfg.linear_state_dtype)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"linear_state_dtype must be None (the cache's dtype) or a dtype such as 'fp32'; "
                             f"got {cfg.linear_state_dtype!r}") from e
