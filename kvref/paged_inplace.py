"""PagedAttention's read, in place: decode attention over the block pool through FlexAttention.

``PagedKVCache`` (kvref/paged.py) gathers every row's blocks into a contiguous copy before
attention: easy to check, and a copy of all S cached rows, per layer, per step. This cache
stores K/V exactly as it does (same pool, same block tables, same bookkeeping), but in a
decode step (one new token per row) attention reads the keys and values where they lie:

    flex_attention(q (B, H, 1, D), K pool (1, H_kv, slots, D), V pool, block_mask)

The ``BlockMask`` is the block table in the form FlexAttention takes: for query row b, the
physical blocks it must visit: its full blocks (``full_kv_indices[b]``, in table order), read
without any mask, and its partly filled last block (``kv_indices[b]``), where a ``mask_mod``
hides the slots not yet written. FlexAttention skips every
block not listed, so each row reads its own blocks and nothing else; compiled, it runs the
online softmax of kvref/splitk.py over them (FlashAttention's running max and sum).

Prefill (T > 1), ragged steps and sequences that stored padding fall back to the gather.
``bytes_copied`` counts what the gather copied (0 for in-place steps).
Uncompiled, ``flex_attention`` computes the masked scores against every pool slot (a reference
implementation, slow); ``compile=True`` (default) uses ``torch.compile(flex_attention)``.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from .config import ModelConfig
from .paged import PagedKVCache

_COMPILED = None


def compiled_flex_attention():
    """``torch.compile(flex_attention)``, built once per process (the first call compiles)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


class InPlacePagedKVCache(PagedKVCache):
    """A ``PagedKVCache`` whose decode steps attend to the block pool in place (FlexAttention)."""

    reads_in_place = True

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = 16, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, prefix_caching: bool = False, compile: bool = True,
                 in_place: bool = True) -> None:
        super().__init__(cfg, num_blocks, block_size, dtype, device, prefix_caching)
        self.flex = compiled_flex_attention() if compile else flex_attention
        self.in_place = in_place  # False: always gather (the reference path, with its bytes counted)
        self.bytes_copied = 0  # bytes the gather wrote, summed over layers and steps
        self.in_place_steps = 0  # forwards that read the pool in place
        dev = self.k.device
        self._p2l = torch.full((1, num_blocks), -1, dtype=torch.long, device=dev)  # (B, blocks): physical -> logical
        self._kv_len = torch.zeros(1, dtype=torch.long, device=dev)  # (B,) keys per row, the new one included

    def _mask_mod(self, b, h, q_idx, kv_idx):
        """Slot ``kv_idx`` of the pool is visible to row b if it holds one of b's first kv_len[b] tokens."""
        bs = self.block_size
        logical = self._p2l[b, kv_idx // bs]  # which of row b's blocks this is (-1: not b's)
        return (logical >= 0) & (logical * bs + kv_idx % bs < self._kv_len[b])

    def _build_view(self) -> None:
        step = self._step
        seqs = [self.seqs[s] for s in step["ids"]]
        if not (self.in_place and max(step["n_new"]) == 1 and all(s.real is None for s in seqs)):
            step["block_mask"] = None
            return super()._build_view()
        # decode: every row gets one token, none stored padding. The bookkeeping the model reads:
        B, dev, bs = len(seqs), self.k.device, self.block_size
        S = max(s.length for s in seqs)
        lengths = torch.tensor([s.length for s in seqs], device=dev)
        self.real = torch.arange(S, device=dev)[None] >= S - lengths[:, None]  # (B, S) right-aligned, as the gather
        self.length, self.seen = S, S
        self.next_pos = torch.tensor([s.n_real for s in seqs], device=dev)
        self.padded = bool((lengths < S).any())
        # where the new tokens go, and the block table as FlexAttention's BlockMask
        n_blocks = self.pool.num_blocks
        table = torch.zeros(B, n_blocks, dtype=torch.int32)  # (B, blocks), padded with block 0 (never visited)
        p2l = torch.full((B, n_blocks), -1, dtype=torch.long)
        for b, s in enumerate(seqs):
            table[b, :len(s.table)] = torch.tensor(s.table, dtype=torch.int32)
            p2l[b, s.table] = torch.arange(len(s.table))
        step["write"] = torch.tensor([s.table[s.length // bs] * bs + s.length % bs for s in seqs], device=dev)
        if self._p2l.shape != p2l.shape:
            self._p2l, self._kv_len = p2l.to(dev), lengths + 1
        else:  # in place: the mask_mod reads these two tensors
            self._p2l.copy_(p2l)
            self._kv_len.copy_(lengths + 1)
        # full blocks need no mask_mod; the partly filled last block (if any) does
        n_full = torch.tensor([(s.length + 1) // bs for s in seqs], dtype=torch.int32)  # (B,)
        n_part = torch.tensor([int((s.length + 1) % bs != 0) for s in seqs], dtype=torch.int32)
        part = torch.zeros(B, n_blocks, dtype=torch.int32)
        part[:, 0] = torch.tensor([s.table[(s.length + 1) // bs] if (s.length + 1) % bs else 0 for s in seqs])
        as_mask = lambda t: t.view(B, 1, 1, -1).to(dev)  # noqa: E731  (B, H=1, query blocks=1, ...)
        step["block_mask"] = BlockMask.from_kv_blocks(
            as_mask(n_part)[..., 0], as_mask(part), as_mask(n_full)[..., 0], as_mask(table), BLOCK_SIZE=(1, bs),
            mask_mod=self._mask_mod, seq_lengths=(1, n_blocks * bs))
        step["shape"] = (B, S, 1)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self._step.get("block_mask") is None:  # prefill or ragged: the gather of PagedKVCache
            k_all, v_all = super().update(layer, k, v)
            self.bytes_copied += k_all.numel() * k_all.element_size() + v_all.numel() * v_all.element_size()
            return k_all, v_all
        for pool, new in ((self.k[layer], k), (self.v[layer], v)):  # pool (H_kv, slots, D), new (B, H_kv, 1, D)
            pool.index_copy_(1, self._step["write"], new[:, :, 0].transpose(0, 1))  # (H_kv, B, D) to B slots
        return None, None  # nothing gathered: attend() reads the pool

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, attend_fn) -> torch.Tensor:
        """Called by the model instead of update() + attention: store k, v (B, H_kv, T, D), attend q (B, H, T, D)."""
        k_all, v_all = self.update(layer, k, v)
        if k_all is not None:
            return attend_fn(q, k_all, v_all, mask)
        if layer == 0:
            self.in_place_steps += 1
        pool_k, pool_v = self.k[layer][None], self.v[layer][None]  # (1, H_kv, slots, D): the pool itself
        with warnings.catch_warnings():  # compile=False chose the unfused reference on purpose
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return self.flex(q, pool_k, pool_v, block_mask=self._step["block_mask"],
                             enable_gqa=q.shape[1] != pool_k.shape[1])  # (B, H, 1, D)
