"""Quality benchmark: what quantizing or evicting the KV cache costs a trained model.

    python -m kvref.bench quality [--quick] [--plot quality.png] [--docs 16] [--probes 60]

Model: ``kvref.tiny_model()``, the byte-level Llama the repo trains itself (``python -m
kvref.train``: 4 layers, 8 query / 2 K/V heads of 16, max_seq_len 512) on a synthetic corpus
(``kvref.corpus``). Every cache is driven the way generation drives it, **one token at a time**,
so each prediction sees exactly what the cache holds at that step (a one-shot prefill would let
early queries see tokens an evicting cache has not dropped yet).

* Perplexity: held-out 512-byte documents (prose, ledgers of records like ``x4821`` = key ``x``,
  value ``4821``, recalls, echoes); max logit error is against the fp32 full cache run the same way.
  The change against fp32 is measured per document; its noise is 3 standard errors of the mean
  change over the documents, and a change inside it prints "no measurable change (noise ±x %)".
* Bytes: ``cache.nbytes`` per sequence once the 511 input tokens are in (fp32 full cache = 100 %).
* Recall: held-out probes ``ledger: <4 records> <prose> recall KEY``, where the 4-digit answer sits
  several hundred bytes back (range printed); exact match of the 4 greedy digits.

Budgets of the bounded caches are 10 / 25 / 50 % of 512 tokens: a window of W, sinks 4 + W - 4,
H2O half heavy hitters and half recent tokens. Quantized caches use group size 16 (= head_dim:
keys per channel over 16 tokens, values per token over all 16 channels); residual 0 or 64 tokens.
int8 and int4 are kvref's QuantizedCache; int2 and fp8 (e4m3, per-tensor scales calibrated on 8
other held-out documents) are ``kvref.bench.simquant.SimulatedQuantCache``, bytes as stored.
Targets (issue): int8 within 1 % of fp32 perplexity, int4 with a residual window within 5 %.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from .. import corpus
from ..cache import DynamicCache, KVCache
from ..evict import H2OCache, SinkCache, SlidingWindowCache
from ..quant import QuantizedCache
from ..train import recall_probes, tiny_model
from .simquant import SimulatedQuantCache, calibrate_fp8

SEQ = 512


# -- verdicts that never state a direction inside the noise ---------------------------------------
def _num(x: float) -> str:
    """Two significant digits, never rounded to zero: 0.0042, 0.37, 12."""
    return f"{x:.2g}" if abs(x) < 10 else f"{x:.0f}"


def change_verdict(change: float, noise: float, unit: str = " %") -> str:
    """A change (e.g. of perplexity, in %) as a sentence fragment, judged against its noise.

    ``noise`` >= 0 is the half-width of the band within which a change is not measurable (e.g. two
    standard errors over documents). Inside it: "no measurable change (noise ±x %)"; outside:
    "+1.2 % (noise ±0.3 %)", the sign and two significant digits, so nothing prints as 0.00.
    """
    if not noise >= 0 or not math.isfinite(change):
        raise ValueError(f"need a finite change and a noise >= 0; got change={change!r}, noise={noise!r}")
    band = f"noise ±{_num(noise)}{unit}"
    if abs(change) <= noise:
        return f"no measurable change ({band})"
    return f"{'+' if change > 0 else '-'}{_num(abs(change))}{unit} ({band})"


def paired_change(per_item: torch.Tensor, ref_item: torch.Tensor, z: float = 2.0) -> tuple[float, float]:
    """(change in %, noise in %) of exp(mean) between two paired measurements per item (B,).

    ``per_item``, ``ref_item``: mean NLL of each document (or probe) with two caches. The change is
    exp(mean difference) - 1; the noise z standard errors of that mean over the items (z = 2: about a
    95 % band), so a change that another sample of documents could reverse is reported as noise.
    """
    d = (per_item - ref_item).double()  # (B,)
    se = float(d.std(unbiased=True) / math.sqrt(len(d))) if len(d) > 1 else float("inf")
    return 100 * math.expm1(float(d.mean())), 100 * math.expm1(z * se)


def cache_menu(budgets: list[float], seq: int = SEQ, fp8_scales=None) -> list[tuple[str, str, callable]]:
    """(name, family, factory) for every cache in the table (``fp8_scales``: see calibrate_fp8)."""
    menu = [
        ("fp32 (full)", "full", DynamicCache),
        ("int8, R=0", "quant", lambda: QuantizedCache(8, 16, 0)),
        ("int8, R=64", "quant", lambda: QuantizedCache(8, 16, 64)),
        ("fp8 e4m3, R=0", "quant", lambda: SimulatedQuantCache("fp8_e4m3", 16, 0, fp8_scales=fp8_scales)),
        ("int4, R=0", "quant", lambda: QuantizedCache(4, 16, 0)),
        ("int4, R=64", "quant", lambda: QuantizedCache(4, 16, 64)),
        ("int2, R=0", "quant", lambda: SimulatedQuantCache("int2", 16, 0)),
        ("int2, R=64", "quant", lambda: SimulatedQuantCache("int2", 16, 64)),
    ]
    for frac in budgets:
        b = round(frac * seq)
        menu += [
            (f"window {b} ({frac:.0%})", "window", lambda b=b: SlidingWindowCache(b)),
            (f"sinks 4+{b - 4} ({frac:.0%})", "sinks", lambda b=b: SinkCache(4, b - 4)),
            (f"H2O {b // 2}+{b - b // 2} ({frac:.0%})", "h2o", lambda b=b: H2OCache(b // 2, b - b // 2)),
        ]
    return menu


@torch.inference_mode()  # no autograd bookkeeping at all: about 20 % less per step than no_grad on a CPU
def stepwise_logits(model, ids: torch.Tensor, cache: KVCache, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Feed ids (B, T) one token at a time through ``cache``; logits (B, T, V)."""
    out = []
    for i in range(ids.shape[1]):
        m = None if mask is None else mask[:, i:i + 1]
        out.append(model(ids[:, i:i + 1], cache=cache, attention_mask=m)[:, -1])
    return torch.stack(out, dim=1)


