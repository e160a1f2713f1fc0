"""Multi-head latent attention (MLA, DeepSeek-V2/V3): cache one small latent per token, not H keys and values.

Each token's hidden state x is squeezed into a latent c = norm(W_DKV x) of r = kv_lora_rank numbers,
plus one RoPE key k_R of d_R = qk_rope_head_dim numbers shared by every head. Only (c, k_R) are cached:
r + d_R numbers per token and layer (576 in DeepSeek-V3, against 128 * (192 + 128) = 40960 for MHA with
the same heads, keys of d_nope + d_R and values of d_v: 71 times more, as kvref.planner.latent_vs_heads and
chapter 10 count it; the DeepSeek-V2 paper's Table 1 compares with MHA of d_h = 128 for keys and values,
2 * 128 * 128 = 32768, 57 times more). Every head h gets its keys and values back through an up-projection
W_UKV = [W_UK; W_UV]:

    k_h = [W_UK_h c ; k_R]     v_h = W_UV_h c     (keys: d_nope + d_R numbers, values: d_v)

Two ways to attend, equal up to rounding:

* naive: expand every cached latent into per-head keys and values, then ordinary attention. Reads the
  cache, then writes and reads H * (d_nope + d_R + d_v) numbers per cached token.
* absorbed (how it is served): q_h . (W_UK_h c) = (W_UK_h^T q_h) . c, so fold W_UK into the query
  once per step and score the latents directly; likewise sum p * c first and apply W_UV_h after.
  Attention then reads r + d_R numbers per cached token for all heads together: MQA over the latent.

``reads`` (a dict, or None) counts the numbers each form reads: "cache" (latents and RoPE keys),
"weights" (W_UKV), "expanded" (per-head K/V the naive form materialises); kvref.planner's
``mla_decode_read_bytes`` is the same count as a formula.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import Mask
from .modules import Linear, RMSNorm, apply_rope


def _count(reads: dict | None, **counts: int) -> None:
    if reads is not None:
        for k, v in counts.items():
            reads[k] = reads.get(k, 0) + v


def _split_kv_b(w_kv_b: torch.Tensor, H: int, d_nope: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UKV (H * (d_nope + d_v), r) -> W_UK (H, d_nope, r) and W_UV (H, d_v, r)."""
    w = w_kv_b.view(H, -1, w_kv_b.shape[-1])
    return w[:, :d_nope], w[:, d_nope:]


def mla_naive(q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
              w_kv_b: torch.Tensor, scale: float, mask: Mask, reads: dict | None = None) -> torch.Tensor:
    """Expand the latents into per-head K/V, then attend. q_nope (B, H, T, d_nope), q_rope (B, H, T, d_R),
    c_kv (B, S, r), k_rope (B, S, d_R), w_kv_b (H * (d_nope + d_v), r). Returns (B, H, T, d_v)."""
    B, H, T, d_nope = q_nope.shape
    S = c_kv.shape[1]
    kv = (c_kv @ w_kv_b.T).view(B, S, H, -1).transpose(1, 2)  # (B, H, S, d_nope + d_v): the expansion
    k_nope, v = kv[..., :d_nope], kv[..., d_nope:]
    k = torch.cat([k_nope, k_rope[:, None].expand(B, H, S, -1)], dim=-1)  # (B, H, S, d_nope + d_R)
    q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, T, d_nope + d_R)
    _count(reads, cache=c_kv.numel() + k_rope.numel(), weights=w_kv_b.numel(), expanded=k.numel() + v.numel())
    if isinstance(mask, str):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def mla_absorbed(q_nope: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
                 w_kv_b: torch.Tensor, scale: float, mask: Mask, reads: dict | None = None) -> torch.Tensor:
    """Attend in the latent space with W_UK folded into the query and W_UV into the output.
    Same arguments and result as ``mla_naive``; no per-head K or V is ever built."""
    B, H, T, d_nope = q_nope.shape
    w_uk, w_uv = _split_kv_b(w_kv_b, H, d_nope)  # (H, d_nope, r), (H, d_v, r)
    q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (B, H, T, r): the query, seen from the latent side
    q = torch.cat([q_lat, q_rope], dim=-1)  # (B, H, T, r + d_R)
    k = torch.cat([c_kv, k_rope], dim=-1)[:, None]  # (B, 1, S, r + d_R): one "head" serves all H
    _count(reads, cache=c_kv.numel() + k_rope.numel(), weights=w_kv_b.numel(), expanded=0)
    v = c_kv[:, None]  # (B, 1, S, r)
    if isinstance(mask, str):
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)  # (B, H, T, r)
    return torch.einsum("bhtr,hvr->bhtv", ctx, w_uv)  # (B, H, T, d_v)


