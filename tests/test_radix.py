"""SGLang's radix tree (kvref.radix) on its own and behind the engine (prefix_caching="radix")."""

from __future__ import annotations

import random

import pytest
import torch

import kvref
from kvref.radix import RadixCachingPool, RadixTree
from kvref.serve import Engine, Request


def tiny() -> kvref.ModelConfig:
    return kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256, max_seq_len=96)


@pytest.fixture(scope="module")
def model() -> kvref.Transformer:
    torch.manual_seed(0)
    return kvref.Transformer(tiny()).eval()


# -- the tree alone: slots are just labels here ------------------------------------------------------
def test_match_insert_split():
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4], ["a", "b", "c", "d"]) == 0  # nothing was cached
    assert tree.insert([1, 2, 7], ["x", "y", "z"]) == 2  # [1, 2] was: the tree keeps "a", "b"
    # the second insert split the edge [1, 2, 3, 4] after 2 tokens: root -> [1, 2] -> {[3, 4], [7]}
    (top,) = tree.root.children.values()
    assert top.key == (1, 2) and sorted(c.key for c in top.children.values()) == [(3, 4), (7,)]
    slots, node = tree.match([1, 2, 7, 9])
    assert slots == ["a", "b", "z"] and tree.tokens(node) == [1, 2, 7]
    slots, node = tree.match([1, 2, 3, 5])  # ends inside [3, 4]: split there
    assert slots == ["a", "b", "c"] and node.key == (3,) and [c.key for c in node.children.values()] == [(4,)]
    assert tree.match([9])[0] == [] and tree.size == 5  # tokens 1 2 3 4 7 held, each once


def test_page_size_aligns_matches_and_inserts():
    tree = RadixTree(page_size=4)
    assert tree.insert(list(range(10)), list(range(10))) == 0
    assert tree.size == 8  # 10 tokens: two whole pages kept, the ragged 2 dropped
    assert tree.match(list(range(7)))[0] == [0, 1, 2, 3]  # 7 tokens hold one whole page only
    assert tree.match([0, 1, 2, 3, 4, 5, 99, 7])[0] == [0, 1, 2, 3]  # diverges at 6: back to the page start
    # diverging inside a page splits at the page boundary, never inside it
    assert tree.insert([0, 1, 2, 3, 4, 5, 6, 99], list("abcdefgh")) == 4
    (top,) = tree.root.children.values()
    assert top.key == (0, 1, 2, 3) and sorted(len(c.key) for c in top.children.values()) == [4, 4]
    with pytest.raises(ValueError, match="page_size must be an integer >= 1"):
        RadixTree(page_size=0)
    with pytest.raises(ValueError, match="one slot per token"):
        tree.insert([1, 2, 3, 4], [1])


def test_eviction_is_lru_over_unlocked_leaves():
    tree = RadixTree()
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([1, 2, 4], [20, 21, 22])  # split: [1, 2] -> {[3], [4]}; slots 20, 21 are the caller's again
    tree.insert([5], [30])
    _, held = tree.match([1, 2, 3])  # touches [1, 2] and [3]
    tree.lock(held)
    assert tree.evictable_size == 2  # [4] and [5]; [1, 2] and [3] are locked
    tree.match([5])  # [5] is now more recent than [4]
    assert tree.evict(1) == [22]  # the least recently used unlocked leaf
    assert tree.evict(10) == [30]  # only [5] is left unlocked: fewer than asked, never a locked one
    tree.unlock(held)
    assert tree.evict(1) == [12]  # [3] goes first (a leaf) ...
    assert tree.evict(1) == [10, 11]  # ... then its parent, now a leaf
    assert tree.size == 0 and tree.evictable_size == 0
    with pytest.raises(ValueError, match="unlock once per lock"):
        tree.unlock(held)


def test_locks_count_requests_and_cover_the_path():
    tree = RadixTree()
    tree.insert([1, 2, 3, 4], list("abcd"))
    _, a = tree.match([1, 2, 3, 4])
    _, b = tree.match([1, 2])  # splits: b = [1, 2] is a's parent now
    tree.lock(a)
    tree.lock(b)
    assert (b.lock_ref, a.lock_ref) == (2, 1)  # two requests run through [1, 2], one through [3, 4]
    tree.unlock(a)
    assert tree.evict(4) == list("cd") and tree.size == 2  # [3, 4] unlocked; [1, 2] still held by b


