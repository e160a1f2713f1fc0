"""Bounded caches: the sliding window is exact, sinks are kept, H2O keeps its budget of heavy hitters,
rows never influence each other, memory stays flat."""

import pytest
import torch

from kvref import DynamicCache, ModelConfig, Transformer, generate
from kvref.evict import BudgetError, H2OCache, SinkCache, SlidingWindowCache

CFG = ModelConfig(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, max_seq_len=256)


def _model(cfg=CFG, seed=0):
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def _run(model, ids, cache, prefill=40, mask=None):
    with torch.no_grad():
        out = [model(ids[:, :prefill], cache=cache, attention_mask=None if mask is None else mask[:, :prefill])]
        out += [model(ids[:, i:i + 1], cache=cache) for i in range(prefill, ids.shape[1])]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("window,prefill", [(16, 40), (16, 8), (1, 5), (64, 30)])
def test_window_equals_masked_reference(window, prefill):
    model = _model()
    ref_model = Transformer(CFG.with_(sliding_window=window)).eval()
    ref_model.load_state_dict(model.state_dict())
    ids = torch.randint(0, 256, (2, 120))
    mask = torch.ones(2, 120, dtype=torch.long)
    mask[1, :7] = 0  # row 1 left-padded: slots still map to positions one to one
    with torch.no_grad():
        ref = ref_model(ids, attention_mask=mask)
    out = _run(model, ids, SlidingWindowCache(window), prefill, mask)
    # fp32 cached vs reference: the course-wide 1e-5 (padding positions' outputs are never used).
    assert float((out - ref)[0].abs().max()) <= 1e-5
    assert float((out - ref)[1, 7:].abs().max()) <= 1e-5


def test_window_generate_greedy_identical():
    model = _model()
    ref_model = Transformer(CFG.with_(sliding_window=24)).eval()
    ref_model.load_state_dict(model.state_dict())
    ids = torch.randint(0, 256, (2, 30))
    a = generate(model, ids, 100, cache=SlidingWindowCache(24)).tokens
    b = generate(ref_model, ids, 100, cache="dynamic").tokens
    assert torch.equal(a, b)


def test_sinks_are_kept():
    model = _model()
    ids = torch.randint(0, 256, (2, 100))
    full, sink = DynamicCache(), SinkCache(sinks=4, window=20)
    _run(model, ids, full)
    _run(model, ids, sink)
    # Layer 0 keys depend only on token and position, so they must match the full cache's exactly
    # (deeper layers' keys differ: they already saw a truncated context).
    expected = torch.cat([full.k[0][:, :, :4], full.k[0][:, :, -20:]], dim=2)  # first 4 + newest 20
    assert torch.allclose(sink.k[0], expected, atol=1e-6)
    assert sink.length == 24 and sink.seen == 100
    assert torch.equal(sink.next_pos, torch.tensor([100, 100]))  # true positions continue


def test_sinks_skip_left_padding():
    model = _model()
    ids = torch.randint(0, 256, (2, 60))
    mask = torch.ones(2, 60, dtype=torch.long)
    mask[1, :5] = 0
    full, sink = DynamicCache(), SinkCache(sinks=2, window=10)
    _run(model, ids, full, mask=mask)
    _run(model, ids, sink, mask=mask)
    assert torch.equal(sink.k[0][1, :, :2], full.k[0][1, :, 5:7])  # row 1's first two *real* tokens
    assert bool(sink.real.all())


def _manual_h2o(cache, steps, B=1, H_kv=1, D=4, hot=((3, 7),), seed=0):
    """Drive the cache without a model: q is all ones; in K/V head h, keys at positions ``hot[h]``
    align with it, so they get most of the attention."""
    g = torch.Generator().manual_seed(seed)
    for t in range(steps):
        k = torch.randn(B, H_kv, 1, D, generator=g) * 0.1
        for h in range(H_kv):
            if t in hot[h]:
                k[:, h] = 3.0
        v = torch.full((B, H_kv, 1, D), float(t))  # value = position, to identify kept tokens
        k_all, _ = cache.update(0, k, v)
        cache.observe(0, torch.ones(B, H_kv, 1, D), k_all, None)
        cache.advance(torch.ones(B, 1, dtype=torch.bool))
        assert cache.length == min(t + 1, cache.budget)
    return cache.v[0][..., 0]  # (B, H_kv, S): positions held


