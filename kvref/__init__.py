"""kvref: the reference implementation of the KV-cache course.

    import kvref
    model = kvref.Transformer(kvref.ModelConfig(arch="gpt2"))
    out = kvref.generate(model, ids, max_new_tokens=32, cache="static")
"""

from .cache import DynamicCache, KVCache, StaticCache
from .config import PRESETS, ModelConfig
from .generate import Generation, GenerationStats, decode_one_token, generate, prefill, sample
from .hf import load_hf
from .model import Transformer
from .tokenizer import ByteTokenizer

__all__ = [
    "ByteTokenizer", "DynamicCache", "Generation", "GenerationStats", "KVCache", "ModelConfig", "PRESETS",
    "StaticCache", "Transformer", "decode_one_token", "generate", "load_hf", "prefill", "sample",
]
__version__ = "0.1.0"
