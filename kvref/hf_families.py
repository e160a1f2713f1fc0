"""Three more Hugging Face families for ``kvref.load_hf``: Qwen3, Gemma 3 (text) and DeepSeek-V3 (MLA).

Each has a config translation (which refuses, with one ValueError naming the field and its value,
anything kvref cannot run exactly: nothing loads approximately) and a weight-name map onto the
per-layer model of kvref.layers.
"""

from __future__ import annotations

import torch

from .config import ModelConfig

FAMILIES = ("qwen3", "gemma3_text", "deepseek_v3")
_GEMMA_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


def _refuse(field: str, value, why: str) -> ValueError:
    return ValueError(f"{field}={value!r}: {why}")


def _rope(params: dict | None, where: str, allow_linear: bool = False) -> tuple[float | None, float | None]:
    """(theta, linear factor or None) of a rope_parameters / rope_scaling dict; refuses other scalings."""
    params = params or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "linear" and allow_linear:
        return params.get("rope_theta"), float(params["factor"])
    if kind != "default":
        allowed = "'default' or 'linear'" if allow_linear else "'default'"
        raise _refuse(f"{where}.rope_type", kind, f"kvref implements RoPE {allowed} here, not this scaling")
    return params.get("rope_theta"), None


def _common_refusals(hf: dict, act_field: str, act: str) -> None:
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf.get(field) is not None:
            raise _refuse(field, hf[field], "kvref has no logit softcapping, so this model would load approximately")
    if hf.get(act_field, act) != act:
        raise _refuse(act_field, hf[act_field], f"kvref runs {act} here")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        field = "attention_bias" if hf.get("attention_bias") else "mlp_bias"
        raise _refuse(field, True, "kvref runs this family without biases")


def _shape(hf: dict) -> dict:
    return dict(n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"], d_model=hf["hidden_size"],
                d_ff=hf["intermediate_size"], vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"],
                norm_eps=hf.get("rms_norm_eps", 1e-6))


