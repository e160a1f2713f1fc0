"""One dataclass that says what a model looks like, plus presets of real models.

Notation used everywhere in the course (code, book, notebooks):

    B    batch size                 T    tokens in this forward call
    H    query heads                H_kv key/value heads (H_kv divides H)
    D    head dimension             L    layers
    S    tokens held by the cache   V    vocabulary size
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

ARCHS = ("gpt2", "llama")
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
        if self.arch == "llama" and self.head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of channels, so head_dim must be even; got {self.head_dim}")
        if self.d_ff is None:
            fix("d_ff", 4 * self.d_model if self.arch == "gpt2" else _swiglu_hidden(self.d_model))
        if self.qkv_bias is None:
            fix("qkv_bias", self.arch == "gpt2")
        if self.arch == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ValueError("arch='gpt2' is multi-head attention: n_kv_heads must equal n_heads")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None; got {self.sliding_window}")

    @property
    def n_rep(self) -> int:
        """How many query heads share one K/V head (H / H_kv)."""
        return self.n_heads // self.n_kv_heads

    def with_(self, **changes) -> "ModelConfig":
        """A copy with some fields changed (and re-validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"ModelConfig has no field(s) {sorted(unknown)}")
        return replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **changes) -> "ModelConfig":
        """The published shape of a real model, e.g. ``ModelConfig.preset("llama-3-8b")``."""
        if name not in PRESETS:
            raise KeyError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name].with_(**changes) if changes else PRESETS[name]


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