@torch.inference_mode()  # the cache was filled by stepwise_logits in inference mode: it goes on in it
def recall(model, make, probes) -> float:
    """Exact-match accuracy of the 4 answer digits, prompts fed token by token (left-padded batch)."""
    T = max(len(p) for p, _, _ in probes)
    ids = torch.tensor([[0] * (T - len(p)) + list(p) for p, _, _ in probes])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p, _, _ in probes])
    cache = make()
    logits = stepwise_logits(model, ids, cache, mask)[:, -1]
    got = []
    for _ in range(4):
        nxt = logits.argmax(-1)  # (B,)
        got.append(nxt)
        logits = model(nxt[:, None], cache=cache)[:, -1]
    got = torch.stack(got, 1).tolist()
    return sum(bytes(g) == a for g, (_, a, _) in zip(got, probes)) / len(probes)


def run(n_docs: int, n_probes: int, budgets: list[float], threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    model = tiny_model()
    docs = corpus.batch(corpus.HELDOUT_SEED, 10_000, n_docs, SEQ)  # (N, 512), unseen by training and by train's eval
    x, y = docs[:, :-1], docs[:, 1:]
    probes = recall_probes(n_probes, SEQ, start=10_000)
    scales = calibrate_fp8(model, corpus.batch(corpus.HELDOUT_SEED, 20_000, 8, SEQ))  # other documents
    rows, ref = [], None
    for name, family, make in cache_menu(budgets, fp8_scales=scales):
        t0 = time.perf_counter()
        cache = make()
        logits = stepwise_logits(model, x, cache)
        doc_nll = F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(1)  # (N,)
        if ref is None:
            ref = logits
        rows.append(dict(name=name, family=family, bytes=cache.nbytes // n_docs,
                         ppl=math.exp(float(doc_nll.mean())), doc_nll=doc_nll,
                         max_err=float((logits - ref).abs().max()), recall=recall(model, make, probes),
                         seconds=time.perf_counter() - t0))
        print(f"  {name}: {rows[-1]['seconds']:.0f}s", flush=True)
    return rows


Z = 3  # standard errors in the noise band of a perplexity change


def vs_fp32(row: dict, base: dict) -> tuple[float, str]:
    """(change in %, verdict) of a row's perplexity against the fp32 row, per document, with noise."""
    change, noise = paired_change(row["doc_nll"], base["doc_nll"], z=Z)
    return change, change_verdict(change, noise)


def table(rows: list[dict]) -> str:
    base = rows[0]
    out = ["| cache | KV bytes / seq | % of fp32 | perplexity | vs fp32 | max logit err | recall |",
           "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        vs = "reference" if r is base else vs_fp32(r, base)[1]
        out.append(f"| {r['name']} | {r['bytes']:,} | {100 * r['bytes'] / base['bytes']:.1f} % | {r['ppl']:.4f} | "
                   f"{vs} | {r['max_err']:.3g} | {100 * r['recall']:.0f} % |")
    return "\n".join(out)


def verdicts(rows: list[dict]) -> str:
    by = {r["name"]: r for r in rows}
    lines = []
    for name, target in (("int8, R=0", 1.0), ("int8, R=64", 1.0), ("int4, R=64", 5.0)):
        change, text = vs_fp32(by[name], by["fp32 (full)"])
        lines.append(f"- {name}: perplexity vs fp32 {text} (target |change| <= {target:g} %): "
                     f"{'met' if abs(change) <= target else 'NOT met'}")
    return "\n".join(lines)


def plot(path: str, rows: list[dict], budgets: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = rows[0]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    marks = {"full": "k*", "quant": "bs", "window": "o", "sinks": "^", "h2o": "D"}
    for r in rows:
        ax[0].plot(100 * r["bytes"] / base["bytes"], r["ppl"], marks[r["family"]], label=r["name"])
    ax[0].set(xlabel="KV bytes, % of fp32 full cache", ylabel="held-out perplexity (bytes)", yscale="log",
              title="cost vs quality")
    ax[0].legend(fontsize=7, ncol=2)
    for fam, label in (("window", "sliding window"), ("sinks", "sinks + window"), ("h2o", "H2O")):
        pts = [r for r in rows if r["family"] == fam]
        ax[1].plot([100 * b for b in budgets], [100 * r["recall"] for r in pts], marks[fam] + "-", label=label)
    for r in rows:
        if r["family"] in ("full", "quant"):
            ax[1].axhline(100 * r["recall"], ls=":", lw=1, color="k" if r["family"] == "full" else "b")
    ax[1].set(xlabel="cache budget, % of 512 tokens", ylabel="recall accuracy, %", ylim=(-5, 105),
              title="recall of a key several hundred bytes back\n(dotted: full / quantized caches)")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench quality", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 documents, 12 probes, one budget (25 %%)")
    ap.add_argument("--plot", metavar="FILE.png", help="also save a figure")
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--probes", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    docs, probes, budgets = (4, 12, [0.25]) if a.quick else (a.docs, a.probes, [0.10, 0.25, 0.50])
    dist = [d for _, _, d in recall_probes(probes, SEQ, start=10_000)]
    print(f"tiny trained model, {docs} held-out docs of {SEQ} bytes, {probes} recall probes (answer "
          f"{min(dist)}-{max(dist)} bytes back), every cache fed token by token")
    rows = run(docs, probes, budgets, a.threads)
    print()
    print(table(rows))
    print()
    print(verdicts(rows))
    if a.plot:
        plot(a.plot, rows, budgets)
        print(f"\nfigure: {a.plot}")


if __name__ == "__main__":
    main()