# -- behind the engine ---------------------------------------------------------------------------------
def alone(model, prompt: list[int], n: int) -> list[int]:
    return kvref.generate(model, torch.tensor([prompt]), n, cache="dynamic").tokens[0, len(prompt):].tolist()


def shared_prefix_trace(n: int, seed: int, system: int = 20) -> list[Request]:
    rng = random.Random(seed)
    sys_a = [rng.randrange(256) for _ in range(system)]
    sys_b = sys_a[:10] + [rng.randrange(256) for _ in range(system - 10)]  # shares 10 tokens with sys_a
    return [Request(i, rng.choice([sys_a, sys_b]) + [rng.randrange(256) for _ in range(rng.randint(1, 9))],
                    rng.randint(1, 8), arrival=rng.randint(0, 12)) for i in range(n)]


def test_engine_outputs_equal_in_every_mode_and_radix_finds_what_the_hash_chain_does(model):
    reqs = shared_prefix_trace(10, seed=0)
    runs = {}
    for mode in (False, True, "hash", "radix"):
        eng = Engine(model, num_blocks=40, block_size=4, token_budget=16, prefix_caching=mode)
        runs[mode] = (eng, eng.run(reqs))
    for r in reqs[:4]:  # a few against the model alone; every mode against no caching below
        assert runs[False][1][r.rid].output == alone(model, r.prompt, r.max_new_tokens)
    for mode, (eng, states) in runs.items():
        assert {k: s.output for k, s in states.items()} == {k: s.output for k, s in runs[False][1].items()}, mode
        assert not eng.cache.seqs and eng.cache.pool.num_free == 40  # nothing leaked; cached blocks evictable
    cached = {m: sum(s.cached_tokens for s in st.values()) for m, (_, st) in runs.items()}
    assert cached[False] == 0 and cached[True] == cached["hash"] > 0  # True is the hash chain
    assert cached["radix"] >= cached["hash"]  # the requirement: at least the hash chain's hits
    tree = runs["radix"][0].cache.pool.tree
    assert tree.evictable_size == tree.size > 0  # every lock was released at finish


