"""Rollback on every cache kind: ``crop(length)`` then re-feeding equals a cache fed only the kept tokens.

Bounds: fp32 logits within 1e-5 (the same math, summed in another order, as the course's other cache tests).
The quantized cache is the exception, with its own bound (see its test).
"""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.cache import CropError
from kvref.layers import LayeredCache
from tests.conftest import tiny_config, tiny_model

G = torch.Generator().manual_seed(3)
IDS = torch.randint(0, 256, (2, 30), generator=G)  # 12 prompt + 6 drafts + re-fed tokens


def layered_model() -> kvref.Transformer:
    cfg = kvref.ModelConfig(n_layers=4, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, max_seq_len=40,
                            sliding_window=5, layer_types=("latent", "sliding", "full", "shared:1"),
                            kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)
    return tiny_model(cfg, std=0.3)


def feed(model, cache, ids, chunks):
    """Feed ids (B, T) in the given chunk sizes; return the logits of every fed token (B, T, V)."""
    out, t = [], 0
    for n in chunks:
        out.append(model(ids[:, t:t + n], cache=cache))
        t += n
    return torch.cat(out, dim=1)


def crop_then_refeed(model, make, keep=14, fed=18):
    """Prompt of 12, a verify-like chunk up to `fed`, crop to `keep`, then re-feed: a chunk of 3 and 4 single
    tokens. Returns (logits after the crop, logits of a fresh cache fed only ids[:, :keep] then the same)."""
    rest = IDS[:, keep:]  # the "other" continuation starts where the crop left off
    other = torch.cat([IDS[:, :keep], rest.flip(1)], dim=1)  # a different token after the cut than before it
    with torch.no_grad():
        a = make()
        feed(model, a, IDS, [12, fed - 12])
        a.crop(keep)
        got = feed(model, a, other[:, keep:], [3, 1, 1, 1, 1])
        b = make()
        feed(model, b, other, [keep])
        want = feed(model, b, other[:, keep:], [3, 1, 1, 1, 1])
    return got, want, a, b


