"""Quantized KV cache: store K/V as int8 or int4 codes, dequantize when attention reads them.

KV-cache quantization trades precision for space: fp16 -> int8 halves the cache, int4 quarters
it. It is lossy, so its effect has to be measured on real data (``python -m kvref.bench quality``).

Asymmetric (min/max) quantization of a group of G numbers x:

    scale = (max x - min x) / (2**bits - 1)      zero = min x
    code  = round((x - zero) / scale)             x_hat = code * scale + zero     |x - x_hat| <= scale / 2

Which numbers share a group matters. Following KIVI (Liu et al., 2024):

* **keys per channel**: key outliers live in a few fixed channels, so each channel gets its own
  scale, shared by a group of G consecutive tokens;
* **values per token**: each token's value vector is split into groups of G channels.

The newest tokens stay in full precision (the *residual window* of R tokens): they are the ones
attention weighs most, and keys can only be quantized once G tokens have gathered for a group.
Tokens leave the residual in whole key groups, so between R and R + G - 1 tokens are held in full
precision (exactly ``residual_tokens(S, R, G)``). Scales and zero points are kept in the compute dtype;
int4 codes are packed two per byte.

``quantize`` itself takes any width from 2 to 8 bits (one code per byte), so that narrower formats
can be studied (``kvref.bench.simquant.SimulatedQuantCache``); ``QuantizedCache`` stores 8 or 4.
FP8 is the other common cache format: ``fp8_round_trip`` rounds to torch's float8 dtypes
(e4m3: 3 mantissa bits, largest 448; e5m2: 2 mantissa bits, largest 57344) after dividing by a scale.

kvref reads the cache by dequantizing all of it into a full-precision copy that attention then
reads (``QuantizedCache.read``); engines built for quantized caches convert the codes inside the
attention kernel instead, so the bytes read per decode step shrink as well as the bytes stored.
"""

from __future__ import annotations

import torch

from .cache import CropError, KVCache
from .config import ModelConfig

BITS = (8, 4)  # what QuantizedCache (and kvref.memory's kv_bits) stores: int4 packed two per byte
INT_BITS = range(2, 9)  # what quantize() accepts: 2 to 8 bits, one code per byte
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


class QuantizationError(ValueError):
    """A quantization setting that cannot work (bits, group size, head_dim)."""


