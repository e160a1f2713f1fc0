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
    for name in kvref.memory.PLANNER_PRESETS:
        c = P[name]
        assert sum(kv_bytes_by_kind(c, 2, 3000).values()) == kvref.kv_cache_bytes(c, 2, 3000)
    rows = planner_rows(seq_lens=(8192,))
    for name in kvref.memory.PLANNER_PRESETS:
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
    (dict(layer_types=("csa", "full"), sliding_window=8, index_topk=4, index_head_dim=8), "csa_rate"),
    (dict(layer_types=("hca", "full"), hca_rate=8), "sliding_window"),
    (dict(index_key_dtype="int4"), "index_key_dtype must be one of"),
    (dict(global_n_kv_heads=3), "multiple of global_n_kv_heads"),
    (dict(global_head_dim=0), "global_head_dim must be None"),
    (dict(k_is_v=1), "k_is_v must be True or False"),
    (dict(linear_state_dtype="int8"), "linear_state_dtype must be None"),
])
def test_bad_layer_types_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        kvref.ModelConfig(n_layers=2, **changes)


def test_shared_helper():
    assert shared(3) == "shared:3"
    c = kvref.ModelConfig(n_layers=3, layer_types=("full", "full", shared(0)))
    assert kvref.kv_cache_bytes(c, 1, 10, "fp32") == 2 * 10 * 2 * 4 * 16 * 4


# -- 2026: the indexer key's own dtype, compressed layers, a shared indexer, wider global layers ------------------


def test_llama31_is_llama3_with_a_128k_context():
    # Llama-3.1-8B's config.json: the shape of Llama-3-8B, max_position_embeddings 131072 (Llama-3-8B: 8192)
    a, b = P["llama-3.1-8b"], P["llama-3-8b"]
    assert (a.max_seq_len, b.max_seq_len) == (131072, 8192)
    assert kvref.kv_cache_bytes(a, 1, 131072, "bf16") == 32 * 131072 * 2 * 8 * 128 * 2  # 16 GiB
    assert "llama-3.1-8b" in kvref.memory.CH10_PRESETS and "llama-3-8b" not in kvref.memory.CH10_PRESETS


def test_fp8_indexer_key_takes_a_byte_a_number_and_a_scale():
    # DeepSeek-V3.2-Exp inference/model.py: the indexer's k_cache is float8_e4m3fn (128 numbers) with one fp32
    # scale (k_scale_cache, 128 // 128 = 1); the latent and RoPE key stay bf16: 576 * 2 + 128 + 4 = 1284 bytes
    c = P["deepseek-v3.2"].with_(index_key_dtype="fp8")
    assert kvref.memory.index_key_bytes(c, "bf16") == 132 and kvref.memory.index_key_bytes(P["deepseek-v3.2"]) == 256
    assert kvref.kv_cache_bytes(c, 1, 1000, "bf16") == 61 * 1000 * 1284
    assert kvref.kv_cache_bytes(P["deepseek-v3.2"], 1, 1000, "bf16") == 61 * 1000 * 1408  # as HF stores it
    assert "i=132" in layer_formula(c, 0) and "d_I=128" in layer_formula(P["deepseek-v3.2"], 0)


def test_deepseek_v4_compressed_layers():
    c = P["deepseek-v4-flash"]
    assert kind_counts(c) == {"sliding": 2, "csa": 21, "hca": 20}  # compress_ratios [0, 0, 4, 128, 4, ..., 4]
    assert [layer_kind(c, i) for i in (0, 1, 2, 3, 42)] == ["sliding", "sliding", "csa", "hca", "csa"]
    row = 512 * 2  # one K=V head of 512 numbers, bf16: cached once
    for S in (100, 131072, 1000003):
        window = min(S, 128) * row
        csa = window + (S // 4) * (row + 128 * 2)  # a compressed row and an indexer key of 128 per 4 tokens
        hca = window + (S // 128) * row
        assert kvref.kv_cache_bytes(c, 1, S, "bf16") == 2 * window + 21 * csa + 20 * hca, S
    # past the window, a token adds a quarter of a csa row and 1/128 of an hca row
    assert kvref.kv_bytes_per_token(c, "bf16") == 21 * (row + 256) // 4 + 20 * row // 128
    assert "reads min(S // m, k) rows" in layer_formula(c, 2) and "K = V" in layer_formula(c, 0)


def test_glm52_shares_its_indexer():
    c = P["glm-5.2"]
    # indexer_types "full" where max(i - 3 + 1, 0) % 4 == 0: layers 0, 1, 2, 6, 10, ..., 74
    assert [i for i in range(78) if layer_kind(c, i) == "sparse"] == [0, 1, 2] + list(range(6, 78, 4))
    assert kind_counts(c) == {"latent": 57, "sparse": 21}
    assert kvref.kv_cache_bytes(c, 1, 4096, "bf16") == 4096 * (21 * (576 + 128) + 57 * 576) * 2


def test_gemma4_full_layers_are_wider_and_the_tail_shares():
    c = P["gemma-4-e4b"]
    assert kind_counts(c) == {"full": 4, "sliding": 20, "shared": 18}  # 42 layers, 5:1, 18 shared
    assert [kv_source(c, i) for i in (24, 29, 41)] == [22, 23, 23]
    S = 131072
    sliding = 20 * min(S, 512) * 2 * 2 * 256 * 2  # K and V, 2 heads of 256, bf16
    full = 4 * S * 2 * 2 * 512 * 2  # global_head_dim 512
    assert kvref.kv_cache_bytes(c, 1, S, "bf16") == sliding + full
    assert "D=512" in layer_formula(c, 5) and "D=256" in layer_formula(c, 0)


def test_k_is_v_halves_a_plain_config():
    c = kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=1, d_model=32)  # D = 8
    assert kvref.kv_cache_bytes(c.with_(k_is_v=True), 1, 10, "fp32") * 2 == kvref.kv_cache_bytes(c, 1, 10, "fp32")


def test_linear_state_in_fp32():
    # HF's Gated DeltaNet keeps the recurrent state in fp32, the convolution inputs in the model dtype
    c = P["qwen3-next-80b-a3b"].with_(linear_state_dtype="fp32")
    assert layer_kv_bytes(c, 0, 1, 5, "bf16") == 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2


def test_planner_rows_stop_at_the_context():
    rows = planner_rows(("gemma-3n-e4b", "gemma-4-e4b"), seq_lens=(32768, 131072))
    g3n = [r for r in rows if r["preset"] == "gemma-3n-e4b"]
    assert all(r["bytes"][131072] is None for r in g3n)  # max_position_embeddings 32768
    # at 32K: 16 sliding layers hold 512 tokens, 4 full layers 32768, 2 x 2 x 256 numbers each, bf16
    assert g3n[-1]["bytes"][32768] == (16 * 512 + 4 * 32768) * 2 * 2 * 256 * 2
    assert all(r["bytes"][131072] is not None for r in rows if r["preset"] == "gemma-4-e4b")


@pytest.mark.parametrize("name", ["deepseek-v4-flash", "gemma-4-e4b"])
def test_planner_only_shapes_are_not_run(name):
    cfg = P[name].with_(n_layers=4, layer_types=P[name].layer_types[:4], d_model=64, n_heads=4, vocab_size=64,
                        max_seq_len=64)
    with pytest.raises(ValueError, match="plans the memory"):
        kvref.Transformer(cfg)
    with pytest.raises(ValueError, match="plans the memory"):
        kvref.LayeredCache(cfg, batch=1, max_len=8)
