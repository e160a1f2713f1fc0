"""Paged decode attention in place (FlexAttention over the block pool) equals the gather version.

Reference: ``PagedKVCache`` (kvref/paged.py), which gathers each row's blocks into a contiguous
copy; both caches get the same calls. Bound 1e-5 on the logits: fp32, the same sums in another
order. Tests use FlexAttention uncompiled (``compile=False``: PyTorch's reference implementation
of the same BlockMask, seconds instead of a ~20-130 s compile on this machine); the compiled
kernel is compared with the gather in ``python -m kvref.bench decode`` (table 4).
"""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.paged import PagedKVCache
from kvref.paged_inplace import InPlacePagedKVCache

from conftest import tiny_config, tiny_model

TOL = 1e-5


def left_pad(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, T - len(r):], mask[b, T - len(r):] = torch.tensor(r), 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def test_ragged_decode_in_place_equals_gather(device):
    # three sequences of 3, 9 and 6 tokens, 4-token blocks: their decode steps cross block
    # boundaries at different steps, and their blocks interleave in the pool
    model = tiny_model(tiny_config(n_kv_heads=2), device=device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 9, 6)]
    gather = PagedKVCache(model.cfg, num_blocks=24, block_size=4, device=device)
    inplace = InPlacePagedKVCache(model.cfg, num_blocks=24, block_size=4, device=device, compile=False)
    ids, mask = left_pad(prompts, device)
    logits = {}
    for name, c in (("gather", gather), ("inplace", inplace)):
        for s in range(3):
            c.add_sequence(s)
        c.begin([0, 1, 2], [len(p) for p in prompts])
        logits[name] = model(ids, cache=c, attention_mask=mask, last_only=True)[:, -1]
    copied_after_prefill = inplace.bytes_copied
    assert copied_after_prefill > 0  # the prefill (T > 1) falls back to the gather
    for step in range(7):
        tok = logits["gather"].argmax(-1)[:, None]
        for name, c in (("gather", gather), ("inplace", inplace)):
            c.begin([0, 1, 2], 1)
            logits[name] = model(tok, cache=c, last_only=True)[:, -1]
        assert (logits["inplace"] - logits["gather"]).abs().max() <= TOL, step
    assert inplace.in_place_steps == 7
    assert inplace.bytes_copied == copied_after_prefill  # the decode steps copied nothing
    assert [s.table for s in inplace.seqs.values()] == [s.table for s in gather.seqs.values()]  # same blocks used


@torch.inference_mode()
def test_gather_mode_counts_the_bytes_it_copies():
    cfg = tiny_config(n_kv_heads=2)
    model = tiny_model(cfg)
    cache = InPlacePagedKVCache(cfg, num_blocks=16, block_size=4, compile=False, in_place=False)
    model(torch.zeros(2, 5, dtype=torch.long), cache=cache)
    before = cache.bytes_copied
    model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
    # K and V, every layer, every row, all S + T = 6 slots, fp32
    assert cache.bytes_copied - before == 2 * cfg.n_layers * 2 * 6 * cfg.n_kv_heads * cfg.head_dim * 4
    assert cache.in_place_steps == 0


@torch.inference_mode()
def test_forked_sequences_read_shared_blocks_in_place():
    # fork shares the prompt's blocks; the partly filled last block is copied on write at the
    # next step, the full ones stay shared and are read in place by both rows
    model = tiny_model(tiny_config(n_kv_heads=2))
    prompt = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    out = {}
    for name, c in (("gather", PagedKVCache(model.cfg, 16, 4)),
                    ("inplace", InPlacePagedKVCache(model.cfg, 16, 4, compile=False))):
        c.add_sequence("a")
        c.begin(["a"], 10)
        first = model(prompt, cache=c, last_only=True)[:, -1]
        c.fork("a", "b")
        toks, steps = torch.stack([first.argmax(-1), (first.argmax(-1) + 1) % 256], 0)[:, :1], []
        for _ in range(5):
            c.begin(["a", "b"], 1)
            lg = model(toks, cache=c, last_only=True)[:, -1]
            steps.append(lg)
            toks = lg.argmax(-1)[:, None]
        out[name] = torch.stack(steps)
        assert c.cow_copies == 1
    assert (out["inplace"] - out["gather"]).abs().max() <= TOL


@pytest.mark.parametrize("padded", [False, True])
def test_generate_with_the_in_place_cache_gives_the_static_tokens(padded):
    model = tiny_model(tiny_config(n_kv_heads=2))
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = None
    if padded:  # stored padding: those sequences fall back to the gather, still correct
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[0, :2] = 0
    cache = InPlacePagedKVCache(model.cfg, num_blocks=16, block_size=4, compile=False)
    out = kvref.generate(model, ids, 8, cache=cache, attention_mask=mask).tokens
    assert torch.equal(out, kvref.generate(model, ids, 8, cache="static", attention_mask=mask).tokens)
    assert cache.in_place_steps == (0 if padded else 7)
