"""Block-by-block decode attention (online softmax, split-K, paged) equals SDPA in fp32.

Bound 1e-5: the same sums in another order, in fp32 (the project's bound for fp32 paths).
The scores are scaled up (x 8) so that the softmax is peaked and blocks have very different
maxima: a combine that forgot to rescale a block by exp(m_j - m) would be off by O(1).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvref.splitk import (combine_partials, online_softmax_attention, paged_decode_attention, split_k_attention,
                          split_k_partials)

TOL = 1e-5


def qkv(B=2, H=4, H_kv=2, T=1, S=37, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = 8 * torch.randn(B, H, T, D, generator=g)
    return q, torch.randn(B, H_kv, S, D, generator=g), torch.randn(B, H_kv, S, D, generator=g)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize("fn", [online_softmax_attention, split_k_attention])
@pytest.mark.parametrize("S,block", [(37, 16), (1, 16), (16, 16), (33, 5), (64, 1), (7, 64)])
def test_blockwise_equals_sdpa(fn, S, block):
    # 37 / 16 and 33 / 5: the block size does not divide S (a short last block); 16 / 16 divides it;
    # S = 1 and block 64 > S: one block only; block 1: every key its own block
    q, k, v = qkv(S=S)
    assert (fn(q, k, v, block) - sdpa(q, k, v)).abs().max() <= TOL


@pytest.mark.parametrize("fn", [online_softmax_attention, split_k_attention])
def test_several_queries_and_mqa(fn):
    q, k, v = qkv(B=3, H=6, H_kv=1, T=5, S=29)  # MQA, 5 queries that all see all 29 keys
    assert (fn(q, k, v, 8) - sdpa(q, k, v)).abs().max() <= TOL


def test_partials_are_per_block_and_the_combine_rescales():
    q, k, v = qkv(S=20)
    m, l, acc = split_k_partials(q, k, v, block_size=8)
    assert m.shape[0] == 3  # 8 + 8 + 4 keys
    assert (m.amax(0) - m.amin(0)).max() > 1  # blocks really have different maxima
    naive = acc.sum(0) / l.sum(0)  # forgetting to rescale: what the combine must not do
    assert (naive - sdpa(q, k, v)).abs().max() > 1e-2
    assert (combine_partials(m, l, acc) - sdpa(q, k, v)).abs().max() <= TOL


def test_paged_reads_blocks_through_the_table():
    # three sequences of odd lengths scattered over a pool of 4-slot blocks; the reference is
    # SDPA on each sequence's K/V laid out contiguously
    g = torch.Generator().manual_seed(1)
    H, H_kv, D, bs = 4, 2, 8, 4
    k_pool, v_pool = torch.randn(H_kv, 12 * bs, D, generator=g), torch.randn(H_kv, 12 * bs, D, generator=g)
    tables, lengths = [[7, 2, 9], [0], [11, 3, 5, 1]], [9, 3, 16]
    q = 8 * torch.randn(3, H, 1, D, generator=g)
    out = paged_decode_attention(q, k_pool, v_pool, tables, lengths, bs)
    for b, (table, n) in enumerate(zip(tables, lengths)):
        slots = torch.tensor([blk * bs + i for blk in table for i in range(bs)][:n])
        ref = sdpa(q[b:b + 1], k_pool[None, :, slots], v_pool[None, :, slots])
        assert (out[b:b + 1] - ref).abs().max() <= TOL


def test_bad_input_is_refused():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="block_size"):
        split_k_attention(q, k, v, 0)
    with pytest.raises(ValueError, match="multiple"):
        online_softmax_attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match="does not fit"):
        paged_decode_attention(q[:1], k[0], v[0], [[0]], [17], 16)
