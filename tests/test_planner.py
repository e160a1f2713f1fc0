"""The per-layer memory planner (kvref.planner): every expected number below is worked out by hand
from the published config fields (in each comment), not taken from the code under test."""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.kinds import kind_counts, kv_source, layer_kind, shared
from kvref.memory import kv_bytes_by_kind, layer_formula, layer_kv_bytes, mla_decode_read_bytes, planner_rows

P = {**kvref.PRESETS, **kvref.config.MODERN_PRESETS}


def test_course_presets_stay_apart():
    """Chapters 3 and 4 walk kvref.PRESETS with GPT-2/Llama arithmetic (weights included): the per-layer
    presets must not appear there, and ModelConfig.preset finds both."""
    assert set(kvref.PRESETS) == {"gpt2", "llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b"}
    assert kvref.ModelConfig.preset("gemma-3-27b").layer_types[5] == "full"
    for name in kvref.PRESETS:
        kvref.memory.weight_bytes(kvref.PRESETS[name])  # countable


def test_old_presets_unchanged():
    """Configs without layer_types keep the one formula 2 * L * B * S * H_kv * D * b."""
    for name in ("gpt2", "llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b"):
        c = P[name]
        assert kvref.kv_cache_bytes(c, 3, 1000) == 2 * c.n_layers * 3 * 1000 * c.n_kv_heads * c.head_dim * 2


def test_deepseek_v3_latent_bytes():
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) numbers x 2 bytes (bf16) per token
    assert kvref.kv_bytes_per_token(P["deepseek-v3"], torch.bfloat16) == 61 * 576 * 2
    assert kvref.kv_cache_bytes(P["deepseek-v3"], 2, 4096, torch.bfloat16) == 2 * 4096 * 61 * 576 * 2
    # V3.2 adds the indexer key, index_head_dim 128
    assert kvref.kv_cache_bytes(P["deepseek-v3.2"], 1, 100, "fp32") == 100 * 61 * (576 + 128) * 4


def test_gemma3_27b_sliding_and_full():
    c = P["gemma-3-27b"]
    assert kind_counts(c) == {"full": 10, "sliding": 52}  # 62 layers, every 6th global
    assert [i for i in range(62) if layer_kind(c, i) == "full"] == list(range(5, 62, 6))
    per_row = 2 * 16 * 128 * 2  # K and V, H_kv 16, D 128, bf16
    for S in (10, 1024, 8192, 131072):
        expect = 52 * min(S, 1024) * per_row + 10 * S * per_row
        assert kvref.kv_cache_bytes(c, 1, S, torch.bfloat16) == expect
    # past the window only the global layers grow
    grow = kvref.kv_cache_bytes(c, 1, 5001, "bf16") - kvref.kv_cache_bytes(c, 1, 5000, "bf16")
    assert grow == kvref.kv_bytes_per_token(c, "bf16") == 10 * per_row


def test_qwen3_next_linear_state_is_flat():
    c = P["qwen3-next-80b-a3b"]
    assert kind_counts(c) == {"full": 12, "linear": 36}
    # state 32 value heads x 128 x 128, conv: (2*16*128 + 32*128) channels x (4 - 1) inputs
    linear = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3
    assert layer_kv_bytes(c, 0, 1, 1, "bf16") == layer_kv_bytes(c, 0, 1, 10**6, "bf16") == linear * 2
    assert layer_kv_bytes(c, 0, 1, 0, "bf16") == 0
    assert kvref.kv_cache_bytes(c, 1, 8192, "bf16") == 36 * linear * 2 + 12 * 8192 * 2 * 2 * 256 * 2


def test_gemma3n_shared_layers_store_nothing():
    c = P["gemma-3n-e4b"]
    assert kv_source(c, 20) == 18 and kv_source(c, 24) == 19 and kv_source(c, 5) == 5
    assert layer_kv_bytes(c, 30, 1, 4096) == 0
    assert "reads layer 18" in layer_formula(c, 20)
    per_row = 2 * 2 * 256 * 2  # K and V of 2 heads of 256, fp16
    assert kvref.kv_cache_bytes(c, 1, 4096) == 16 * 512 * per_row + 4 * 4096 * per_row


def test_by_kind_and_rows_sum_to_total():
    for name in kvref.memory.CH10_PRESETS:
        c = P[name]
        assert sum(kv_bytes_by_kind(c, 2, 3000).values()) == kvref.kv_cache_bytes(c, 2, 3000)
    rows = planner_rows(seq_lens=(8192,))
    for name in kvref.memory.CH10_PRESETS:
        mine = [r for r in rows if r["preset"] == name]
        assert sum(r["bytes"][8192] for r in mine[:-1]) == mine[-1]["bytes"][8192]
        assert sum(r["layers"] for r in mine[:-1]) == P[name].n_layers


def test_mla_read_bytes_by_hand():
    c = P["deepseek-v3"]
    S, H, L = 4096, 128, 61
    naive = mla_decode_read_bytes(c, S, "naive", torch.bfloat16)
    absorbed = mla_decode_read_bytes(c, S, "absorbed", torch.bfloat16)
    assert absorbed["cache"] == naive["cache"] == L * S * 576 * 2
    assert absorbed["weights"] == L * H * (128 + 128) * 512 * 2  # W_UK and W_UV
    assert naive["expanded"] == L * S * H * (128 + 64 + 128) * 2 and absorbed["expanded"] == 0
    with pytest.raises(ValueError, match="form must be one of"):
        mla_decode_read_bytes(c, S, "fast")
    with pytest.raises(ValueError, match="no latent"):
        mla_decode_read_bytes(P["llama-3-8b"], S, "naive")


@pytest.mark.parametrize("changes, match", [
    (dict(layer_types=("full",)), "1 entries but n_layers is 2"),
    (dict(layer_types=("full", "global")), r"layer_types\[1\] = 'global'"),
    (dict(layer_types=("full", "shared:1")), "0 <= j < 1"),
    (dict(layer_types=("sliding", "full")), "sliding_window"),
    (dict(layer_types=("latent", "full")), "kv_lora_rank"),
    (dict(layer_types=("linear", "shared:0")), "has K/V of its own"),
])
def test_bad_layer_types_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        kvref.ModelConfig(n_layers=2, **changes)


def test_shared_helper():
    assert shared(3) == "shared:3"
    c = kvref.ModelConfig(n_layers=3, layer_types=("full", "full", shared(0)))
    assert kvref.kv_cache_bytes(c, 1, 10, "fp32") == 2 * 10 * 2 * 4 * 16 * 4
