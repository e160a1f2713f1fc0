"""Bad input gets one clear error that says what was wrong and what is allowed; nothing is truncated."""

from __future__ import annotations

import pytest
import torch

import kvref
from conftest import CUDA, tiny_config, tiny_model


@pytest.fixture
def model():
    return tiny_model(tiny_config("llama", 2, max_seq_len=32))


def test_prompt_plus_new_tokens_beyond_max_seq_len(model):
    ids = torch.randint(0, 256, (1, 20))
    with pytest.raises(ValueError, match=r"20 tokens.*max_new_tokens \(13\) = 33 exceeds the 32.*at most 12"):
        kvref.generate(model, ids, 13)
    assert kvref.generate(model, ids, 12).tokens.shape == (1, 32)  # the boundary itself is allowed


def test_forward_beyond_max_seq_len(model):
    with pytest.raises(ValueError, match="max_seq_len is 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    cache = kvref.DynamicCache()
    model(torch.zeros(1, 30, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"30 tokens already seen \+ 3 new = 33"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.length == 30  # the refused call left the cache as it was


def test_static_cache_capacity(model):
    cache = kvref.StaticCache(model.cfg, 1, max_len=10)
    model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"max_len=10.*holds 8.*adds 3.*max_len >= 11"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceeds the 10 tokens"):
        kvref.generate(model, torch.zeros(1, 8, dtype=torch.long), 5, cache=kvref.StaticCache(model.cfg, 1, 10))


def test_heads_not_divisible():
    with pytest.raises(ValueError, match=r"n_heads \(8\) must be a multiple of n_kv_heads \(3\).*\[1, 2, 4, 8\]"):
        kvref.ModelConfig(n_heads=8, n_kv_heads=3, d_model=64)


@pytest.mark.parametrize("bad", [-1, 256, 10_000])
def test_token_outside_vocabulary(model, bad):
    ids = torch.tensor([[1, 2, bad]])
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary.*\[0, 255\]"):
        model(ids)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        kvref.generate(model, ids, 3)


def test_cache_built_for_another_model(model):
    other = kvref.Transformer(tiny_config("llama", 4, n_layers=3, max_seq_len=32))
    cache = kvref.StaticCache(other.cfg, 1, 16)
    with pytest.raises(ValueError, match=r"built for another model.*n_layers: cache 3 vs model/input 2.*n_kv_heads"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    dyn = kvref.DynamicCache()  # a dynamic cache binds to the first model that uses it
    other(torch.zeros(1, 4, dtype=torch.long), cache=dyn)
    with pytest.raises(ValueError, match="built for another model"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=dyn)


def test_cache_of_another_dtype_or_batch(model):
    with pytest.raises(ValueError, match=r"dtype: cache torch.float16 vs model/input torch.float32"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=kvref.StaticCache(model.cfg, 1, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"batch: cache 2 vs model/input 1"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=kvref.StaticCache(model.cfg, 2, 16))


@CUDA
def test_cache_on_another_device(model):
    with pytest.raises(ValueError, match=r"device: cache cuda vs model/input cpu"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=kvref.StaticCache(model.cfg, 1, 16, device="cuda"))


def test_input_on_another_device(model):
    ids = torch.zeros(1, 4, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match="on meta but the model is on cpu"):
        model(ids)


def test_attention_mask_of_the_wrong_shape(model):
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape of input_ids \(2, 5\).*got \(2, 6\)"):
        model(ids, attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match=r"shape of input_ids"):
        kvref.generate(model, ids, 2, attention_mask=torch.ones(5))
    with pytest.raises(ValueError, match="only hold 0"):
        model(ids, attention_mask=torch.full((2, 5), 2))


@pytest.mark.parametrize("kw,msg", [
    (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    (dict(max_new_tokens=2, temperature=-1.0), "temperature must be >= 0"),
    (dict(max_new_tokens=2, top_k=0), r"top_k must be None or an integer in \[1, 256\]"),
    (dict(max_new_tokens=2, cache="paged-ish"), "cache must be one of"),
])
def test_generate_arguments(model, kw, msg):
    with pytest.raises(ValueError, match=msg):
        kvref.generate(model, torch.zeros(1, 3, dtype=torch.long), **kw)


def test_config_errors():
    with pytest.raises(ValueError, match="arch must be one of"):
        kvref.ModelConfig(arch="bert")
    with pytest.raises(ValueError, match="head_dim must be even"):
        kvref.ModelConfig(arch="llama", n_heads=2, head_dim=7, d_model=14)
    with pytest.raises(KeyError, match="choose one of"):
        kvref.ModelConfig.preset("llama-9b")


def test_presets_have_published_shapes():
    p = kvref.PRESETS
    assert (p["llama-2-7b"].n_layers, p["llama-2-7b"].n_kv_heads, p["llama-2-7b"].head_dim) == (32, 32, 128)
    assert (p["llama-3-8b"].n_kv_heads, p["mistral-7b"].n_kv_heads, p["qwen2.5-7b"].n_kv_heads) == (8, 8, 4)
    assert p["gpt2"].d_model == 768 and p["gpt2"].n_heads == 12 and p["qwen2.5-7b"].qkv_bias


def test_cache_stores_kv_heads_only():
    cfg = tiny_config("llama", 1)  # MQA: 4 query heads share 1 K/V head
    model = tiny_model(cfg)
    static, dynamic = kvref.StaticCache(cfg, 2, 16), kvref.DynamicCache()
    ids = torch.zeros(2, 5, dtype=torch.long)
    model(ids, cache=static), model(ids, cache=dynamic)
    assert static.k.shape == (cfg.n_layers, 2, 1, 16, cfg.head_dim)
    assert dynamic.k[0].shape == (2, 1, 5, cfg.head_dim)
    elt = 4  # fp32
    assert static.nbytes == 2 * cfg.n_layers * 2 * 16 * 1 * cfg.head_dim * elt
    assert dynamic.nbytes == 2 * cfg.n_layers * 2 * 5 * 1 * cfg.head_dim * elt


def test_reset_forgets_the_previous_prompt():
    model = tiny_model(tiny_config("gpt2"))
    a, b = torch.randint(0, 256, (1, 6)), torch.randint(0, 256, (1, 6))
    for cache in (kvref.StaticCache(model.cfg, 1, 32), kvref.DynamicCache()):
        model(a, cache=cache)
        stale = model(b, cache=cache)  # b appended after a: not b's logits
        cache.reset()
        fresh = model(b, cache=cache)
        torch.testing.assert_close(fresh, model(b), atol=1e-5, rtol=0)
        assert (stale - fresh).abs().max() > 1e-2  # without reset the answer really is different
