"""The speculative pair of chapter 12: a deeper target and a 1-layer draft distilled from it.

``python -m kvref.spec_pair`` trains both (about 15 minutes of one CPU core) and writes them to
``kvref/data/spec_target.*`` and ``kvref/data/spec_draft.*`` (+ a log each); ``spec_pair()`` loads
the committed ones.

Why these shapes. On a CPU a tiny model's decode step costs a fixed overhead per layer (Python,
kernel launches), not the bytes of its weights, so a draft is cheap only if it has far fewer
*layers* than the target, whatever its width: the target has 8 layers, the draft 1 (about a tenth
of a target step; ``python -m kvref.bench speculative`` measures it).

How the draft is trained. The target is trained by ``kvref.train`` on the course corpus like the
course's tiny model. The draft learns from the target itself (self-distillation): continuations
the target writes greedily from corpus prompts are the data, and the loss pulls the draft's
next-byte distribution towards the target's (KL) and its top choice onto the target's argmax (the
only thing greedy verification checks). Training a draft on the target's own outputs is what
Medusa's self-distillation does (Cai et al., 2024, "Medusa", section 2.3.2,
https://arxiv.org/abs/2401.10774) and what DistillSpec studies (Zhou et al., 2023,
https://arxiv.org/abs/2310.08461): the draft is judged on the target's text, so it learns that text.

    target, draft = spec_pair()
    out = kvref.speculative.generate(target, ids, 100, draft=draft, k=4)   # the target's greedy tokens
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
from .train import DATA, TINY_CONFIG, tiny_model, train, update

TARGET_CKPT = DATA / "spec_target.safetensors"
DRAFT_CKPT = DATA / "spec_draft.safetensors"

# 8 narrow layers (0.81 M parameters) over 256 bytes (training at 512 costs 4x per document on 2 shared
# cores); the draft: 1 layer (0.22 M), same byte vocabulary
TARGET_CONFIG = TINY_CONFIG.with_(n_layers=8, d_model=96, n_heads=6, n_kv_heads=2, head_dim=16, d_ff=256,
                                  max_seq_len=256)
DRAFT_CONFIG = TINY_CONFIG.with_(n_layers=1)


def spec_pair(device: torch.device | str = "cpu") -> tuple[Transformer, Transformer]:
    """The committed (target, draft), eval mode, fp32."""
    return tiny_model(TARGET_CKPT, device), tiny_model(DRAFT_CKPT, device)


def train_target(max_minutes: float = 10.0, out: Path = TARGET_CKPT) -> dict:
    """TARGET_CONFIG through ``kvref.train``'s second phase only, shortened: 1000 steps of four 256-byte corpus
    documents (no copying drills: the draft needs a target that writes the corpus's prose, not one that recalls)."""
    return train(steps=1000, phase1_steps=0, batch2=4, max_minutes=max_minutes, config=TARGET_CONFIG, out=out,
                 log=out.with_name(out.stem + "_log.txt"), eval_probes=20)


@torch.inference_mode()
def target_continuations(target: Transformer, n_batches: int, batch: int = 16, prompt: int = 128,
                         new: int = 128, seed: int = corpus.TRAIN_SEED) -> torch.Tensor:
    """(n_batches * batch, prompt + new) byte sequences: a corpus prompt, then the target's greedy continuation."""
    rows = []
    for i in range(n_batches):
        ids = corpus.batch(seed, 10_000 + i * batch, batch, prompt)  # corpus documents the target never saw
        rows.append(generate(target, ids, new).tokens.cpu())
    return torch.cat(rows)


def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per position plus cross-entropy on the teacher's argmax; both (N, V) -> ()."""
    t_logp = F.log_softmax(teacher_logits.float(), -1)
    s_logp = F.log_softmax(student_logits.float(), -1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
    return kl + F.cross_entropy(student_logits.float(), teacher_logits.argmax(-1))


def train_draft(target: Transformer, steps: int = 800, n_batches: int = 32, batch: int = 16, lr: float = 2e-3,
                seed: int = 0, max_minutes: float = 8.0, out: Path = DRAFT_CKPT, log_every: int = 50) -> dict:
    """Distil DRAFT_CONFIG from ``target`` on its own greedy continuations; save and return the stats."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    t0, c0 = time.time(), time.process_time()
    data = target_continuations(target, n_batches, batch)  # (N, S)
    gen_s = time.time() - t0
    with torch.inference_mode():
        teacher = torch.cat([target(x[:, :-1]).half() for x in data.split(batch)])  # (N, S - 1, V), fp16 to save RAM
    student = Transformer(DRAFT_CONFIG)
    opt = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(seed)
    lines = [f"config: {json.dumps(DRAFT_CONFIG.__dict__)}",
             f"params: {sum(p.numel() for p in student.parameters())}; data: {data.shape[0]} sequences of "
             f"{data.shape[1]} bytes (128 corpus bytes + 128 the target wrote greedily), made in {gen_s:.0f} s"]
    done = 0
    for step in range(steps):
        idx = torch.randint(0, data.shape[0], (batch,), generator=g)
        logits = student(data[idx, :-1])  # (B, S - 1, V)
        loss = distill_loss(logits.flatten(0, 1), teacher[idx].flatten(0, 1))
        update(student, opt, sched, loss)
        done = step + 1
        if done % log_every == 0 or done == steps:
            lines.append(f"step {done:5d}  loss {loss.item():.4f}  wall {time.time() - t0:6.1f}s")
        if (time.process_time() - c0) / 60 > max_minutes:
            lines.append(f"stopped at step {done}: the {max_minutes}-minute CPU limit was reached")
            break
    student.eval()
    stats = {"steps": done, "train_wall_seconds": round(time.time() - t0, 1),
             "greedy_agreement_heldout": round(agreement(target, student), 4)}
    lines.append("result: " + json.dumps(stats))
    save_file({k: v.contiguous() for k, v in student.state_dict().items() if k != "lm_head.weight"}, str(out))
    out.with_suffix(".json").write_text(json.dumps({"config": DRAFT_CONFIG.__dict__, "stats": stats}, indent=1) + "\n")
    out.with_name(out.stem + "_log.txt").write_text("\n".join(lines) + "\n")
    return stats


@torch.inference_mode()
def agreement(target: Transformer, draft: Transformer, n: int = 8, prompt: int = 128, new: int = 128) -> float:
    """How often the draft's argmax equals the target's, teacher-forced on the target's greedy continuations
    of held-out prompts (the per-token acceptance of greedy speculative decoding, k = 1)."""
    x = torch.cat([generate(target, corpus.batch(corpus.HELDOUT_SEED, 0, n, prompt), new).tokens])
    t, d = target(x[:, :-1]).argmax(-1), draft(x[:, :-1]).argmax(-1)  # (n, S - 1)
    return float((t[:, prompt - 1:] == d[:, prompt - 1:]).float().mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.spec_pair", description=__doc__.split("\n")[0])
    ap.add_argument("--skip-target", action="store_true", help="distil a draft from the committed target")
    ap.add_argument("--draft-steps", type=int, default=800)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not a.skip_target:
        print(json.dumps(train_target(), indent=1))
    target = tiny_model(TARGET_CKPT)
    print(json.dumps(train_draft(target, steps=a.draft_steps), indent=1))


if __name__ == "__main__":
    main()