def test_h2o_keeps_budget_and_heavy_hitters():
    held = _manual_h2o(H2OCache(heavy=3, recent=4), steps=30)
    assert held.shape[-1] == 7  # exactly heavy + recent
    pos = held[0, 0].tolist()
    assert pos[-4:] == [26.0, 27.0, 28.0, 29.0]  # the recent window
    assert {3.0, 7.0} <= set(pos[:3])  # the two tokens every query attended to most


class _Spy(H2OCache):
    """Records, at every eviction, the scores of the candidates and which were kept."""

    def __init__(self, *a):
        super().__init__(*a)
        self.log = []

    def _keep(self, layer):
        idx = super()._keep(layer)
        self.log.append((self.scores[layer].clone(), idx.clone(), self.recent))
        return idx


def test_h2o_keeps_the_highest_scoring_tokens_per_row_and_head():
    model = _model()
    cache = _Spy(6, 6)
    _run(model, torch.randint(0, 256, (2, 60)), cache, prefill=20)
    assert cache.log and all(k.shape[2] == 12 for k in cache.k)
    for scores, idx, recent in cache.log:
        S = scores.shape[-1]
        heavy = idx[..., :-recent]
        assert torch.equal(idx[..., -recent:], torch.arange(S - recent, S).expand_as(idx[..., -recent:]))
        old = scores[..., : S - recent]
        kept = old.gather(-1, heavy)
        dropped = old.masked_fill(torch.zeros_like(old, dtype=torch.bool).scatter(-1, heavy, True), float("-inf"))
        # Every kept heavy hitter scored at least as much as every evicted token, in each (row, head).
        assert bool((kept.amin(-1) >= dropped.amax(-1)).all())


def test_h2o_heads_choose_independently():
    held = _manual_h2o(H2OCache(heavy=2, recent=3), steps=25, H_kv=2, hot=((2, 5), (3, 6)))
    assert held[0, 0, :2].tolist() == [2.0, 5.0]  # each K/V head keeps its own heavy hitters
    assert held[0, 1, :2].tolist() == [3.0, 6.0]


@pytest.mark.parametrize("make", [lambda: H2OCache(8, 8), lambda: SinkCache(4, 12), lambda: SlidingWindowCache(16)])
def test_rows_are_independent(make):
    model = _model()
    ids = torch.randint(0, 256, (2, 80))
    other = ids.clone()
    other[1] = torch.randint(0, 256, (80,))  # change only row 1
    a, b = _run(model, ids, make(), 20), _run(model, other, make(), 20)
    # Row 0 must not notice: scores are per sequence, never summed over the batch (the reference H2O bug).
    assert float((a[0] - b[0]).abs().max()) <= 1e-5
    assert float((a[1] - b[1]).abs().max()) > 1e-3  # and row 1 did change


def test_h2o_scores_are_per_sequence():
    cache = H2OCache(2, 2)
    held = _manual_h2o(cache, steps=20, B=2)
    assert cache.scores[0].shape[0] == 2  # (B, H_kv, S): one score row per sequence
    assert torch.equal(held[0], held[1])


@pytest.mark.parametrize("make,budget", [(lambda: H2OCache(8, 8), 16), (lambda: SinkCache(4, 12), 16),
                                         (lambda: SlidingWindowCache(16), 16)])
def test_memory_stays_flat(make, budget):
    model, cache = _model(), make()
    ids = torch.randint(0, 256, (2, 4 * budget + 8))
    sizes = []
    with torch.no_grad():
        for i in range(ids.shape[1]):  # 4x the budget, one token at a time
            model(ids[:, i:i + 1], cache=cache)
            sizes.append(cache.nbytes)
    full = sizes[budget - 1]
    assert all(s == full for s in sizes[budget:])  # not a byte more once the budget is reached
    per_token = 2 * CFG.n_layers * 2 * CFG.n_kv_heads * CFG.head_dim * 4  # K+V, fp32, batch 2
    assert full <= budget * per_token * 1.1  # K/V of `budget` tokens (+ H2O's fp32 scores: 1 per head, not per D)


def test_bad_budgets_raise_clear_errors():
    for bad in (lambda: SlidingWindowCache(0), lambda: SinkCache(4, 0), lambda: SinkCache(-1, 8),
                lambda: H2OCache(0, 0), lambda: H2OCache(-1, 4), lambda: SlidingWindowCache(2.5)):
        with pytest.raises(BudgetError, match=">= "):
            bad()
    assert issubclass(BudgetError, ValueError)
    assert H2OCache(0, 1).budget == 1 and H2OCache(1, 0).budget == 1  # either part alone is a valid budget
