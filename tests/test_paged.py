"""The paged cache: block-table attention equals contiguous attention; sharing; every error path."""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.paged import BlockPool, CacheFull, PagedKVCache


def tiny(**kw) -> kvref.ModelConfig:
    return kvref.ModelConfig(**{"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_model": 32, "vocab_size": 256,
                                "max_seq_len": 64, **kw})


def model_for(cfg: kvref.ModelConfig) -> kvref.Transformer:
    torch.manual_seed(0)
    return kvref.Transformer(cfg).eval()


def alone(model, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation of one prompt with a contiguous (dynamic) cache: the reference."""
    return kvref.generate(model, torch.tensor([prompt]), n, cache="dynamic").tokens[0, len(prompt):].tolist()


def left_pad(chunks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(map(len, chunks))
    ids = torch.zeros(len(chunks), T, dtype=torch.long)
    mask = torch.zeros(len(chunks), T, dtype=torch.long)
    for b, c in enumerate(chunks):
        ids[b, T - len(c):] = torch.tensor(c)
        mask[b, T - len(c):] = 1
    return ids, mask


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@torch.inference_mode()
def test_ragged_batch_over_block_tables_equals_contiguous(arch):
    cfg = tiny(arch=arch, n_kv_heads=None if arch == "gpt2" else 2)
    model = model_for(cfg)
    lens = [3, 9, 14]  # with block_size 4: inside one block, across two boundaries, across three
    prompts = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in lens]
    cache = PagedKVCache(cfg, num_blocks=20, block_size=4)
    for b in range(3):
        cache.add_sequence(b)
    ids, mask = left_pad(prompts)
    cache.begin([0, 1, 2], lens, prompts)
    logits = model(ids, cache=cache, attention_mask=mask)
    for b, p in enumerate(prompts):  # fp32: the gather changes no arithmetic, 1e-5 is float noise
        ref = model(torch.tensor([p]))[0]
        torch.testing.assert_close(logits[b, -len(p):], ref, atol=1e-5, rtol=0)
    more = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]  # a second, ragged chunk over the cached blocks
    ids, mask = left_pad(more)
    cache.begin([0, 1, 2], [6, 1, 5], more)
    logits = model(ids, cache=cache, attention_mask=mask)
    for b, (p, m) in enumerate(zip(prompts, more)):
        ref = model(torch.tensor([p + m]))[0, len(p):]  # no cache: the whole sequence at once
        torch.testing.assert_close(logits[b, -len(m):], ref, atol=1e-5, rtol=0)
        prompts[b] = p + m
    nxt, outs = logits[:, -1].argmax(-1), [[] for _ in prompts]
    for _ in range(8):  # ragged decode: lengths keep crossing block boundaries at different steps
        for b, t in enumerate(nxt.tolist()):
            outs[b].append(t)
        cache.begin([0, 1, 2], 1, [[t] for t in nxt.tolist()])
        nxt = model(nxt[:, None], cache=cache)[:, -1].argmax(-1)
    for b, p in enumerate(prompts):
        assert outs[b] == alone(model, p, 8)
    cache.reset()
    assert cache.pool.num_free == 20  # nothing leaks


def test_generate_with_paged_cache_and_left_padding():
    cfg = tiny()
    model = model_for(cfg)
    ids = torch.randint(0, 256, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :4] = 0
    ref = kvref.generate(model, ids, 9, cache="static", attention_mask=mask)
    paged = PagedKVCache(cfg, num_blocks=16, block_size=4)
    out = kvref.generate(model, ids, 9, cache=paged, attention_mask=mask)
    assert torch.equal(out.tokens, ref.tokens)
    assert paged.pool.num_used == 3 * 5  # 18 slots per row (padding included) -> 5 blocks of 4


@torch.inference_mode()
def test_fork_shares_blocks_and_copies_on_write():
    cfg = tiny()
    model = model_for(cfg)
    prompt = list(range(10, 20))  # 10 tokens, block_size 4: two full blocks + one half-filled
    cache = PagedKVCache(cfg, num_blocks=20, block_size=4)
    cache.add_sequence(0)
    cache.begin([0], [10], [prompt])
    first = model(torch.tensor([prompt]), cache=cache)[0, -1].argmax().item()
    for s in (1, 2, 3):
        cache.fork(0, s)
    assert cache.pool.num_used == 3  # four samples, still three blocks
    forced = [first, 7, 8, 9]  # each sample continues with a different token
    outs = [[t] for t in forced]
    nxt = torch.tensor(forced)
    for _ in range(5):
        cache.begin([0, 1, 2, 3], 1, [[t] for t in nxt.tolist()])
        nxt = model(nxt[:, None], cache=cache)[:, -1].argmax(-1)
        for b, t in enumerate(nxt.tolist()):
            outs[b].append(t)
    assert cache.cow_copies == 3  # the half block, shared by 4: three writers copy, the last owns it
    for b in range(4):
        assert outs[b][1:] == alone(model, prompt + [forced[b]], 5)
    # 15 tokens per sample = 4 blocks each. Shared: 2 full prompt blocks once + 2 own blocks per sample.
    assert cache.pool.num_used == 2 + 4 * 2
    saved = 4 * 4 - cache.pool.num_used
    assert saved == 6  # measured saving: 6 of 16 blocks
    cache.reset()
    assert cache.pool.num_free == 20


def test_pool_exhaustion_says_needed_and_free_and_leaks_nothing():
    cfg = tiny()
    model = model_for(cfg)
    cache = PagedKVCache(cfg, num_blocks=5, block_size=4)
    cache.add_sequence("a")
    cache.add_sequence("b")
    cache.begin(["a"], [12])  # 3 blocks
    model(torch.zeros(1, 12, dtype=torch.long), cache=cache)
    with pytest.raises(CacheFull, match="3 blocks of 4 tokens needed, 2 of 5 free") as err:
        cache.begin(["b"], [9])
    assert (err.value.needed, err.value.free, err.value.total) == (3, 2, 5)
    assert cache.pool.num_free == 2 and cache.seqs["b"].table == []  # all or nothing
    with pytest.raises(CacheFull, match="cannot hold it"):  # longer than the whole pool
        cache.begin(["b"], [24])
    cache.reset()
    assert cache.pool.num_free == 5


def test_free_twice_and_free_shared():
    pool = BlockPool(4, block_size=4)
    a, b = pool.allocate(2)
    pool.free(a)
    with pytest.raises(ValueError, match="already free"):
        pool.free(a)
    pool.share(b)  # two holders
    pool.free(b)  # defined result: one holder left, the block stays allocated
    assert pool.refs[b] == 1 and pool.num_free == 3
    pool.free(b)
    assert pool.num_free == 4
    with pytest.raises(ValueError, match="not in this pool"):
        pool.free(9)
    b = pool.allocate(4)[-1]
    for bad in (-1, 4):  # -1 would be refs[-1], the last block
        with pytest.raises(ValueError, match="not in this pool"):
            pool.share(bad)
        with pytest.raises(ValueError, match="not in this pool"):
            pool.free(bad)
    assert pool.refs == [1, 1, 1, 1] and pool.num_free == 0


@torch.inference_mode()
def test_freeing_a_shared_sequence_keeps_the_other_intact():
    cfg = tiny()
    model = model_for(cfg)
    prompt = list(range(30, 39))
    cache = PagedKVCache(cfg, num_blocks=10, block_size=4)
    cache.add_sequence(0)
    cache.begin([0], [9], [prompt])
    tok = model(torch.tensor([prompt]), cache=cache)[0, -1].argmax()
    cache.fork(0, 1)
    cache.free_sequence(0)  # the blocks are still held by sequence 1
    assert cache.pool.num_used == 3
    out = [tok.item()]
    for _ in range(4):
        cache.begin([1], 1)
        tok = model(tok.view(1, 1), cache=cache)[0, -1].argmax()
        out.append(tok.item())
    assert out == alone(model, prompt, 5)
    cache.free_sequence(1)
    assert cache.pool.num_free == 10


def test_growing_past_max_seq_len_and_bad_masks_leak_nothing():
    cfg = tiny(max_seq_len=16)
    model = model_for(cfg)
    cache = PagedKVCache(cfg, num_blocks=10, block_size=4)
    cache.add_sequence(0)
    cache.begin([0], [12])
    model(torch.zeros(1, 12, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="past max_seq_len=16"):
        cache.begin([0], [5])
    assert cache.pool.num_free == 7
    cache.add_sequence(1)
    cache.begin([0, 1], [1, 3])
    with pytest.raises(ValueError, match="attention_mask must mark exactly"):  # row 0 announced 1 token, given 3
        model(torch.zeros(2, 3, dtype=torch.long), cache=cache)
    assert cache.pool.num_free == 7  # the blocks claimed for the failed step came back
    with pytest.raises(ValueError, match="unknown"):
        cache.begin(["nope"], [1])
