"""Linear attention: a "linear" layer (Gated DeltaNet, as in Qwen3-Next) and the state it caches.

An attention layer keeps every token's K and V; a linear-attention layer keeps one matrix per head,
S of shape (d_k, d_v), and folds each new token into it (the gated delta rule, Yang et al., 2024,
"Gated Delta Networks", https://arxiv.org/abs/2412.06464, eq. for the recurrent form):

    S_t = a_t * S_{t-1} + k_t (beta_t * (v_t - (a_t * S_{t-1})^T k_t))^T      # (d_k, d_v)
    o_t = S_t^T q_t                                                          # (d_v,)

a_t = exp(g_t) in (0, 1] forgets, beta_t in (0, 1) is the write strength, q and k are L2-normalised.
Before that, q, k and v pass through a short causal convolution (kernel K, per channel), so the cache
also keeps the last K - 1 inputs of it. The output is RMS-normalised per head, gated by silu(z), projected.
Qwen3-Next's shapes (HF transformers' ``Qwen3NextGatedDeltaNet``): H_k key heads of d_k, H_v value
heads of d_v (H_v a multiple of H_k: each key head serves H_v / H_k value heads).

The cache of such a layer is (B, H_v, d_k, d_v) + (B, C, K - 1) whatever S is, which is why
``crop`` cannot roll it back: the state after token 90 no longer tells what it was after token 80.
Speculative decoding therefore copies it before feeding draft tokens (``snapshot()``) and puts the
copy back when some are rejected (``restore(snap)``), then feeds the accepted tokens again.
This is the recurrent form only (one token after another, in Python): exact and short, not fast.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import CropError
from .modules import Linear, RMSNorm


class LinearStateError(CropError):
    """Raised by a cache with linear-attention layers that is asked to crop: use snapshot() / restore()."""


def conv_channels(cfg) -> int:
    """q, k and v all pass through the short convolution: C = 2 * H_k * d_k + H_v * d_v."""
    return 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token after another, in fp32.

    q, k (B, H, T, d_k), v (B, H, T, d_v), g and beta (B, H, T), state (B, H, d_k, d_v);
    returns the outputs (B, H, T, d_v) and the state after the last token.
    """
    S = state.float()
    outs = []
    for t in range(q.shape[2]):
        S = S * g[:, :, t, None, None].exp()  # forget: a_t S
        k_t = k[:, :, t].float()  # (B, H, d_k)
        remembered = (S * k_t[..., None]).sum(-2)  # (B, H, d_v): what S returns for k_t now
        delta = (v[:, :, t].float() - remembered) * beta[:, :, t, None]  # (B, H, d_v): the correction
        S = S + k_t[..., None] * delta[..., None, :]  # write k_t -> v_t
        outs.append((S * q[:, :, t].float()[..., None]).sum(-2))  # (B, H, d_v)
    return torch.stack(outs, dim=2), S


