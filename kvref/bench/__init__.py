"""Benchmarks: scripts that print a markdown table, never timed tests (docs/CONVENTIONS.md).

    python -m kvref.bench            # = core: cache vs no cache, kvref vs HF, roofline, torch.compile
    python -m kvref.bench serving    # paged vs contiguous KV memory, prefix caching
    python -m kvref.bench quality    # what quantised / evicted caches cost in quality
    python -m kvref.bench decode     # compiled decode, roofline, kvref vs HF by batch, paged in place
    python -m kvref.bench gpu        # the GPU check (CUDA tests + decode on CUDA); exits 3 without CUDA

Each accepts ``--quick`` (a smoke run of about a minute) and ``--plot FILE.png``.
Results and how they were measured: docs/benchmarks.md.
"""