def test_radix_under_memory_pressure_evicts_only_unlocked_blocks(model):
    rng = random.Random(3)
    reqs = [Request(i, [rng.randrange(256) for _ in range(rng.randint(9, 20))], rng.randint(4, 10),
                    arrival=i // 2) for i in range(10)]
    # 14 blocks of 4 = 56 slots for 10 distinct prompts of up to 30 tokens: the tree must give blocks back
    eng = Engine(model, num_blocks=14, block_size=4, token_budget=12, prefix_caching="radix")
    states = eng.run(reqs)
    base = Engine(model, num_blocks=14, block_size=4, token_budget=12).run(reqs)
    assert {k: s.output for k, s in states.items()} == {k: s.output for k, s in base.items()}
    assert eng.cache.pool.evictions > 0  # eviction really ran (the pool's assert checks no held block went)
    assert eng.cache.pool.num_free == 14 and not eng.cache.seqs


def test_bad_prefix_caching_mode_is_refused(model):
    for bad in ("lru", "Radix", 1, None):
        with pytest.raises(ValueError, match=r"prefix_caching must be one of \(False, True, 'hash', 'radix'\)"):
            Engine(model, num_blocks=8, block_size=4, prefix_caching=bad)


def test_a_model_the_engine_cannot_page_is_refused():
    # sliding-window layers are paged now (tests/test_serve_hybrid.py); a kind with a fixed-size state is not
    cfg = kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256, max_seq_len=96,
                            layer_types=("sliding", "linear"), sliding_window=8, linear_num_key_heads=2,
                            linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                            linear_conv_kernel_dim=4)
    model = kvref.Transformer(cfg).eval()  # kvref runs linear layers (kvref.linear_attn); the engine cannot page them
    with pytest.raises(ValueError, match=r"layer_types\[1\] = 'linear': the paged engine cannot page this kind"):
        Engine(model, num_blocks=8, block_size=4, prefix_caching="radix")


# -- the tree's page inside the cache's blocks (Engine(..., prefix_caching="radix", page_size=...)) ------
def test_a_page_size_that_does_not_divide_the_block_size_is_refused(model):
    for bad in (3, 8, 0, True, 2.0):
        with pytest.raises(ValueError, match=rf"page_size={bad!r} does not divide block_size=4: .* allowed page "
                                             r"sizes: \[1, 2, 4\]"):
            RadixCachingPool(8, 4, page_size=bad)
        with pytest.raises(ValueError, match=rf"page_size={bad!r} does not divide block_size=4"):
            Engine(model, num_blocks=8, block_size=4, prefix_caching="radix", page_size=bad)
    with pytest.raises(ValueError, match="page_size sets the radix tree's page: it needs prefix_caching='radix'"):
        Engine(model, num_blocks=8, block_size=4, prefix_caching="hash", page_size=2)


@pytest.mark.parametrize("page, hit", [(1, 7), (2, 6), (4, 4)])
def test_a_match_is_cut_to_the_page_and_a_partial_block_is_copied_on_write(model, page, hit):
    cache = kvref.PagedKVCache(model.cfg, num_blocks=8, block_size=4)
    cache.pool = RadixCachingPool(8, 4, page_size=page)
    a, b = list(range(1, 10)), [1, 2, 3, 4, 5, 6, 7, 50, 51]  # 9 tokens each; they share the first 7
    with torch.inference_mode():
        ref = {"a": model(torch.tensor([a + [60]]))[0], "b": model(torch.tensor([b]))[0]}  # uncached
        assert cache.add_sequence("a", a) == 0
        cache.begin(["a"], 9, [a])
        model(torch.tensor([a]), cache=cache)  # blocks 0 and 1 full: the tree holds tokens 1..8
        # b's last token is never matched; of the 7 shared tokens, the whole pages: 7 (page 1), 6 (2), 4 (4)
        assert cache.add_sequence("b", b) == hit
        table_a = list(cache.seqs["a"].table)
        assert cache.seqs["b"].table == table_a[:-(-hit // 4)]
        cache.begin(["b"], 9 - hit, [b[hit:]])
        out_b = model(torch.tensor([b[hit:]]), cache=cache)[0]
        assert (out_b - ref["b"][hit:]).abs().max() <= 1e-5
        assert cache.cow_copies == (hit % 4 != 0)  # b wrote into a's block 1 only through a copy
        cache.begin(["a"], 1, [[60]])  # a's own cached K/V are untouched by b's writes
        assert (model(torch.tensor([[60]]), cache=cache)[0, -1] - ref["a"][-1]).abs().max() <= 1e-5


def test_smaller_pages_find_more_and_give_the_same_tokens(model):
    rng = random.Random(5)
    system = [rng.randrange(256) for _ in range(18)]  # 18 shared tokens: 4 whole blocks of 4, then 2
    reqs = [Request(0, system + [rng.randrange(256) for _ in range(6)], 3)]  # caches 24 tokens, 6 whole blocks
    reqs += [Request(i, system + [200 + i] + [rng.randrange(256) for _ in range(4)], 5, arrival=6) for i in range(1, 6)]
    base = {k: s.output for k, s in Engine(model, num_blocks=40, block_size=4, token_budget=16).run(reqs).items()}
    cached = {}
    for page in (4, 2, 1):
        eng = Engine(model, num_blocks=40, block_size=4, token_budget=16, prefix_caching="radix", page_size=page)
        states = eng.run(reqs)
        assert {k: s.output for k, s in states.items()} == base, page
        assert eng.cache.pool.num_free == 40 and not eng.cache.seqs  # nothing leaked
        cached[page] = sum(s.cached_tokens for s in states.values())
    # each of the 5 later requests shares 18 tokens with request 0 (its 19th differs): pages of 4 find 16 of
    # them, pages of 2 and 1 all 18 (the last 2 in a block shared partly filled, then copied on write)
    assert cached == {4: 5 * 16, 2: 5 * 18, 1: 5 * 18}


def test_pages_under_memory_pressure(model):
    reqs = shared_prefix_trace(10, seed=0, system=18)  # prompts share 18 or 10 tokens: not whole blocks of 4
    base = {k: s.output for k, s in Engine(model, num_blocks=14, block_size=4, token_budget=16).run(reqs).items()}
    for page in (1, 2):  # 14 blocks of 4 for 10 prompts of up to 27 tokens: the tree must give pages back
        eng = Engine(model, num_blocks=14, block_size=4, token_budget=16, prefix_caching="radix", page_size=page)
        states = eng.run(reqs)
        assert {k: s.output for k, s in states.items()} == base, page
        assert eng.cache.pool.evictions > 0 and eng.cache.cow_copies > 0  # pages evicted, partial blocks copied
        assert eng.cache.pool.num_free == 14 and not eng.cache.seqs