class GatedDeltaNet(nn.Module):
    """A "linear" layer: projections, short causal conv, gated delta rule, gated RMSNorm, output projection."""

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        H_k, H_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        d_k, d_v, K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
        if H_v % H_k:
            raise ValueError(f"linear_num_value_heads ({H_v}) must be a multiple of linear_num_key_heads ({H_k})")
        self.C = conv_channels(cfg)
        self.in_proj = Linear(cfg.d_model, self.C + H_v * d_v + 2 * H_v, bias=False)  # q k v | z | b a
        self.conv_weight = nn.Parameter(torch.randn(self.C, K) / K ** 0.5)  # (C, K): tap K - 1 is the newest input
        self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, H_v)))  # per-head forgetting speed
        self.dt_bias = nn.Parameter(torch.zeros(H_v))
        self.norm = RMSNorm(d_v, cfg.norm_eps)
        self.out_proj = Linear(H_v * d_v, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, real: torch.Tensor | None, cache) -> torch.Tensor:
        """x (B, T, d_model); real (B, T) bool (False on left padding) or None; cache: a LayeredCache or None."""
        cfg = self.cfg
        B, T, _ = x.shape
        H_k, H_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        d_k, d_v, K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
        mixed, z, b, a = self.in_proj(x).split([self.C, H_v * d_v, H_v, H_v], dim=-1)
        if real is not None:  # padding writes nothing: zero conv input, no forgetting, no write
            mixed = mixed * real[..., None]
        if cache is not None:
            conv_state, state = cache.linear_state(self.layer)  # (B, C, K - 1), (B, H_v, d_k, d_v)
        else:
            conv_state = x.new_zeros(B, self.C, K - 1)
            state = x.new_zeros(B, H_v, d_k, d_v)
        window = torch.cat([conv_state.to(x.dtype), mixed.transpose(1, 2)], dim=2)  # (B, C, K - 1 + T)
        conv = (window.unfold(2, K, 1) * self.conv_weight[:, None, :]).sum(-1)  # (B, C, T)
        q, k, v = F.silu(conv).transpose(1, 2).split([H_k * d_k, H_k * d_k, H_v * d_v], dim=-1)
        q = F.normalize(q.view(B, T, H_k, d_k).float(), dim=-1) * d_k ** -0.5
        k = F.normalize(k.view(B, T, H_k, d_k).float(), dim=-1)
        q, k = (t.repeat_interleave(H_v // H_k, dim=2).transpose(1, 2) for t in (q, k))  # (B, H_v, T, d_k)
        v = v.reshape(B, T, H_v, d_v).transpose(1, 2)  # (B, H_v, T, d_v)
        beta = torch.sigmoid(b.float())  # (B, T, H_v)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # (B, T, H_v), log a_t <= 0
        if real is not None:
            beta, g = beta * real[..., None], g * real[..., None]
        o, state = delta_rule(q, k, v, g.transpose(1, 2), beta.transpose(1, 2), state)  # (B, H_v, T, d_v)
        if cache is not None:
            cache.set_linear_state(self.layer, window[:, :, window.shape[2] - (K - 1):], state)
        o = self.norm(o.transpose(1, 2).to(x.dtype)) * F.silu(z.view(B, T, H_v, d_v))  # (B, T, H_v, d_v)
        return self.out_proj(o.reshape(B, T, H_v * d_v))


class LinearStates(nn.Module):
    """The cache group of a model's linear layers: per layer a state (B, H_v, d_k, d_v) and the conv's last
    K - 1 inputs (B, C, K - 1), kept whatever S is. ``state_dtype``: cfg.linear_state_dtype (None: ``dtype``)."""

    def __init__(self, cfg, n_layers: int, batch: int, dtype: torch.dtype, device=None, static: bool = True) -> None:
        super().__init__()
        from .units import as_dtype

        s_dtype = as_dtype(cfg.linear_state_dtype) if cfg.linear_state_dtype is not None else dtype
        H_v, d_k, d_v = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.state = torch.zeros(n_layers, batch, H_v, d_k, d_v, dtype=s_dtype, device=device)
        self.conv = torch.zeros(n_layers, batch, conv_channels(cfg), cfg.linear_conv_kernel_dim - 1, dtype=dtype,
                                device=device)
        self.length, self.static = 0, static

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[j], self.state[j]

    def set(self, j: int, conv: torch.Tensor, state: torch.Tensor) -> None:
        self.conv[j].copy_(conv)
        self.state[j].copy_(state)

    def advance(self, T: int) -> None:
        self.length += T

    def reset(self) -> None:
        self.state.zero_()
        self.conv.zero_()
        self.length = 0

    def check_crop(self, length: int) -> None:
        if length not in (0, self.length):
            raise LinearStateError(f"a linear-attention state cannot be cropped (to {length} of {self.length} "
                                   f"tokens): it holds no per-token rows. Take snap = cache.snapshot() before "
                                   f"feeding tokens you may reject, then cache.restore(snap) and feed the kept ones")

    def crop(self, length: int) -> None:
        self.check_crop(length)
        if length == 0:
            self.reset()

    def snapshot(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        return self.length, self.state.clone(), self.conv.clone()

    def restore(self, snap: tuple[int, torch.Tensor, torch.Tensor]) -> None:
        self.length = snap[0]
        self.state.copy_(snap[1])
        self.conv.copy_(snap[2])

    @property
    def nbytes(self) -> int:
        if not self.static and self.length == 0:  # the planner's "0 before the first token"
            return 0
        return self.state.numel() * self.state.element_size() + self.conv.numel() * self.conv.element_size()
