"""The engine on models with per-layer kinds: sliding + full (Gemma 3), latent (DeepSeek-V3's MLA), a window on
every layer (Mistral), on the paged pool with one block table per group of layers (kvref.paged_hybrid).

Bounds: fp32 logits within 1e-5 of the uncached forward (the course's bound for cached paths: the same
arithmetic, summed over other slot orders); greedy tokens identical to each request run alone through
kvref.generate (LayeredCache) and to HF generate (tiny random Gemma 3). Expected block counts are worked
out by hand in the comments, never read from the code under test.
"""

from __future__ import annotations

import random

import pytest
import torch

import kvref
from kvref.paged_hybrid import PagedHybridCache, first_needed, hybrid_hit, layer_groups
from kvref.serve import Engine, Request

BASE = dict(n_heads=4, d_model=32, vocab_size=256, max_seq_len=96)
CONFIGS = {
    "gemma": dict(n_layers=3, n_kv_heads=2, sliding_window=5, layer_types=("sliding", "full", "sliding"), qk_norm=True),
    "latent": dict(n_layers=2, n_kv_heads=4, layer_types=("latent", "latent"), kv_lora_rank=16, qk_rope_head_dim=4,
                   qk_nope_head_dim=8, v_head_dim=8),
    "mistral": dict(n_layers=2, n_kv_heads=2, sliding_window=6),  # no layer_types: every layer windowed
    "mixed": dict(n_layers=4, n_kv_heads=2, sliding_window=5, layer_types=("latent", "sliding", "full", "shared:1"),
                  kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8),  # every group at once
    "full+shared": dict(n_layers=2, n_kv_heads=2, layer_types=("full", "shared:0")),  # one group, one layer
}


def build(name: str) -> kvref.Transformer:
    torch.manual_seed(0)
    model = kvref.Transformer(kvref.ModelConfig(**BASE, **CONFIGS[name])).eval()
    with torch.no_grad():  # wider than the default init, so greedy tokens vary and equality means something
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request) -> kvref.Transformer:
    return build(request.param)


@pytest.fixture(scope="module")
def gemma() -> kvref.Transformer:
    return build("gemma")


def alone(model, prompt: list[int], n: int) -> list[int]:
    return kvref.generate(model, torch.tensor([prompt]), n, cache="dynamic").tokens[0, len(prompt):].tolist()


