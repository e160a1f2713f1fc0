"""Load a Hugging Face-format folder (config.json + *.safetensors) into a kvref Transformer.

Only the file formats are shared with ``transformers``; this module does not import it.
Supported ``model_type``s: gpt2, llama, mistral, qwen2, and (kvref.hf_families) qwen3, gemma3_text and
deepseek_v3 (dense layers only).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import ModelConfig
from .hf_families import FAMILIES, config_from_family, family_weights
from .layout import set_layout
from .model import Transformer

SUPPORTED = ("gpt2", "llama", "mistral", "qwen2") + FAMILIES


def config_from_hf(hf: dict) -> ModelConfig:
    """Translate a config.json dict into a ModelConfig (or say clearly why not)."""
    kind = hf.get("model_type")
    if kind == "gemma3":
        raise ValueError("model_type 'gemma3' is the image-text model; kvref reads its language model alone "
                         "(model_type 'gemma3_text', saved from Gemma3ForCausalLM)")
    if kind not in SUPPORTED:
        raise ValueError(f"model_type {kind!r} is not supported; load_hf reads {', '.join(SUPPORTED)}")
    if kind in FAMILIES:
        return config_from_family(hf)
    if kind == "gpt2":
        if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"gpt2 with activation {hf['activation_function']!r} is not supported (gelu_new only)")
        if hf.get("scale_attn_by_inverse_layer_idx"):
            raise ValueError("gpt2 with scale_attn_by_inverse_layer_idx=True is not supported")
        return ModelConfig(
            arch="gpt2", n_layers=hf["n_layer"], n_heads=hf["n_head"], d_model=hf["n_embd"],
            d_ff=hf.get("n_inner") or 4 * hf["n_embd"], vocab_size=hf["vocab_size"],
            max_seq_len=hf["n_positions"], norm_eps=hf.get("layer_norm_epsilon", 1e-5), tie_embeddings=True,
        )
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"RoPE scaling {rope_type!r} is not supported; only plain RoPE ('default')")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (silu only)")
    if hf.get("mlp_bias") or (kind == "llama" and hf.get("attention_bias")):
        raise ValueError("llama with attention_bias or mlp_bias is not supported")
    window = None
    if kind == "mistral":
        window = hf.get("sliding_window")
    elif kind == "qwen2" and hf.get("use_sliding_window"):
        raise ValueError("qwen2 with use_sliding_window=True is not supported")
    n_heads = hf["num_attention_heads"]
    return ModelConfig(
        arch="llama", n_layers=hf["num_hidden_layers"], n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads, d_model=hf["hidden_size"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads, d_ff=hf["intermediate_size"],
        vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"],
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), qkv_bias=kind == "qwen2",
        norm_eps=hf.get("rms_norm_eps", 1e-6), sliding_window=window,
    )


def _gpt2_weights(w: dict, cfg: ModelConfig) -> dict:
    """GPT-2 stores Conv1D weights as (in, out): transpose them into nn.Linear's (out, in)."""
    w = {k.removeprefix("transformer."): v for k, v in w.items()}
    sd = {"tok_emb.weight": w["wte.weight"], "pos_emb.weight": w["wpe.weight"],
          "norm.weight": w["ln_f.weight"], "norm.bias": w["ln_f.bias"]}
    for i in range(cfg.n_layers):
        p, q = f"h.{i}.", f"blocks.{i}."
        for ours, theirs in [("norm1", "ln_1"), ("norm2", "ln_2")]:
            sd[q + ours + ".weight"], sd[q + ours + ".bias"] = w[p + theirs + ".weight"], w[p + theirs + ".bias"]
        for ours, theirs in [("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"),
                             ("mlp.up", "mlp.c_fc"), ("mlp.down", "mlp.c_proj")]:
            sd[q + ours + ".weight"] = w[p + theirs + ".weight"].t()
            sd[q + ours + ".bias"] = w[p + theirs + ".bias"]
    return sd


def _llama_weights(w: dict, cfg: ModelConfig) -> dict:
    """Llama/Mistral/Qwen2 names; q, k, v (and gate, up) are concatenated into our fused matmuls."""
    sd = {"tok_emb.weight": w["model.embed_tokens.weight"], "norm.weight": w["model.norm.weight"]}
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = w["lm_head.weight"]
    for i in range(cfg.n_layers):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        sd[q + "norm1.weight"] = w[p + "input_layernorm.weight"]
        sd[q + "norm2.weight"] = w[p + "post_attention_layernorm.weight"]
        sd[q + "attn.qkv.weight"] = torch.cat([w[a + f"{x}_proj.weight"] for x in "qkv"])
        if cfg.qkv_bias:
            sd[q + "attn.qkv.bias"] = torch.cat([w[a + f"{x}_proj.bias"] for x in "qkv"])
        sd[q + "attn.proj.weight"] = w[a + "o_proj.weight"]
        sd[q + "mlp.up.weight"] = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        sd[q + "mlp.down.weight"] = w[p + "mlp.down_proj.weight"]
    return sd


def load_hf(path: str | Path, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
            layout: str | None = None) -> Transformer:
    """Read a Hugging Face model folder and return an equivalent kvref ``Transformer``.

    ``layout``: how the linear weights lie in memory (``kvref.layout.set_layout``): "auto" (time both
    on this model, keep the faster; the default, also via $KVREF_LAYOUT), "out_in" or "in_out".
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json; expected a Hugging Face model folder")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weight files")
    hf = json.loads((path / "config.json").read_text())
    cfg = config_from_hf(hf)
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    try:
        if hf["model_type"] in FAMILIES:
            sd = family_weights(weights, cfg, hf["model_type"])
        else:
            sd = _gpt2_weights(weights, cfg) if cfg.arch == "gpt2" else _llama_weights(weights, cfg)
    except KeyError as e:
        raise ValueError(f"{path}: weight {e.args[0]!r} is missing for a {hf['model_type']} model") from None
    if dtype is None:
        dtype = sd["tok_emb.weight"].dtype  # keep the dtype the weights were saved in
    model = Transformer(cfg, dtype=dtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not fit the model (missing {missing}, unexpected {unexpected})")
    model = model.to(device=device).eval()
    set_layout(model, layout)
    return model
