"""Core benchmark: what the KV cache buys, and how fast kvref decodes.

    python -m kvref.bench [core] [--quick] [--plot FILE.png] [--repeats 5] [--threads 1]

Model: GPT-2-124M's shape (``ModelConfig.preset("gpt2")``) with random fp32 weights, no download:
a seeded ``transformers.GPT2LMHeadModel`` is saved to a temporary folder and read back with
``kvref.load_hf``, so kvref and HF run the very same weights. Four sections:

1. tokens/s with a static cache vs none (recompute everything each step) as N grows;
2. kvref ``generate`` vs HF ``generate`` (greedy), batch 1 and 16, and whether the tokens agree;
3. decode speed as a fraction of the memory-bandwidth roofline (bandwidth measured in this run);
4. the decode step under ``torch.compile`` vs eager.

The machine is shared and noisy (docs/CONVENTIONS.md): one process, the runs being compared are
interleaved (A, B, A, B, ...) and each keeps its best of k. Progress on stderr, table on stdout.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import logging
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

import kvref
from kvref.generate import decode_one_token, prefill

from .timing import sync


@dataclass
class Row:
    section: str
    what: str
    value: str
    target: str = ""
    met: bool | None = None  # None: no target on this row
    note: str = ""


def at_least(section: str, what: str, value: float, target: float, unit: str, note: str = "") -> Row:
    fmt = (lambda x: f"{x:.0%}") if unit == "%" else (lambda x: f"{x:.2f}{unit}")
    return Row(section, what, fmt(value), f">= {fmt(target)}", value >= target, note)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    t0 = sync(device)
    fn()
    return sync(device) - t0


def interleaved(runs: dict[str, Callable[[], float]], repeats: dict[str, int], bar: tqdm) -> dict[str, float]:
    """Call each run round-robin (A, B, A, B, ...), ``repeats[name]`` times; keep each one's best (least) time."""
    best = {name: float("inf") for name in runs}
    for r in range(max(repeats.values())):
        for name, run in runs.items():
            if r < repeats[name]:
                best[name] = min(best[name], run())
                bar.update()
    return best