KINDS = {
    "dynamic": (tiny_config(n_kv_heads=2), lambda cfg: kvref.DynamicCache()),
    "static": (tiny_config(n_kv_heads=2), lambda cfg: kvref.StaticCache(cfg, 2, 40)),
    "gpt2-static": (tiny_config("gpt2"), lambda cfg: kvref.StaticCache(cfg, 2, 40)),
    "paged": (tiny_config(n_kv_heads=2), lambda cfg: kvref.PagedKVCache(cfg, num_blocks=24, block_size=4)),
    "window": (tiny_config(n_kv_heads=2, sliding_window=6), lambda cfg: kvref.SlidingWindowCache(6, slack=5)),  # drops up to 6
    "sink-no-eviction": (tiny_config(n_kv_heads=2), lambda cfg: kvref.SinkCache(2, 30)),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("keep", [12, 14, 17])  # all drafts rejected, some, all but one
def test_crop_then_refeed_equals_fresh(kind, keep):
    cfg, make = KINDS[kind]
    model = tiny_model(cfg)
    got, want, a, b = crop_then_refeed(model, lambda: make(cfg), keep=keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("static", [True, False])
def test_layered_latent_sliding_full_shared(static):
    model = layered_model()
    make = lambda: LayeredCache(model.cfg, 2, 40, static=static, slack=5)  # noqa: E731
    for keep in (12, 15):
        got, want, a, b = crop_then_refeed(model, make, keep=keep)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert a.length == b.length and a.groups["sliding"].length == b.groups["sliding"].length


def test_ring_slack_rule():
    """A ring of W + s slots drops at most s + 1 newest tokens: s = 2 drops 3, not 4 (cache unchanged)."""
    cfg = tiny_config(n_kv_heads=2, sliding_window=6)
    model = tiny_model(cfg)
    cache = kvref.SlidingWindowCache(6, slack=2)
    with torch.no_grad():
        feed(model, cache, IDS, [12, 6])
    before = (cache.seen, cache.length, cache.next_pos.clone(), [k.clone() for k in cache.k])
    with pytest.raises(CropError, match=r"drop at most 3 .* asked to drop 4"):
        cache.crop(14)
    assert (cache.seen, cache.length) == before[:2] and torch.equal(cache.next_pos, before[2])
    assert all(torch.equal(x, y) for x, y in zip(cache.k, before[3]))
    cache.crop(15)  # 3 = s + 1 is allowed
    assert (cache.seen, cache.length) == (15, 5)


def test_quantized_crop_what_holds():
    """Residual R = 8, G = 4. After 18 tokens, 8 are quantized (2 groups) and 10 are in full precision; crop
    to 15 drops 3 residual tokens. A cache fed only the 15 quantizes 4 (one group): the first group is
    identical, the second differs by at most scale / 2 (it is quantized here, exact there), the last 7 are
    the fed rows in both (layer 0, whose keys depend on the tokens alone: a later layer's keys depend on
    what attention read, quantized or not). Dropping more than the residual holds is refused."""
    cfg = tiny_config(n_kv_heads=2)
    model = tiny_model(cfg)
    make = lambda: kvref.QuantizedCache(bits=8, group_size=4, residual=8)  # noqa: E731
    with torch.no_grad():
        a, b = make(), make()
        feed(model, a, IDS, [12, 6])
        a.crop(15)
        feed(model, b, IDS, [15])
    assert a.seen == b.seen == 15 and a.kq[0].shape[2] == 8 and b.kq[0].shape[2] == 4
    for layer in range(1):  # layer 0's K depend on the tokens only; later layers' on what attention read
        (ka, va), (kb, vb) = a.read(layer), b.read(layer)
        torch.testing.assert_close(ka[:, :, :4], kb[:, :, :4], atol=1e-6, rtol=0)
        torch.testing.assert_close(ka[:, :, 8:], kb[:, :, 8:], atol=0, rtol=0)
        half_step = a.k_scale[layer][:, :, 1:2].amax() / 2  # the second key group's largest scale
        assert (ka[:, :, 4:8] - kb[:, :, 4:8]).abs().max() <= half_step * 1.001
    with pytest.raises(CropError, match="only drop tokens still held in full precision"):
        a.crop(2)  # 13 dropped, 7 in the residual
    assert a.seen == 15 and a.k_res[0].shape[2] == 7


def test_paged_blocks_return_and_shared_block_is_never_written():
    """Blocks past the cut go back to the pool. A cut inside a block another sequence shares (a fork) leaves
    that block as it was: the next write copies it first."""
    cfg = tiny_config(n_kv_heads=2)
    model = tiny_model(cfg)
    cache = kvref.PagedKVCache(cfg, num_blocks=16, block_size=4)
    cache.add_sequence("a")
    with torch.no_grad():
        cache.begin(["a"], 10)
        model(IDS[:1, :10], cache=cache)  # blocks 0, 1, 2 (2 half full)
        cache.fork("a", "b")
        cache.begin(["a"], 8)
        model(IDS[:1, 10:18], cache=cache)  # a: 18 tokens in 5 blocks; the shared half block was copied
        free_before = cache.pool.num_free
        cache.crop_sequence("a", 6)  # cut inside block 1, which b shares
        assert cache.pool.num_free == free_before + 3  # a's blocks 2', 3, 4 are back
        shared = cache.seqs["a"].table[-1]
        assert cache.seqs["b"].table[1] == shared and cache.pool.refs[shared] == 2
        k_shared = cache.k[:, :, shared * 4:(shared + 1) * 4].clone()
        copies = cache.cow_copies
        cache.begin(["a"], 2)
        model(IDS[:1, 20:22], cache=cache)
    assert cache.cow_copies == copies + 1 and cache.seqs["a"].table[1] != shared
    assert torch.equal(cache.k[:, :, shared * 4:(shared + 1) * 4], k_shared)  # b's block untouched


def test_paged_prefix_cached_block_leaves_the_index_before_rewrite():
    """A full block only this sequence holds but the prefix cache names: a cut inside it removes the name,
    so a later request with the old tokens does not match rewritten K/V."""
    cfg = tiny_config(n_kv_heads=2)
    model = tiny_model(cfg)
    cache = kvref.PagedKVCache(cfg, num_blocks=16, block_size=4, prefix_caching=True)
    toks = IDS[0, :13].tolist()
    cache.add_sequence("a", toks)
    with torch.no_grad():
        cache.begin(["a"], 13, [toks])
        model(IDS[:1, :13], cache=cache)
    assert len(cache.pool.by_hash) == 3  # three full blocks named
    cache.crop_sequence("a", 6)
    assert len(cache.pool.by_hash) == 2  # block 0 still named (kept whole), block 1 dropped, block 2 freed
    assert cache.pool.match(toks)[0] == [cache.seqs["a"].table[0]]  # only the first block still matches


@pytest.mark.parametrize("bad", [-1, 19, 2.5, True])
def test_bad_crop_is_refused_and_cache_unchanged(bad):
    cfg = tiny_config(n_kv_heads=2)
    model = tiny_model(cfg)
    for cache in (kvref.DynamicCache(), kvref.StaticCache(cfg, 2, 40),
                  kvref.PagedKVCache(cfg, num_blocks=24, block_size=4)):
        with torch.no_grad():
            feed(model, cache, IDS, [12, 6])
        n = cache.seqs[0].length if isinstance(cache, kvref.PagedKVCache) else cache.seen
        with pytest.raises(CropError, match="an integer from 0 to the 18 tokens"):
            cache.crop(bad)
        assert n == (cache.seqs[0].length if isinstance(cache, kvref.PagedKVCache) else cache.seen) == 18


def test_h2o_refuses_rollback():
    cfg = tiny_config(n_kv_heads=2)
    model = tiny_model(cfg)
    cache = kvref.H2OCache(heavy=4, recent=4)
    with torch.no_grad():
        feed(model, cache, IDS, [12])
    with pytest.raises(CropError, match="cannot roll back"):
        cache.crop(10)
    assert cache.seen == 12 and cache.length == 8


def test_plain_dynamic_cache_serves_mixed_layer_kinds():
    """kvref.DynamicCache() on a model with latent, sliding, full and shared layers (HF's DynamicCache does too):
    generation equals the LayeredCache's, and crop then re-feed equals a fresh cache."""
    model = layered_model()
    want = kvref.generate(model, IDS[:1, :8], 12, cache="dynamic").tokens
    cache = kvref.DynamicCache()
    assert torch.equal(kvref.generate(model, IDS[:1, :8], 12, cache=cache).tokens, want)
    assert cache.length == 8 + 12 - 1 and cache.nbytes == cache.inner.nbytes > 0
    got, want, a, b = crop_then_refeed(model, kvref.DynamicCache, keep=13)  # the sliding window is 5: 5 dropped
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert a.length == b.length == 20 and a.seen == 20
