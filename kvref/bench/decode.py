"""Decode at the limit: compiled decode, the roofline, kvref vs HF by batch, paged attention in place.

    python -m kvref.bench decode [--quick] [--repeats 5] [--threads 1] [--sections 12345] [--batches 1,4,16,64]

Four tables, each measured in one process with the runs it compares interleaved (A, B, A, B, ...)
``--repeats`` times; the tables give the median and the spread (min-max) over the repeats:

1. ``torch.compile`` of ``kvref.compiled.decode_step`` (fullgraph, StaticCache outside; inductor's
   default and with frozen weights, plus CUDA graphs on a GPU) vs the
   eager ``decode_one_token``, batch 1, GPT-2-124M shape (random fp32 weights, as in ``core``);
   compile time, graph breaks and whether the greedy tokens are identical;
2. the same decode steps as a fraction of the memory-bandwidth roofline (bandwidth measured in
   the same run: on CPU a large fp32 matrix-vector product and a plain streaming read of the same
   matrix, on CUDA a device-to-device copy);
3. kvref ``generate`` and kvref's compiled decode (``CompiledDecoder(freeze=True)``, eager prefill)
   vs HF ``generate`` at batch 1, 4, 16, 64 (same weights, greedy, tokens compared);
4. one decode step at S = 512, B = 16 on the serving benchmark's model (4 layers, GQA 8/2 heads of
   64): StaticCache, PagedKVCache (gather) and InPlacePagedKVCache (FlexAttention, compiled), with
   the bytes the gather copies per step;
5. where a decode step's time goes, kvref vs HF at batch 1 and 16 (block matrices, output layer,
   attention, everything else), the weight layout kvref chose, and the two limits measured in the
   same run (weight-read rate at B=1, GEMM rate at B=16) with both libraries against them
   (``kvref.bench.step_profile``).

kvref's weight layout (``kvref.layout``) is chosen for each batch before it is timed (its decode step
at B rows is what is compared): (out, in) or (in, out) storage, or, above one row, oneDNN's packed
copies of the weights; $KVREF_LAYOUT=out_in|in_out|onednn forces one. Section 5 prints the measured
limits of the ratios: the ratio kvref would reach if all its work but the matrix products took no
time, and the ratio of the matrix products alone.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

import kvref
from kvref.compiled import CompiledDecoder, graph_breaks
from kvref.generate import decode_one_token, prefill
from kvref.paged_inplace import InPlacePagedKVCache

from . import step_profile
from .core import bytes_per_decode_token, gpt2_pair, prompt_ids
from .serving import CFG as SERVING_CFG
from .timing import cpu_name, error_line, guarded, interleave, med, ratio_spread, spread, sync, table


# -- 1 and 2: compiled decode, roofline ----------------------------------------------------------
def eager_loop(model, ids, new, cache) -> tuple[float, torch.Tensor]:
    """Median seconds of the ``new - 1`` eager decode steps, and the greedy tokens."""
    cache.reset()
    times, out = [], [prefill(model, ids, cache).argmax(-1)]
    for _ in range(new - 1):
        t0 = sync(model.device)
        out.append(decode_one_token(model, out[-1], cache).argmax(-1))
        times.append(sync(model.device) - t0)
    return med(times), torch.stack(out, 1)


def compiled_loop(dec, model, ids, new, cache) -> tuple[float, torch.Tensor]:
    times: list[float] = []
    tokens = dec.generate(ids, new, cache, times)
    return med(times), tokens[:, ids.shape[1]:]


def bandwidth_probes(device: torch.device) -> dict[str, tuple[Callable[[], float], str]]:
    """name -> (a run returning bytes/s, what it measures). CPU: a matrix-vector product and a plain read."""
    if device.type == "cuda":
        src = torch.empty(2**28, dtype=torch.float32, device=device)  # 1 GiB
        dst = torch.empty_like(src)

        def copy() -> float:
            t0 = sync(device)
            dst.copy_(src)
            return 2 * src.numel() * 4 / (sync(device) - t0)  # read + write

        return {"copy": (copy, "device-to-device copy of 1 GiB (read + write)")}
    W, x = torch.randn(16384, 8192), torch.randn(1, 8192)  # 512 MiB: larger than the caches

    def median_of_5(op: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                op()
                times.append(time.perf_counter() - t0)
            return W.numel() * 4 / med(times)
        return run

    return {"matvec": (median_of_5(lambda: F.linear(x, W)), "fp32 matrix-vector product, 16384x8192 (512 MiB)"),
            "read": (median_of_5(W.sum), "W.sum() over the same 512 MiB: a plain streaming read")}


def resident_mb() -> float:
    """This process's resident memory in MB (psutil, which Jupyter brings; nan without it)."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    gc.collect()
    return psutil.Process().memory_info().rss / 1e6


