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
        from .kinds import is_layered, validate

        validate(self)
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


def _gemma3n_types(n: int = 35, n_shared: int = 15) -> tuple[str, ...]:
    """Gemma 3n: 4 sliding : 1 full; the last ``n_shared`` layers read the last earlier layer of their kind."""
    base = _pattern(n, 5, "sliding")
    own = n - n_shared
    src = {k: max(i for i in range(own) if base[i] == k) for k in ("sliding", "full")}
    return base[:own] + tuple(f"shared:{src[k]}" for k in base[own:])


# Kept apart from PRESETS, which chapters 3 and 4 walk as "the models of this course" (GPT-2/Llama shapes
# with weights kvref can count): these are for the per-layer planner (kvref.planner, chapter 10).
MODERN_PRESETS: dict[str, ModelConfig] = {
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
}
