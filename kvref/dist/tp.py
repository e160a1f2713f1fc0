"""Tensor parallelism: each of W ranks holds 1/W of every layer's heads, and so 1/W of the KV cache.

    out = run_tp("path/to/hf_model", input_ids, max_new_tokens=16, world_size=2)
    out.tokens, out.cache_bytes_per_rank

Megatron's split, as vLLM does it, on kvref's model:

- q, k, v projections are column-parallel: rank r computes only its own heads (no communication);
- the attention output projection and the MLP's down projection are row-parallel: each rank multiplies
  its slice of the inputs and an all-reduce sums the partial outputs (the only communication, two
  all-reduces per layer);
- the MLP's up (and gate) projection is column-parallel, so its output slice feeds the row-parallel down;
- embeddings, norms and the LM head are replicated (vLLM splits the vocabulary too; kvref keeps it whole).

Rank r keeps the K/V of the heads it computes. With W <= H_kv that is H_kv / W heads; with W > H_kv a
K/V head cannot be split, so it is *replicated*: rank r keeps the one K/V head its H / W query heads read,
and W / H_kv ranks keep a copy of each (vLLM: ``num_kv_heads = max(1, H_kv // tp_size)``). Past H_kv,
more GPUs no longer shrink the cache per GPU.

Also runnable as ``torchrun --nproc-per-node 2 -m kvref.dist.tp --model DIR --ids 1,2,3 --new 8``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from ..cache import StaticCache
from ..config import ModelConfig
from ..generate import generate
from ..model import Attention, Block, Transformer
from ..modules import Linear
from ..planner import kv_heads_per_rank
from .launch import DEFAULT_TIMEOUT_S, init_from_env, launch


class TPConfigError(ValueError):
    """The world size cannot split this model's heads (or MLP) evenly."""


def check_split(cfg: ModelConfig, world_size: int) -> None:
    """Raise TPConfigError unless ``world_size`` splits H, H_kv (or replicates it) and d_ff evenly."""
    H, H_kv, W = cfg.n_heads, cfg.n_kv_heads, world_size
    if not isinstance(W, int) or W < 1:
        raise TPConfigError(f"world_size must be an integer >= 1; got {W!r}")
    if cfg.layered or cfg.arch not in ("llama", "gpt2"):
        raise TPConfigError("run_tp splits the plain GPT-2 and Llama layers only (no per-layer kinds)")
    allowed = [w for w in range(1, H + 1) if H % w == 0 and (H_kv % w == 0 or w % H_kv == 0)
               and cfg.d_ff % w == 0]
    if W not in allowed:
        raise TPConfigError(
            f"world_size {W} cannot split this model: it must divide H={H} and d_ff={cfg.d_ff}, and either divide "
            f"H_kv={H_kv} or be a multiple of it (then K/V heads are replicated); allowed: {allowed}")


