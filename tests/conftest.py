"""Shared fixtures: tiny seeded models (fast on 2 CPU cores) and the device list.

CUDA cases are collected everywhere and skip cleanly when no GPU is present.
"""

from __future__ import annotations

import pytest
import torch

import kvref

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def tiny_config(arch: str = "llama", n_kv_heads: int | None = None, **kw) -> kvref.ModelConfig:
    """Two layers, four heads of 16 dims: big enough for GQA/MQA, small enough to run in milliseconds."""
    base = dict(arch=arch, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, d_model=64, vocab_size=256, max_seq_len=96)
    base.update(kw)
    return kvref.ModelConfig(**base)


def tiny_model(cfg: kvref.ModelConfig, device: str = "cpu", seed: int = 0, std: float = 0.2) -> kvref.Transformer:
    """Random weights with a larger spread than the default init (0.02), so that greedy decoding
    does not collapse onto one repeated token and a wrong cache changes the chosen tokens."""
    torch.manual_seed(seed)
    model = kvref.Transformer(cfg, device=device).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    return model


# (arch, n_kv_heads): MHA for both architectures, GQA and MQA for the Llama family.
ATTENTION_KINDS = [("gpt2", None), ("llama", None), ("llama", 2), ("llama", 1)]
