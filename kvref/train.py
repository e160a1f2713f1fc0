"""Train the course's tiny model: ``python -m kvref.train`` (about 11 minutes of one CPU core).

A byte-level Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention: 8 query heads share 2 K/V
heads) trained from scratch on the synthetic corpus of ``kvref.corpus``. The result is committed
as ``kvref/data/tiny.safetensors`` (+ ``tiny.json``, + ``train_log.txt``), and
``kvref.tiny_model()`` loads it, so quality experiments on quantized or bounded caches measure
something real: prose the model predicts well, and records it must recall hundreds of bytes later.

How a 0.8 M-parameter model learns a lookup 500 bytes back in 11 minutes (train_log.txt shows
each step): first it must learn to copy, "find the earlier occurrence of what I just read and
predict what followed it" (induction heads). Small models find that only after a plateau, and
only if the data is dense in it, so phase 1 alternates strings repeated over and over with short
lookup drills; copying shows within ~1200 short steps. Phase 2 stretches the lookup to full-length
documents; at its first check, 400 steps in, it works 500 bytes back. The answer digits weigh more
in the loss: they are rare.

    model = tiny_model()                                   # eval mode, fp32, CPU
    prompt = b"ledger: x4821 q0937\nThe cache holds the bread. recall q"
    out = generate(model, torch.tensor([list(prompt)]), 4)
    bytes(out.tokens[0, -4:].tolist())                     # b'0937'
"""

from __future__ import annotations

import argparse
import inspect
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


@torch.no_grad()
def copy_accuracy(model: Transformer, n_docs: int = 8, length: int = 256) -> float:
    """Teacher-forced accuracy on the repeated part of held-out repeat documents (chance: ~1/36)."""
    x = torch.tensor([list(corpus.repeat_document(corpus.HELDOUT_SEED, i, length + 1)) for i in range(n_docs)])
    pred = model(x[:, :-1].to(model.device)).argmax(-1).cpu()
    hits = [int(pred[b, t] == x[b, t + 1]) for b in range(n_docs) for t in corpus.copy_targets(bytes(x[b].tolist()))]
    return sum(hits) / len(hits)


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


