"""Scaled dot-product attention, twice: written out step by step, and fused.

Both take q (B, H, T, D) and k, v (B, H_kv, S, D) where the last T of the S key slots are the
new tokens. ``mask`` is None (every key visible: one new token, nothing padded), the string
"causal" (a fresh prompt with no padding), or a (B, 1, T, S) bool tensor, True = may attend.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Mask = torch.Tensor | str | None


def build_mask(
    real: torch.Tensor | None, past: int, T: int, padded: bool, window: int | None, device: torch.device
) -> Mask:
    """Which of the S = past + T key slots each of the T new queries may see.

    ``real`` (B, S) marks slots holding real tokens (False = left padding).
    A padding query sees at least itself, so its softmax never divides by zero;
    its output is never used.
    """
    S = past + T
    if not padded and (window is None or window >= S):
        if T == 1:
            return None  # one query at the end: every earlier key is visible
        if past == 0:
            return "causal"
    q_slot = torch.arange(past, S, device=device)[:, None]  # (T, 1)
    k_slot = torch.arange(S, device=device)[None, :]  # (1, S)
    allowed = k_slot <= q_slot  # (T, S) causal
    if window is not None:
        # Left padding keeps real tokens contiguous, so slot distance = position distance.
        allowed = allowed & (q_slot - k_slot < window)
    if real is None:
        return allowed[None, None]  # (1, 1, T, S)
    return (allowed[None] & (real[:, None, :] | (k_slot == q_slot)[None]))[:, None]  # (B, 1, T, S)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask) -> torch.Tensor:
    """The fused kernel: F.scaled_dot_product_attention, sharing K/V heads across query groups."""
    gqa = q.shape[1] != k.shape[1]
    if isinstance(mask, str):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask) -> torch.Tensor:
    """The same computation, one readable step at a time."""
    B, H, T, D = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, S, D): query head h reads K/V head h // (H / H_kv)
    v = v.repeat_interleave(H // H_kv, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, S)
    if isinstance(mask, str):
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, T, S), rows sum to 1
    return weights @ v  # (B, H, T, D)


ATTENTION = {"sdpa": sdpa_attention, "manual": manual_attention}