def shared_prefix_trace(n: int, seed: int, new: int = 10) -> list[Request]:
    """Requests that share a 13-token system prompt (3 whole blocks of 4, then a ragged one) and differ after."""
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(13)]
    return [Request(i, system + [rng.randrange(256) for _ in range(rng.randint(1, 9))], rng.randint(new // 2, new),
                    arrival=i // 4) for i in range(n)]


@torch.inference_mode()
def feed(model, cache: PagedHybridCache, rows: dict, n: int) -> torch.Tensor:
    """Feed each row's next ``n`` tokens (rows: id -> (tokens, position)); logits (B, n, V)."""
    chunks = [toks[pos:pos + n] for toks, pos in rows.values()]
    cache.begin(list(rows), n, chunks)
    out = model(torch.tensor(chunks), cache=cache)
    for rid in rows:
        rows[rid] = (rows[rid][0], rows[rid][1] + n)
    return out


@pytest.mark.parametrize("mode", [False, "hash", "radix"])
def test_engine_equals_each_request_alone(model, mode):
    reqs = shared_prefix_trace(8, seed=1, new=24)
    # 12 blocks of 4 per group of layers for 8 requests of up to 45 tokens, each holding a block per group per
    # 4 tokens (a sliding group: those of its last window): running requests outgrow the pool and are preempted
    # (not with Mistral's lone sliding group, at most 3 blocks per request, unless a radix tree keeps them);
    # a budget of 9 tokens per step forces chunked prefill
    num_blocks = 12 * len(set(layer_groups(model.cfg).values()))
    eng = Engine(model, num_blocks=num_blocks, block_size=4, token_budget=9, prefix_caching=mode)
    states = eng.run(reqs)
    for r in reqs:
        assert states[r.rid].output == alone(model, r.prompt, r.max_new_tokens), r.rid
    if model.cfg.layer_types is not None or mode == "radix":
        assert sum(s.preempted for s in eng.steps) > 0  # the pool really ran out
    if mode:  # the later requests find the system prompt's 3 whole blocks
        assert sum(s.cached_tokens for s in states.values()) >= 12
    assert eng.cache.pool.num_free == num_blocks and not eng.cache.seqs  # every block back (or evictable)


def test_prefix_caching_modes_give_the_same_tokens(gemma):
    reqs = shared_prefix_trace(10, seed=2)
    outs = []
    for mode in (False, True, "hash", "radix"):
        states = Engine(gemma, num_blocks=64, block_size=4, token_budget=16, prefix_caching=mode).run(reqs)
        outs.append({k: s.output for k, s in states.items()})
    assert outs[0] == outs[1] == outs[2] == outs[3]


@pytest.mark.parametrize("name", ["gemma", "latent"])
def test_logits_equal_the_uncached_forward(name):
    model = build(name)
    rng = random.Random(3)
    seqs = {r: [rng.randrange(256) for _ in range(30)] for r in "abc"}
    with torch.inference_mode():
        ref = {r: model(torch.tensor([t]))[0] for r, t in seqs.items()}  # (30, V) each, no cache
    cache = PagedHybridCache(model.cfg, num_blocks=40, block_size=4)
    rows = {}
    for r, start in (("a", 0), ("b", 0), ("c", 0)):
        cache.add_sequence(r)
        rows[r] = (seqs[r], start)
    # rows at different lengths (a: 7, b: 3, c: 0 cached) then decodes: left padding in the cached part
    for group, n in ((["a"], 7), (["a", "b"], 3), (["a", "b", "c"], 5), (["a", "b", "c"], 1), (["b", "c"], 4),
                     (["a", "b", "c"], 1), (["a", "b", "c"], 1)):
        sub = {r: rows[r] for r in group}
        out = feed(model, cache, sub, n)
        for b, r in enumerate(group):
            pos = rows[r][1]
            assert (out[b] - ref[r][pos:pos + n]).abs().max() <= 1e-5, (group, n, r)
            rows[r] = sub[r]


def test_ragged_rows_are_refused_with_a_window(gemma):
    cache = PagedHybridCache(gemma.cfg, num_blocks=8, block_size=4)
    cache.add_sequence("a"), cache.add_sequence("b")
    with pytest.raises(ValueError, match="same number of new tokens"):
        cache.begin(["a", "b"], [3, 1], [[1, 2, 3], [4]])
    assert cache.pool.num_free == 8  # nothing claimed


def test_sliding_blocks_out_of_the_window_go_back(gemma):
    cache = PagedHybridCache(gemma.cfg, num_blocks=20, block_size=4)
    cache.add_sequence("a")
    rows = {"a": (list(range(1, 40)), 0)}
    feed(gemma, cache, rows, 17)
    # 17 tokens in blocks of 4: the full group holds 5 blocks; the next token (position 17) sees a window of 5,
    # tokens 13..16, in block 3 (12..15) and 4 (16): sliding blocks 0-2 go back. 5 + 2 = 7 blocks in use.
    assert cache.pool.num_used == 7
    assert [b is None for b in cache.seqs["a"].tables["sliding"]] == [True, True, True, False, False]
    for _ in range(3):
        feed(gemma, cache, rows, 1)
    # 20 tokens: full 5 blocks (0..19); the window before position 20 is tokens 16..19, block 4 alone
    assert cache.pool.num_used == 5 + 1
    cache.free_sequence("a")
    assert cache.pool.num_free == 20


def test_the_hybrid_hit_rule_by_hand():
    T, F = True, False
    # blocks of 4, window 8: a prefix of n blocks needs sliding blocks from the one holding token 4n - 7
    assert hybrid_hit({"full": [T, T, T, T], "sliding": [F, F, T, T]}, 8, 4) == 4  # token 9: blocks 2, 3
    assert hybrid_hit({"full": [T, T, T, F], "sliding": [T, T, T, T]}, 8, 4) == 3  # full stops at block 3
    assert hybrid_hit({"full": [T, T, T, T], "sliding": [F, T, T, F]}, 8, 4) == 3  # n = 4 needs block 3
    assert hybrid_hit({"full": [T, T, T], "sliding": [F, F, T]}, 5, 4) == 3  # tokens 8-11: block 2 only
    assert hybrid_hit({"full": [T, T, T, T], "sliding": [F, T, F, F]}, 4, 4) == 2  # window of one block
    assert hybrid_hit({"full": [F, T], "sliding": [T, T]}, 8, 4) == 0  # no prefix without block 0
    assert hybrid_hit({"latent": [T, T, F]}, None, 4) == 2  # latent layers need every block, like full ones
    assert first_needed(4, 5, 4) == 3 and first_needed(1, 8, 4) == 0  # token 12 in block 3; none before 0


def test_a_sliding_group_whose_old_blocks_were_evicted_still_hits(gemma):
    cache = PagedHybridCache(gemma.cfg, num_blocks=10, block_size=4, prefix_caching="hash")
    prompt = list(range(100, 117))  # 17 tokens: 4 whole blocks, then the last token
    cache.add_sequence("a", prompt)
    feed(gemma, cache, {"a": (prompt, 0)}, 17)  # full: 5 blocks, sliding: 5, then sliding 0-2 go back (cached)
    cache.free_sequence("a")
    # 10 blocks, none truly free but A's partial blocks 4 (full and sliding): taking 5 evicts the least recently
    # released cached blocks: sliding 0, 1, 2 (given back during the forward, before A finished)
    taken = cache.pool.allocate(5)
    for b in taken:
        cache.pool.free(b)  # uncached blocks: back on the free list
    assert cache.pool.evictions == 3
    with torch.inference_mode():
        ref = gemma(torch.tensor([prompt]))[0, -1]
    # a repeat of the prompt: the full layers have blocks 0-3; the first computed token (16) sees tokens 12..16,
    # so the sliding layers need block 3 only, still cached: a hit of 16 tokens despite blocks 0-2 gone
    assert cache.add_sequence("b", prompt) == 16
    out = feed(gemma, cache, {"b": (prompt, 16)}, 1)[0, -1]
    assert (out - ref).abs().max() <= 1e-5
    cache.free_sequence("b")
    cache.pool.free(cache.pool.allocate(1)[0])  # the free list first: nothing evicted
    blocks = cache.pool.allocate(cache.pool.num_free)  # now everything: sliding block 3 goes too
    for b in blocks:
        cache.pool.free(b)
    # n = 4 needs sliding block 3, n = 3 block 2 (token 8), n = 2 block 1, n = 1 block 0: all gone, no hit
    assert cache.add_sequence("c", prompt) == 0


def test_a_kind_the_engine_cannot_page_is_refused():
    cfg = kvref.ModelConfig(**BASE, n_layers=2, n_kv_heads=2, layer_types=("full", "linear"),
                            linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_conv_kernel_dim=4)
    model = kvref.Transformer(cfg).eval()  # kvref runs linear layers (kvref.linear_attn); the engine cannot page them
    with pytest.raises(ValueError, match=r"layer_types\[1\] = 'linear': the paged engine cannot page this kind; "
                                         r"it pages full, sliding, latent and shared:j layers"):
        Engine(model, num_blocks=8, block_size=4)


def test_engine_equals_hf_generate_on_gemma3(tmp_path):
    pytest.importorskip("transformers")
    from ch10_fixtures import tiny_hf

    hf, ours = tiny_hf("gemma3", tmp_path)  # sliding, sliding, full; window 6
    reqs = shared_prefix_trace(4, seed=4)
    with torch.no_grad():
        want = {r.rid: hf.generate(torch.tensor([r.prompt]), max_new_tokens=r.max_new_tokens, do_sample=False,
                                   min_new_tokens=r.max_new_tokens)[0, len(r.prompt):].tolist() for r in reqs}
    for mode in (False, "hash"):
        states = Engine(ours, num_blocks=24, block_size=4, token_budget=8, prefix_caching=mode).run(reqs)
        assert {k: s.output for k, s in states.items()} == want, mode