# -- the arithmetic -------------------------------------------------------------------------------
def quantize(x: torch.Tensor, bits: int, group_size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize x in groups of ``group_size`` consecutive elements along ``dim`` (-1 or -2).

    Returns (codes uint8, same shape as x, one code per byte), scale and zero, with ``dim`` shrunk
    by ``group_size`` (in x's dtype).
    """
    if not isinstance(bits, int) or bits not in INT_BITS:
        raise QuantizationError(f"bits must be an integer from 2 to 8; got {bits!r}")
    dim = dim % x.dim()
    n = x.shape[dim]
    if n % group_size:
        raise QuantizationError(f"group_size {group_size} does not divide the {n} elements along dim {dim}")
    g = x.float().unflatten(dim, (n // group_size, group_size))  # group members along dim + 1
    lo, hi = g.amin(dim + 1, keepdim=True), g.amax(dim + 1, keepdim=True)
    qmax = 2**bits - 1
    scale = ((hi - lo) / qmax).to(x.dtype)  # kept in the compute dtype, as stored
    zero = lo.to(x.dtype)
    s = scale.float().masked_fill(scale == 0, 1.0)  # a constant group: every code is 0, x_hat = zero exactly
    codes = ((g - zero.float()) / s).round().clamp(0, qmax).to(torch.uint8).flatten(dim, dim + 1)
    return codes, scale.squeeze(dim + 1), zero.squeeze(dim + 1)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int, dim: int) -> torch.Tensor:
    """Inverse of ``quantize`` (up to the rounding error): codes * scale + zero, in scale's dtype."""
    dim = dim % codes.dim()
    g = codes.float().unflatten(dim, (-1, group_size))  # group members along dim + 1
    x_hat = g * scale.float().unsqueeze(dim + 1)  # each group's scale and zero broadcast over it
    x_hat += zero.float().unsqueeze(dim + 1)
    return x_hat.flatten(dim, dim + 1).to(zero.dtype)


def fp8_scale(x: torch.Tensor, fmt: str = "e4m3", dim: int | None = None) -> torch.Tensor:
    """Scale that maps the largest |x| onto the format's largest number: per tensor (``dim=None``,
    a 0-dim tensor, as vLLM's k_scale / v_scale) or per slice along ``dim`` (keepdim)."""
    big = torch.finfo(_fp8_dtype(fmt)).max
    amax = x.float().abs().amax() if dim is None else x.float().abs().amax(dim, keepdim=True)
    return (amax / big).masked_fill(amax == 0, 1.0)


def fp8_round_trip(x: torch.Tensor, scale: torch.Tensor | float = 1.0, fmt: str = "e4m3") -> torch.Tensor:
    """What an FP8 cache gives back: x / scale rounded to float8 (``fmt`` e4m3 or e5m2), times scale.

    Float formats keep a relative precision (e4m3: within 1/16 of each number, down to 2**-6 * scale;
    below that the step is fixed); numbers beyond the largest one saturate, they do not wrap.
    """
    dt = _fp8_dtype(fmt)
    big = torch.finfo(dt).max
    y = (x.float() / scale).clamp(-big, big)  # float8_e4m3fn has no inf: out-of-range would be NaN
    return (y.to(dt).float() * scale).to(x.dtype)


def _fp8_dtype(fmt: str) -> torch.dtype:
    if fmt not in FP8:
        raise QuantizationError(f"fp8 format must be one of {sorted(FP8)}; got {fmt!r}")
    return FP8[fmt]


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim (which must be even): (..., D) -> (..., D / 2)."""
    if codes.shape[-1] % 2:
        raise QuantizationError(f"int4 packs two values per byte: the last dim must be even; got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(..., D / 2) bytes -> (..., D) codes in 0..15."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


# -- the memory bill ------------------------------------------------------------------------------
def residual_tokens(seq_len: int, residual: int, group_size: int) -> int:
    """Tokens held in full precision: all of them up to R, then R + ((S - R) mod G)."""
    return seq_len if seq_len <= residual else residual + (seq_len - residual) % group_size


def quantized_kv_bytes(cfg: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype, bits: int,
                       group_size: int | None = None, residual: int = 0) -> int:
    """Bytes a QuantizedCache holds for ``seq_len`` tokens: codes + scales + zero points + residual.

    Per layer, row and K/V head, for K and for V alike (both have one group per G elements):
    N_q = S - residual_tokens quantized tokens cost N_q * D * bits / 8 bytes of codes plus
    N_q * D / G groups * 2 numbers (scale, zero) in ``dtype``; the residual costs r * D * dtype bytes.
    """
    G = group_size or cfg.head_dim
    D, esize = cfg.head_dim, torch.empty(0, dtype=dtype).element_size()
    r = residual_tokens(seq_len, residual, G)
    n_q = seq_len - r
    per_head = n_q * D * bits // 8 + (n_q * D // G) * 2 * esize + r * D * esize
    return 2 * cfg.n_layers * batch * cfg.n_kv_heads * per_head


# -- the cache ------------------------------------------------------------------------------------
class QuantizedCache(KVCache):
    """KIVI-style KV cache: int8/int4 codes, keys per channel, values per token, fp residual window.

    ``bits``: 8 or 4. ``group_size``: G elements share one scale and zero point (default: head_dim);
    it must divide head_dim. ``residual``: the R newest tokens stay in full precision (0 = none,
    apart from an incomplete key group). Attention gets dequantized K/V on every read.
    """

    def __init__(self, bits: int = 8, group_size: int | None = None, residual: int = 32) -> None:
        super().__init__()
        if bits not in BITS:
            raise QuantizationError(f"bits must be 8 or 4; got {bits!r}")
        if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
            raise QuantizationError(f"group_size must be a positive integer or None (= head_dim); got {group_size!r}")
        if not isinstance(residual, int) or residual < 0:
            raise QuantizationError(f"residual must be an integer >= 0 (tokens kept in full precision); got {residual!r}")
        self.bits, self.group_size, self.residual = bits, group_size, residual
        self._init_store()

    def _init_store(self) -> None:
        self.kq: list[torch.Tensor] = []  # per layer (B, H_kv, N_q, D * bits / 8) uint8 codes
        self.k_scale: list[torch.Tensor] = []  # (B, H_kv, N_q / G, D): per channel, G tokens a group
        self.k_zero: list[torch.Tensor] = []
        self.vq: list[torch.Tensor] = []  # (B, H_kv, N_q, D * bits / 8)
        self.v_scale: list[torch.Tensor] = []  # (B, H_kv, N_q, D / G): per token, G channels a group
        self.v_zero: list[torch.Tensor] = []
        self.k_res: list[torch.Tensor] = []  # (B, H_kv, r, D) full precision, newest tokens
        self.v_res: list[torch.Tensor] = []

    def _validate(self, D: int) -> int:
        G = self.group_size or D
        if D % G:
            raise QuantizationError(
                f"group_size {G} must divide head_dim {D}: values are grouped along head_dim. "
                f"Allowed here: {[g for g in range(1, D + 1) if D % g == 0]}")
        if self.bits == 4 and D % 2:
            raise QuantizationError(f"int4 packs two values per byte along head_dim, which must be even; got {D}")
        return G

    def check(self, cfg: ModelConfig, batch: int, new_tokens: int, dtype: torch.dtype, device) -> None:
        self._validate(cfg.head_dim)
        super().check(cfg, batch, new_tokens, dtype, device)

    # -- storage ------------------------------------------------------------------------------------
    def _pack(self, codes: torch.Tensor) -> torch.Tensor:
        return pack_int4(codes) if self.bits == 4 else codes

    def _unpack(self, stored: torch.Tensor) -> torch.Tensor:
        return unpack_int4(stored) if self.bits == 4 else stored

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        G = self._validate(k.shape[-1])
        if layer == len(self.k_res):  # first call for this layer: empty quantized store
            B, H_kv, _, D = k.shape
            nb = D * self.bits // 8
            empty = lambda *s, dt=k.dtype: torch.empty(*s, dtype=dt, device=k.device)  # noqa: E731
            self.kq.append(empty(B, H_kv, 0, nb, dt=torch.uint8))
            self.vq.append(empty(B, H_kv, 0, nb, dt=torch.uint8))
            self.k_scale.append(empty(B, H_kv, 0, D))
            self.k_zero.append(empty(B, H_kv, 0, D))
            self.v_scale.append(empty(B, H_kv, 0, D // G))
            self.v_zero.append(empty(B, H_kv, 0, D // G))
            self.k_res.append(k)
            self.v_res.append(v)
        else:
            self.k_res[layer] = torch.cat([self.k_res[layer], k], dim=2)  # (B, H_kv, r + T, D)
            self.v_res[layer] = torch.cat([self.v_res[layer], v], dim=2)
        r = self.k_res[layer].shape[2]
        move = (r - self.residual) // G * G if r > self.residual else 0  # whole key groups leave the residual
        if move:
            old_k, old_v = self.k_res[layer][:, :, :move], self.v_res[layer][:, :, :move]
            kc, ks, kz = quantize(old_k, self.bits, G, dim=-2)  # keys: per channel, G tokens a group
            vc, vs, vz = quantize(old_v, self.bits, G, dim=-1)  # values: per token, G channels a group
            self.kq[layer] = torch.cat([self.kq[layer], self._pack(kc)], dim=2)
            self.k_scale[layer] = torch.cat([self.k_scale[layer], ks], dim=2)
            self.k_zero[layer] = torch.cat([self.k_zero[layer], kz], dim=2)
            self.vq[layer] = torch.cat([self.vq[layer], self._pack(vc)], dim=2)
            self.v_scale[layer] = torch.cat([self.v_scale[layer], vs], dim=2)
            self.v_zero[layer] = torch.cat([self.v_zero[layer], vz], dim=2)
            self.k_res[layer] = self.k_res[layer][:, :, move:]
            self.v_res[layer] = self.v_res[layer][:, :, move:]
        return self.read(layer)

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All S keys and values of a layer, dequantized, oldest first: (B, H_kv, S, D) each."""
        G = self.group_size or self.k_res[layer].shape[-1]
        k_old = dequantize(self._unpack(self.kq[layer]), self.k_scale[layer], self.k_zero[layer], G, dim=-2)
        v_old = dequantize(self._unpack(self.vq[layer]), self.v_scale[layer], self.v_zero[layer], G, dim=-1)
        return torch.cat([k_old, self.k_res[layer]], dim=2), torch.cat([v_old, self.v_res[layer]], dim=2)

    def reset(self) -> None:
        super().reset()
        self._init_store()
        self.spec = None

    def _crop_storage(self, length: int, drop: int) -> None:
        """Only full-precision tokens can be dropped: a quantized key group's scale and zero point were
        computed over all G of its tokens, so the kept ones cannot be restored once some are cut away.

        What holds after a crop: the kept residual rows are the very rows fed (bit for bit), every quantized
        group has the codes a cache fed only the kept tokens gives it, and such a fresh cache may still
        hold in full precision up to ceil(drop / G) groups that this one has already quantized (they left
        the residual while the dropped tokens were held): those numbers differ by at most scale / 2.
        Keep ``residual >= k + 1`` for speculative decoding with k drafts, so drafts never leave the residual.
        """
        r = self.k_res[0].shape[2] if self.k_res else 0
        if drop > r:
            raise CropError(f"QuantizedCache can only drop tokens still held in full precision: its {r} newest "
                            f"(residual={self.residual}); asked to drop {drop}. Build it with a larger residual "
                            f"(>= k + 1 for k draft tokens)")
        self.k_res = [t[:, :, : r - drop] for t in self.k_res]  # (B, H_kv, r - drop, D)
        self.v_res = [t[:, :, : r - drop] for t in self.v_res]

    @property
    def nbytes(self) -> int:
        """Codes + scales + zero points + full-precision residual, every layer, K and V."""
        parts = self.kq + self.k_scale + self.k_zero + self.vq + self.v_scale + self.v_zero + self.k_res + self.v_res
        return sum(t.numel() * t.element_size() for t in parts)