def update(model: torch.nn.Module, opt: torch.optim.Optimizer, sched, loss: torch.Tensor) -> None:
    """One training step: gradients of ``loss``, their norm clipped to 1, then the optimizer and the schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def train(steps: int = 3600, batch_size: int = 16, lr: float = 1e-3, seed: int = 0,
          phase1_steps: int = 2000, phase1_len: int = 128, batch2: int = 4, lr2: float = 1e-3, repeat_every: int = 4,
          answer_weight: float = 5.0, max_minutes: float = 15.0, out: Path = CKPT, threads: int = 1,
          log_every: int = 20, eval_every: int = 0, eval_docs: int = 64, eval_probes: int = 100,
          config: ModelConfig | None = None, log: Path | None = None) -> dict:
    """Train ``config`` (default TINY_CONFIG) for ``steps`` AdamW steps on fresh documents; save and return the stats.

    Phase 1 (the first ``phase1_steps``): short ``phase1_len``-byte documents, cheap per step,
    alternating repeat documents and lookup drills: the model learns to copy (find the earlier
    match, read what followed; after a plateau of ~800 steps) and, right after, to look a key up in
    a ledger. Phase 2: full-length documents with prose and records recalled anywhere up to 500
    bytes later, every ``repeat_every``-th one still a repeat document; there the lookup stretches
    from ~100 to ~500 bytes. The learning rate is ``lr`` through phase 1, then ``lr2`` decayed
    (cosine) to 10 % over phase 2. The four answer digits of each recall weigh ``answer_weight``
    times as much as other bytes in the loss: they are ~1 % of the bytes, but the whole point.
    The log goes to ``log`` (default: train_log.txt next to ``out``).
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = config if config is not None else TINY_CONFIG
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    def lr_at(s: int) -> float:  # lr through phase 1; then lr2, cosine-decayed to 10 % over phase 2
        if s < phase1_steps:
            return 1.0
        frac = (s - phase1_steps) / max(steps - phase1_steps, 1)
        return lr2 / lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    log_lines = [f"config: {json.dumps(cfg.__dict__)}",
                 f"params: {sum(p.numel() for p in model.parameters())}, steps: {steps} (phase 1: {phase1_steps} x "
                 f"{batch_size} x {phase1_len} bytes, repeat and lookup documents; phase 2: {steps - phase1_steps} x "
                 f"{batch2} x {cfg.max_seq_len} bytes, 1 in {repeat_every} a repeat document), lr: {lr} then {lr2}, "
                 f"answer digits weigh {answer_weight}, threads: {threads}"]
    t0, c0 = time.time(), time.process_time()
    done = 0
    bar = tqdm(range(steps), desc="train", unit="step")
    ema = None
    for step in bar:
        phase1 = step < phase1_steps
        if phase1:  # repeat documents and lookup drills, alternating
            first = step * batch_size
            docs = [corpus.repeat_document(corpus.PHASE1_SEED, i, phase1_len + 1) if i % 2 == 0 else
                    corpus.lookup_document(corpus.PHASE1_SEED, i, phase1_len + 1) for i in range(first, first + batch_size)]
        else:  # every repeat_every-th document is still a repeat document, so copying is not forgotten
            first = (step - phase1_steps) * batch2
            docs = [corpus.repeat_document(corpus.TRAIN_SEED, i, cfg.max_seq_len + 1) if i % repeat_every == 0 else
                    corpus.document(corpus.TRAIN_SEED, i, cfg.max_seq_len + 1) for i in range(first, first + batch2)]
        x = torch.tensor([list(d) for d in docs])  # (B, T + 1)
        weight = torch.ones(x.shape[0], x.shape[1] - 1)  # (B, T): per predicted byte
        for b, d in enumerate(docs):
            weight[b, corpus.answer_positions(d)] = answer_weight
        logits = model(x[:, :-1])  # (B, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none")  # (B * T,)
        loss = (nll * weight.flatten()).sum() / weight.sum()
        update(model, opt, sched, loss)
        done = step + 1
        lv = loss.item()
        ema = lv if ema is None else 0.9 * ema + 0.1 * lv
        bar.set_postfix(loss=f"{ema:.3f}")
        if done % log_every == 0 or done == steps:
            log_lines.append(f"step {done:5d}  loss {lv:.4f}  ema {ema:.4f}  lr {sched.get_last_lr()[0]:.2e}"
                             f"  wall {time.time() - t0:6.1f}s  cpu/threads {60 * _cpu_minutes(c0, threads):6.1f}s")
        if eval_every and done % eval_every == 0:
            model.eval()
            copy = copy_accuracy(model)
            acc = recall_accuracy(model, 20) if not phase1 else (float("nan"), float("nan"))
            model.train()
            log_lines.append(f"step {done:5d}  copy {copy:.2f}  recall (20 probes) exact {acc[0]:.2f}  "
                             f"digit {acc[1]:.2f}")
            bar.write(log_lines[-1])
        if _cpu_minutes(c0, threads) > max_minutes:
            log_lines.append(f"stopped at step {done}: the {max_minutes}-minute limit (CPU time / threads) was reached")
            break
    train_s, train_cpu = time.time() - t0, 60 * _cpu_minutes(c0, threads)
    model.eval()
    stats = {
        "steps": done, "train_wall_seconds": round(train_s, 1), "train_cpu_seconds_per_thread": round(train_cpu, 1), 
        "tokens_seen": min(done, phase1_steps) * batch_size * phase1_len
        + max(done - phase1_steps, 0) * batch2 * cfg.max_seq_len,
        "heldout_loss": round(heldout_loss(model, eval_docs), 4),
        "unigram_loss": round(corpus.unigram_nll(heldout=corpus.batch(corpus.HELDOUT_SEED, 0, eval_docs,
                                                                      cfg.max_seq_len)), 4),
    }
    stats["copy_accuracy"] = round(copy_accuracy(model), 4)
    stats["recall_exact"], stats["recall_digit"] = recall_accuracy(model, eval_probes)
    d = [p[2] for p in recall_probes(eval_probes, cfg.max_seq_len)]
    stats["recall_distance_min_mean_max"] = [min(d), round(sum(d) / len(d), 1), max(d)]
    log_lines.append("result: " + json.dumps(stats))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(out))
    out.with_suffix(".json").write_text(json.dumps({"config": cfg.__dict__, "stats": stats}, indent=1) + "\n")
    (Path(log) if log is not None else out.with_name("train_log.txt")).write_text("\n".join(log_lines) + "\n")
    return stats


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.train", description=__doc__.split("\n")[0])
    d = {k: v.default for k, v in inspect.signature(train).parameters.items()}  # one set of defaults: train's
    ap.add_argument("--steps", type=int, default=d["steps"], help="all steps, phase 1 included")
    ap.add_argument("--phase1-steps", type=int, default=d["phase1_steps"])
    ap.add_argument("--batch", type=int, default=d["batch_size"], help="phase-1 batch (documents of 128 bytes)")
    ap.add_argument("--batch2", type=int, default=d["batch2"], help="phase-2 batch (documents of 512 bytes)")
    ap.add_argument("--lr", type=float, default=d["lr"], help="phase-1 learning rate")
    ap.add_argument("--lr2", type=float, default=d["lr2"], help="phase-2 learning rate (then cosine-decayed)")
    ap.add_argument("--answer-weight", type=float, default=d["answer_weight"],
                    help="loss weight of the answer digits of a recall (other bytes: 1)")
    ap.add_argument("--threads", type=int, default=d["threads"],
                    help="1 is robust on a shared machine (2 threads stall whenever one core is busy)")
    ap.add_argument("--max-minutes", type=float, default=d["max_minutes"],
                    help="stop early (and say so) past this much CPU time per thread (= wall time on an idle machine)")
    ap.add_argument("--eval-every", type=int, default=0, help="log copy and recall accuracy (20 probes) every N steps")
    ap.add_argument("--out", type=Path, default=CKPT)
    a = ap.parse_args(argv)
    stats = train(a.steps, a.batch, a.lr, phase1_steps=a.phase1_steps, batch2=a.batch2, lr2=a.lr2,
                  answer_weight=a.answer_weight, max_minutes=a.max_minutes, out=a.out, threads=a.threads,
                  eval_every=a.eval_every)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
