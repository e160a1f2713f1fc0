"""``python -m kvref.bench [NAME] [options]``: run one benchmark; NAME defaults to ``core``.

Each benchmark is a module ``kvref.bench.NAME`` with a ``main(argv)``; options after NAME go to it
(``python -m kvref.bench serving --help``).
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "core": "cache vs no cache, kvref vs HF transformers, bandwidth roofline, torch.compile",
    "serving": "paged vs contiguous KV memory, prefix caching, block-table decode speed (then the engine's tables)",
    "engine": "the Engine (static, continuous, hash, radix) vs HF generate; throughput and latency against load",
    "quality": "what quantised and evicting caches cost in output quality",
    "decode": "compiled decode, roofline, kvref vs HF by batch, paged attention in place (FlexAttention)",
    "gpu": "the GPU check: CUDA tests, decode benchmark on CUDA, one markdown report",
    "ch10": "chapter 10: bytes per token, MLA reads per step, per-layer planner, interleaved growth, top-k vs H2O",
    "speculative": "chapter 12: acceptance and tokens/s by k, draft model vs prompt lookup, verify cost, kvref vs HF",
    "linear": "kvref Linear's CPU rules: F.linear vs (W @ x.T).T in fp32, 16-bit products vs fp32 rounded once",
    "dist": "chapter 13: ship the prompt's cache or recompute it, tensor-parallel tokens and bytes per rank",
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv.pop(0) if argv and not argv[0].startswith("-") else "core"
    if name not in BENCHMARKS:
        listing = "\n".join(f"  {n:8s} {what}" for n, what in BENCHMARKS.items())
        raise SystemExit(f"unknown benchmark {name!r}. Usage: python -m kvref.bench [NAME] [options]; NAME is one of\n"
                         f"{listing}")
    module_name = f"kvref.bench.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise  # the benchmark exists but something it imports is missing: show the real error
        raise SystemExit(f"benchmark {name!r} is not written yet: kvref/bench/{name}.py does not exist") from None
    module.main(argv)


if __name__ == "__main__":
    main()
