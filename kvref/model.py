"""A decoder-only transformer you can read in one sitting: GPT-2 and the Llama family.

    logits = model(input_ids, cache=None, attention_mask=None)   # (B, T) -> (B, T, V)

With a cache, only the new tokens go in: their K/V are appended to the cache and their
positions continue from what the cache already holds (per row, when a mask marks padding).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import ATTENTION, build_mask
from .cache import KVCache
from .config import ModelConfig
from .modules import Linear, RMSNorm, apply_rope, rope_tables  # noqa: F401  (importable from here too)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.qkv = Linear(cfg.d_model, (H + 2 * H_kv) * D, bias=cfg.qkv_bias)  # q, k, v in one matmul
        self.proj = Linear(H * D, cfg.d_model, bias=cfg.arch == "gpt2")
        self.attend = ATTENTION[cfg.attn_impl]

    def forward(self, x: torch.Tensor, rope: tuple | None, mask, cache: KVCache | None) -> torch.Tensor:
        B, T, _ = x.shape
        H, H_kv, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        q, k, v = self.qkv(x).split([H * D, H_kv * D, H_kv * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        v = v.view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)  # rotate before caching: cached K keep their position
        if cache is not None and cache.reads_in_place:  # stores k, v and attends where they lie (paged_inplace)
            y = cache.attend(self.layer, q, k, v, mask, self.attend)  # (B, H, T, D)
            return self.proj(y.transpose(1, 2).reshape(B, T, H * D))
        if cache is not None:
            k, v = cache.update(self.layer, k, v)  # (B, H_kv, S, D): all keys so far, new ones last
            if cache.observes:
                cache.observe(self.layer, q, k, mask)
        y = self.attend(q, k, v, mask)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * D))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gpt2 = cfg.arch == "gpt2"
        if self.gpt2:
            self.up = Linear(cfg.d_model, cfg.d_ff)
            self.down = Linear(cfg.d_ff, cfg.d_model)
        else:  # SwiGLU: gate and up projections fused into one matmul
            self.up = Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
            self.down = Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gpt2:
            return self.down(F.gelu(self.up(x), approximate="tanh"))
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        norm = (lambda: nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)) if cfg.arch == "gpt2" else (
            lambda: RMSNorm(cfg.d_model, cfg.norm_eps))
        self.norm1, self.attn, self.norm2, self.mlp = norm(), Attention(cfg, layer), norm(), MLP(cfg)

    def forward(self, x: torch.Tensor, rope, mask, cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, mask, cache)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.arch == "gpt2" else None
        self._layered = cfg.layered  # per-layer kinds (chapter 10): kvref.layers builds and runs the blocks
        if self._layered:
            from . import layers

            self.blocks, self.norm = layers.build_blocks(cfg), layers.make_norm(cfg, cfg.d_model)
        else:
            self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
            self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.arch == "gpt2" else RMSNorm(
                cfg.d_model, cfg.norm_eps)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init)
        self.to(device=device, dtype=dtype)
        if self._layered:  # one table per group: full, sliding, latent (fp32, cast at use)
            for g, (cos, sin) in layers.rope_tables(cfg, self.device).items():
                self.register_buffer(f"rope_cos_{g}", cos, persistent=False)
                self.register_buffer(f"rope_sin_{g}", sin, persistent=False)
        elif cfg.arch == "llama":  # computed in fp32 whatever the weights' dtype, cast at use
            cos, sin = rope_tables(cfg, self.device)
            self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, D)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.kv_rows = 0  # work counter: K/V rows computed per layer, summed over every forward

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    @property
    def device(self) -> torch.device:
        return self.tok_emb.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_emb.weight.dtype

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None, last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V) for the new tokens, or (B, 1, V) for the last one if ``last_only``."""
        if self._layered:
            from .layers import forward_layered

            return forward_layered(self, input_ids, cache, attention_mask, last_only)
        cfg = self.cfg
        real = self._check_inputs(input_ids, attention_mask)
        B, T = input_ids.shape
        past, seen, window = 0, 0, cfg.sliding_window
        if cache is not None:
            cache.check(cfg, B, T, self.dtype, self.device)
            past, seen = cache.length, cache.seen
            window = cache.window or window
        if seen + T > cfg.max_seq_len:
            raise ValueError(
                f"sequence too long: {seen} tokens already seen + {T} new = {seen + T} "
                f"(left padding included), but max_seq_len is {cfg.max_seq_len}"
            )
        # Position of each new token (continuing each row from what the cache holds; padding does not
        # count) and which key slots each new query may see.
        if real is None and (cache is None or not cache.padded):  # the common case: no padding anywhere
            pos = torch.arange(seen, seen + T, device=input_ids.device).expand(B, T)  # (B, T); seen, not length: evicting caches
            mask = build_mask(None, past, T, False, window, input_ids.device)
        else:
            if real is None:
                real = torch.ones(B, T, dtype=torch.bool, device=input_ids.device)
            start = cache.next_pos[:, None] if cache is not None and cache.length else 0
            pos = (start + real.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
            slots_real = torch.cat([cache.real, real], dim=1) if cache is not None and cache.length else real
            mask = build_mask(slots_real, past, T, True, window, input_ids.device)  # (B, 1, T, S)

        x = self.tok_emb(input_ids)  # (B, T, d_model)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        else:
            rope = (self.rope_cos[pos][:, None].to(x.dtype), self.rope_sin[pos][:, None].to(x.dtype))  # (B, 1, T, D)
        for block in self.blocks:
            x = block(x, rope, mask, cache)
        if cache is not None:
            cache.advance(real if real is not None else torch.ones(B, T, dtype=torch.bool, device=input_ids.device))
        self.kv_rows += B * T  # each layer computed one K row and one V row per new token
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))  # (B, T, V)

    def _check_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (
                torch.long, torch.int32):
            got = f"{tuple(input_ids.shape)} {input_ids.dtype}" if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be an integer tensor of shape (B, T); got {got}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids has no tokens (T = 0); pass at least one token")
        if input_ids.device != self.device:
            raise ValueError(f"input_ids are on {input_ids.device} but the model is on {self.device}")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.cfg.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary: ids must be in [0, {self.cfg.vocab_size - 1}]")
        if attention_mask is None:
            return None
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)} (1 = real token, "
                f"0 = padding, for the tokens of this call only); got {tuple(attention_mask.shape)}"
            )
        if attention_mask.dtype != torch.bool and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
            raise ValueError("attention_mask may only hold 0 (padding) and 1 (real token)")
        return attention_mask.to(device=input_ids.device, dtype=torch.bool)
