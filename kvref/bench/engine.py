"""The engine against Hugging Face `generate`, and the engine under rising load (chapter 11).

    python -m kvref.bench engine [--quick] [--seed 0] [--threads 1]
    (also printed at the end of ``python -m kvref.bench serving``)

Model: a random-weight HF ``LlamaForCausalLM`` (4 layers, d_model 256, 8 query / 2 K/V heads of 32,
SwiGLU 704, vocab 256), loaded into kvref with ``kvref.load_hf``: both run the very same weights, fp32.
Trace (seeded): 48 requests, all at step 0, each a 48-token system prompt shared by all plus a question of
8-96 tokens and 8-64 new tokens (no EOS: every request generates exactly its max_new_tokens).

Section 1 serves the trace five ways and checks that every request's tokens are the same:
HF ``generate`` one request at a time; HF ``generate`` on left-padded static batches of 8 (arrival order,
each batch runs to its longest request); kvref ``Engine`` with static batches of 8 (``batching="static"``),
continuous batching, continuous + the hash chain, continuous + the radix tree. Latencies come from
``kvref.serve.metrics``; HF's token times from a streamer. HF's own continuous batching
(``generate_batch``) is timed on the first 8 requests, next to ``generate`` one at a time on them.
Each server runs ``--repeats`` times, round-robin; the fastest run of each is reported.

Section 2 is the load curve: the same kind of requests arriving as a Poisson process at rising rates
(requests per engine step), served by continuous batching + radix on a pool of 96 blocks of 16. The knee is
the lowest rate at which tokens/s reach 90 % of the highest tokens/s of the sweep: past it, more load only
adds queueing.

Section 3 is a hybrid model: a random-weight HF ``Gemma3ForCausalLM`` (6 layers: 5 sliding-window layers of
window 32, then 1 full; d_model 256, 8 query / 2 K/V heads of 32) loaded into kvref, serving the first 16
requests of the trace: HF ``generate`` one at a time against the engine (kvref.paged_hybrid: one block table
per group of layers) without prefix caching, with the hash chain and with the radix tree.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch

import kvref

from ..serve import Engine, Request, metrics, poisson_arrivals

BLOCK, POOL_BLOCKS, BUDGET = 16, 256, 256
CLOCK = time.process_time  # 1 thread: this process's CPU seconds, far less disturbed by other jobs (main() sets it)


def llama_pair(seed: int):
    """The same random weights as a kvref model and as HF's LlamaForCausalLM."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model = kvref.load_hf(folder)
    return model.eval(), hf


def gemma_pair(seed: int):
    """A hybrid model (HF ``Gemma3ForCausalLM``: 5 sliding-window layers of window 32, then 1 full) as both."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.manual_seed(seed)
    hf = Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=256, hidden_size=256, intermediate_size=704, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, sliding_window=32, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        query_pre_attn_scalar=32, max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    with torch.no_grad():  # HF's init (std 0.02) times sqrt(d_model) = 16 embeddings: the input token wins every step
        hf.get_input_embeddings().weight.mul_(0.2)
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model = kvref.load_hf(folder)
    return model.eval(), hf


def trace(n: int, seed: int, arrivals: list[int] | None = None, system: int = 48) -> list[Request]:
    rng = random.Random(seed)
    sys_prompt = [rng.randrange(3, 256) for _ in range(system)]
    return [Request(i, sys_prompt + [rng.randrange(3, 256) for _ in range(rng.randint(8, 96))], rng.randint(8, 64),
                    arrival=0 if arrivals is None else arrivals[i]) for i in range(n)]


class Times:
    """An HF streamer that records when each generated token of the batch appeared."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.first = True

    def put(self, value) -> None:
        if self.first:  # generate() hands the prompt over first
            self.first = False
        else:
            self.t.append(CLOCK())

    def end(self) -> None:
        pass


class HFState:  # what metrics() reads
    def __init__(self, req: Request, arrival: float, token_s: list[float], output: list[int]) -> None:
        self.req, self.arrival_s, self.token_s, self.output = req, arrival, token_s, output


@torch.inference_mode()
def hf_serve(hf, reqs: list[Request], batch: int) -> tuple[dict, float]:
    """HF generate over ``reqs`` in arrival-order batches of ``batch`` (left-padded); every request arrives at t0."""
    states, t0 = {}, CLOCK()
    for i in range(0, len(reqs), batch):
        group = reqs[i:i + batch]
        width, new = max(len(r.prompt) for r in group), max(r.max_new_tokens for r in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for b, r in enumerate(group):
            ids[b, width - len(r.prompt):] = torch.tensor(r.prompt)
            mask[b, width - len(r.prompt):] = 1
        times = Times()
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          pad_token_id=0, streamer=times)
        for b, r in enumerate(group):
            states[r.rid] = HFState(r, t0, times.t[:r.max_new_tokens], out[b, width:width + r.max_new_tokens].tolist())
    return states, CLOCK() - t0