MLA = {"naive": mla_naive, "absorbed": mla_absorbed}


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on adjacent channel pairs (0, 1), (2, 3), ... as DeepSeek's checkpoints are laid out: regroup
    them into the "rotate half" layout (evens, then odds), then rotate as usual. x (B, h, T, d_R)."""
    *lead, d = x.shape
    x = x.view(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)
    return apply_rope(x, cos, sin)


class MLAttention(nn.Module):
    """The MLA layer: q (optionally through a rank-q_lora_rank bottleneck), the latent and RoPE key, attention
    in the form ``self.form`` ("absorbed" by default, or "naive"), the output projection."""

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer, self.form = cfg, layer, "absorbed"
        H, r, dR = cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.d_nope, self.d_v = cfg.qk_nope_head_dim, cfg.v_head_dim
        d_qk = self.d_nope + dR
        if cfg.q_lora_rank:
            self.q_a = Linear(cfg.d_model, cfg.q_lora_rank, bias=False)
            self.q_a_norm = RMSNorm(cfg.q_lora_rank, 1e-6)  # HF's DeepSeek-V3 keeps 1e-6 here, whatever rms_norm_eps
            self.q_b = Linear(cfg.q_lora_rank, H * d_qk, bias=False)
        else:
            self.q = Linear(cfg.d_model, H * d_qk, bias=False)
        self.kv_a = Linear(cfg.d_model, r + dR, bias=False)  # x -> [latent c, RoPE key k_R]
        self.kv_a_norm = RMSNorm(r, 1e-6)
        self.kv_b = Linear(r, H * (self.d_nope + self.d_v), bias=False)  # W_UKV: latent -> per-head k_nope, v
        self.proj = Linear(H * self.d_v, cfg.d_model, bias=False)
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else d_qk ** -0.5
        self.reads: dict | None = None  # set to {} to count what attention reads

    def forward(self, x: torch.Tensor, rope: tuple, mask: Mask, cache) -> torch.Tensor:
        B, T, _ = x.shape
        H, r = self.cfg.n_heads, self.cfg.kv_lora_rank
        q = self.q_b(self.q_a_norm(self.q_a(x))) if self.cfg.q_lora_rank else self.q(x)
        q = q.view(B, T, H, -1).transpose(1, 2)  # (B, H, T, d_nope + d_R)
        q_nope, q_rope = q[..., :self.d_nope], q[..., self.d_nope:]
        c, k_rope = self.kv_a(x).split([r, self.cfg.qk_rope_head_dim], dim=-1)
        c = self.kv_a_norm(c)  # (B, T, r)
        q_rope = rope_interleaved(q_rope, *rope)
        k_rope = rope_interleaved(k_rope[:, None], *rope)[:, 0]  # (B, T, d_R), rotated before caching
        if cache is not None:
            c, k_rope = cache.update(self.layer, c, k_rope)  # (B, S, r), (B, S, d_R)
        y = MLA[self.form](q_nope, q_rope, c, k_rope, self.kv_b.weight, self.scale, mask, self.reads)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * self.d_v))


def set_form(model: nn.Module, form: str) -> None:
    """Switch every MLA layer of ``model`` to ``form`` ("naive" or "absorbed")."""
    if form not in MLA:
        raise ValueError(f"form must be one of {tuple(MLA)}; got {form!r}")
    for m in model.modules():
        if isinstance(m, MLAttention):
            m.form = form


class LatentCache(nn.Module):
    """Per latent layer, the latent c and the RoPE key k_R of every token side by side: (B, S, r + d_R).

    ``static=True``: one (L_latent, B, max_len, r + d_R) buffer written at explicit slots; otherwise
    grown by ``torch.cat``. Driven by kvref.layers.LayeredCache, which keeps the slot bookkeeping."""

    def __init__(self, n_layers: int, r: int, d_rope: int, batch: int, max_len: int, dtype: torch.dtype,
                 device, static: bool) -> None:
        super().__init__()
        self.r, self.static, self.max_len = r, static, max_len
        self.buf = torch.zeros(n_layers, batch, max_len, r + d_rope, dtype=dtype, device=device) if static else None
        self.rows: list[torch.Tensor] = []  # dynamic: per layer (B, S, r + d_R)
        self.length = 0

    def update(self, layer: int, c: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = torch.cat([c, k_rope], dim=-1)  # (B, T, r + d_R)
        end = self.length + new.shape[1]
        if self.static:
            self.buf[layer, :, self.length:end] = new
            held = self.buf[layer, :, :end]
        else:
            if layer == len(self.rows):
                self.rows.append(new)
            else:
                self.rows[layer] = torch.cat([self.rows[layer], new], dim=1)
            held = self.rows[layer]
        return held[..., :self.r], held[..., self.r:]  # (B, S, r), (B, S, d_R) views

    def advance(self, T: int) -> None:
        self.length += T

    def reset(self) -> None:
        self.length, self.rows = 0, []

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens (LayeredCache checks the bound): static rows past it are never read."""
        self.length = length
        if not self.static:
            self.rows = [t[:, :length] for t in self.rows]  # (B, length, r + d_R)

    @property
    def nbytes(self) -> int:
        held = [self.buf] if self.static else self.rows
        return sum(t.numel() * t.element_size() for t in held)