def decoder(model, mode: str) -> CompiledDecoder:
    """"default": inductor; "frozen": inductor with freezing (weights as constants); else a torch.compile mode."""
    if mode in ("default", "frozen"):
        return CompiledDecoder(model, freeze=mode == "frozen")
    return CompiledDecoder(model, mode=mode)


def compile_and_roofline(model, device, prompt, new, repeats, modes, log) -> tuple[list[str], list[list[str]],
                                                                                   list[list[str]], dict]:
    ids = prompt_ids(1, prompt, model.cfg.vocab_size).to(device)

    def new_cache() -> kvref.StaticCache:
        return kvref.StaticCache(model.cfg, 1, prompt + new, dtype=model.dtype, device=device)

    cache, decoders, caches, info = new_cache(), {}, {}, {}  # one cache per compiled decoder (CUDA graphs
    torch._dynamo.reset()  # pin their caches' addresses), reset and reused by every run of that decoder
    for mode in modes:
        log(f"compiling the decode step ({mode})")
        t0, rss0 = time.perf_counter(), resident_mb()
        try:
            dec, caches[mode] = decoder(model, mode), new_cache()
            with torch.inference_mode():
                compiled_loop(dec, model, ids, 3, caches[mode])  # the first steps compile (and record CUDA graphs)
        except Exception as e:  # one mode failing (say, on a new GPU) must not lose the others' rows
            info[f"{mode}: failed"] = error_line(e, 200)
            continue
        info[f"compile s ({mode})"] = time.perf_counter() - t0
        info[f"resident memory +MB ({mode})"] = f"{resident_mb() - rss0:.0f}"  # frozen: packed weight copies
        decoders[mode] = dec
    with torch.inference_mode():
        cache.reset()
        kvref.prefill(model, ids, cache)
        info["graph breaks"] = graph_breaks(model, cache, ids[:, -1])
        eager_tokens = eager_loop(model, ids, new, cache)[1]
        info["identical"] = {m: torch.equal(compiled_loop(d, model, ids, new, caches[m])[1], eager_tokens)
                             for m, d in decoders.items()}
    probes = bandwidth_probes(device)
    runs = {"eager": lambda: eager_loop(model, ids, new, cache)[0]}
    runs.update({f"probe {p}": lambda run=run: 1 / run() for p, (run, _) in probes.items()})
    for m, d in decoders.items():
        runs[f"compiled ({m})"] = lambda d=d, m=m: compiled_loop(d, model, ids, new, caches[m])[0]
    log(f"timing eager / compiled / bandwidth, {repeats} interleaved repeats")
    with torch.inference_mode():
        times = interleave(runs, repeats)
    bws = {p: [1 / t for t in times.pop(f"probe {p}")] for p in probes}
    w_bytes, kv_bytes = bytes_per_decode_token(model, prompt + new / 2)
    rows1 = [[name, spread(t), ratio_spread(times["eager"], t) if name != "eager" else "1.00x"]
             for name, t in times.items()]
    rows2 = [[f"bandwidth ({p})", f"{med(bw) / 1e9:.1f} GB/s ({min(bw) / 1e9:.1f}-{max(bw) / 1e9:.1f})",
              f"{probes[p][1]}, median of 5"] for p, bw in bws.items()]
    rows2.append(["bytes per decode token", f"{w_bytes / 1e6:.0f} + {kv_bytes / 1e6:.1f} MB",
                  f"weights + K/V, B=1, {prompt + new / 2:.0f} cached tokens on average"])
    rows2 += [[f"ideal decode tokens/s ({p})", f"{med(bw) / (w_bytes + kv_bytes):.1f}", "bandwidth / bytes per token"]
              for p, bw in bws.items()]
    for name, t in times.items():
        for p, bw in bws.items():
            fr = [(w_bytes + kv_bytes) / (s * b) for s, b in zip(t, bw)]  # paired with the same repeat's probe
            rows2.append([f"{name}: tokens/s, fraction of roofline ({p})", f"{1 / med(t):.1f}, {med(fr):.0%} "
                          f"({min(fr):.0%}-{max(fr):.0%})", "target >= 90 %"])
    return ["decode step, B=1", "median ms (min-max)", "eager / this"], rows1, rows2, info