def local_config(cfg: ModelConfig, world_size: int) -> ModelConfig:
    """The shape one rank runs: H / W query heads, its K/V heads, d_ff / W; d_model unchanged."""
    check_split(cfg, world_size)
    return cfg.with_(n_heads=cfg.n_heads // world_size, n_kv_heads=kv_heads_per_rank(cfg.n_kv_heads, world_size),
                     head_dim=cfg.head_dim, d_ff=cfg.d_ff // world_size)


def rank_heads(cfg: ModelConfig, rank: int, world_size: int) -> tuple[range, range]:
    """(query heads, K/V heads) rank ``rank`` computes. With replication the K/V range is the one head
    that the rank's query heads share: head h reads K/V head h // (H / H_kv)."""
    h = cfg.n_heads // world_size
    q = range(rank * h, (rank + 1) * h)
    kv_per = kv_heads_per_rank(cfg.n_kv_heads, world_size)
    first = q.start // cfg.n_rep if world_size > cfg.n_kv_heads else rank * kv_per
    return q, range(first, first + kv_per)


def shard_qkv(weight: torch.Tensor, cfg: ModelConfig, rank: int, world_size: int) -> torch.Tensor:
    """Rows of the fused q|k|v weight (or bias) that rank ``rank`` computes: its query heads, then its K/V
    heads' rows of k and of v. weight: ((H + 2 H_kv) D, d_model) -> ((H/W + 2 h_kv) D, d_model)."""
    H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = weight.split([H * D, H_kv * D, H_kv * D], dim=0)
    qh, kvh = rank_heads(cfg, rank, world_size)
    rows = lambda t, heads: t[heads.start * D:heads.stop * D]  # noqa: E731  (heads are contiguous rows of D)
    return torch.cat([rows(q, qh), rows(k, kvh), rows(v, kvh)], dim=0)


class RowParallelLinear(Linear):
    """y = all_reduce(x_r @ W_r.T) + b: the rank's input slice times its weight columns, summed over
    ranks. The bias is added once, after the sum."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(y)  # every rank now holds the full output
        return y if self.bias is None else y + self.bias


def _column(w: torch.Tensor, rank: int, world_size: int, dim: int = 0) -> torch.Tensor:
    return w.chunk(world_size, dim=dim)[rank]


@torch.no_grad()
def shard_model(full: Transformer, rank: int, world_size: int) -> Transformer:
    """A Transformer of ``local_config`` shape holding rank ``rank``'s slices of ``full``'s weights."""
    cfg, lcfg = full.cfg, local_config(full.cfg, world_size)
    part = Transformer(lcfg, dtype=full.dtype).eval()
    for i, (fb, pb) in enumerate(zip(full.blocks, part.blocks)):
        fb: Block
        pa: Attention = pb.attn
        pa.qkv.weight.copy_(shard_qkv(fb.attn.qkv.weight, cfg, rank, world_size))
        if fb.attn.qkv.bias is not None:
            pa.qkv.bias.copy_(shard_qkv(fb.attn.qkv.bias, cfg, rank, world_size))
        proj = RowParallelLinear(lcfg.n_heads * cfg.head_dim, cfg.d_model, bias=fb.attn.proj.bias is not None)
        proj.weight.copy_(_column(fb.attn.proj.weight, rank, world_size, dim=1))  # (d_model, H/W * D)
        if proj.bias is not None:
            proj.bias.copy_(fb.attn.proj.bias)
        pa.proj = proj.to(full.dtype)
        up = fb.mlp.up.weight
        if cfg.arch == "gpt2":
            pb.mlp.up.weight.copy_(_column(up, rank, world_size))
            pb.mlp.up.bias.copy_(_column(fb.mlp.up.bias, rank, world_size))
        else:  # gate|up fused: slice each half, keep them fused
            gate, upw = up.chunk(2, dim=0)
            pb.mlp.up.weight.copy_(torch.cat([_column(gate, rank, world_size), _column(upw, rank, world_size)]))
        down = RowParallelLinear(lcfg.d_ff, cfg.d_model, bias=fb.mlp.down.bias is not None)
        down.weight.copy_(_column(fb.mlp.down.weight, rank, world_size, dim=1))  # (d_model, d_ff / W)
        if down.bias is not None:
            down.bias.copy_(fb.mlp.down.bias)
        pb.mlp.down = down.to(full.dtype)
        pb.norm1.load_state_dict(fb.norm1.state_dict())
        pb.norm2.load_state_dict(fb.norm2.state_dict())
    part.tok_emb.weight.copy_(full.tok_emb.weight)
    if part.pos_emb is not None:
        part.pos_emb.weight.copy_(full.pos_emb.weight)
    part.norm.load_state_dict(full.norm.state_dict())
    if not cfg.tie_embeddings:
        part.lm_head.weight.copy_(full.lm_head.weight)
    return part


@dataclass
class TPResult:
    tokens: list[list[int]]  # (B, T + N) the prompt and the new tokens, as rank 0 produced them
    cache_bytes_per_rank: list[int]  # each rank's KV cache after generation (StaticCache of T + N slots)
    kv_heads_per_rank: list[list[int]]  # which K/V heads each rank kept


def tp_worker(rank: int, world_size: int, model_dir: str, ids: list[list[int]], max_new_tokens: int) -> dict:
    """What every rank runs: load, keep its slice, generate greedily (all ranks choose the same token,
    since the all-reduced logits are identical everywhere)."""
    from ..hf import load_hf

    torch.set_num_threads(1)
    full = load_hf(model_dir, layout="out_in")
    cfg = full.cfg
    part = shard_model(full, rank, world_size)
    del full
    input_ids = torch.tensor(ids, dtype=torch.long)
    B, T = input_ids.shape
    cache = StaticCache(part.cfg, B, T + max_new_tokens, dtype=part.dtype)
    out = generate(part, input_ids, max_new_tokens, cache=cache)
    return {"tokens": out.tokens.tolist(), "cache_bytes": int(cache.nbytes),
            "kv_heads": list(rank_heads(cfg, rank, world_size)[1])}


def read_config(model_dir: str) -> ModelConfig:
    """The kvref config of a Hugging Face model folder (read in the parent, before any process starts)."""
    import json
    from pathlib import Path

    from ..hf import config_from_hf

    cfg_file = Path(model_dir) / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{model_dir} has no config.json; expected a Hugging Face model folder")
    return config_from_hf(json.loads(cfg_file.read_text()))


def check_request(cfg: ModelConfig, input_ids: torch.Tensor, max_new_tokens: int) -> None:
    """ValueError for a request no rank could serve, before any process starts."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype not in (
            torch.long, torch.int32) or input_ids.numel() == 0:
        raise ValueError("input_ids must be a non-empty (B, T) integer tensor")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {cfg.vocab_size - 1}]")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1; got {max_new_tokens!r}")
    if input_ids.shape[1] + max_new_tokens > cfg.max_seq_len:
        raise ValueError(f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"max_seq_len = {cfg.max_seq_len}")


