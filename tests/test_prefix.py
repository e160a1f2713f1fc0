"""Prefix caching: reuse of the longest cached chain, LRU eviction, identical outputs, statistics."""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.paged import CacheFull, PagedKVCache
from kvref.prefix import ROOT, PrefixCachingPool, block_hash
from kvref.serve import Engine, Request


def tiny() -> kvref.ModelConfig:
    return kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256, max_seq_len=96)


@pytest.fixture(scope="module")
def model() -> kvref.Transformer:
    torch.manual_seed(0)
    return kvref.Transformer(tiny()).eval()


@torch.inference_mode()
def prefill(model, cache: PagedKVCache, sid, prompt: list[int]) -> tuple[int, torch.Tensor]:
    """Start a sequence, feed the uncached part of its prompt; (cached tokens, logits of the fed part)."""
    cached = cache.add_sequence(sid, prompt)
    rest = prompt[cached:]
    cache.begin([sid], [len(rest)], [rest])
    return cached, model(torch.tensor([rest]), cache=cache)[0]


def test_hash_names_the_whole_prefix():
    a, b = block_hash(ROOT, [1, 2, 3, 4]), block_hash(ROOT, [1, 2, 3, 5])
    assert a != b
    assert block_hash(a, [9, 9, 9, 9]) != block_hash(b, [9, 9, 9, 9])  # same tokens, different history
    assert block_hash(a, [9, 9, 9, 9]) == block_hash(a, [9, 9, 9, 9])


@torch.inference_mode()
def test_reuse_longest_chain_and_outputs_unchanged(model):
    system = list(range(100, 130))  # 30 tokens: 7 full blocks of 4 + 2
    cache = PagedKVCache(tiny(), num_blocks=40, block_size=4, prefix_caching=True)
    cached, _ = prefill(model, cache, "a", system + [1, 2, 3])
    assert cached == 0
    cache.free_sequence("a")  # its blocks stay cached
    prompt_b = system + [7, 7, 7, 7, 7]
    cached, logits = prefill(model, cache, "b", prompt_b)
    assert cached == 28  # the 7 full blocks of the shared system prompt
    ref = model(torch.tensor([prompt_b]))[0, cached:]  # no cache at all
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)  # fp32: the cached K/V are the same numbers
    assert cache.pool.hit_tokens == 28 and cache.pool.lookup_tokens == 33 + 35
    assert cache.pool.hit_rate == pytest.approx(28 / 68)


def test_last_prompt_token_is_always_recomputed(model):
    prompt = list(range(50, 58))  # exactly two full blocks
    cache = PagedKVCache(tiny(), num_blocks=10, block_size=4, prefix_caching=True)
    prefill(model, cache, "a", prompt)
    cached, logits = prefill(model, cache, "b", prompt)  # identical prompt, while "a" still holds the blocks
    assert cached == 4 and logits.shape[0] == 4  # the second block holds the last token: recomputed
    assert cache.pool.num_used == 3  # a: 2 blocks; b: shares the first, computes its own second


def test_lru_eviction_and_in_use_blocks_are_never_evicted():
    pool = PrefixCachingPool(3, block_size=2)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):  # name each block as a one-block prefix
        pool.commit([b], [i, i], [])
    for b in blocks:
        pool.free(b)  # freed in order: blocks[0] is the least recently used
    assert pool.num_free == 3 and len(pool.evictable) == 3
    found, _ = pool.match([1, 1, 0])  # reuse blocks[1]: in use again, no longer evictable
    assert found == [blocks[1]]
    (new,) = pool.allocate(1)
    assert new == blocks[0] and pool.evictions == 1  # the oldest unused cached block went first
    assert pool.match([0, 0, 5])[0] == []  # its content is gone
    (new2,) = pool.allocate(1)
    assert new2 == blocks[2]
    with pytest.raises(CacheFull, match="1 blocks of 2 tokens needed, 0 of 3 free"):
        pool.allocate(1)  # blocks[1] is in use: never evicted
    assert pool.match([1, 1, 0])[0] == [blocks[1]]  # still findable


def test_engine_with_prefix_caching_equals_without(model):
    system = list(range(200, 236))  # a 36-token shared system prompt
    reqs = [Request(i, system + [i, i + 1, i + 2], 4, arrival=8 * i) for i in range(5)]  # no overlap
    outs = {}
    for on in (False, True):
        eng = Engine(model, num_blocks=30, block_size=4, token_budget=16, prefix_caching=on)
        states = eng.run(reqs)
        outs[on] = {r: s.output for r, s in states.items()}
        saved = sum(s.cached_tokens for s in states.values())
        if on:  # requests 1..4 each reuse the 9 full blocks of the system prompt
            assert saved == 4 * 36
            assert sum(st.prefill_tokens for st in eng.steps) == 5 * 39 - saved
        else:
            assert saved == 0
        assert eng.cache.pool.num_used == 0  # everything finished and freed
    assert outs[True] == outs[False]
