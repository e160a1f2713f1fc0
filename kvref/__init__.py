"""kvref: the reference implementation of the KV-cache course.

    import kvref
    model = kvref.Transformer(kvref.ModelConfig(arch="gpt2"))
    out = kvref.generate(model, ids, max_new_tokens=32, cache="static")

One concept per module: config, model (+ attention), cache, generate, hf (loading), memory
(the formula and a planner), paged + prefix (block pool, prefix caching), chunked, serve
(continuous batching), quant (int8/int4 KV), evict (window, sinks, H2O), train (the tiny model);
for decode speed: layout (the linear weights' memory order, timed), compiled (a decode step torch.compile takes whole), splitk (online softmax and
split-K attention, for reading), paged_inplace (paged decode attention in place with FlexAttention);
for chapter 10's models whose layers differ: kinds (the layer kinds), planner (bytes per layer),
layers (the per-layer model path and LayeredCache), mla (latent attention), hf_families (Qwen3,
Gemma 3, DeepSeek-V3 for load_hf), select (top-k selection over a full cache); speculative (a draft
guesses, the target verifies in one forward, every cache rolls back with ``crop``).
"""

from .cache import CropError, DynamicCache, KVCache, StaticCache
from .chunked import chunked_prefill
from .config import MODERN_PRESETS, PRESETS, ModelConfig
from .evict import BudgetError, H2OCache, SinkCache, SlidingWindowCache
from .generate import Generation, GenerationStats, decode_one_token, generate, prefill, sample
from .hf import load_hf
from .layers import LayeredCache
from .layout import set_layout
from .memory import MemoryPlan, kv_bytes_per_token, kv_cache_bytes, param_count, plan_memory, weight_bytes
from .model import Transformer
from .paged import BlockPool, CacheFull, PagedKVCache
from .prefix import PrefixCachingPool
from .quant import QuantizationError, QuantizedCache
from .serve import Engine, Request
from .tokenizer import ByteTokenizer

__all__ = [
    "BlockPool", "BudgetError", "ByteTokenizer", "CacheFull", "CropError", "DynamicCache", "Engine", "Generation",
    "GenerationStats", "H2OCache", "KVCache", "LayeredCache", "MODERN_PRESETS", "MemoryPlan", "ModelConfig", "PRESETS", "PagedKVCache",
    "PrefixCachingPool", "QuantizationError", "QuantizedCache", "Request", "SinkCache", "SlidingWindowCache",
    "StaticCache", "Transformer", "chunked_prefill", "decode_one_token", "generate", "kv_bytes_per_token",
    "kv_cache_bytes", "load_hf", "param_count", "plan_memory", "prefill", "sample", "set_layout", "tiny_model", "weight_bytes",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # tiny_model lives in kvref.train, imported on first use: importing it here would make
    # `python -m kvref.train` find the module already loaded (runpy warns about that).
    if name == "tiny_model":
        from .train import tiny_model

        return tiny_model
    raise AttributeError(f"module 'kvref' has no attribute {name!r}")
