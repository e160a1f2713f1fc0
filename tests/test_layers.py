"""Per-layer kinds without HF: cross-layer K/V sharing, MLA read counts, and the refusals of load_hf.

Bounds: cached vs uncached fp32 within 1e-5 (the course's bound for the same math in another order).
"""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref.hf import config_from_hf
from kvref.layers import LayeredCache
from kvref.memory import mla_decode_read_bytes
from kvref.mla import MLAttention, set_form


def shared_model(arch: str = "llama", seed: int = 0, **changes) -> kvref.Transformer:
    kw = dict(arch=arch, n_layers=5, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, sliding_window=5,
              max_seq_len=64, layer_types=("full", "sliding", "full", "shared:1", "shared:2"), qk_norm=True)
    torch.manual_seed(seed)
    model = kvref.Transformer(kvref.ModelConfig(**{**kw, **changes})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("arch, static", [("llama", True), ("llama", False), ("gemma", True)])
def test_shared_layers_cached_equal_uncached(arch, static):
    model = shared_model(arch)
    ids = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(1))  # 30 > window 5
    cache = LayeredCache(model.cfg, 2, 30, static=static)
    with torch.no_grad():
        steps = [model(ids[:, :7], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(7, 30)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(ids), atol=1e-5, rtol=0)
    # two full layers (0, 2) and one ring (1) are stored; layers 3 and 4 store nothing
    assert cache.nbytes == kvref.kv_cache_bytes(model.cfg, 2, 30, torch.float32)
    assert cache.nbytes == 2 * 2 * 2 * 8 * 4 * (2 * 30 + 5)


def test_shared_layer_reads_its_source():
    """Layer 4 ("shared:2") has no K/V projection; its attention output is attention of its own queries
    over the keys and values layer 2 computed from layer 2's input, rebuilt here by hand."""
    import torch.nn.functional as F
    from kvref.model import apply_rope

    model = shared_model(qk_norm=False)
    assert model.blocks[4].attn.qkv.out_features == 4 * 8  # q only
    seen = {}
    hooks = [model.blocks[i].attn.register_forward_hook(
        lambda m, args, out, i=i: seen.__setitem__(i, (args[0], out))) for i in (2, 4)]
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(ids)
        for h in hooks:
            h.remove()
        cos, sin = model.rope_cos_full[:12][None, None], model.rope_sin_full[:12][None, None]
        x2, x4 = seen[2][0], seen[4][0]  # (1, T, d_model): each layer's normalised input
        k, v = (x2 @ model.blocks[2].attn.qkv.weight[32:].T).view(1, 12, 4, 8).split(2, dim=2)
        k, v = apply_rope(k.transpose(1, 2), cos, sin), v.transpose(1, 2)  # (1, H_kv, T, D)
        q = apply_rope((x4 @ model.blocks[4].attn.qkv.weight.T).view(1, 12, 4, 8).transpose(1, 2), cos, sin)
        y = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
        expect = model.blocks[4].attn.proj(y.transpose(1, 2).reshape(1, 12, 32))
    torch.testing.assert_close(seen[4][1], expect, atol=1e-5, rtol=0)


def test_mla_reads_match_the_formula():
    cfg = kvref.ModelConfig(n_layers=2, n_heads=4, d_model=32, head_dim=12, max_seq_len=64,
                            layer_types=("latent", "latent"), kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=4,
                            qk_nope_head_dim=8, v_head_dim=6)
    model = kvref.Transformer(cfg).eval()
    ids = torch.randint(0, 256, (1, 21))
    for form in ("naive", "absorbed"):
        set_form(model, form)
        cache = LayeredCache(cfg, 1, 21)
        model(ids[:, :20], cache=cache)
        layers = [m for m in model.modules() if isinstance(m, MLAttention)]
        for m in layers:
            m.reads = {}
        model(ids[:, 20:], cache=cache)  # one decode step over S = 21 keys
        counted = {k: sum(m.reads[k] for m in layers) * 4 for k in ("cache", "weights", "expanded")}
        expect = mla_decode_read_bytes(cfg, 21, form, torch.float32)
        assert counted == {k: expect[k] for k in counted}
    assert counted["expanded"] == 0  # the absorbed form never builds per-head K/V


def test_planner_only_kinds_do_not_run():
    # "linear" runs since kvref.linear_attn (tests/test_linear_attn.py); DeepSeek-V3.2's "sparse" is still planned only
    cfg = kvref.ModelConfig.preset("deepseek-v3.2").with_(n_layers=2, layer_types=("sparse", "latent"), d_model=64, n_kv_heads=4,
                                                          n_heads=4, vocab_size=256)
    with pytest.raises(ValueError, match=r"layer_types\[0\] = 'sparse': kvref plans the memory"):
        kvref.Transformer(cfg)
    qn = kvref.ModelConfig.preset("qwen3-next-80b-a3b").with_(n_layers=4, layer_types=("linear",) * 3 + ("full",),
                                                               d_model=64, n_heads=4, head_dim=16, vocab_size=256,
                                                               linear_num_key_heads=2, linear_num_value_heads=4,
                                                               linear_key_head_dim=8, linear_value_head_dim=8)
    assert kvref.Transformer(qn).blocks[0].linear  # Qwen3-Next's pattern builds


def _hf(model_type: str, **fields) -> dict:
    base = dict(model_type=model_type, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                hidden_size=32, intermediate_size=64, vocab_size=64, max_position_embeddings=64, head_dim=8)
    if model_type == "gemma3_text":
        base.update(layer_types=["sliding_attention", "full_attention"], sliding_window=4, query_pre_attn_scalar=8)
    if model_type == "deepseek_v3":
        base.update(kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4,
                    first_k_dense_replace=2)
    return {**base, **fields}


@pytest.mark.parametrize("hf, match", [
    (_hf("deepseek_v3", first_k_dense_replace=1), r"first_k_dense_replace=1: layers 1\.\.1 .*mixture-of-experts"),
    (_hf("deepseek_v3", rope_parameters={"rope_type": "yarn", "factor": 40.0, "rope_theta": 1e4}),
     r"rope_parameters.rope_type='yarn'"),
    (_hf("deepseek_v3", rope_interleave=False), r"rope_interleave=False"),
    (_hf("gemma3_text", final_logit_softcapping=30.0), r"final_logit_softcapping=30.0: kvref has no logit softcapping"),
    (_hf("gemma3_text", attn_logit_softcapping=50.0), r"attn_logit_softcapping=50.0"),
    (_hf("gemma3_text", layer_types=["sliding_attention", "chunked_attention"]),
     r"layer_types\[1\]='chunked_attention'"),
    (_hf("gemma3_text", rope_parameters={"full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
     r"rope_parameters.full_attention.rope_type='dynamic'"),
    (_hf("qwen3", use_sliding_window=True), r"use_sliding_window=True"),
    (_hf("qwen3", layer_types=["full_attention", "sliding_attention"]), r"layer_types\[1\]='sliding_attention'"),
    (_hf("qwen3", attention_bias=True), r"attention_bias=True"),
    (_hf("gemma3"), r"'gemma3' is the image-text model"),
])
def test_configs_kvref_cannot_run_exactly_are_refused(hf, match):
    with pytest.raises(ValueError, match=match):
        config_from_hf(hf)


def test_refusal_is_one_value_error_from_load_hf(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(_hf("deepseek_v3", first_k_dense_replace=0)))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="first_k_dense_replace=0"):
        kvref.load_hf(tmp_path)


def test_every_runnable_kind_cached_equals_uncached(device):
    """Full, sliding, latent and shared layers in one model, on each device: cached decode = one forward."""
    cfg = kvref.ModelConfig(n_layers=4, n_heads=4, n_kv_heads=2, d_model=32, head_dim=8, max_seq_len=40,
                            sliding_window=4, layer_types=("latent", "sliding", "full", "shared:1"),
                            kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)
    torch.manual_seed(0)
    model = kvref.Transformer(cfg, device=device).eval()
    ids = torch.randint(0, 256, (2, 24), device=device)
    for static in (True, False):
        cache = LayeredCache(cfg, 2, 24, device=device, static=static)
        with torch.no_grad():
            steps = [model(ids[:, :5], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(5, 24)]
            torch.testing.assert_close(torch.cat(steps, dim=1), model(ids), atol=1e-5, rtol=0)
        assert cache.nbytes == kvref.kv_cache_bytes(cfg, 2, 24, torch.float32)


def test_plan_memory_with_layer_kinds():
    """The planner answers deployment questions for per-layer presets once the weights are given."""
    GiB = kvref.memory.GiB
    cfg = kvref.ModelConfig.preset("gemma-3-27b")
    with pytest.raises(ValueError, match="pass weights=<bytes> to plan_memory"):
        kvref.plan_memory(cfg, 80 * GiB)
    plan = kvref.plan_memory(cfg, 80 * GiB, weights=54 * GiB, seq_len=131072, dtype=torch.bfloat16)
    # 26 GiB for KV; one 128K sequence takes 52 * 1024 + 10 * 131072 rows of 2 * 16 * 128 * 2 bytes
    per_seq = (52 * 1024 + 10 * 131072) * 2 * 16 * 128 * 2
    assert plan.need_bytes == per_seq and plan.max_batch == 26 * GiB // per_seq
