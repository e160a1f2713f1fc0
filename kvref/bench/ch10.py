"""``python -m kvref.bench ch10``: chapter 10's tables, all computed, none typed.

1. cache bytes per token for each preset (what one more token adds at long context), and MLA against
   MHA and GQA of the same per-head width;
2. bytes read per MLA decode step, naive (re-expanded K/V) against absorbed (latent space);
3. the planner: per-layer formula and bytes per sequence at 8K and 128K;
4. interleaved local/global layers: a 5:1 model's cache measured from kvref's LayeredCache as it grows,
   next to the formula;
5. top-k selection against H2O eviction on the tiny model's lookup probes (recall and rows read).
"""

from __future__ import annotations

import argparse

import torch

from ..config import ModelConfig
from ..memory import GiB, kv_bytes_per_token, kv_cache_bytes
from ..planner import PLANNER_PRESETS, latent_vs_heads, mla_decode_read_bytes, planner_table

MiB = 1024**2


def bytes_per_token_table(dtype: torch.dtype = torch.bfloat16) -> str:
    rows = ["| preset | layers by kind | KV bytes per token (long S) | at 8K tokens | at 128K tokens |",
            "|---|---|---|---|---|"]
    from ..kinds import kind_counts

    for name in PLANNER_PRESETS:
        cfg = ModelConfig.preset(name)
        kinds = ", ".join(f"{n} {k}" for k, n in kind_counts(cfg).items())
        at = {S: f"{kv_cache_bytes(cfg, 1, S, dtype) / GiB:.3f} GiB" if S <= cfg.max_seq_len else "past its context"
              for S in (8192, 131072)}
        rows.append(f"| {name} | {kinds} | {kv_bytes_per_token(cfg, dtype) / 1024:.1f} KiB | {at[8192]} | {at[131072]} |")
    m = latent_vs_heads(ModelConfig.preset("deepseek-v3"), dtype)
    rows += ["", "| DeepSeek-V3 width, per token | MLA (latent + RoPE key) | GQA, 8 K/V heads | MHA, 128 heads |",
             "|---|---|---|---|",
             f"| bytes | {m['mla'] / 1024:.1f} KiB | {m['gqa'] / 1024:.1f} KiB | {m['mha'] / 1024:.1f} KiB |",
             f"| vs MLA | 1x | {m['gqa'] / m['mla']:.1f}x | {m['mha'] / m['mla']:.1f}x |"]
    return "\n".join(rows)


def mla_reads_table(seq_lens: tuple[int, ...] = (4096, 32768, 131072), dtype: torch.dtype = torch.bfloat16) -> str:
    cfg = ModelConfig.preset("deepseek-v3")
    rows = ["| S | form | latent cache | W_UKV weights | expanded K/V | total per step | naive / absorbed |",
            "|---|---|---|---|---|---|---|"]
    for S in seq_lens:
        n, a = (mla_decode_read_bytes(cfg, S, f, dtype) for f in ("naive", "absorbed"))
        for form, d in (("naive", n), ("absorbed", a)):
            ratio = f"{n['total'] / a['total']:.1f}x" if form == "naive" else ""
            rows.append(f"| {S} | {form} | {d['cache'] / MiB:.0f} MiB | {d['weights'] / MiB:.0f} MiB | "
                        f"{d['expanded'] / MiB:.0f} MiB | {d['total'] / GiB:.2f} GiB | {ratio} |")
    return "\n".join(rows)


def interleaved_growth(lengths: tuple[int, ...] = (16, 32, 64, 128, 256), window: int = 32) -> list[dict]:
    """A small 5:1 local:global model (12 layers, Gemma body, window ``window``) run through a dynamic
    LayeredCache: its measured ``cache.nbytes`` after S tokens, the formula, and what 12 full layers would hold."""
    from ..layers import LayeredCache
    from ..model import Transformer

    types = tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(12))
    cfg = ModelConfig(arch="gemma", n_layers=12, n_heads=4, n_kv_heads=2, d_model=64, head_dim=16,
                      max_seq_len=max(lengths), sliding_window=window, layer_types=types, qk_norm=True)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    cache = LayeredCache(cfg, 1, static=False)
    ids = torch.randint(0, 256, (1, max(lengths)))
    out, done = [], 0
    with torch.no_grad():
        for S in lengths:
            model(ids[:, done:S], cache=cache)
            done = S
            out.append({"S": S, "measured": cache.nbytes, "formula": kv_cache_bytes(cfg, 1, S, torch.float32),
                        "all_full": kv_cache_bytes(cfg.with_(layer_types=None, arch="llama", sliding_window=None,
                                                             qk_norm=False), 1, S, torch.float32)})
    return out


def interleaved_table(rows: list[dict]) -> str:
    lines = ["| S | measured cache.nbytes (5:1 model) | formula | 12 full layers |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['S']} | {r['measured'] / 1024:.0f} KiB | {r['formula'] / 1024:.0f} KiB | "
                     f"{r['all_full'] / 1024:.0f} KiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench ch10", description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=20, help="lookup probes for the selection table (chapter 7: 20)")
    ap.add_argument("--ks", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="rows per query / kept")
    ap.add_argument("--no-select", action="store_true", help="skip the (slow) selection vs eviction table")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("## 1. KV cache bytes per token (bf16)\n\n" + bytes_per_token_table())
    print("\n## 2. Bytes read per MLA decode step, DeepSeek-V3, batch 1, bf16\n\n" + mla_reads_table())
    print("\n## 3. Planner: per-layer formula, bytes per sequence (bf16)\n\n" + planner_table())
    growth = interleaved_table(interleaved_growth())
    print("\n## 4. Interleaved 5:1 layers, measured from kvref's cache (fp32)\n\n" + growth)
    if not args.no_select:
        from ..select import selection_table, selection_vs_eviction
        from ..train import tiny_model

        rows = selection_vs_eviction(tiny_model(), ks=tuple(args.ks), n_probes=args.probes)
        print(f"\n## 5. Top-k selection vs H2O eviction, tiny model, {args.probes} lookup probes "
              f"(S = {rows[0]['S']} tokens)\n\n" + selection_table(rows))


if __name__ == "__main__":
    main()
