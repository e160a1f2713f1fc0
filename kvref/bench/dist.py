"""``python -m kvref.bench dist``: the cache across processes, measured on this machine (gloo, 1 thread each).

1. ship or recompute: for each prompt length, the decode process either recomputes the prompt (one
   prefill) or receives its cache from the prefill process (gloo send/recv of the K/V message, then
   unpacked into a cache); interleaved repeats, medians, the ratio, and the break-even length;
2. tensor parallelism on a tiny HF Llama (H=4, H_kv=2): greedy tokens at W = 1, 2, 4 against one process,
   each rank's measured cache against the planner (W = 4 > H_kv: K/V heads replicated);
3. the planner for real shapes: cache per GPU against the world size (bf16, one 32K-token sequence);
4. the host tier: time to first token of a returning conversation whose prefix blocks were evicted from the
   paged pool (recompute), brought back from the host tier (tier hit), or never evicted (pool hit).

Loopback gloo on one machine is not a datacentre link: the chapter sets a real GPU's prefill rate against
a real link's bandwidth, with sources, next to these numbers.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

import torch
import torch.distributed as dist

from ..cache import DynamicCache
from ..config import ModelConfig
from ..memory import GiB, kv_cache_bytes
from ..model import Transformer
from ..planner import per_rank_kv_bytes
from ..dist.launch import launch
from ..dist.transfer import GlooConnector, install, pack
from .timing import interleave, med, table

# A small Llama (about 30M parameters): big enough that a prefill costs real work on one core.
BENCH_CFG = ModelConfig(arch="llama", n_layers=8, n_heads=8, n_kv_heads=2, d_model=512, vocab_size=4096,
                        max_seq_len=2048)
LENGTHS = (1, 4, 16, 64, 256, 1024)


def _ship_worker(rank: int, world: int, lengths: tuple[int, ...], repeats: int) -> dict:
    """Rank 1 times recompute (its own prefill) and receive (gloo recv + install), interleaved;
    rank 0 prefills once per length and sends on every repeat."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(BENCH_CFG).eval()  # same seed on both ranks: the same weights
    conn = GlooConnector(peer=1 - rank)
    gen = torch.Generator().manual_seed(1)
    prompts = {S: torch.randint(0, BENCH_CFG.vocab_size, (1, S), generator=gen) for S in lengths}
    times = {S: {"recompute": [], "ship": []} for S in lengths}
    sent = {}
    with torch.inference_mode():
        msgs = {}
        if rank == 0:
            for S in lengths:
                cache = DynamicCache()
                first = model(prompts[S], cache=cache, last_only=True)[:, -1].argmax(-1)
                msgs[S] = pack(cache, first)
        for _ in range(repeats):
            for S in lengths:
                if rank == 1:
                    t0 = time.perf_counter()
                    model(prompts[S], cache=DynamicCache(), last_only=True)
                    times[S]["recompute"].append(time.perf_counter() - t0)
                dist.barrier()  # both ready: the transfer starts now
                if rank == 0:
                    sent[S] = conn.send(msgs[S])
                else:
                    t0 = time.perf_counter()
                    install(conn.recv(), BENCH_CFG, model.dtype, DynamicCache())
                    times[S]["ship"].append(time.perf_counter() - t0)
    return {"times": times, "sent": sent}


def ship_table(repeats: int, lengths: tuple[int, ...] = LENGTHS) -> tuple[str, dict]:
    _, recv = launch(_ship_worker, 2, (lengths, repeats), timeout_s=120)
    rows, crossing, info = [], None, {}
    for S in lengths:
        rc, sh = recv["times"][S]["recompute"], recv["times"][S]["ship"]
        nbytes = kv_cache_bytes(BENCH_CFG, 1, S, torch.float32)
        if crossing is None and med(sh) < med(rc):
            crossing = S
        rows.append([S, f"{nbytes / 1024:.0f} KiB", f"{1e3 * med(rc):.2f} ms", f"{1e3 * med(sh):.2f} ms",
                     f"{med(rc) / med(sh):.1f}x", f"{nbytes / med(sh) / 1e9:.2f} GB/s"])
    lo, hi = lengths[-2], lengths[-1]  # per-token costs from the two longest prompts (fixed costs cancel)
    per = {k: (med(recv["times"][hi][k]) - med(recv["times"][lo][k])) / (hi - lo) for k in ("recompute", "ship")}
    info.update(recompute_per_token_s=per["recompute"], ship_per_token_s=per["ship"],
                ship_fixed_s=med(recv["times"][lengths[0]]["ship"]),
                bytes_per_token=kv_cache_bytes(BENCH_CFG, 1, 1, torch.float32))
    head = ["prompt tokens", "K/V shipped (fp32)", "recompute (prefill)", "ship (send/recv + install)",
            "recompute / ship", "effective link"]
    info["crossing"] = crossing
    return table(head, rows), info


def tp_table(new_tokens: int = 6) -> str:
    import transformers

    from ..dist import run_tp
    from ..generate import generate
    from ..hf import load_hf

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=256, max_position_embeddings=64))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hf.eval().save_pretrained(tmp)
        model = load_hf(tmp)
        single = generate(model, ids, new_tokens).tokens.tolist()
        S = ids.shape[1] + new_tokens
        for W in (1, 2, 4):
            out = run_tp(tmp, ids, new_tokens, W)
            plan = per_rank_kv_bytes(model.cfg, W, 1, S, torch.float32)
            rows.append([W, "yes" if out.tokens == single else "**no**", str(out.kv_heads_per_rank),
                         ", ".join(map(str, out.cache_bytes_per_rank)), plan,
                         f"{sum(out.cache_bytes_per_rank) / kv_cache_bytes(model.cfg, 1, S, torch.float32):.1f}x"])
    head = ["W", "tokens = one process", "K/V heads per rank", "cache bytes per rank (measured)", "planner",
            "all ranks / one process"]
    return table(head, rows)