# -- 3. kvref vs HF by batch ---------------------------------------------------------------------
def versus_hf(model, hf, batches, prompt, new, repeats, log) -> list[list[str]]:
    """kvref generate (eager), kvref's compiled decode (frozen weights) and HF generate, interleaved."""
    rows, device = [], model.device
    for B in batches:
        ids, out = prompt_ids(B, prompt, model.cfg.vocab_size, seed=B).to(device), {}
        layout = kvref.set_layout(model, None, rows=B)  # before compiling: freezing packs the weights as they lie
        dec, cache = decoder(model, "frozen"), kvref.StaticCache(model.cfg, B, prompt + new, device=device)
        log(f"kvref vs HF, B={B}: compiling")
        t0 = time.perf_counter()
        dec.generate(ids, 3, cache)
        compile_s = time.perf_counter() - t0

        def ours() -> float:
            t0 = sync(device)
            out["kvref"] = kvref.generate(model, ids, new, cache="static").tokens
            return sync(device) - t0

        def ours_compiled() -> float:
            t0 = sync(device)
            out["compiled"] = dec.generate(ids, new, cache)
            return sync(device) - t0

        def theirs() -> float:
            t0 = sync(device)
            with torch.inference_mode():
                out["hf"] = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                                        min_new_tokens=new, pad_token_id=hf.config.eos_token_id)
            return sync(device) - t0

        log(f"kvref vs HF, B={B}: {repeats} interleaved repeats")
        t = interleave({"kvref": ours, "compiled": ours_compiled, "hf": theirs}, repeats)
        same = all(out[k].shape == out["hf"].shape and bool((out[k] == out["hf"]).all()) for k in ("kvref", "compiled"))
        target = {1: "1.15x (compiled 1.3x)", 16: "1.3x"}.get(B)
        rows.append([f"B={B}", layout, f"{B * new / med(t['kvref']):.1f}", f"{B * new / med(t['compiled']):.1f}",
                     f"{B * new / med(t['hf']):.1f}", ratio_spread(t["hf"], t["kvref"]),
                     ratio_spread(t["hf"], t["compiled"]), f">= {target}" if target else "", f"{compile_s:.0f}",
                     "identical" if same else "DIFFER"])
    return rows


