"""Serving benchmark: paged vs contiguous KV memory, prefix caching, block-table decode speed.

    python -m kvref.bench serving [--quick] [--plot serving.png] [--seed 0] [--threads 1]

Model: a random-weight Llama-style model, 4 layers, d_model 512, 8 query / 2 K/V heads of 64
(GQA 4:1 like Llama-3/Mistral), SwiGLU 1408, vocab 256, max_seq_len 1024, fp32: 11.4 M
parameters (44 MiB), 4 KiB of K/V per token. Its weights outweigh a decode step's K/V, as in a
real 7B model, so batching more requests per step pays, as on a GPU. The values of the weights
do not matter; every request generates exactly its max_new_tokens (no EOS).

Trace (seeded): prompt length ~ lognormal(median 160, sigma 0.6) clipped to [16, 640], output
length ~ lognormal(median 96, sigma 0.6) clipped to [8, 384]; all requests arrive at step 0
(an offline batch: the queue is never empty, so capacity decides throughput).

Both engines get the same KV budget (8192 token slots) and the same scheduler (kvref.serve.Engine,
token budget 256 per step). "Contiguous" reserves max_seq_len = 1024 slots per request on
admission (a paged pool with one 1024-token block per request is exactly that); "paged" hands
out 16-token blocks as sequences grow. Both run the same gather code, so their speed difference
is scheduling (how many requests fit), not kernels; the kernel cost of block tables is measured
separately, one decode step over block tables vs over a StaticCache (contiguous, no copy) and a
DynamicCache (contiguous, re-copied by torch.cat every step).

Prefix trace: every request starts with the same 256-token system prompt, then a question
~ lognormal(median 32, sigma 0.5) in [4, 128] and an answer ~ lognormal(median 16, sigma 0.5) in
[4, 48]; arrivals are Poisson, one every 3 steps on average.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch

from ..cache import DynamicCache, StaticCache
from ..config import ModelConfig
from ..memory import kv_cache_bytes
from ..model import Transformer
from ..paged import PagedKVCache
from ..serve import Engine, Request

CFG = ModelConfig(arch="llama", n_layers=4, n_heads=8, n_kv_heads=2, d_model=512, vocab_size=256, max_seq_len=1024)
BUDGET_TOKENS = 8192
BLOCK = 16
TOKEN_BUDGET = 256


def lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(median * math.exp(rng.gauss(0.0, sigma)))))


def serving_trace(n: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        p, o = lognormal_int(rng, 160, 0.6, 16, 640), lognormal_int(rng, 96, 0.6, 8, 384)
        reqs.append(Request(i, [rng.randrange(CFG.vocab_size) for _ in range(p)], o, arrival=0))
    return reqs


def prefix_trace(n: int, seed: int, system_len: int = 256) -> list[Request]:
    rng = random.Random(seed + 1)
    system = [rng.randrange(CFG.vocab_size) for _ in range(system_len)]
    reqs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 3)
        q, o = lognormal_int(rng, 32, 0.5, 4, 128), lognormal_int(rng, 16, 0.5, 4, 48)
        reqs.append(Request(i, system + [rng.randrange(CFG.vocab_size) for _ in range(q)], o, arrival=int(t)))
    return reqs


def run_engine(model: Transformer, reqs: list[Request], block_size: int, prefix_caching: bool = False,
               clock=time.perf_counter) -> dict:
    eng = Engine(model, num_blocks=BUDGET_TOKENS // block_size, block_size=block_size, token_budget=TOKEN_BUDGET,
                 prefix_caching=prefix_caching, clock=clock)
    t0 = clock()
    states = eng.run(reqs)
    seconds = clock() - t0
    reserved = sum(s.blocks_used * block_size for s in eng.steps)
    out_tokens = sum(len(s.output) for s in states.values())
    ttft = sorted(s.ttft_s for s in states.values())
    return {
        "engine": eng, "states": states, "seconds": seconds, "steps": len(eng.steps),
        "waste": 1 - sum(s.slots_used for s in eng.steps) / reserved,
        "running_mean": sum(s.running for s in eng.steps) / len(eng.steps),
        "running_max": max(s.running for s in eng.steps),
        "tok_per_s": out_tokens / seconds, "tok_per_step": out_tokens / len(eng.steps),
        "preempted": sum(s.preempted for s in eng.steps),
        "ttft_mean": sum(ttft) / len(ttft), "ttft_p50": ttft[len(ttft) // 2],
        "cached": sum(s.cached_tokens for s in states.values()),
        "prompt": sum(len(s.req.prompt) for s in states.values()),
    }


@torch.inference_mode()
def decode_step_times(model: Transformer, B: int, S: int, reps: int, clock=time.perf_counter) -> dict[str, float]:
    """Best-of-``reps`` seconds for one decode step of B rows after S cached tokens, kinds interleaved."""
    ids = torch.randint(0, CFG.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    caches = {
        "static": StaticCache(CFG, B, S + reps + 1),
        "dynamic": DynamicCache(),
        "paged": PagedKVCache(CFG, num_blocks=B * (-(-(S + reps + 1) // BLOCK)), block_size=BLOCK),
    }
    for c in caches.values():
        model(ids, cache=c, last_only=True)
    tok = ids[:, -1:]
    best = {k: float("inf") for k in caches}
    for _ in range(reps):
        for name, c in caches.items():
            t0 = clock()
            model(tok, cache=c, last_only=True)
            best[name] = min(best[name], clock() - t0)
    return best


def plot(path: str, paged: dict, contig: dict, off: dict, on: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for name, r, color in (("contiguous", contig, "C0"), ("paged", paged, "C1")):
        steps = r["engine"].steps
        bs = r["engine"].cache.block_size
        ax[0].plot([s.blocks_used * bs for s in steps], color=color, label=f"{name}: reserved")
        ax[0].plot([s.slots_used for s in steps], "--", color=color, alpha=0.7, label=f"{name}: holding a token")
        ax[1].plot([s.running for s in steps], color=color, label=name)
    ax[0].set(title=f"KV slots (budget {BUDGET_TOKENS})", xlabel="engine step", ylabel="token slots")
    ax[1].set(title="requests running", xlabel="engine step")
    for name, r in (("prefix cache off", off), ("prefix cache on", on)):
        t = sorted(1e3 * s.ttft_s for s in r["states"].values())
        ax[2].plot(t, [i / len(t) for i in range(len(t))], label=name)
    ax[2].set(title="time to first token (CDF)", xlabel="ms", ylabel="fraction of requests")
    for a in ax:
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench serving", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller traces and fewer repeats (a smoke run)")
    ap.add_argument("--plot", metavar="FILE.png", help="also save a figure")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: tiny ops on a shared machine are steadier single-threaded)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    # One thread: time = this process's CPU seconds, what a dedicated core would take, and far less
    # disturbed by other jobs on a shared machine than wall time. More threads: wall time.
    clock = time.process_time if args.threads == 1 else time.perf_counter
    torch.manual_seed(args.seed)
    model = Transformer(CFG).eval()
    n = 40 if args.quick else 200

    reqs = serving_trace(n, args.seed)
    contig = run_engine(model, reqs, CFG.max_seq_len, clock=clock)
    paged = run_engine(model, reqs, BLOCK, clock=clock)
    for r in reqs:  # same greedy outputs, whatever the memory layout and batch
        assert contig["states"][r.rid].output == paged["states"][r.rid].output, r.rid
    ptrace = prefix_trace(n, args.seed)
    off = run_engine(model, ptrace, BLOCK, prefix_caching=False, clock=clock)
    on = run_engine(model, ptrace, BLOCK, prefix_caching=True, clock=clock)
    assert all(off["states"][r.rid].output == on["states"][r.rid].output for r in ptrace)
    reps = 5 if args.quick else 30
    dec = {S: decode_step_times(model, 16, S, reps, clock) for S in (128, 512)}

    mean_p = sum(len(r.prompt) for r in reqs) / n
    mean_o = sum(r.max_new_tokens for r in reqs) / n
    budget_mib = kv_cache_bytes(CFG, 1, BUDGET_TOKENS, torch.float32) / 2**20
    print(f"\n## Serving benchmark ({n} requests; prompt mean {mean_p:.0f}, output mean {mean_o:.0f} tokens; "
          f"KV budget {BUDGET_TOKENS} tokens = {budget_mib:.0f} MiB fp32; {args.threads} thread(s), "
          f"times in {'CPU' if args.threads == 1 else 'wall'} seconds)\n")
    ok = lambda c: "yes" if c else "NO"  # noqa: E731
    rows = [
        ("KV reserved but unused (time average)", f"{contig['waste']:.1%}", f"{paged['waste']:.1%}",
         "contiguous 60-80 %, paged < 4 %", ok(0.6 <= contig["waste"] <= 0.8 and paged["waste"] < 0.04)),
        ("requests running (mean / max)", f"{contig['running_mean']:.1f} / {contig['running_max']}",
         f"{paged['running_mean']:.1f} / {paged['running_max']}",
         "paged > contiguous", ok(paged["running_mean"] > contig["running_mean"])),
        ("output tokens per step", f"{contig['tok_per_step']:.1f}", f"{paged['tok_per_step']:.1f}",
         f"paged/contiguous = {paged['tok_per_step'] / contig['tok_per_step']:.2f}x", ""),
        ("output tokens per second", f"{contig['tok_per_s']:.0f}", f"{paged['tok_per_s']:.0f}",
         f"paged/contiguous = {paged['tok_per_s'] / contig['tok_per_s']:.2f}x > 1",
         ok(paged["tok_per_s"] > contig["tok_per_s"])),
        ("engine steps / preemptions", f"{contig['steps']} / {contig['preempted']}",
         f"{paged['steps']} / {paged['preempted']}", "", ""),
    ]
    print("| paged vs contiguous, same KV budget | contiguous (1024/request) | paged (16-token blocks) | target | met |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")

    hit = on["cached"] / on["prompt"]
    cut = 1 - on["ttft_mean"] / off["ttft_mean"]
    print(f"\n| prefix trace (256-token shared system prompt) | cache off | cache on | target | met |")
    print("|---|---|---|---|---|")
    print(f"| prompt tokens found cached (hit rate) | 0 (0.0%) | {on['cached']} ({hit:.1%}) | > 0 | {ok(hit > 0)} |")
    print(f"| time to first token, mean / median (ms) | {1e3 * off['ttft_mean']:.1f} / {1e3 * off['ttft_p50']:.1f} | "
          f"{1e3 * on['ttft_mean']:.1f} / {1e3 * on['ttft_p50']:.1f} | lower: -{cut:.0%} | {ok(cut > 0)} |")
    print(f"| time for the whole trace (s) | {off['seconds']:.1f} | {on['seconds']:.1f} | | |")

    print(f"\n| one decode step, B=16, best of {reps} | static (contiguous) | dynamic (torch.cat) | paged "
          f"| paged/static | paged/dynamic | target: paged/static <= 1.3x |")
    print("|---|---|---|---|---|---|---|")
    for S, d in dec.items():
        ratio = d["paged"] / d["static"]
        print(f"| S = {S} | {1e3 * d['static']:.2f} ms | {1e3 * d['dynamic']:.2f} ms | {1e3 * d['paged']:.2f} ms "
              f"| {ratio:.2f}x | {d['paged'] / d['dynamic']:.2f}x | {ok(ratio <= 1.3)} |")
    if args.plot:
        plot(args.plot, paged, contig, off, on)
        print(f"\nfigure: {args.plot}")
    from . import engine  # chapter 11: the engine against HF generate, and under rising load

    engine.main((["--quick"] if args.quick else []) + ["--seed", str(args.seed), "--threads", str(args.threads)])


if __name__ == "__main__":
    main()