def planner_table(presets: tuple[str, ...] = ("llama-3-8b", "qwen2.5-7b", "deepseek-v3"), seq_len: int = 32768,
                  worlds: tuple[int, ...] = (1, 2, 4, 8, 16)) -> str:
    rows = []
    for name in presets:
        cfg = ModelConfig.preset(name)
        cells = []
        for W in worlds:
            try:
                cells.append(f"{per_rank_kv_bytes(cfg, W, 1, seq_len, torch.bfloat16) / GiB:.3f}")
            except ValueError:
                cells.append("cannot split")
        rows.append([name, cfg.n_heads, cfg.n_kv_heads if cfg.kv_lora_rank is None else "latent", *cells])
    return table(["preset", "H", "H_kv", *[f"W={W} (GiB per rank)" for W in worlds]], rows)


TIER_CFG = ModelConfig(arch="llama", n_layers=4, n_heads=8, n_kv_heads=2, d_model=256, vocab_size=4096,
                       max_seq_len=1024)


@torch.inference_mode()
def tier_table(repeats: int, talk_len: int = 256, block_size: int = 16) -> str:
    """TTFT of a conversation that returns (its 256 tokens + a 16-token question) after other traffic."""
    from ..dist.tier import add_host_tier
    from ..paged import PagedKVCache

    torch.manual_seed(0)
    model = Transformer(TIER_CFG).eval()
    gen = torch.Generator().manual_seed(0)
    talk = torch.randint(0, TIER_CFG.vocab_size, (talk_len,), generator=gen).tolist()
    question = torch.randint(0, TIER_CFG.vocab_size, (16,), generator=gen).tolist()
    others = [torch.randint(0, TIER_CFG.vocab_size, (talk_len,), generator=gen).tolist() for _ in range(2)]
    small = 2 * talk_len // block_size  # room for the traffic, not for the talk as well: all of it is evicted

    def serve(cache, sid, prompt):
        t0 = time.perf_counter()
        cached = cache.add_sequence(sid, prompt)
        cache.begin([sid], [len(prompt) - cached], [prompt[cached:]])
        model(torch.tensor([prompt[cached:]]), cache=cache, last_only=True)
        dt = time.perf_counter() - t0
        cache.free_sequence(sid)
        return cached, dt

    def returning(kind: str):
        def run() -> float:
            blocks = 4 * small if kind == "pool hit" else small
            cache = PagedKVCache(TIER_CFG, num_blocks=blocks, block_size=block_size, prefix_caching=True)
            if kind == "tier hit":
                add_host_tier(cache, capacity_blocks=4 * small)
            serve(cache, "talk", talk)
            for i, p in enumerate(others):
                serve(cache, f"other{i}", p)
            cached, dt = serve(cache, "back", talk + question)
            found[kind] = cached
            return dt
        return run

    found: dict[str, int] = {}
    kinds = ("recompute", "tier hit", "pool hit")
    times = interleave({k: returning(k) for k in kinds}, repeats)
    base = med(times["recompute"])
    rows = [[k, found[k], talk_len + 16 - found[k], f"{1e3 * med(times[k]):.1f} ms", f"{base / med(times[k]):.1f}x"]
            for k in kinds]
    return table(["returning conversation", "prompt tokens found", "tokens prefilled", "time to first token",
                  "speed-up vs recompute"], rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kvref.bench dist", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="interleaved repeats of each length")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"## kvref.bench dist ({platform.processor() or platform.machine()}, 1 thread per process, gloo loopback)\n")
    print(f"### Ship or recompute (model: {BENCH_CFG.n_layers} layers, d_model {BENCH_CFG.d_model}, H {BENCH_CFG.n_heads},"
          f" H_kv {BENCH_CFG.n_kv_heads}, fp32; medians of {a.repeats} interleaved repeats)\n")
    text, info = ship_table(a.repeats)
    print(text)
    print(f"\nbreak-even: shipping is faster from {info['crossing']} prompt tokens on"
          if info["crossing"] else "\nbreak-even: recompute was faster at every length measured")
    print(f"\nper token, from the {LENGTHS[-2]}- and {LENGTHS[-1]}-token prompts: recompute "
          f"{1e3 * info['recompute_per_token_s']:.3f} ms, ship {1e3 * info['ship_per_token_s']:.4f} ms "
          f"({info['bytes_per_token']} bytes of K/V per token); fixed cost of one transfer (1 token): "
          f"{1e3 * info['ship_fixed_s']:.2f} ms")
    print("\n### Tensor parallelism (tiny HF Llama, H=4, H_kv=2, 10 + 6 tokens, fp32)\n")
    print(tp_table())
    print("\n### Planner: cache per GPU against the world size (bf16, one 32K-token sequence)\n")
    print(planner_table())
    print(f"\n### Host tier: a returning conversation (model: {TIER_CFG.n_layers} layers, d_model {TIER_CFG.d_model}, "
          f"fp32, blocks of 16, one process; medians of {a.repeats} interleaved repeats)\n")
    print(tier_table(a.repeats))


if __name__ == "__main__":
    main()
