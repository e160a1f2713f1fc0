"""The small parts every layer kind is built from: RMSNorm, RoPE and kvref's Linear.

The plain model (kvref.model), the per-layer kinds (kvref.layers) and MLA (kvref.mla) all import them from
here, so none of those imports another to borrow a part.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # normalise in fp32, as the Llama reference does
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(cfg: ModelConfig, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position: each (max_seq_len, D), in fp32."""
    D = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.int64, device=device).float() / D))
    angles = torch.arange(cfg.max_seq_len, device=device).float()[:, None] * inv_freq[None, :]  # (S_max, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (S_max, D): the "rotate half" layout of HF checkpoints
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + D/2) of x (B, H, T, D) by the angle of each token's position."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin  # cos, sin: (B, 1, T, D)


REVERSED_MIN_WIDTH = 512  # Linear's (W @ x.T).T form only for products at least this wide (in_features)


def upcast_from_rows(weights: int) -> int:
    """From how many rows a 16-bit product on a CPU without a 16-bit kernel runs in fp32 (Linear's rule)."""
    return 4 if weights <= 2**21 else 32


class Linear(nn.Linear):
    """``nn.Linear`` (same weights, same results up to rounding) with three CPU speed-ups.

    ``x @ W.T + b`` can also be computed as ``(W @ x.T).T + b``. For 8 to 32 rows of x (one decode
    step of a batch of 8-32 sequences) and GPT-2's widths, MKL's fp32 GEMM ran the second form 1.1-1.3x
    faster per decode step on an Intel Xeon (docs/benchmarks.md). For narrow products (the course's tiny
    models, 128 wide) it was 1.4-2.4x *slower* on the AMD EPYC, so it is kept to products at least
    ``REVERSED_MIN_WIDTH`` (512) wide.
    Other shapes and devices use F.linear, and so does a weight stored (in, out) (``kvref.layout``), for
    which the second form is the slow one.

    ``kvref.layout`` may also give the layer ``packed``: oneDNN's reordered copy of W (``pack``). While the
    weight is the one it was packed from, fp32 CPU inference then runs on oneDNN's kernel instead of
    MKL's (about 2x faster with 4-64 rows on an AMD EPYC, where MKL does not take its fastest path).

    A CPU without a 16-bit matrix unit (oneDNN says so: no AVX-512 BF16/FP16 or AMX) multiplies bf16 and
    fp16 with PyTorch's plain loops, 1.2-10x slower than MKL's fp32 GEMM on the same numbers for 4-128 rows
    (docs/benchmarks.md, ``python -m kvref.bench linear``). There the product runs in fp32 and is rounded
    once to the input's dtype, which is what a 16-bit GEMM with fp32 accumulation returns (only the order
    of the sums differs). Converting W costs about one row of the slow product for small weights but 15-20
    rows for large ones, so it pays from 4 rows for weights up to 2M numbers and from 32 rows for larger
    ones (a 4096 x 4096 layer, a GPT-2 lm_head): ``upcast_from_rows``.

    ``path(x)`` names the product ``forward`` will run for x.
    """

    packed: torch.Tensor | None = None  # oneDNN's opaque copy of W, or None
    _packed_from: tuple[int, int] = (0, -1)  # (data_ptr, _version) of the weight it was packed from

    def pack(self, rows: int) -> None:
        """Keep oneDNN's copy of W reordered for ``rows`` rows per call (a hint: any row count works)."""
        w = self.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_size=rows)
        self._packed_from = (w.data_ptr(), w._version)

    def unpack(self) -> None:
        self.packed = None

    def __getstate__(self) -> dict:  # copy.deepcopy, pickle: oneDNN's opaque copy cannot be copied; drop it
        state = self.__dict__.copy()
        state.pop("packed", None)
        state.pop("_packed_from", None)
        return state

    def _packed_ok(self, x: torch.Tensor) -> bool:
        w = self.weight
        return (x.device.type == "cpu" and x.dtype == torch.float32 == w.dtype
                and (w.data_ptr(), w._version) == self._packed_from  # W changed since: the copy is stale
                and not (torch.is_grad_enabled() and w.requires_grad))  # oneDNN's op has no backward

    def path(self, x: torch.Tensor) -> str:
        """Which product ``forward`` runs for x: "packed" (oneDNN's copy), "fp32" (a 16-bit product in fp32,
        rounded once), "reversed" ((W @ x.T).T) or "linear" (F.linear)."""
        if not torch.compiler.is_compiling() and self.packed is not None and self._packed_ok(x):
            return "packed"
        rows = x.numel() // self.in_features
        if (x.dtype != torch.float32 and x.dtype == self.weight.dtype and x.device.type == "cpu"
                and x.dtype in _slow_16bit() and rows >= upcast_from_rows(self.weight.numel())):
            return "fp32"
        if (x.device.type == "cpu" and x.dtype == torch.float32 and 8 <= rows <= 32
                and self.in_features >= REVERSED_MIN_WIDTH and self.weight.is_contiguous()):
            return "reversed"
        return "linear"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        path = self.path(x)
        if path == "packed":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if path == "fp32":
            bias = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)  # one rounding, as a 16-bit GEMM
        if path == "linear":
            return super().forward(x)
        rows = x.numel() // self.in_features
        x2 = x.reshape(rows, self.in_features)
        y = self.weight @ x2.T if self.bias is None else torch.addmm(self.bias[:, None], self.weight, x2.T)
        return y.T.contiguous().view(*x.shape[:-1], self.out_features)  # y was (out, rows)


@functools.cache
def _slow_16bit() -> frozenset[torch.dtype]:
    """The 16-bit dtypes this CPU has no oneDNN matrix kernel for (PyTorch then multiplies them in plain loops)."""
    slow = set()
    for dtype, has in ((torch.bfloat16, "_is_mkldnn_bf16_supported"), (torch.float16, "_is_mkldnn_fp16_supported")):
        try:
            native = bool(getattr(torch.ops.mkldnn, has)())
        except (AttributeError, RuntimeError):  # a torch without the check: assume the plain loops
            native = False
        if not native:
            slow.add(dtype)
    return frozenset(slow)
