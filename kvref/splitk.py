"""Decode attention block by block: the online softmax, and split-K (Flash-Decoding).

One decode step's attention is q (B, H, T, D) against k, v (B, H_kv, S, D), usually with T = 1.
Its softmax needs the maximum and the sum of exp over all S scores, which seems to ask for all
S scores at once. It does not: cut the keys into blocks of ``block_size`` and keep, per query,

    m    the largest score seen so far
    l    the sum of exp(score - m) so far
    acc  the sum of exp(score - m) * v so far

When a block brings a larger maximum m', everything kept so far is rescaled by exp(m - m'). At the
end, acc / l is exactly softmax(scores) @ v. Two ways to walk the blocks:

* ``online_softmax_attention``: one after the other, with a running (m, l, acc): FlashAttention's
  loop, and what vLLM's PagedAttention kernel does as it follows the block table;
* ``split_k_attention``: every block on its own (in parallel on a GPU: Flash-Decoding), each giving
  a partial (m_j, l_j, acc_j), then one combine step rescales them to the common maximum.

Both read K/V one block at a time and never hold the (B, H, T, S) weights. They are written for
reading, not speed: ``F.scaled_dot_product_attention`` is the fast kernel they must equal.
Every query sees every key (a decode step, or a prompt's keys seen from after the prompt).
"""

from __future__ import annotations

import math

import torch


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1; got {block_size!r}")
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"need q (B, H, T, D) and k, v (B, H_kv, S, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1] or q.shape[-1] != k.shape[-1] or k.shape[2] == 0:
        raise ValueError(f"H={q.shape[1]} must be a multiple of H_kv={k.shape[1]}, D must match, S >= 1")


def _block_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Scores of one block of keys: its max m_j (B, H, T, 1), sum l_j and unnormalised output acc_j."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)  # (B, H, s, D): query head h reads K/V head h // n_rep
    v = v.repeat_interleave(n_rep, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, s), s = keys in this block
    m = scores.amax(dim=-1, keepdim=True)  # (B, H, T, 1)
    p = torch.exp(scores - m)  # (B, H, T, s), each <= 1: no overflow
    return m, p.sum(dim=-1, keepdim=True), p @ v  # (B, H, T, 1), (B, H, T, 1), (B, H, T, D)


def _fold(state: tuple | None, part: tuple) -> tuple:
    """Add one block's partial (m_j, l_j, acc_j) to the running (m, l, acc)."""
    if state is None:
        return part
    (m, l, acc), (m_j, l_j, acc_j) = state, part
    m_new = torch.maximum(m, m_j)
    old, new = torch.exp(m - m_new), torch.exp(m_j - m_new)  # rescale both to the new maximum
    return m_new, l * old + l_j * new, acc * old + acc_j * new


def online_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             block_size: int = 16) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v, reading ``block_size`` keys at a time with a running max and sum."""
    _check(q, k, v, block_size)
    state = None
    for start in range(0, k.shape[2], block_size):  # the last block may be shorter
        state = _fold(state, _block_partial(q, k[:, :, start:start + block_size], v[:, :, start:start + block_size]))
    _, l, acc = state
    return acc / l  # (B, H, T, D)


def split_k_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     block_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split-K's first pass: every block alone. (m, l, acc) stacked over n blocks on dim 0."""
    _check(q, k, v, block_size)
    parts = [_block_partial(q, k[:, :, s:s + block_size], v[:, :, s:s + block_size])
             for s in range(0, k.shape[2], block_size)]  # independent: one thread block each on a GPU
    m, l, acc = (torch.stack(x) for x in zip(*parts))  # (n, B, H, T, 1), (n, B, H, T, 1), (n, B, H, T, D)
    return m, l, acc


def combine_partials(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Split-K's second pass: rescale each block's partial to the common maximum, then normalise."""
    m_all = m.amax(dim=0)  # (B, H, T, 1)
    scale = torch.exp(m - m_all)  # (n, B, H, T, 1): exp(m_j - m), <= 1
    return (acc * scale).sum(dim=0) / (l * scale).sum(dim=0)  # (B, H, T, D)


def split_k_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v as Flash-Decoding computes it: partials per block, then one combine."""
    return combine_partials(*split_k_partials(q, k, v, block_size))


def paged_decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, tables: list[list[int]],
                           lengths: list[int], block_size: int) -> torch.Tensor:
    """What a paged decode kernel does, one sequence and one block at a time, in Python.

    ``k_pool``, ``v_pool`` (H_kv, slots, D) hold block i in slots [i * block_size, (i + 1) * block_size);
    sequence b's tokens are in the blocks ``tables[b]``, its ``lengths[b]`` keys in order. q (B, H, 1, D).
    Each block is sliced from the pool where it lies (a view, no copy) and folded into a running
    max and sum, as in ``online_softmax_attention``. Returns (B, H, 1, D).
    """
    out = []
    for b, (table, n) in enumerate(zip(tables, lengths)):
        if not 1 <= n <= len(table) * block_size:
            raise ValueError(f"sequence {b}: length {n} does not fit its {len(table)} blocks of {block_size}")
        state = None
        for i, block in enumerate(table[: -(-n // block_size)]):
            used = min(block_size, n - i * block_size)  # the last block may be partly filled
            start = block * block_size
            k_blk = k_pool[None, :, start:start + used]  # (1, H_kv, used, D), a view into the pool
            v_blk = v_pool[None, :, start:start + used]
            state = _fold(state, _block_partial(q[b:b + 1], k_blk, v_blk))
        out.append(state[2] / state[1])
    return torch.cat(out)  # (B, H, 1, D)
