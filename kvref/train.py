"""Train the course's tiny model: ``python -m kvref.train`` (about 10 minutes on 2 CPU cores).

A byte-level Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention: 8 query heads share 2 K/V
heads) trained from scratch on the synthetic corpus of ``kvref.corpus``. The result is committed
as ``kvref/data/tiny.safetensors`` (+ ``tiny.json``, + ``train_log.txt``), and
``kvref.tiny_model()`` loads it, so quality experiments on quantized or bounded caches measure
something real: prose the model predicts well, and records it must recall hundreds of bytes later.

    model = tiny_model()                       # eval mode, fp32, CPU
    ids = torch.tensor([list(b"recall ")])
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from . import corpus
from .config import ModelConfig
from .generate import generate
from .model import Transformer

DATA = Path(__file__).parent / "data"
CKPT = DATA / "tiny.safetensors"

TINY_CONFIG = ModelConfig(arch="llama", n_layers=4, n_heads=8, n_kv_heads=2, d_model=128, max_seq_len=512,
                          vocab_size=256)


def tiny_model(path: str | Path | None = None, device: torch.device | str = "cpu") -> Transformer:
    """The committed tiny trained model (eval mode, fp32). ``path``: another .safetensors from train."""
    from safetensors.torch import load_file

    path = Path(path) if path is not None else CKPT
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; run `python -m kvref.train` to make one")
    cfg = ModelConfig(**json.loads(path.with_suffix(".json").read_text())["config"])
    model = Transformer(cfg)
    state = load_file(str(path))
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state)
    return model.to(device).eval()


@torch.no_grad()
def heldout_loss(model: Transformer, n_docs: int = 64, length: int | None = None) -> float:
    """Mean next-byte cross-entropy (nats) on held-out documents, full attention."""
    length = length or model.cfg.max_seq_len
    x = corpus.batch(corpus.HELDOUT_SEED, 0, n_docs, length).to(model.device)
    total = 0.0
    for chunk in x.split(16):
        logits = model(chunk[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum"))
    return total / (n_docs * (length - 1))


def recall_probes(n: int, length: int, start: int = 0) -> list[tuple[bytes, bytes, int]]:
    """Held-out retrieval probes (prompt, 4-digit answer, distance in bytes)."""
    return [corpus.recall_prompt(corpus.HELDOUT_SEED, start + i, length) for i in range(n)]


@torch.no_grad()
def recall_accuracy(model: Transformer, n: int = 100, cache="dynamic") -> tuple[float, float]:
    """(exact-match accuracy of all 4 digits, per-digit accuracy), greedy, full cache."""
    probes = recall_probes(n, model.cfg.max_seq_len)
    exact = digits = 0
    for i in range(0, n, 20):
        group = probes[i:i + 20]
        T = max(len(p) for p, _, _ in group)
        ids = torch.tensor([[0] * (T - len(p)) + list(p) for p, _, _ in group])
        mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p, _, _ in group])
        out = generate(model, ids.to(model.device), 4, cache=cache, attention_mask=mask.to(model.device))
        for row, (_, ans, _) in zip(out.tokens[:, T:].tolist(), group):
            exact += bytes(row) == ans
            digits += sum(a == b for a, b in zip(row, ans))
    return exact / n, digits / (4 * n)


def _cpu_minutes(c0: float, threads: int) -> float:
    """CPU time since c0 spread over ``threads``: the wall time the run would take on an idle machine
    (a shared machine stretches wall time, not this)."""
    return (time.process_time() - c0) / 60 / threads


def train(steps: int = 1850, batch_size: int = 8, lr: float = 3e-3, warmup: int = 30, seed: int = 0,
          phase1_steps: int = 1400, phase1_len: int = 256,
          max_minutes: float = 14.0, out: Path = CKPT, threads: int = 2, log_every: int = 20,
          eval_every: int = 0, eval_docs: int = 64, eval_probes: int = 100) -> dict:
    """Train TINY_CONFIG for ``steps`` AdamW steps on fresh documents; save and return the stats.

    Phase 1 (the first ``phase1_steps``): short ``phase1_len``-byte documents rich in echoes and
    small ledgers, cheap per step, where the model discovers copying. Phase 2: full-length
    documents with ledgers recalled hundreds of bytes later. Learning rate: linear warmup, then a
    cosine decay to 10 % over all steps.
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = TINY_CONFIG
    model = Transformer(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0)))))
    log_lines = [f"config: {json.dumps(cfg.__dict__)}",
                 f"params: {sum(p.numel() for p in model.parameters())}, steps: {steps} (phase 1: {phase1_steps} x "
                 f"{batch_size} x {phase1_len} bytes, phase 2: {steps - phase1_steps} x {batch_size} x "
                 f"{cfg.max_seq_len} bytes), lr: {lr}, threads: {threads}"]
    t0, c0 = time.time(), time.process_time()
    done = 0
    bar = tqdm(range(steps), desc="train", unit="step")
    ema = None
    for step in bar:
        phase1 = step < phase1_steps
        length = phase1_len if phase1 else cfg.max_seq_len
        x = corpus.batch(corpus.TRAIN_SEED, step * batch_size, batch_size, length + 1, warmup=phase1)
        logits = model(x[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        done = step + 1
        lv = loss.item()
        ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        bar.set_postfix(loss=f"{ema:.3f}")
        if done % log_every == 0 or done == steps:
            log_lines.append(f"step {done:5d}  loss {lv:.4f}  ema {ema:.4f}  lr {sched.get_last_lr()[0]:.2e}"
                             f"  wall {time.time() - t0:6.1f}s  cpu/threads {60 * _cpu_minutes(c0, threads):6.1f}s")
        if eval_every and done % eval_every == 0:
            model.eval()
            acc = recall_accuracy(model, 20)
            model.train()
            log_lines.append(f"step {done:5d}  recall (20 probes) exact {acc[0]:.2f}  digit {acc[1]:.2f}")
            bar.write(log_lines[-1])
        if _cpu_minutes(c0, threads) > max_minutes:
            log_lines.append(f"stopped at step {done}: the {max_minutes}-minute limit (CPU time / threads) was reached")
            break
    train_s, train_cpu = time.time() - t0, 60 * _cpu_minutes(c0, threads)
    model.eval()
    stats = {
        "steps": done, "train_wall_seconds": round(train_s, 1), "train_cpu_seconds_per_thread": round(train_cpu, 1), 
        "tokens_seen": min(done, phase1_steps) * batch_size * phase1_len
        + max(done - phase1_steps, 0) * batch_size * cfg.max_seq_len,
        "heldout_loss": round(heldout_loss(model, eval_docs), 4),
        "unigram_loss": round(corpus.unigram_nll(heldout=corpus.batch(corpus.HELDOUT_SEED, 0, eval_docs,
                                                                      cfg.max_seq_len)), 4),
    }
    stats["recall_exact"], stats["recall_digit"] = recall_accuracy(model, eval_probes)
    d = [p[2] for p in recall_probes(eval_probes, cfg.max_seq_len)]
    stats["recall_distance_min_mean_max"] = [min(d), round(sum(d) / len(d), 1), max(d)]
    log_lines.append("result: " + json.dumps(stats))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(out))
    out.with_suffix(".json").write_text(json.dumps({"config": cfg.__dict__, "stats": stats}, indent=1) + "\n")
    out.with_name("train_log.txt").write_text("\n".join(log_lines) + "\n")
    return stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.train", description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1850, help="all steps, phase 1 included")
    ap.add_argument("--phase1-steps", type=int, default=1400)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=14.0, help="stop early (and say so) past this much CPU time per thread (= wall time on an idle machine)")
    ap.add_argument("--eval-every", type=int, default=0, help="log recall accuracy (20 probes) every N steps")
    ap.add_argument("--out", type=Path, default=CKPT)
    a = ap.parse_args(argv)
    stats = train(a.steps, a.batch, a.lr, phase1_steps=a.phase1_steps, max_minutes=a.max_minutes, out=a.out,
                  threads=a.threads, eval_every=a.eval_every)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