def prompt_ids(batch: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def gpt2_pair(seed: int) -> tuple[kvref.Transformer, torch.nn.Module]:
    """The same random GPT-2-124M weights, once as a kvref model and once as HF's GPT2LMHeadModel."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(GPT2Config()).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        model = kvref.load_hf(folder)
    if model.cfg != kvref.ModelConfig.preset("gpt2"):
        raise RuntimeError(f"GPT2Config() did not give the gpt2 preset's shape: {model.cfg}")
    return model, hf


# -- 1. cache vs no cache ------------------------------------------------------------------------
ONE_RUN_FROM = 256  # without a cache, this many new tokens take minutes: time them once


def cache_vs_none(model, lengths, prompt, k, bar, curve) -> list[Row]:
    ids, rows = prompt_ids(1, prompt, model.cfg.vocab_size), []
    for n in lengths:
        bar.set_description(f"1 cache, N={n}")
        once = n >= ONE_RUN_FROM
        best = interleaved(
            {"static": lambda: timed(lambda: kvref.generate(model, ids, n, cache="static"), model.device),
             "none": lambda: timed(lambda: kvref.generate(model, ids, n, cache=None), model.device)},
            {"static": k, "none": 1 if once else k}, bar)
        fast, slow = n / best["static"], n / best["none"]
        curve.append((n, fast, slow))
        full = " = max_seq_len" if prompt + n == model.cfg.max_seq_len else ""
        note = f"prompt {prompt} + {n}{full}; best of {k} (no cache: {'1 run' if once else f'best of {k}'})"
        rows.append(Row("1 cache", f"N={n} new: tokens/s static cache / no cache", f"{fast:.1f} / {slow:.1f}",
                        note=f"{fast / slow:.1f}x; {note}"))
    n = 512 if 512 in lengths else lengths[-1]
    _, fast, slow = next(c for c in curve if c[0] == n)
    rows.append(at_least("1 cache", f"speed-up of the cache at N={n}", fast / slow, 10, "x",
                         "" if n == 512 else "--quick: target is meant for N=512"))
    return rows


# -- 2. kvref vs Hugging Face transformers -------------------------------------------------------
def versus_hf(model, hf, batches, prompt, new, k, bar, bars) -> list[Row]:
    rows = []
    for B, target in batches:
        bar.set_description(f"2 vs HF, B={B}")
        ids, out = prompt_ids(B, prompt, model.cfg.vocab_size, seed=B), {}

        def ours() -> None:
            out["kvref"] = kvref.generate(model, ids, new, cache="static").tokens

        def theirs() -> None:
            with torch.inference_mode():
                out["hf"] = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                                        min_new_tokens=new, pad_token_id=hf.config.eos_token_id)

        best = interleaved({"kvref": lambda: timed(ours, model.device), "hf": lambda: timed(theirs, model.device)},
                           {"kvref": k, "hf": k}, bar)
        ours_s, theirs_s = B * new / best["kvref"], B * new / best["hf"]
        bars.append((B, ours_s, theirs_s))
        rows.append(Row("2 vs HF", f"B={B}: tokens/s kvref static / HF generate", f"{ours_s:.1f} / {theirs_s:.1f}",
                        note=f"prompt {prompt}, {new} new, greedy, prefill included; best of {k}"))
        rows.append(at_least("2 vs HF", f"B={B}: kvref / HF", ours_s / theirs_s, target, "x"))
        same = out["kvref"].shape == out["hf"].shape and bool((out["kvref"] == out["hf"]).all())
        rows.append(Row("2 vs HF", f"B={B}: greedy tokens kvref == HF", "identical" if same else "DIFFER",
                        "identical", same, f"{B}x{new} tokens"))
    return rows


# -- 3. memory-bandwidth roofline ----------------------------------------------------------------
def bytes_per_decode_token(model: kvref.Transformer, avg_len: float) -> tuple[float, float]:
    """(weight bytes, K/V bytes) one decode step reads at batch 1 with avg_len cached tokens."""
    cfg, size = model.cfg, model.dtype.itemsize
    weights = sum(p.numel() for p in model.parameters())  # the tied lm_head counted once: it reads all of tok_emb
    if model.pos_emb is not None:
        weights -= model.pos_emb.weight.numel() - cfg.d_model  # one row of the position table is read
    kv = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * avg_len  # K and V, every layer
    return weights * size, kv * size


def roofline(model, prompt, new, probe_rows, k, bar, bars) -> list[Row]:
    cols = 8192
    W, x = torch.randn(probe_rows, cols), torch.randn(1, cols)  # x @ W.T: the decode step's kind of work
    ids = prompt_ids(1, prompt, model.cfg.vocab_size)

    def probe() -> float:  # one run = the median of 5 products, as a decode run is the median of its steps
        return statistics.median(timed(lambda: F.linear(x, W), model.device) for _ in range(5))

    def decode() -> float:
        return statistics.median(kvref.generate(model, ids, new, cache="static").stats.decode_s)

    bar.set_description("3 roofline")
    best = interleaved({"probe": probe, "decode": decode}, {"probe": k, "decode": k}, bar)
    bandwidth = W.numel() * W.element_size() / best["probe"]
    w_bytes, kv_bytes = bytes_per_decode_token(model, prompt + new / 2)
    ideal, measured = bandwidth / (w_bytes + kv_bytes), 1 / best["decode"]
    bars.append((ideal, measured))
    return [
        Row("3 roofline", "read bandwidth (fp32 matrix-vector product)", f"{bandwidth / 1e9:.1f} GB/s",
            note=f"{probe_rows}x{cols} matrix ({W.numel() * 4 / 2**20:.0f} MiB); best of {k} medians of 5"),
        Row("3 roofline", "bytes read per decode token (weights + K/V)",
            f"{w_bytes / 1e6:.0f} + {kv_bytes / 1e6:.1f} MB",
            note=f"B=1, {prompt + new / 2:.0f} cached tokens on average"),
        Row("3 roofline", "decode tokens/s: ideal (bandwidth / bytes) / measured", f"{ideal:.1f} / {measured:.1f}",
            note=f"prompt {prompt}, {new} new; best of {k} medians of the {new - 1} decode steps"),
        at_least("3 roofline", "decode speed / roofline", measured / ideal, 0.8, "%"),
    ]


# -- 4. torch.compile ----------------------------------------------------------------------------
def decode_loop(step, model, ids, new) -> tuple[float, torch.Tensor]:
    """Prefill eagerly, then ``new - 1`` greedy steps of ``step``: (seconds per step, tokens)."""
    cache = kvref.StaticCache(model.cfg, ids.shape[0], ids.shape[1] + new, dtype=model.dtype, device=model.device)
    with torch.inference_mode():
        out = [prefill(model, ids, cache).argmax(-1)]
        t0 = sync(model.device)
        for _ in range(new - 1):
            out.append(step(model, out[-1], cache).argmax(-1))
        return (sync(model.device) - t0) / (new - 1), torch.stack(out, dim=1)


def compiled_vs_eager(model, device, prompt, new, k, bar) -> list[Row]:
    section, name = "4 compile", f"{device.type}, {model.cfg.n_layers} layers: "
    model = model if device == model.device else copy.deepcopy(model).to(device)
    ids = prompt_ids(1, prompt, model.cfg.vocab_size).to(device)
    bar.set_description(f"4 compile, {device.type}")
    # cache.length and model.kv_rows are Python ints that change every step: compile them as
    # symbols (one graph for every length) rather than as constants (a recompile per step).
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph breaks are expected (see the note): count, don't print
    with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
        step = torch.compile(decode_one_token, dynamic=True)
        try:
            first = timed(lambda: decode_loop(step, model, ids, new), device)
            bar.update()
            runs = {"eager": lambda: decode_loop(decode_one_token, model, ids, new)[0],
                    "compiled": lambda: decode_loop(step, model, ids, new)[0]}
            best = interleaved(runs, {"eager": k, "compiled": k}, bar)
            same = torch.equal(decode_loop(step, model, ids, new)[1], decode_loop(decode_one_token, model, ids, new)[1])
        except Exception as e:  # e.g. no working C++ toolchain for inductor: report it, don't crash
            msg = str(e).strip().splitlines()[0][:150] if str(e).strip() else ""
            return [Row(section, name + "torch.compile failed", type(e).__name__, note=msg.replace("|", "/"))]
        finally:
            torch._logging.set_logs()
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    steady = best["compiled"] * (new - 1)
    return [
        Row(section, name + "compile time (first run - steady run)", f"{first - steady:.1f} s",
            note=f"prompt {prompt}, {new} new, B=1; {breaks} graph breaks (input checks, cache bookkeeping)"),
        Row(section, name + "decode ms/token eager / compiled",
            f"{1e3 * best['eager']:.2f} / {1e3 * best['compiled']:.2f}",
            note=f"speed-up {best['eager'] / best['compiled']:.2f}x; best of {k}"),
        Row(section, name + "greedy tokens compiled == eager", "identical" if same else "DIFFER"),
    ]


# -- output ---------------------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    lines = ["| section | measurement | value | target | met | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        lines.append(f"| {r.section} | {r.what} | {r.value} | {r.target} | {met} | {r.note} |")
    return "\n".join(lines)


def plot(path: str, curve, bars, roof) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4))
    n, fast, slow = zip(*curve)
    a.plot(n, fast, "o-", label="static cache")
    a.plot(n, slow, "s-", label="no cache")
    a.set(xscale="log", yscale="log", xlabel="new tokens N", ylabel="tokens/s", title="1. cache vs no cache (B=1)")
    a.set_xticks(n, [str(v) for v in n], minor=False)
    a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    a.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    a.legend()
    xs = range(len(bars))
    b.bar([i - 0.2 for i in xs], [o for _, o, _ in bars], 0.4, label="kvref")
    b.bar([i + 0.2 for i in xs], [t for _, _, t in bars], 0.4, label="HF transformers")
    b.set(xticks=list(xs), xticklabels=[f"B={B}" for B, _, _ in bars], ylabel="tokens/s", title="2. kvref vs HF")
    b.legend()
    for ideal, measured in roof:
        c.bar(["roofline", "measured"], [ideal, measured], color=["grey", "C0"])
    c.set(ylabel="decode tokens/s (B=1)", title="3. memory-bandwidth roofline")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench core", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few tokens and repeats: checks that it works (~1 min)")
    ap.add_argument("--plot", metavar="FILE.png", help="also save a figure")
    ap.add_argument("--repeats", type=int, default=None, help="best of k (default 5, 2 with --quick)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on a shared machine, multi-threaded small matmuls stall "
                         "whenever another process holds a core; see docs/benchmarks.md)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    k = args.repeats or (2 if args.quick else 5)
    q = args.quick
    lengths = (16, 64) if q else (64, 128, 256, 512, 1016)
    new, batches = (16 if q else 128), ((1, 1.3), (16, 1.5))
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    total = (sum(k + (1 if n >= ONE_RUN_FROM else k) for n in lengths) + 2 * k * len(batches) + 2 * k
             + len(devices) * (2 * k + 1))  # timed runs, for the progress bar
    bar = tqdm(total=total, desc="kvref.bench core", unit="run", file=sys.stderr)

    model, hf = gpt2_pair(args.seed)
    rows, curve, hf_bars, roof = [], [], [], []
    rows += cache_vs_none(model, lengths, 8, k, bar, curve)
    rows += versus_hf(model, hf, batches, 32, new, k, bar, hf_bars)
    rows += roofline(model, 32, new, 8192 if q else 16384, k, bar, roof)
    # --quick compiles a 2-layer model: compile time grows with depth, and this is a smoke run
    small = kvref.Transformer(model.cfg.with_(n_layers=2)).eval() if q else model
    for device in devices:
        rows += compiled_vs_eager(small, device, 32, new, k, bar)
    if not torch.cuda.is_available():
        rows.append(Row("4 compile", "cuda", "skipped", note="no CUDA device in this run"))
    bar.close()

    cpu = f"{os.cpu_count()} CPU cores, torch threads: {torch.get_num_threads()}"
    import transformers

    print(f"\n## kvref core benchmark ({datetime.date.today()}; {cpu}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; "
          f"GPT-2-124M shape, random fp32 weights{'; --quick' if q else ''})\n")
    print(table(rows))
    if args.plot:
        plot(args.plot, curve, hf_bars, roof)
        print(f"\nfigure: {args.plot}")


if __name__ == "__main__":
    main()
