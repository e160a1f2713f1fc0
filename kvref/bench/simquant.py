"""Simulated KV-cache formats for quality studies: what attention reads from a cache of any width.

kvref's ``QuantizedCache`` stores int8 and int4 codes. To see where quantization starts to hurt,
chapter 06 also measures int3, int2 and FP8, and keys with outlier channels. These tools do that
without writing a packed store for every format:

* ``SimulatedQuantCache(fmt, group_size, residual, keys)``: hands attention exactly what a cache of
  format ``fmt`` ("int2" ... "int8", "fp8_e4m3", "fp8_e5m2") would give back, with QuantizedCache's
  layout (keys per channel, values per token, whole groups leaving an exact residual window); with
  an int format it computes what QuantizedCache computes, bit for bit (tests/test_quant_quality.py);
* ``format_bytes``: the bytes such a cache would hold (codes bit-packed, scales, residual);
* ``with_key_outliers(model, factor)``: the same model (same logits) whose keys carry outlier
  channels, as KIVI measured in real Llama keys; synthesised by rescaling, and said so wherever used.
"""

from __future__ import annotations

import copy

import torch

from ..cache import DynamicCache, KVCache
from ..quant import QuantizationError, dequantize, fp8_round_trip, fp8_scale, quantize, residual_tokens


