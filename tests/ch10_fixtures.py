"""Tiny random Hugging Face models of the chapter-10 families and kvref's copies of them (tests only).

``tiny_hf(family, tmp_path, **overrides)`` -> (hf_model, kvref_model). Weights are spread wider than
HF's init (std 0.2; norm weights jittered) so that greedy output varies and equality means something.
"""

from __future__ import annotations

import logging

import torch

import kvref

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=256,
            max_position_embeddings=128)


def hf_config(family: str, **overrides):
    import transformers as tf

    if family == "qwen3":
        return tf.Qwen3Config(**{**BASE, "num_key_value_heads": 2, "head_dim": 24, **overrides})  # D != 64 / 4
    if family == "gemma3":
        kw = {**BASE, "num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 6,
              "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
              "query_pre_attn_scalar": 24, **overrides}
        return tf.Gemma3TextConfig(**kw)
    if family == "deepseek_v3":
        kw = {**BASE, "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 24, "qk_rope_head_dim": 8,
              "qk_nope_head_dim": 16, "v_head_dim": 12, **overrides}
        kw.setdefault("first_k_dense_replace", kw["num_hidden_layers"])  # dense MLP layers only
        return tf.DeepseekV3Config(**kw)
    raise KeyError(family)


def tiny_hf(family: str, path, seed: int = 0, **overrides):
    import transformers as tf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    tf.logging.set_verbosity_error()
    tf.logging.disable_progress_bar()
    cls = {"qwen3": tf.Qwen3ForCausalLM, "gemma3": tf.Gemma3ForCausalLM, "deepseek_v3": tf.DeepseekV3ForCausalLM}
    torch.manual_seed(seed)
    hf = cls[family](hf_config(family, **overrides)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
        if family == "gemma3":  # Gemma multiplies embeddings by sqrt(d_model): with tied weights, a large
            hf.get_input_embeddings().weight.mul_(0.2)  # embedding makes the input token win every step
    hf.save_pretrained(path)
    return hf, kvref.load_hf(path)