def config_from_family(hf: dict) -> ModelConfig:
    """ModelConfig for a qwen3, gemma3_text or deepseek_v3 config.json dict."""
    kind = hf["model_type"]
    if kind == "qwen3":
        _common_refusals(hf, "hidden_act", "silu")
        types = hf.get("layer_types") or []
        if hf.get("use_sliding_window") or any(t != "full_attention" for t in types):
            bad = next((f"layer_types[{i}]", t) for i, t in enumerate(types) if t != "full_attention") if any(
                t != "full_attention" for t in types) else ("use_sliding_window", True)
            raise _refuse(*bad, "kvref runs Qwen3 with full attention in every layer")
        theta, _ = _rope(hf.get("rope_parameters") or hf.get("rope_scaling"), "rope_parameters")
        n_kv = hf.get("num_key_value_heads") or hf["num_attention_heads"]
        return ModelConfig(arch="llama", **_shape(hf), n_kv_heads=n_kv,
                           head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
                           rope_theta=float(theta or hf.get("rope_theta", 10000.0)), qk_norm=True, qkv_bias=False,
                           tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    if kind == "gemma3_text":
        _common_refusals(hf, "hidden_activation", "gelu_pytorch_tanh")
        if hf.get("use_bidirectional_attention"):
            raise _refuse("use_bidirectional_attention", True, "kvref's attention is causal")
        types = []
        for i, t in enumerate(hf["layer_types"]):
            if t not in _GEMMA_TYPES:
                raise _refuse(f"layer_types[{i}]", t, f"kvref knows {', '.join(_GEMMA_TYPES)} for Gemma 3")
            types.append(_GEMMA_TYPES[t])
        rp = hf.get("rope_parameters") or {}
        if "full_attention" in rp:  # transformers 5: one dict per layer type
            theta, factor = _rope(rp["full_attention"], "rope_parameters.full_attention", allow_linear=True)
            local, _ = _rope(rp.get("sliding_attention"), "rope_parameters.sliding_attention")
        else:  # older files: rope_theta, rope_scaling (global layers), rope_local_base_freq
            theta, factor = _rope(hf.get("rope_scaling"), "rope_scaling", allow_linear=True)
            theta, local = theta or hf.get("rope_theta", 1e6), hf.get("rope_local_base_freq", 10000.0)
        return ModelConfig(arch="gemma", **_shape(hf), n_kv_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"],
                           rope_theta=float(theta), rope_local_theta=float(local), rope_scaling=factor,
                           sliding_window=hf["sliding_window"], layer_types=tuple(types), qk_norm=True, qkv_bias=False,
                           attn_scale=float(hf["query_pre_attn_scalar"]) ** -0.5,
                           tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
    if kind == "deepseek_v3":
        _common_refusals(hf, "hidden_act", "silu")
        L, dense = hf["num_hidden_layers"], hf.get("first_k_dense_replace", 0)
        if dense < L:
            raise _refuse("first_k_dense_replace", dense,
                          f"layers {dense}..{L - 1} of num_hidden_layers={L} are mixture-of-experts layers, which "
                          f"kvref does not run; it loads DeepSeek-V3 configs whose layers are all dense "
                          f"(first_k_dense_replace >= num_hidden_layers)")
        if not hf.get("rope_interleave", True):
            raise _refuse("rope_interleave", False, "kvref rotates DeepSeek's interleaved RoPE layout only")
        theta, _ = _rope(hf.get("rope_parameters") or hf.get("rope_scaling"), "rope_parameters")
        d_nope, d_rope = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"]
        return ModelConfig(arch="llama", **_shape(hf), n_kv_heads=hf["num_attention_heads"], head_dim=d_nope + d_rope,
                           rope_theta=float(theta or hf.get("rope_theta", 10000.0)), layer_types=("latent",) * L,
                           kv_lora_rank=hf["kv_lora_rank"], q_lora_rank=hf.get("q_lora_rank"), qk_rope_head_dim=d_rope,
                           qk_nope_head_dim=d_nope, v_head_dim=hf["v_head_dim"], qkv_bias=False,
                           tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    raise ValueError(f"model_type {kind!r} is not one of {FAMILIES}")


def family_weights(w: dict, cfg: ModelConfig, kind: str) -> dict:
    """HF weight names -> kvref.layers names (q, k, v and gate, up concatenated into fused matmuls)."""
    sd = {"tok_emb.weight": w["model.embed_tokens.weight"], "norm.weight": w["model.norm.weight"]}
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = w["lm_head.weight"]
    norms = [("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")]
    if kind == "gemma3_text":
        norms = [("norm1", "input_layernorm"), ("norm1_post", "post_attention_layernorm"),
                 ("norm2", "pre_feedforward_layernorm"), ("norm2_post", "post_feedforward_layernorm")]
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        a, b = p + "self_attn.", q + "attn."
        for ours, theirs in norms:
            sd[q + ours + ".weight"] = w[p + theirs + ".weight"]
        sd[q + "mlp.up.weight"] = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        sd[q + "mlp.down.weight"] = w[p + "mlp.down_proj.weight"]
        sd[b + "proj.weight"] = w[a + "o_proj.weight"]
        if kind == "deepseek_v3":
            names = [("kv_a", "kv_a_proj_with_mqa"), ("kv_a_norm", "kv_a_layernorm"), ("kv_b", "kv_b_proj")]
            names += [("q_a", "q_a_proj"), ("q_a_norm", "q_a_layernorm"), ("q_b", "q_b_proj")] if cfg.q_lora_rank else [
                ("q", "q_proj")]
            for ours, theirs in names:
                sd[b + ours + ".weight"] = w[a + theirs + ".weight"]
        else:
            sd[b + "qkv.weight"] = torch.cat([w[a + f"{x}_proj.weight"] for x in "qkv"])
            sd[b + "q_norm.weight"], sd[b + "k_norm.weight"] = w[a + "q_norm.weight"], w[a + "k_norm.weight"]
    return sd