# -- 4. paged decode in place --------------------------------------------------------------------
@torch.inference_mode()
def paged_in_place(device, B, S, repeats, block_size, log) -> tuple[list[list[str]], dict]:
    torch.manual_seed(0)
    model = kvref.Transformer(SERVING_CFG, device=device).eval()
    ids = torch.randint(0, SERVING_CFG.vocab_size, (B, S), generator=torch.Generator().manual_seed(0)).to(device)
    blocks = B * -(-(S + repeats + 2) // block_size)
    caches = {"static": kvref.StaticCache(SERVING_CFG, B, S + repeats + 2, device=device),
              "paged, gather": InPlacePagedKVCache(SERVING_CFG, blocks, block_size, device=device, in_place=False),
              "paged, in place": InPlacePagedKVCache(SERVING_CFG, blocks, block_size, device=device)}
    logits = {name: model(ids, cache=c, last_only=True)[:, -1] for name, c in caches.items()}
    tok = logits["static"].argmax(-1)[:, None]
    log("compiling flex_attention (first in-place step)")
    t0 = time.perf_counter()
    for name, c in caches.items():  # one step each (the in-place one compiles); compare the logits
        logits[name] = model(tok, cache=c, last_only=True)[:, -1]
    info = {"compile s": time.perf_counter() - t0,
            "max |logit diff| in place vs gather": (logits["paged, in place"] - logits["paged, gather"]).abs().max(),
            "max |logit diff| gather vs static": (logits["paged, gather"] - logits["static"]).abs().max()}
    copied = {name: getattr(c, "bytes_copied", 0) for name, c in caches.items()}

    def step(c) -> Callable[[], float]:
        def run() -> float:
            t0 = sync(device)
            model(tok, cache=c, last_only=True)
            return sync(device) - t0
        return run

    log(f"timing one decode step, B={B}, S={S}, {repeats} interleaved repeats")
    times = interleave({name: step(c) for name, c in caches.items()}, repeats)
    rows = []
    for name, c in caches.items():
        per_step = (getattr(c, "bytes_copied", 0) - copied[name]) / repeats
        rows.append([name, spread(times[name]), ratio_spread(times[name], times["static"]),
                     f"{per_step / 2**20:.2f} MiB"])
    return rows, info


def report(device: torch.device, quick: bool, repeats: int, log, sections: str = "12345",
           batches: tuple[int, ...] | None = None) -> str:
    """The tables as one markdown string (``sections``: which of 1-5; 1 and 2 run together; ``batches``:
    section 3's batch sizes, default 1, 4, 16, 64)."""
    prompt, new = 32, (8 if quick else 32)
    batches = batches or ((1, 4) if quick else (1, 4, 16, 64))
    model, hf = gpt2_pair(0)
    if quick:  # a smoke run: 2 layers compile fast
        model = kvref.Transformer(model.cfg.with_(n_layers=2)).eval()
    model, hf = model.to(device), hf.to(device)
    modes = ["default", "frozen", "reduce-overhead"] if device.type == "cuda" else ["default", "frozen"]
    title1 = (f"### 1. torch.compile of the decode step ({device.type}, {model.cfg.n_layers} layers, prompt {prompt}, "
              f"{new} new, B=1; {repeats} interleaved repeats, each the median of {new - 1} steps)")

    def sections_1_2() -> list[str]:
        h1, rows1, rows2, info = compile_and_roofline(model, device, prompt, new, repeats, modes, log)
        return [title1 + "\n", table(h1, rows1), "",
                "; ".join(f"{k}: {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in info.items()), "",
                "### 2. decode vs the memory-bandwidth roofline (B=1, same run)\n",
                table(["measurement", "value", "note"], rows2), ""]

    out = guarded(title1, sections_1_2) if set("12") & set(sections) else []
    if not quick and "3" in sections:  # the 2-layer quick model has not the HF weights
        title3 = (f"### 3. kvref generate vs HF generate ({device.type}, prompt {prompt}, {new} new, greedy, "
                  f"prefill included; {repeats} interleaved repeats)")
        out += guarded(title3, lambda: [title3 + "\n", table(
            ["batch", "kvref layout", "kvref tok/s", "kvref compiled tok/s", "HF tok/s", "kvref / HF (median)",
             "kvref compiled / HF (median)", "target", "compile s", "greedy tokens (all three)"],
            versus_hf(model, hf, batches, prompt, new, repeats, log)), ""])
    S, B = (128, 4) if quick else (512, 16)
    title4 = (f"### 4. one decode step over the paged cache ({device.type}, B={B}, S={S}, 16-token blocks, "
              f"serving model: 4 layers, 8/2 heads of 64)")

    def section_4() -> list[str]:
        rows4, info4 = paged_in_place(device, B, S, 5 if quick else max(repeats, 15), 16, log)
        return [title4 + "\n", table(["cache", "median ms (min-max)", "/ static (median)",
                                        "bytes copied per step"], rows4), "",
                "; ".join(f"{k}: {float(v):.3g}" for k, v in info4.items()), ""]

    out += guarded(title4, section_4) if "4" in sections else []
    if not quick and "5" in sections and device.type == "cpu":  # a CPU profile
        title5 = (f"### 5. where a decode step's time goes, and the limits ({device.type}, prompt {prompt}, {new} new, "
                  f"kvref and HF alternating, {repeats} repeats, medians)")
        out += guarded(title5, lambda: [title5 + "\n", *step_profile.section(model, hf, prompt, new, repeats, log)])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 2-layer model, small sizes: checks that it works")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5, 2 with --quick)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--sections", default="12345", help="which tables to run, e.g. 35 (default all; 1 and 2 together)")
    ap.add_argument("--batches", default=None, help="section 3's batch sizes, e.g. 1,16 (default 1,4,16,64)")
    args = ap.parse_args(argv)
    try:
        batches = tuple(int(b) for b in args.batches.split(",")) if args.batches else None
    except ValueError:
        ap.error(f"--batches takes batch sizes separated by commas, e.g. 1,16; got {args.batches!r}")
    if batches and min(batches) < 1:
        ap.error(f"--batches: every batch size must be >= 1; got {args.batches!r}")
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (2 if args.quick else 5)
    t0 = time.perf_counter()
    body = report(torch.device("cpu"), args.quick, repeats, lambda m: print(m, file=sys.stderr, flush=True),
                  args.sections, batches)
    print(f"\n## kvref decode benchmark (cpu: {cpu_name()}, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{time.perf_counter() - t0:.0f} s)\n")
    print(body)


if __name__ == "__main__":
    main()