def engine_serve(model, reqs: list[Request], **kw) -> tuple[dict, float, Engine]:
    eng = Engine(model, num_blocks=kw.pop("num_blocks", POOL_BLOCKS), block_size=BLOCK, token_budget=BUDGET,
                 clock=CLOCK, **kw)
    t0 = CLOCK()
    states = eng.run(reqs)
    return states, CLOCK() - t0, eng


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.1f}"


def section_peers(model, hf, reqs: list[Request], repeats: int) -> None:
    runs = {
        "HF generate, one at a time": lambda: hf_serve(hf, reqs, 1)[:2],
        "HF generate, static batches of 8": lambda: hf_serve(hf, reqs, 8)[:2],
        "Engine, static batches of 8": lambda: engine_serve(model, reqs, batching="static", max_running=8)[:2],
        "Engine, continuous": lambda: engine_serve(model, reqs)[:2],
        "Engine, continuous + hash chain": lambda: engine_serve(model, reqs, prefix_caching="hash")[:2],
        "Engine, continuous + radix tree": lambda: engine_serve(model, reqs, prefix_caching="radix")[:2],
    }
    results: dict = {}
    for _ in range(repeats):  # round-robin, best (fastest) run of each kept: a busy machine slows all alike
        for name, run in runs.items():
            got = run()
            if name not in results or got[1] < results[name][1]:
                results[name] = got
    ref = {r.rid: s.output for r, s in ((r, results["HF generate, one at a time"][0][r.rid]) for r in reqs)}
    base = results["HF generate, static batches of 8"][1]
    tokens = sum(r.max_new_tokens for r in reqs)
    print(f"\n### Engine vs HF generate ({len(reqs)} requests, {tokens} new tokens, all arriving at once; "
          f"best of {repeats} interleaved runs)\n")
    print("| server | same tokens as HF one at a time | tokens/s | vs HF static batches | TTFT p50 / p99 (ms) "
          "| TPOT p50 / p99 (ms) | prompt tokens cached |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (states, seconds) in results.items():
        same = sum(states[r.rid].output == ref[r.rid] for r in reqs)
        m = metrics(states)
        cached = sum(getattr(s, "cached_tokens", 0) for s in states.values())
        print(f"| {name} | {same}/{len(reqs)} | {tokens / seconds:.0f} | {base / seconds:.2f}x | "
              f"{fmt_ms(m['ttft_p50'])} / {fmt_ms(m['ttft_p99'])} | {fmt_ms(m['tpot_p50'])} / {fmt_ms(m['tpot_p99'])} "
              f"| {cached} |")


def section_generate_batch(hf, reqs: list[Request]) -> None:
    from transformers import GenerationConfig

    few, new = reqs[:8], max(r.max_new_tokens for r in reqs[:8])
    cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    t0 = CLOCK()
    try:  # not under inference_mode: generate_batch updates its own tensors in place and fails there
        out = hf.generate_batch(inputs=[r.prompt for r in few], generation_config=cfg, progress_bar=False)
        batch_s = CLOCK() - t0
        got = [list(o.generated_tokens) for o in out.values()]
    except Exception as e:  # an API that moves between versions: say so, do not fail the benchmark
        print(f"\nHF generate_batch could not run here: {type(e).__name__}: {e}")
        return
    one = [Request(r.rid, r.prompt, new) for r in few]
    ref, one_s = hf_serve(hf, one, 1)
    same = sum(g in [s.output for s in ref.values()] for g in got)
    print(f"\nHF's own continuous batching on a CPU (transformers `generate_batch`): the first 8 requests "
          f"({8 * new} new tokens) took {batch_s:.2f} s, `generate` one at a time {one_s:.2f} s: "
          f"{batch_s / one_s:.1f}x the time; {same}/8 outputs equal to `generate`'s.")


def section_load(model, n: int, rates: list[float], seed: int) -> None:
    print(f"\n### Throughput against offered load ({n} requests per rate, Poisson arrivals, continuous + radix, "
          f"{96} blocks of {BLOCK})\n")
    rows, lightest = [], None
    for rate in rates:
        reqs = trace(n, seed + 1, arrivals=poisson_arrivals(n, rate, seed=seed))
        states, seconds, eng = engine_serve(model, reqs, num_blocks=96, prefix_caching="radix")
        m = metrics(states)
        lightest = lightest or m
        offered = rate * sum(r.max_new_tokens for r in reqs) / n  # new tokens asked per step
        busy = [s for s in eng.steps if s.tokens]
        served = sum(len(s.output) for s in states.values()) / (eng.step_no - min(r.arrival for r in reqs))
        rows.append((rate, offered, served, m, states, sum(s.tokens for s in busy) / max(1, len(busy)),
                     sum(s.preempted for s in eng.steps)))
    slo = {"ttft": 4 * lightest["ttft_p50"], "tpot": 2 * lightest["tpot_p50"]}
    peak = max(r[3]["throughput_tok_s"] for r in rows)
    knee = next(r[0] for r in rows if r[3]["throughput_tok_s"] >= 0.9 * peak)
    print(f"SLO for goodput: TTFT <= {fmt_ms(slo['ttft'])} ms and TPOT <= {fmt_ms(slo['tpot'])} ms "
          "(4x and 2x the lightest load's p50)\n")
    print("| requests / step | offered tokens / step | delivered tokens / step | tokens/s | TTFT p50 / p99 (ms) "
          "| TPOT p50 / p99 (ms) | ITL p99 (ms) | goodput | preemptions |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rate, offered, served, m, states, _, pre in rows:
        g = metrics(states, slo=slo)["goodput"]
        print(f"| {rate:g} | {offered:.1f} | {served:.1f} | {m['throughput_tok_s']:.0f} | {fmt_ms(m['ttft_p50'])} / "
              f"{fmt_ms(m['ttft_p99'])} | {fmt_ms(m['tpot_p50'])} / {fmt_ms(m['tpot_p99'])} | {fmt_ms(m['itl_p99'])} "
              f"| {g:.0%} | {pre} |")
    print(f"\nKnee: tokens/s reach 90 % of the sweep's peak ({peak:.0f}) at {knee:g} requests per step; more load "
          "adds waiting (TTFT), not throughput. Delivered tokens / step counts the steps from the first arrival "
          "to the last token.")


def section_hybrid(n: int, seed: int, repeats: int) -> None:
    """A sliding + full model (Gemma 3 layout) through the engine: one block table per group of layers."""
    model, hf = gemma_pair(seed)
    reqs = trace(n, seed)
    runs = {"HF generate, one at a time": lambda: hf_serve(hf, reqs, 1)[:2] + (None,)}
    for mode in (False, "hash", "radix"):
        runs[f"Engine, continuous{'' if not mode else ' + ' + ('hash chain' if mode == 'hash' else 'radix tree')}"] = (
            lambda mode=mode: engine_serve(model, reqs, prefix_caching=mode))
    results: dict = {}
    for _ in range(repeats):  # round-robin, best (fastest) run of each kept
        for name, run in runs.items():
            got = run()
            if name not in results or got[1] < results[name][1]:
                results[name] = got
    ref = {r.rid: results["HF generate, one at a time"][0][r.rid].output for r in reqs}
    tokens, hf_s = sum(r.max_new_tokens for r in reqs), results["HF generate, one at a time"][1]
    full = sum(-(-(len(r.prompt) + r.max_new_tokens - 1) // BLOCK) for r in reqs) * 2  # every block, both groups
    print(f"\n### A hybrid model: Gemma 3 layout (5 sliding-window layers of window 32, 1 full; d_model 256), "
          f"{n} requests, {tokens} new tokens, best of {repeats}\n")
    print("| server | same tokens as HF one at a time | tokens/s | vs HF one at a time | peak blocks in use "
          "| prompt tokens cached |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (states, seconds, eng) in results.items():
        same = sum(states[r.rid].output == ref[r.rid] for r in reqs)
        peak = "-" if eng is None else max(s.blocks_used for s in eng.steps)
        cached = sum(getattr(s, "cached_tokens", 0) for s in states.values())
        print(f"| {name} | {same}/{len(reqs)} | {tokens / seconds:.0f} | {hf_s / seconds:.2f}x | {peak} | {cached} |")
    print(f"\nKept whole, the {n} requests' blocks for both groups would be {full} blocks of {BLOCK}; the sliding "
          f"group gives back every block that falls out of its window (kvref.paged_hybrid).")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and rates (a smoke run)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of each server in section 1 (best kept)")
    args = ap.parse_args(argv)
    global CLOCK
    torch.set_num_threads(args.threads)
    CLOCK = time.process_time if args.threads == 1 else time.perf_counter
    model, hf = llama_pair(args.seed)
    n = 16 if args.quick else 48
    print(f"\n## Engine benchmark: kvref {kvref.__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), times in {'CPU' if args.threads == 1 else 'wall'} seconds; "
          f"Engine: blocks of {BLOCK}, token budget {BUDGET}")
    section_peers(model, hf, trace(n, args.seed), 1 if args.quick else args.repeats)
    section_generate_batch(hf, trace(n, args.seed))
    rates = [0.05, 0.2, 0.8] if args.quick else [0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6]
    section_load(model, n, rates, args.seed)
    section_hybrid(8 if args.quick else 16, args.seed, 1 if args.quick else args.repeats)


if __name__ == "__main__":
    main()
