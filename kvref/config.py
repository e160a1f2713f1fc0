"""One dataclass that says what a model looks like, plus presets of real models.

Notation used everywhere in the course (code, book, notebooks):

    B    batch size                 T    tokens in this forward call
    H    query heads                H_kv key/value heads (H_kv divides H)
    D    head dimension             L    layers
    S    tokens held by the cache   V    vocabulary size
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

ARCHS = ("gpt2", "llama", "gemma")
ATTN_IMPLS = ("sdpa", "manual")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer.

    ``arch="gpt2"``: learned positions, LayerNorm, GELU MLP, biases everywhere, MHA.
    ``arch="llama"``: RoPE, RMSNorm, SwiGLU MLP, grouped-query attention through
    ``n_kv_heads``, optional q/k/v bias (Qwen2 has it).
    Fields left as ``None`` get the usual default in ``__post_init__``.
    """

    arch: str = "llama"
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None -> n_heads (MHA); 1 -> MQA; in between -> GQA
    d_model: int = 64
    head_dim: int | None = None  # None -> d_model // n_heads
    d_ff: int | None = None  # None -> 4 * d_model (gpt2) or the SwiGLU rule of thumb (llama)
    vocab_size: int = 256
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    qkv_bias: bool | None = None  # None -> True for gpt2, False for llama
    norm_eps: float = 1e-5
    sliding_window: int | None = None  # attend to at most this many most recent tokens (Mistral)
    attn_impl: str = "sdpa"  # "sdpa" (fused) or "manual" (written out step by step)
    # -- per-layer kinds (chapter 10; kvref.kinds). Defaults keep every older config as it was. --------------
    layer_types: tuple[str, ...] | None = None  # one kind per layer: full, sliding, latent, sparse, linear, shared:j
    qk_norm: bool = False  # RMSNorm over D on q and k before RoPE (Qwen3, Gemma 3)
    attn_scale: float | None = None  # softmax scale; None -> 1/sqrt(q.k dimension)
    rope_local_theta: float | None = None  # RoPE base of "sliding" layers (Gemma 3); None -> rope_theta
    rope_scaling: float | None = None  # linear RoPE factor of the other layers (positions / factor); None: none
    kv_lora_rank: int | None = None  # MLA: latent width r cached per token
    q_lora_rank: int | None = None  # MLA: query bottleneck (None: one plain q projection)
    qk_rope_head_dim: int | None = None  # MLA: d_R, the RoPE part of q and k (its key is shared by all heads)
    qk_nope_head_dim: int | None = None  # MLA: the position-free part of q and k per head
    v_head_dim: int | None = None  # MLA: value width per head
    index_topk: int | None = None  # sparse selection: rows each query reads (DeepSeek-V3.2: 2048)
    index_head_dim: int | None = None  # sparse selection: indexer key width cached per token
    linear_num_key_heads: int | None = None  # Gated DeltaNet (Qwen3-Next) state shape
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    linear_state_dtype: str | None = None  # the state matrix's storage: None -> the cache's dtype; "fp32" as HF keeps it
    index_key_dtype: str | None = None  # indexer key: None -> the cache's dtype (HF); "fp8" + an fp32 scale (DeepSeek, vLLM)
    # -- 2026: DeepSeek-V4's compressed layers, Gemma 4's wider global layers (planner only) ------------------------
    k_is_v: bool = False  # one tensor is both key and value (DeepSeek-V4's shared-KV MQA): cached once, not twice
    csa_rate: int | None = None  # "csa" layers: one compressed row per csa_rate tokens (DeepSeek-V4: 4)
    hca_rate: int | None = None  # "hca" layers: one compressed row per hca_rate tokens (DeepSeek-V4: 128)
    global_head_dim: int | None = None  # D of the "full" layers where it differs from the others' (Gemma 4: 512)
    global_n_kv_heads: int | None = None  # H_kv of the "full" layers where it differs (Gemma 4 31B: 4)

    def __post_init__(self) -> None:
        def fix(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}; got {self.arch!r}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}; got {self.attn_impl!r}")
        for name in ("n_layers", "n_heads", "d_model", "vocab_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.n_kv_heads is None:
            fix("n_kv_heads", self.n_heads)
        if not 1 <= self.n_kv_heads <= self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}): "
                f"each K/V head serves n_heads / n_kv_heads query heads. "
                f"Allowed n_kv_heads here: {[h for h in range(1, self.n_heads + 1) if self.n_heads % h == 0]}"
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model ({self.d_model}) is not divisible by n_heads ({self.n_heads}); "
                    f"give head_dim explicitly"
                )
            fix("head_dim", self.d_model // self.n_heads)
        if self.arch != "gpt2" and self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of channels, so head_dim must be even; got {self.head_dim}")
        if self.d_ff is None:
            fix("d_ff", 4 * self.d_model if self.arch == "gpt2" else _swiglu_hidden(self.d_model))
        if self.qkv_bias is None:
            fix("qkv_bias", self.arch == "gpt2")
        if self.arch == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ValueError("arch='gpt2' is multi-head attention: n_kv_heads must equal n_heads")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None; got {self.sliding_window}")
        if isinstance(self.layer_types, list):
            fix("layer_types", tuple(self.layer_types))
        from .kinds import is_layered, validate, validate_storage

        validate(self)
        validate_storage(self)
        if self.arch == "gpt2" and is_layered(self):
            raise ValueError("arch='gpt2' has no per-layer kinds, q/k norms or RoPE options; use arch='llama'")
        for name in ("attn_scale", "rope_local_theta", "rope_scaling"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"{name} must be None or > 0; got {v!r}")

    @property
    def n_rep(self) -> int:
        """How many query heads share one K/V head (H / H_kv)."""
        return self.n_heads // self.n_kv_heads

    @property
    def layered(self) -> bool:
        """True when some layer is not the plain GPT-2/Llama kind (the model takes kvref.layers' path)."""
        from .kinds import is_layered

        return is_layered(self)

    def with_(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (and re-validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"ModelConfig has no field(s) {sorted(unknown)}")
        return replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **changes) -> "ModelConfig":
        """The published shape of a real model, e.g. ``ModelConfig.preset("llama-3-8b")`` (PRESETS, and
        chapter 10's MODERN_PRESETS, e.g. ``"deepseek-v3"``)."""
        known = {**PRESETS, **MODERN_PRESETS}
        if name not in known:
            raise KeyError(f"unknown preset {name!r}; choose one of {sorted(known)}")
        return known[name].with_(**changes) if changes else known[name]


def _swiglu_hidden(d_model: int, multiple_of: int = 64) -> int:
    """LLaMA's rule: 2/3 of 4*d_model, rounded up to a multiple of 64."""
    hidden = int(2 * 4 * d_model / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


# Shapes from each model's published config.json (weights are not needed for memory arithmetic).
PRESETS: dict[str, ModelConfig] = {
    "gpt2": ModelConfig(
        arch="gpt2", n_layers=12, n_heads=12, d_model=768, vocab_size=50257, max_seq_len=1024,
        tie_embeddings=True,
    ),
    "llama-2-7b": ModelConfig(
        arch="llama", n_layers=32, n_heads=32, n_kv_heads=32, d_model=4096, d_ff=11008,
        vocab_size=32000, max_seq_len=4096, rope_theta=10000.0, tie_embeddings=False, norm_eps=1e-5,
    ),
    "llama-3-8b": ModelConfig(
        arch="llama", n_layers=32, n_heads=32, n_kv_heads=8, d_model=4096, d_ff=14336,
        vocab_size=128256, max_seq_len=8192, rope_theta=500000.0, tie_embeddings=False, norm_eps=1e-5,
    ),
    "mistral-7b": ModelConfig(
        arch="llama", n_layers=32, n_heads=32, n_kv_heads=8, d_model=4096, d_ff=14336,
        vocab_size=32000, max_seq_len=32768, rope_theta=1000000.0, tie_embeddings=False, norm_eps=1e-5,
    ),
    "qwen2.5-7b": ModelConfig(
        arch="llama", n_layers=28, n_heads=28, n_kv_heads=4, d_model=3584, d_ff=18944,
        vocab_size=152064, max_seq_len=32768, rope_theta=1000000.0, tie_embeddings=False,
        qkv_bias=True, norm_eps=1e-6,
    ),
}


# -- chapter 10: models whose layers cache different things (memory shapes; kvref does not run MoE layers) ------
def _pattern(n: int, every: int, other: str, last: str = "full") -> tuple[str, ...]:
    """n layers, each ``every``-th one ``last`` and the rest ``other`` (5 sliding : 1 full is every=6)."""
    return tuple(last if (i + 1) % every == 0 else other for i in range(n))


def _shared_tail(base: tuple[str, ...], n_shared: int) -> tuple[str, ...]:
    """The last ``n_shared`` layers of ``base`` read the last earlier layer of their kind (Gemma 3n, Gemma 4)."""
    own = len(base) - n_shared
    src = {k: max(i for i in range(own) if base[i] == k) for k in ("sliding", "full")}
    return base[:own] + tuple(f"shared:{src[k]}" for k in base[own:])


def _gemma3n_types(n: int = 35, n_shared: int = 15) -> tuple[str, ...]:
    """Gemma 3n: 4 sliding : 1 full; the last ``n_shared`` layers read the last earlier layer of their kind."""
    return _shared_tail(_pattern(n, 5, "sliding"), n_shared)


def _glm52_types(n: int = 78, freq: int = 4, offset: int = 3) -> tuple[str, ...]:
    """GLM-5.2's indexer_types: a layer runs the DSA indexer ("sparse": it caches the indexer key) when
    max(i - offset + 1, 0) % freq == 0; the others reuse that layer's top-k and cache the latent only."""
    return tuple("sparse" if max(i - offset + 1, 0) % freq == 0 else "latent" for i in range(n))


# Kept apart from PRESETS, which chapters 3 and 4 walk as "the models of this course" (GPT-2/Llama shapes
# with weights kvref can count): these are for the per-layer planner (kvref.planner, chapter 10).
MODERN_PRESETS: dict[str, ModelConfig] = {
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json: Llama-3-8B's shape with a 128K context
    # (max_position_embeddings 131072; its "llama3" RoPE scaling, which the cache does not feel, is left out).
    # Chapter 10's full-attention baseline at 128K: every layer "full", no layer_types.
    "llama-3.1-8b": ModelConfig(
        arch="llama", n_layers=32, n_heads=32, n_kv_heads=8, d_model=4096, d_ff=14336,
        vocab_size=128256, max_seq_len=131072, rope_theta=500000.0, tie_embeddings=False, norm_eps=1e-5,
    ),
    # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (61 layers, MLA in every layer;
    # first_k_dense_replace 3: layers 3-60 are MoE, which only the weights, not the cache, feel)
    "deepseek-v3": ModelConfig(
        arch="llama", n_layers=61, n_heads=128, n_kv_heads=128, d_model=7168, head_dim=192, d_ff=18432,
        vocab_size=129280, max_seq_len=163840, rope_theta=10000.0, tie_embeddings=False, norm_eps=1e-6,
        layer_types=("latent",) * 61, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128,
    ),
    # https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/config.json: V3's shape plus the
    # lightning indexer (index_topk 2048, index_head_dim 128) in every layer
    "deepseek-v3.2": ModelConfig(
        arch="llama", n_layers=61, n_heads=128, n_kv_heads=128, d_model=7168, head_dim=192, d_ff=18432,
        vocab_size=129280, max_seq_len=163840, rope_theta=10000.0, tie_embeddings=False, norm_eps=1e-6,
        layer_types=("sparse",) * 61, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128, index_topk=2048, index_head_dim=128,
    ),
    # https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (text_config; sliding_window_pattern 6:
    # 5 local layers with window 1024, then one global; global RoPE 1e6 with linear factor 8, local 1e4)
    "gemma-3-27b": ModelConfig(
        arch="gemma", n_layers=62, n_heads=32, n_kv_heads=16, d_model=5376, head_dim=128, d_ff=21504,
        vocab_size=262208, max_seq_len=131072, rope_theta=1000000.0, tie_embeddings=True, norm_eps=1e-6,
        sliding_window=1024, layer_types=_pattern(62, 6, "sliding"), qk_norm=True, attn_scale=168 ** -0.5,
        rope_local_theta=10000.0, rope_scaling=8.0,
    ),
    # https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json (36 layers alternating sliding window 128
    # and full, H_kv 8 x D 64; 128 experts and attention sinks, which the cache does not feel)
    "gpt-oss-120b": ModelConfig(
        arch="llama", n_layers=36, n_heads=64, n_kv_heads=8, d_model=2880, head_dim=64, d_ff=2880,
        vocab_size=201088, max_seq_len=131072, rope_theta=150000.0, tie_embeddings=False,
        sliding_window=128, layer_types=_pattern(36, 2, "sliding"),
    ),
    # https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json (full_attention_interval 4:
    # 3 Gated DeltaNet layers, then one gated full-attention layer with H_kv 2 x D 256)
    "qwen3-next-80b-a3b": ModelConfig(
        arch="llama", n_layers=48, n_heads=16, n_kv_heads=2, d_model=2048, head_dim=256, d_ff=5120,
        vocab_size=151936, max_seq_len=262144, rope_theta=10000000.0, tie_embeddings=False, norm_eps=1e-6,
        qk_norm=True, layer_types=_pattern(48, 4, "linear"), linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    ),
    # https://huggingface.co/google/gemma-3n-E4B-it/blob/main/config.json (text_config: 35 layers, 4 sliding
    # (window 512) : 1 full, num_kv_shared_layers 15: layers 20-34 reuse layer 18's (sliding) or 19's (full) K/V,
    # the last earlier layer of their type, as transformers 5.22's Gemma3nTextAttention picks it; these numbers
    # are also that version's Gemma3nTextConfig defaults, documented as "E4B style")
    "gemma-3n-e4b": ModelConfig(
        arch="gemma", n_layers=35, n_heads=8, n_kv_heads=2, d_model=2048, head_dim=256, d_ff=16384,
        vocab_size=262400, max_seq_len=32768, rope_theta=1000000.0, tie_embeddings=True, norm_eps=1e-6,
        sliding_window=512, layer_types=_gemma3n_types(), qk_norm=True, attn_scale=1.0, rope_local_theta=10000.0,
    ),
    # -- 2026 ------------------------------------------------------------------------------------------------------
    # DeepSeek-V4-Flash (https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash, config.json; transformers 5.22's
    # DeepseekV4Config and its cache layers DeepseekV4HCACache / DeepseekV4CSACache): 43 layers, one K/V head of
    # 512 numbers that is both key and value (shared-KV MQA), a 128-token window in every layer;
    # compress_ratios [0, 0, 4, 128, 4, 128, ...]: layers 0-1 keep the window only, then compressed sparse (CSA:
    # one row per 4 tokens, an indexer key of 128 per row, each query reads the top 512) and heavily compressed
    # (HCA: one row per 128 tokens) layers alternate; a 1M-token context
    "deepseek-v4-flash": ModelConfig(
        arch="llama", n_layers=43, n_heads=64, n_kv_heads=1, d_model=4096, head_dim=512, d_ff=2048,
        vocab_size=129280, max_seq_len=1048576, rope_theta=10000.0, tie_embeddings=False, norm_eps=1e-6,
        sliding_window=128, k_is_v=True, layer_types=("sliding",) * 2 + ("csa", "hca") * 20 + ("csa",),
        csa_rate=4, hca_rate=128, index_topk=512, index_head_dim=128, q_lora_rank=1024,
    ),
    # GLM-5.2 (https://huggingface.co/zai-org/GLM-5.2/blob/main/config.json; transformers 5.22's glm_moe_dsa):
    # DeepSeek-V3.2's MLA + DSA at 78 layers (kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 192,
    # v_head_dim 256, index_head_dim 128, index_topk 2048), with the indexer shared (index_topk_freq 4,
    # index_skip_topk_offset 3): the 21 "full" indexer layers (0, 1, 2, then every 4th) cache its key, the 57
    # "shared" ones build no indexer (GlmMoeDsaAttention.indexer is None) and cache the latent only; 1M context
    "glm-5.2": ModelConfig(
        arch="llama", n_layers=78, n_heads=64, n_kv_heads=64, d_model=6144, head_dim=256, d_ff=12288,
        vocab_size=154880, max_seq_len=1048576, rope_theta=8000000.0, tie_embeddings=False, norm_eps=1e-5,
        layer_types=_glm52_types(), kv_lora_rank=512, q_lora_rank=2048, qk_rope_head_dim=64,
        qk_nope_head_dim=192, v_head_dim=256, index_topk=2048, index_head_dim=128,
    ),
    # Gemma 4 E4B (transformers' convert_gemma4_weights.py, variant gemma-4-e4b, and 5.22's Gemma4TextConfig):
    # 42 layers, 5 sliding (window 512) : 1 full, 2 K/V heads of 256 in the sliding layers and of
    # global_head_dim 512 in the full ones; num_kv_shared_layers 18: layers 24-41 reuse layer 22's (sliding)
    # or 23's (full) K/V, the last earlier layer of their type (Gemma4TextAttention.store_full_length_kv)
    "gemma-4-e4b": ModelConfig(
        arch="gemma", n_layers=42, n_heads=8, n_kv_heads=2, d_model=2560, head_dim=256, d_ff=10240,
        vocab_size=262144, max_seq_len=131072, rope_theta=1000000.0, tie_embeddings=True, norm_eps=1e-6,
        sliding_window=512, layer_types=_shared_tail(_pattern(42, 6, "sliding"), 18), qk_norm=True, attn_scale=1.0,
        rope_local_theta=10000.0, global_head_dim=512,
    ),
}
