"""``python -m kvref.bench linear``: the products behind kvref's ``Linear`` rules on this CPU, one thread.

Two tables, each a race of two ways to compute the same product, interleaved, medians of ``--repeats``:

1. fp32: ``F.linear(x, W)`` against the form ``(W @ x.T).T`` that ``Linear`` uses for 8-32 rows of x when
   the product is at least 512 wide (the course's tiny models are 128 wide; GPT-2's 768 and 3072).
2. bf16 and fp16: PyTorch's own 16-bit product against the product in fp32 rounded once, which ``Linear``
   uses on a CPU that oneDNN says has no 16-bit matrix kernel, from 4 rows (weights up to 2M numbers) or
   32 rows (larger).

The last column is ``Linear.path`` for that row (the choice ``forward`` makes), so a rule that does not
fit a CPU shows.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from ..modules import Linear, _slow_16bit
from .timing import cpu_name, interleave, med, sync, table

WIDTHS = [(128, 384), (768, 768), (768, 3072), (3072, 768)]  # (in, out): tiny model's MLP, GPT-2's products
WIDTHS_16 = [(128, 384), (768, 2304), (4096, 4096), (768, 50257)]  # ... and a 7B layer, GPT-2's lm_head


def timer(fn, n: int):
    def run() -> float:
        t0 = sync(torch.device("cpu"))
        for _ in range(n):
            fn()
        return (sync(torch.device("cpu")) - t0) / n
    fn()  # warm: first-call allocations
    return run


def calls(in_f: int, out_f: int, rows: int) -> int:
    return max(1, int(2e7 // (in_f * out_f * max(rows, 4))))  # about 20 M multiply-adds per timed run


def fp32_rows(repeats: int) -> list[list[str]]:
    out = []
    for in_f, out_f in WIDTHS:
        layer = Linear(in_f, out_f)
        w, b = layer.weight.detach(), layer.bias.detach()
        for rows in (8, 16, 32):
            x, n = torch.randn(rows, in_f), calls(in_f, out_f, rows)
            t = interleave({"f": timer(lambda: F.linear(x, w, b), n),
                            "r": timer(lambda: torch.addmm(b[:, None], w, x.T).T.contiguous(), n)}, repeats)
            kvref_way = {"reversed": "(W @ x.T).T", "linear": "F.linear"}[layer.path(x)]
            out.append([f"{in_f} x {out_f}", str(rows), f"{1e6 * med(t['f']):.0f}", f"{1e6 * med(t['r']):.0f}",
                        f"{med(t['f']) / med(t['r']):.2f}x", kvref_way])
    return out


def half_rows(repeats: int) -> list[list[str]]:
    out = []
    for dtype in (torch.bfloat16, torch.float16):
        for in_f, out_f in WIDTHS_16:
            layer = Linear(in_f, out_f, bias=False, dtype=dtype)
            w = layer.weight.detach()
            for rows in (1, 4, 16, 32, 128):
                x, n = torch.randn(rows, in_f, dtype=dtype), max(1, calls(in_f, out_f, rows) // 8)
                t = interleave({"own": timer(lambda: F.linear(x, w), n),
                                "fp32": timer(lambda: F.linear(x.float(), w.float()).to(dtype), n)}, repeats)
                kvref_way = "fp32, rounded once" if layer.path(x) == "fp32" else "own"
                out.append([str(dtype).removeprefix("torch."), f"{in_f} x {out_f}", str(rows),
                            f"{1e3 * med(t['own']):.2f}", f"{1e3 * med(t['fp32']):.2f}",
                            f"{med(t['own']) / med(t['fp32']):.2f}x", kvref_way])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench linear", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    slow = ", ".join(str(d).removeprefix("torch.") for d in sorted(_slow_16bit(), key=str)) or "none"
    print(f"## kvref Linear's products (cpu: {cpu_name()}, 1 thread, torch {torch.__version__}, "
          f"{args.repeats} interleaved repeats, medians)\n")
    print("### 1. fp32, 8-32 rows: F.linear against (W @ x.T).T\n")
    print(table(["W (in x out)", "rows", "F.linear us", "(W @ x.T).T us", "F.linear / reversed", "kvref's Linear"],
                fp32_rows(args.repeats)))
    print(f"\n### 2. 16-bit products: PyTorch's own against fp32 rounded once "
          f"(no oneDNN 16-bit kernel here for: {slow})\n")
    print(table(["dtype", "W (in x out)", "rows", "own ms", "fp32 + round ms", "own / fp32", "kvref's Linear"],
                half_rows(args.repeats)))


if __name__ == "__main__":
    main()
