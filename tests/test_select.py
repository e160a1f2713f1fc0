"""Top-k selection over a full cache (kvref.select): exact when k covers every row, reads counted by hand,
and on the tiny trained model it keeps the looked-up fact while reading a small share of the rows."""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.select import TopKCache, selection_vs_eviction


def small_model() -> kvref.Transformer:
    torch.manual_seed(0)
    cfg = kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, max_seq_len=64)
    return kvref.Transformer(cfg).eval()


def run(model, cache, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    with torch.no_grad():
        steps = [model(ids[:, :prompt], cache=cache)]
        steps += [model(ids[:, t:t + 1], cache=cache) for t in range(prompt, ids.shape[1])]
    return torch.cat(steps, dim=1)


def test_k_covering_every_row_is_full_attention():
    model = small_model()
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(1))
    cache = TopKCache(20)
    got = run(model, cache, ids, prompt=8)
    torch.testing.assert_close(got, model(ids), atol=1e-5, rtol=0)  # fp32, same math: the 1e-5 bound
    assert cache.rows_read == cache.rows_full


def test_rows_read_by_hand():
    """Causal prompt of T tokens then N decode steps: query t sees t + 1 rows and reads min(k, t + 1)."""
    model = small_model()
    B, H_kv, L, T, N, k = 2, 2, 2, 10, 5, 4
    ids = torch.randint(0, 256, (B, T + N), generator=torch.Generator().manual_seed(2))
    cache = TopKCache(k)
    out = run(model, cache, ids, prompt=T)
    visible = range(1, T + N + 1)
    assert cache.rows_full == B * H_kv * L * sum(visible)
    assert cache.rows_read == B * H_kv * L * sum(min(k, s) for s in visible)
    assert (out - model(ids)).abs().max() > 1e-4  # k = 4 < S really changes attention on this random model


def test_selection_keeps_the_fact_on_the_tiny_model():
    """The lookup probes of chapter 7: the full cache answers all 5; top-32 selection (whole cache kept) answers
    the same ones while reading under a fifth of the rows full attention reads."""
    model = kvref.tiny_model()
    (row,) = selection_vs_eviction(model, ks=(32,), n_probes=5, h2o=False)
    assert row["recall_full"] == 1.0
    assert row["recall_select"] == 1.0
    assert row["read_frac"] < 0.2 and row["read_frac_answer"] < 0.1  # S is about 500: 32 rows is ~6 %


def test_bad_k():
    with pytest.raises(ValueError, match="k .rows each query reads. must be an integer >= 1"):
        TopKCache(0)