class SimulatedQuantCache(KVCache):
    """Attention reads what a quantized cache of format ``fmt`` would give back (a study tool).

    ``fmt``: "int2" ... "int8" (min/max codes, groups of G as in QuantizedCache) or "fp8_e4m3" /
    "fp8_e5m2" (one scale per layer for K and one for V, ``fp8_scales[layer] = (k_scale, v_scale)``,
    default 1.0: vLLM's per-tensor scales). Tokens leave the exact residual in whole groups of G, as
    in QuantizedCache (fp8: one by one, it has no groups); they are then quantized and dequantized
    once and kept dequantized, in fp32.
    ``keys``: "channel" (KIVI, as QuantizedCache) or "token" (keys grouped like values: the ablation).
    With an int format it computes what QuantizedCache computes (tests/test_quant_quality.py).
    ``nbytes`` is what a cache storing the format would hold (codes bit-packed, scales, residual),
    not the fp32 copy this simulation keeps.
    """

    def __init__(self, fmt: str = "int4", group_size: int = 16, residual: int = 0, keys: str = "channel",
                 fp8_scales: list[tuple[float, float]] | None = None) -> None:
        super().__init__()
        if fmt.startswith("int") and fmt[3:].isdigit() and 2 <= int(fmt[3:]) <= 8:
            self.bits = int(fmt[3:])
        elif fmt in ("fp8_e4m3", "fp8_e5m2"):
            self.bits = 8
        else:
            raise QuantizationError(f"fmt must be int2 ... int8, fp8_e4m3 or fp8_e5m2; got {fmt!r}")
        if keys not in ("channel", "token"):
            raise QuantizationError(f"keys must be 'channel' or 'token'; got {keys!r}")
        if not isinstance(group_size, int) or group_size < 1 or not isinstance(residual, int) or residual < 0:
            raise QuantizationError(f"group_size must be >= 1 and residual >= 0; got {group_size!r}, {residual!r}")
        self.fmt, self.G, self.residual, self.keys, self.fp8_scales = fmt, group_size, residual, keys, fp8_scales
        self.step = 1 if fmt.startswith("fp8") else group_size  # fp8 needs no group: each token leaves at once
        self._init_store()

    def _init_store(self) -> None:
        # Per layer one buffer (B, H_kv, capacity, D) for K and one for V: slots [0, n_q) hold the quantized
        # tokens (dequantized), [n_q, S) the exact residual. New rows are written in place and attention reads
        # a view of the first S slots (the same numbers a torch.cat would give, without copying all S rows
        # every step); the capacity doubles when full.
        self.k_buf: list[torch.Tensor] = []
        self.v_buf: list[torch.Tensor] = []
        self.n_q: list[int] = []  # per layer: quantized tokens
        self.held: list[int] = []  # per layer: S

    # The two parts, as views: k_old[layer] (B, H_kv, N_q, D) quantized then dequantized, k_res (B, H_kv, r, D)
    @property
    def k_old(self) -> list[torch.Tensor]:
        return [b[:, :, :n] for b, n in zip(self.k_buf, self.n_q)]

    @property
    def v_old(self) -> list[torch.Tensor]:
        return [b[:, :, :n] for b, n in zip(self.v_buf, self.n_q)]

    @property
    def k_res(self) -> list[torch.Tensor]:
        return [b[:, :, n:S] for b, n, S in zip(self.k_buf, self.n_q, self.held)]

    @property
    def v_res(self) -> list[torch.Tensor]:
        return [b[:, :, n:S] for b, n, S in zip(self.v_buf, self.n_q, self.held)]

    def _round_trip(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A block of G tokens (B, H_kv, G, D) as the format gives it back."""
        if self.fmt.startswith("fp8"):
            ks, vs = self.fp8_scales[layer] if self.fp8_scales else (1.0, 1.0)
            return fp8_round_trip(k, ks, self.fmt[4:]), fp8_round_trip(v, vs, self.fmt[4:])
        k_dim = -2 if self.keys == "channel" else -1  # per channel: G tokens share a scale
        k_hat = dequantize(*quantize(k, self.bits, self.G, k_dim), self.G, k_dim)
        v_hat = dequantize(*quantize(v, self.bits, self.G, -1), self.G, -1)  # values per token
        return k_hat, v_hat

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = k.shape[2]
        if layer == len(self.k_buf):
            self.k_buf.append(k.new_empty(*k.shape[:2], max(2 * T, 64), k.shape[3]))
            self.v_buf.append(v.new_empty(*v.shape[:2], max(2 * T, 64), v.shape[3]))
            self.n_q.append(0)
            self.held.append(0)
        S = self.held[layer] + T
        if S > self.k_buf[layer].shape[2]:  # full: a buffer twice as large
            for bufs in (self.k_buf, self.v_buf):
                old = bufs[layer]
                bufs[layer] = old.new_empty(*old.shape[:2], 2 * S, old.shape[3])
                bufs[layer][:, :, :self.held[layer]] = old[:, :, :self.held[layer]]
        kb, vb, n = self.k_buf[layer], self.v_buf[layer], self.n_q[layer]
        kb[:, :, S - T:S], vb[:, :, S - T:S] = k, v
        self.held[layer] = S
        r = S - n
        move = (r - self.residual) // self.step * self.step if r > self.residual else 0
        if move:
            k_hat, v_hat = self._round_trip(layer, kb[:, :, n:n + move], vb[:, :, n:n + move])
            kb[:, :, n:n + move], vb[:, :, n:n + move] = k_hat, v_hat
            self.n_q[layer] = n + move
        return kb[:, :, :S], vb[:, :, :S]  # (B, H_kv, S, D) views

    def reset(self) -> None:
        super().reset()
        self._init_store()
        self.spec = None

    @property
    def nbytes(self) -> int:
        if not self.k_buf:
            return 0
        B, H_kv, _, D = self.k_buf[0].shape
        return format_bytes(self.fmt, len(self.k_buf), B, H_kv, D, self.held[0], self.k_buf[0].dtype, self.G,
                            self.residual)


def format_bytes(fmt: str, L: int, B: int, H_kv: int, D: int, S: int, dtype: torch.dtype, group_size: int,
                 residual: int) -> int:
    """Bytes a cache of format ``fmt`` ("fp16", "int2" ... "int8", "fp8_e4m3", ...) holds for S tokens.

    ``dtype``: the compute dtype (scales, zero points and the residual are kept in it). int: as
    kvref.quant.quantized_kv_bytes (codes bit-packed, a scale and a zero per group of G); fp8: one
    byte per number and one fp32 scale per layer for K and one for V; "fp16" / "fp32": no quantization.
    """
    e = torch.empty(0, dtype=dtype).element_size()
    if fmt in ("fp16", "fp32"):
        return 2 * L * B * H_kv * S * D * (2 if fmt == "fp16" else 4)
    r = residual_tokens(S, residual, 1 if fmt.startswith("fp8") else group_size)  # fp8: no groups
    n_q = S - r
    if fmt.startswith("fp8"):
        return 2 * L * B * H_kv * (n_q * D + r * D * e) + 2 * L * 4
    bits = int(fmt[3:])
    return 2 * L * B * H_kv * (n_q * D * bits // 8 + (n_q * D // group_size) * 2 * e + r * D * e)


def with_key_outliers(model, factor: float, pair: int | None = None):
    """A copy of a Llama-style ``model`` whose keys carry outlier channels, with the same function.

    In every layer and K/V head, the RoPE channel pair (i, i + D/2) (``pair``, default the last one,
    which RoPE rotates slowest) of the keys is multiplied by ``factor`` and the same channels of the
    queries that read that head are divided by it: q . k is unchanged (up to rounding), RoPE
    commutes with scaling a whole pair, so the model computes the same logits, but its cached keys
    now have two channels ``factor`` times larger than before, as KIVI measured in real Llama keys.
    """
    cfg = model.cfg
    H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    i = D // 2 - 1 if pair is None else pair
    chans = torch.tensor([i, i + D // 2])
    out = copy.deepcopy(model)
    with torch.no_grad():
        for block in out.blocks:
            qkv = block.attn.qkv  # rows: H * D queries, H_kv * D keys, H_kv * D values
            for p in (qkv.weight, qkv.bias) if qkv.bias is not None else (qkv.weight,):
                for j in range(H_kv):
                    p[H * D + j * D + chans] *= factor  # key head j
                    for h in range(j * H // H_kv, (j + 1) * H // H_kv):  # the query heads that read it
                        p[h * D + chans] /= factor
    return out


@torch.no_grad()
def calibrate_fp8(model, ids: torch.Tensor, fmt: str = "e4m3") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-tensor FP8 scales, one for K and one for V per layer, from the keys and values ``model``
    computes on calibration ``ids`` (B, T): the largest |k| maps to the format's largest number,
    as a calibrated vLLM FP8 cache's k_scale / v_scale."""
    cache = DynamicCache()
    model(ids, cache=cache)
    return [(fp8_scale(k, fmt), fp8_scale(v, fmt)) for k, v in zip(cache.k, cache.v)]