def run_tp(model_dir: str, input_ids: torch.Tensor, max_new_tokens: int, world_size: int,
           port: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> TPResult:
    """Generate greedily with the model in ``model_dir`` split over ``world_size`` gloo processes.

    Checks the split before starting anything (TPConfigError); a rank that fails or a collective that
    waits past ``timeout_s`` gives PeerFailed (kvref.dist.launch)."""
    cfg = read_config(model_dir)
    check_split(cfg, world_size)
    check_request(cfg, input_ids, max_new_tokens)
    outs = launch(tp_worker, world_size, (str(model_dir), input_ids.tolist(), max_new_tokens), port=port,
                  timeout_s=timeout_s)
    if any(o["tokens"] != outs[0]["tokens"] for o in outs):
        raise RuntimeError("ranks disagree on the tokens; the all-reduce did not give every rank the same logits")
    return TPResult(tokens=outs[0]["tokens"], cache_bytes_per_rank=[o["cache_bytes"] for o in outs],
                    kv_heads_per_rank=[o["kv_heads"] for o in outs])


def main() -> None:
    p = argparse.ArgumentParser(description="tensor-parallel greedy generation (run under torchrun)")
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--ids", required=True, help="prompt token ids, comma separated")
    p.add_argument("--new", type=int, default=8, help="new tokens")
    a = p.parse_args()
    rank, world = init_from_env()
    try:
        out = tp_worker(rank, world, a.model, [[int(t) for t in a.ids.split(",")]], a.new)
        # One write per line: the ranks share one stdout, and a line written in pieces interleaves with the others'.
        lines = [f"tokens {out['tokens'][0]}\n"] if rank == 0 else []
        lines.append(f"rank {rank}: K/V heads {out['kv_heads']}, cache {out['cache_bytes']} bytes\n")
        for line in lines:
            sys.stdout.write(line)
            sys.stdout.flush()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
