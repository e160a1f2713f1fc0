"""Bytes and dtypes: the units every memory formula in kvref counts in (chapter 3's $e$, bytes per element).

A module of its own, below the memory ledger (kvref.memory), the per-layer planner (kvref.planner) and the
layer kinds (kvref.kinds), so that each of them imports it and none imports another back.
"""

from __future__ import annotations

import torch

GiB = 1024**3
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating-point torch dtype, also from the names "fp16", "bf16", "fp32"."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be a torch.dtype or one of {sorted(DTYPES)}; got {dtype!r}")
        dtype = DTYPES[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"the cache dtype must be a floating-point torch.dtype; got {dtype!r}")
    return dtype


def bytes_per_element(dtype: torch.dtype | str) -> int:
    """2 for fp16/bf16, 4 for fp32."""
    return torch.empty((), dtype=as_dtype(dtype)).element_size()
