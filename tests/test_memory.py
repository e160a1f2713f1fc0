"""The memory ledger: the formula, the seed's worked numbers, every cache's nbytes, the planner."""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.memory import GiB, kv_bytes_per_token, kv_cache_bytes, param_count, plan_memory, weight_bytes
from kvref.paged import PagedKVCache

MiB = 1024**2


def tiny(**kw) -> kvref.ModelConfig:
    return kvref.ModelConfig(**{"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_model": 32, "vocab_size": 256,
                                "max_seq_len": 64, **kw})


def test_seed_worked_example_7b_mha():
    # The seed's numbers are exact powers of two for llama-2-7b (32 layers x 4096 hidden, fp16).
    cfg = kvref.ModelConfig.preset("llama-2-7b")
    assert kv_bytes_per_token(cfg, torch.float16) == 512 * 1024
    assert kv_cache_bytes(cfg, 1, 4096, torch.float16) == 2 * GiB
    assert kv_cache_bytes(cfg, 1, 8192, torch.float16) == 4 * GiB  # twice at 8K
    assert kv_cache_bytes(cfg, 8, 4096, torch.float16) == 16 * GiB  # eight times at batch 8
    assert kv_cache_bytes(cfg, 1, 4096, "fp32") == 4 * GiB


@pytest.mark.parametrize("name, at_4k", [
    ("llama-3-8b", 512 * MiB),  # GQA 8 of 32 heads: a quarter of llama-2-7b
    ("mistral-7b", 512 * MiB),
    ("qwen2.5-7b", 224 * MiB),  # 28 layers x 4 KV heads x 128
    ("gpt2", 144 * MiB),  # 12 layers x 768, MHA
])
def test_preset_figures(name, at_4k):
    assert kv_cache_bytes(kvref.ModelConfig.preset(name), 1, 4096, torch.float16) == at_4k


def test_weight_bytes_match_the_model():
    # Analytic parameter count == what nn.Module counts, across the features that change it.
    for cfg in [tiny(arch="gpt2", n_kv_heads=None), tiny(), tiny(qkv_bias=True, tie_embeddings=False)]:
        assert param_count(cfg) == sum(p.numel() for p in kvref.Transformer(cfg).parameters())
    assert param_count(kvref.ModelConfig.preset("llama-2-7b")) == 6_738_415_616  # the published count
    assert 12.5 * GiB < weight_bytes(kvref.ModelConfig.preset("llama-2-7b")) < 12.6 * GiB  # the seed's "about 13 GB"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_formula_equals_every_cache_nbytes(dtype):
    cfg = tiny()
    model = kvref.Transformer(cfg, dtype=dtype)
    ids = torch.randint(0, 256, (3, 7))
    static = kvref.StaticCache(cfg, 3, 40, dtype=dtype)
    assert static.nbytes == kv_cache_bytes(cfg, 3, 40, dtype)  # preallocated max_len, used or not
    dynamic = kvref.DynamicCache()
    kvref.generate(model, ids, 5, cache=dynamic)
    assert dynamic.nbytes == kv_cache_bytes(cfg, 3, 7 + 4, dtype)  # the last new token is never stored
    paged = PagedKVCache(cfg, num_blocks=10, block_size=4, dtype=dtype)
    assert paged.nbytes == kv_cache_bytes(cfg, 1, 10 * 4, dtype, block_size=4)  # the whole pool


def test_block_rounding():
    cfg = tiny()
    per_token = kv_bytes_per_token(cfg, torch.float32)
    assert kv_cache_bytes(cfg, 2, 17, torch.float32, block_size=16) == 2 * 32 * per_token
    assert kv_cache_bytes(cfg, 2, 16, torch.float32, block_size=16) == 2 * 16 * per_token


def test_quantized_formula_by_hand_and_against_the_cache():
    cfg = tiny()  # L=2, H_kv=2, D=8
    # int8, G=4, 10 tokens, residual 2: Q=8 quantized tokens per (layer, row, head), for K and for V:
    # codes 8*8 = 64 B; 8*8/4 = 16 groups x (scale + zero) x 2 B = 64 B; residual 2*8*2 = 32 B -> 160.
    # x 2 (K, V) x L*B*H_kv = 4 -> 1280.
    assert kv_cache_bytes(cfg, 1, 10, torch.float16, kv_bits=8, group_size=4, residual=2) == 1280
    # int4 packs two per byte: codes 32 B instead of 64 -> 128 per K or V -> 1024.
    assert kv_cache_bytes(cfg, 1, 10, "fp16", kv_bits=4, group_size=4, residual=2) == 1024
    # All tokens in the residual window: exactly the fp16 cache.
    assert kv_cache_bytes(cfg, 1, 10, torch.float16, kv_bits=4, group_size=4, residual=64) == kv_cache_bytes(
        cfg, 1, 10, torch.float16)
    from kvref.quant import QuantizedCache

    cache = QuantizedCache(bits=4, group_size=4, residual=2)
    kvref.generate(kvref.Transformer(cfg), torch.randint(0, 256, (3, 7)), 5, cache=cache)
    assert cache.nbytes == kv_cache_bytes(cfg, 3, 11, torch.float32, kv_bits=4, group_size=4, residual=2)


def test_planner_on_a_24_gib_card():
    cfg = kvref.ModelConfig.preset("llama-2-7b")
    one = plan_memory(cfg, 24 * GiB, batch=1, seq_len=4096, reserve_bytes=GiB)
    assert one.fits and one.need_bytes == 2 * GiB
    # 24 - 12.55 weights - 1 reserve = 10.45 GiB -> 5 sequences of 2 GiB, and 21398 tokens of 512 KiB.
    assert one.max_batch == 5 and one.kv_tokens == (24 * GiB - weight_bytes(cfg) - GiB) // (512 * 1024)
    eight = plan_memory(cfg, 24 * GiB, batch=8, seq_len=4096, reserve_bytes=GiB)
    assert not eight.fits
    assert eight.max_seq_len == eight.kv_tokens // 8  # no rounding in a plain cache
    text = eight.explain()
    assert "8 sequences of 4096 tokens" in text and "16.00 GiB" in text and "24.00 GiB" in text
    assert "does not fit" in text
    gqa = plan_memory(kvref.ModelConfig.preset("llama-3-8b"), 24 * GiB, batch=8, seq_len=4096, reserve_bytes=GiB)
    assert gqa.fits  # GQA: a quarter of the KV, the same request fits
    tiny_card = plan_memory(cfg, 8 * GiB)
    assert tiny_card.kv_budget_bytes == 0 and tiny_card.max_batch == 0 and "does not even hold" in tiny_card.explain()


def test_planner_with_paging_rounds_to_blocks():
    cfg = tiny(max_seq_len=1000)
    per_token = kv_bytes_per_token(cfg, torch.float16)
    plan = plan_memory(cfg, 100 * per_token, batch=1, weights=0, block_size=16)
    assert plan.max_seq_len == 96  # 100 tokens of budget hold 6 whole blocks of 16


def test_bad_inputs_say_what_is_allowed():
    cfg = tiny()
    with pytest.raises(ValueError, match="floating-point"):
        kv_cache_bytes(cfg, 1, 8, torch.int8)
    with pytest.raises(ValueError, match="batch must be an integer >= 0"):
        kv_cache_bytes(cfg, -1, 8)
    with pytest.raises(ValueError, match="kv_bits must be one of"):
        kv_cache_bytes(cfg, 1, 8, kv_bits=3, group_size=4)
    with pytest.raises(ValueError, match="group_size must divide head_dim=8"):
        kv_cache_bytes(cfg, 1, 8, kv_bits=8, group_size=3)
