"""PagedAttention's memory manager: the KV cache as a pool of fixed-size blocks.

A contiguous cache must reserve every sequence's maximum length up front, and sequences of
different lengths that come and go leave holes nobody can use. Paging (vLLM) cuts the cache into
blocks of ``block_size`` tokens (16 by default), hands them out one at a time as a sequence grows,
and keeps a *block table* per sequence: token i lives in block ``table[i // block_size]`` at
offset ``i % block_size``. Blocks need not be adjacent, so nothing fragments, and at most one
partly filled block per sequence is ever wasted. Blocks are reference-counted, so sequences can
share them: ``fork`` gives n samples of one prompt the prompt's blocks for free, and a shared,
partly filled block is copied only when one of them writes to it (copy on write).

The model never sees blocks. Before each forward the cache gathers every row's slots into the
slot-aligned view the model expects: (B, H_kv, S + T, D) with row b's tokens right-aligned and
the slots in front marked as padding, exactly like a left-padded batch.

    cache = PagedKVCache(cfg, num_blocks=64)
    cache.add_sequence("a"); cache.add_sequence("b")
    cache.begin(["a", "b"], [5, 3])                  # row 0 gets 5 new tokens, row 1 gets 3
    logits = model(ids, cache=cache, attention_mask=mask)  # ids (2, 5), row 1 left-padded
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import torch

from .cache import CropError, KVCache
from .config import ModelConfig
from .pool import BlockPool, CacheFull  # noqa: F401  (importable from here too)
from .prefix import PrefixCachingPool


@dataclass
class Sequence:
    table: list[int] = field(default_factory=list)  # block ids in token order
    length: int = 0  # slots stored
    n_real: int = 0  # of those, real tokens (the rest is padding, stored only in plain generate() use)
    real: torch.Tensor | None = None  # (length,) bool per slot, kept only once a padding slot is stored
    tokens: list[int] | None = None  # ids of the stored tokens, when the caller tells us (prefix caching)
    hashes: list = field(default_factory=list)  # one per full block (prefix caching)


class PagedKVCache(KVCache):
    """A KV cache stored in blocks, shared by many sequences; plugs into ``Transformer`` like any cache.

    Without ``begin``, each forward's rows are sequences 0..B-1 (so ``generate`` works unchanged).
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int = 16, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, prefix_caching: bool = False) -> None:
        super().__init__()
        if cfg.sliding_window is not None:
            raise ValueError("PagedKVCache does not implement sliding-window attention; "
                             "kvref.paged_hybrid.PagedHybridCache does (kvref.serve.Engine uses it for such models)")
        if prefix_caching:
            self.pool: BlockPool = PrefixCachingPool(num_blocks, block_size)
        else:
            self.pool = BlockPool(num_blocks, block_size)
        self.cfg, self.block_size = cfg, block_size
        dtype = dtype or torch.get_default_dtype()
        shape = (cfg.n_layers, cfg.n_kv_heads, num_blocks * block_size, cfg.head_dim)  # (L, H_kv, slots, D)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.seqs: dict[Hashable, Sequence] = {}
        self.cow_copies = 0  # blocks copied because a shared block was written
        self._step: dict | None = None  # the batch of the forward in flight (set by begin)

    # -- sequences -------------------------------------------------------------------------------
    def add_sequence(self, seq_id: Hashable, prompt: list[int] | None = None) -> int:
        """Start an empty sequence; with prefix caching, reuse cached blocks of ``prompt``.

        Returns how many prompt tokens are already cached (a multiple of block_size, always less
        than len(prompt) so the last prompt token is computed and yields logits).
        """
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} already exists; free it first")
        if prompt and hasattr(self.pool, "match_tokens"):  # a radix pool with pages smaller than blocks may
            table, hashes, n = self.pool.match_tokens(list(prompt))  # share a partly filled last block
        else:
            table, hashes = self.pool.match(list(prompt)) if prompt else ([], [])
            n = len(table) * self.block_size
        self.seqs[seq_id] = Sequence(table, n, n, None, [] if prompt is None else list(prompt[:n]), hashes)
        return n

    def fork(self, src: Hashable, dst: Hashable) -> None:
        """``dst`` starts as a copy of ``src`` that shares all of its blocks (nothing is copied yet)."""
        s = self.seqs[src]
        if dst in self.seqs:
            raise ValueError(f"sequence {dst!r} already exists")
        for b in s.table:
            self.pool.share(b)
        self.seqs[dst] = Sequence(list(s.table), s.length, s.n_real, s.real,  # real is never modified in place
                                  None if s.tokens is None else list(s.tokens), list(s.hashes))

    def free_sequence(self, seq_id: Hashable) -> None:
        """Give the sequence's blocks back (last block first, so a prefix cache evicts tails first)."""
        seq = self.seqs.pop(seq_id)
        for b in reversed(seq.table):
            self.pool.free(b)

    def reset(self) -> None:
        for seq_id in list(self.seqs):
            self.free_sequence(seq_id)
        self._step = None
        super().reset()

    # -- one forward -----------------------------------------------------------------------------
    def blocks_needed(self, seq_id: Hashable, n_new: int) -> int:
        """Blocks the pool must supply for ``n_new`` more tokens (new blocks + a copy on write)."""
        seq, bs = self.seqs[seq_id], self.block_size
        grow = max(0, -(-(seq.length + n_new) // bs) - len(seq.table))  # blocks of a failed step are reused
        cow = n_new > 0 and seq.length % bs != 0 and self._pinned(seq.table[-1])
        return grow + cow

    def _pinned(self, block: int) -> bool:
        """Is ``block`` read by someone else (another holder; a radix pool: its tree)? Then writes copy it."""
        pinned = getattr(self.pool, "pinned", None)
        return pinned(block) if pinned is not None else self.pool.refs[block] > 1

    def begin(self, seq_ids: list[Hashable], n_new: list[int] | int, token_ids: list[list[int]] | None = None) -> None:
        """Declare the next forward: row b continues ``seq_ids[b]`` by ``n_new[b]`` tokens.

        Blocks are claimed here, before any compute, all or nothing (``CacheFull`` otherwise).
        The forward's input is (B, max n_new), each row left-padded (attention_mask 0 in front).
        ``token_ids`` (the new ids per row) lets a prefix cache remember full blocks.
        """
        n_new = [n_new] * len(seq_ids) if isinstance(n_new, int) else list(n_new)
        unknown = [s for s in seq_ids if s not in self.seqs]
        if unknown or len(set(seq_ids)) != len(seq_ids) or len(n_new) != len(seq_ids) or not seq_ids:
            raise ValueError(f"begin needs distinct, existing sequences, one count each; unknown: {unknown}")
        if token_ids is not None and [len(x) for x in token_ids] != n_new:
            raise ValueError("token_ids must hold exactly n_new[b] ids for each row b")
        for s, t in zip(seq_ids, n_new):
            if t < 1:
                raise ValueError(f"sequence {s!r}: n_new must be >= 1; got {t}")
            if self.seqs[s].length + t > self.cfg.max_seq_len:
                raise ValueError(f"sequence {s!r} would grow to {self.seqs[s].length + t} tokens, "
                                 f"past max_seq_len={self.cfg.max_seq_len}")
        need = sum(self.blocks_needed(s, t) for s, t in zip(seq_ids, n_new))  # (counts one copy too many if
        if need > self.pool.num_free:  # all holders of a shared block write it in this very step)
            raise CacheFull(need, self.pool.num_free, self.pool.num_blocks, self.block_size)
        for s, t in zip(seq_ids, n_new):
            self._grow(self.seqs[s], t)
        self._step = {"ids": list(seq_ids), "n_new": n_new, "token_ids": token_ids}
        self._build_view()

    def _grow(self, seq: Sequence, n_new: int) -> None:
        bs = self.block_size
        if seq.length % bs and self._pinned(seq.table[-1]):  # copy on write
            old, new = seq.table[-1], self.pool.allocate(1)[0]
            self.k[:, :, new * bs:(new + 1) * bs] = self.k[:, :, old * bs:(old + 1) * bs]
            self.v[:, :, new * bs:(new + 1) * bs] = self.v[:, :, old * bs:(old + 1) * bs]
            self.pool.free(old)
            seq.table[-1] = new
            self.cow_copies += 1
        seq.table += self.pool.allocate(max(0, -(-(seq.length + n_new) // bs) - len(seq.table)))

    def _build_view(self) -> None:
        """Slot ids of the (B, S + T) view: row b's n_b old tokens end at slot S, its t_b new ones at S + T."""
        step, bs, dev = self._step, self.block_size, self.k.device
        seqs = [self.seqs[s] for s in step["ids"]]
        lengths, B = [s.length for s in seqs], len(seqs)
        S, T = max(lengths), max(step["n_new"])
        n = torch.tensor(lengths, device=dev)[:, None]  # (B, 1)
        t = torch.tensor(step["n_new"], device=dev)[:, None]
        width = max(len(s.table) for s in seqs)
        tables = torch.tensor([s.table + [0] * (width - len(s.table)) for s in seqs], device=dev)  # (B, blocks)
        j = torch.arange(S + T, device=dev)[None]  # (1, S + T)
        tok = torch.where(j < S, j - (S - n), n + j - S - (T - t)).clamp(min=0)  # token index held by each slot
        valid = torch.where(j < S, j >= S - n, j - S >= T - t)  # (B, S + T)
        slot = tables.gather(1, tok // bs) * bs + tok % bs
        step["read"] = torch.where(valid, slot, 0).flatten()  # padding reads slot 0: finite, masked out
        ragged = min(step["n_new"]) < T
        step["write"] = slot[:, S:][valid[:, S:]] if ragged else slot[:, S:].flatten()  # where new tokens go
        step["src"] = torch.arange(B * T, device=dev).view(B, T)[valid[:, S:]] if ragged else None
        step["shape"] = (B, S, T)
        self.real = valid[:, :S].clone()  # (B, S) what the model sees as cached
        for b, s in enumerate(seqs):
            if s.real is not None:  # stored padding (generate() with a left-padded prompt)
                self.real[b, S - s.length:] = s.real
        self.length, self.seen = S, max(a + b for a, b in zip(lengths, step["n_new"])) - T  # seen + T = longest
        self.next_pos = torch.tensor([s.n_real for s in seqs], device=dev)  # sequence, so the model's max_seq_len
        self.padded = ragged or min(lengths) < S or any(s.n_real < s.length for s in seqs)  # check bounds real ones

    def check(self, cfg: ModelConfig, batch: int, new_tokens: int, dtype: torch.dtype, device) -> None:
        spec = (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, dtype, torch.device(device).type)
        mine = (self.k.shape[0], self.k.shape[1], self.k.shape[3], self.k.dtype, self.k.device.type)
        if spec != mine:
            raise ValueError(f"this PagedKVCache holds (L, H_kv, D, dtype, device) = {mine}; the model has {spec}")
        if self._step is None:  # plain use, as with any other cache: rows are sequences 0..B-1
            others = set(self.seqs) - set(range(batch))
            if others:
                raise ValueError(f"the cache holds sequences {sorted(map(repr, others))}: call begin() first")
            for b in range(batch):
                self.seqs.setdefault(b, Sequence())
            self.begin(list(range(batch)), new_tokens)
        B, S, T = self._step["shape"]
        if (batch, new_tokens) != (B, T):
            raise ValueError(f"begin() announced a ({B}, {T}) input; the model got ({batch}, {new_tokens})")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, S, T = self._step["shape"]
        out = []
        for pool, new in ((self.k[layer], k), (self.v[layer], v)):  # pool (H_kv, slots, D)
            new = new.transpose(0, 1).reshape(new.shape[1], B * T, -1)  # (H_kv, B*T, D)
            if self._step["src"] is not None:  # drop the padding of ragged rows
                new = new.index_select(1, self._step["src"])
            pool.index_copy_(1, self._step["write"], new)
            view = pool.index_select(1, self._step["read"])  # (H_kv, B*(S+T), D): the gather
            out.append(view.view(view.shape[0], B, S + T, -1).transpose(0, 1))  # (B, H_kv, S+T, D)
        return out[0], out[1]

    def advance(self, real: torch.Tensor) -> None:
        step, self._step = self._step, None
        B, S, T = step["shape"]
        t = torch.tensor(step["n_new"], device=real.device)[:, None]
        announced = torch.arange(T, device=real.device)[None] >= T - t  # (B, T) the slots begin() stores
        if bool(((real != announced) & (t < T)).any()):  # a row narrower than T must be left-padded exactly
            for s in step["ids"]:  # give back the blocks claimed for this step
                seq = self.seqs[s]
                while len(seq.table) > -(-seq.length // self.block_size):
                    self.pool.free(seq.table.pop())
            raise ValueError("the attention_mask must mark exactly each row's last n_new[b] tokens as real "
                             "(rows left-padded to the widest), as announced to begin()")
        n_real = real.sum(dim=1).tolist()
        for b, (s, n) in enumerate(zip(step["ids"], step["n_new"])):
            seq = self.seqs[s]
            if seq.real is not None or n_real[b] < n:  # padding stored: keep per-slot flags from now on
                old = torch.ones(seq.length, dtype=torch.bool, device=real.device) if seq.real is None else seq.real
                seq.real = torch.cat([old, real[b, T - n:]])
            seq.length, seq.n_real = seq.length + n, seq.n_real + n_real[b]
            ids = step["token_ids"]
            if ids is None or seq.tokens is None:
                seq.tokens = None  # ids unknown: this sequence's blocks cannot be shared by content
            else:
                seq.tokens += list(ids[b])
                self.pool.commit(seq.table, seq.tokens, seq.hashes)

    # -- rollback (speculative decoding) ---------------------------------------------------------
    def crop_sequence(self, seq_id: Hashable, length: int) -> None:
        """Keep the first ``length`` tokens of one sequence; whole blocks past the cut go back to the pool.

        The block the cut falls inside stays in the table, partly filled. If another holder shares it
        (``fork``, or a prefix-cache hit), it is never written: the next step copies it first (copy on
        write, as for any shared partial block). If only the prefix cache still names it (a full block
        this sequence alone holds, registered under the hash of its tokens), it is dropped from the
        prefix cache before its tail is overwritten, so no later request can match stale K/V.
        """
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise CropError(f"no sequence {seq_id!r} in this cache")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= seq.length:
            raise CropError(f"crop keeps the first `length` tokens: an integer from 0 to the {seq.length} tokens "
                            f"sequence {seq_id!r} holds; got {length!r}")
        bs = self.block_size
        while len(seq.table) > -(-length // bs):  # whole blocks past the cut, last first
            self.pool.free(seq.table.pop())
        if length % bs and self.pool.refs[seq.table[-1]] == 1:
            self._unregister(seq.table[-1])  # private now, and about to be rewritten
        if seq.real is not None:
            seq.real = seq.real[:length]
            seq.n_real = int(seq.real.sum())
        else:
            seq.n_real = length
        seq.length = length
        if seq.tokens is not None:
            seq.tokens = seq.tokens[:length]
        seq.hashes = seq.hashes[: length // bs]  # only full blocks are named

    def _unregister(self, block: int) -> None:
        hash_of = getattr(self.pool, "hash_of", None)  # a PrefixCachingPool's index (kvref.prefix)
        if hash_of is not None and block in hash_of:
            del self.pool.by_hash[hash_of.pop(block)]

    def crop(self, length: int) -> None:
        """Plain use (rows are sequences 0..B-1, as ``generate`` drives it): crop every row to ``length``."""
        if self._step is not None:
            raise CropError("crop between forward calls, not after begin() announced one")
        rows = sorted(s for s in self.seqs if isinstance(s, int))
        if not rows or rows != list(range(len(self.seqs))):
            raise CropError("crop(length) is for plain use (sequences 0..B-1); use crop_sequence(seq_id, length)")
        held = min(self.seqs[b].length for b in rows)
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= held:
            raise CropError(f"crop keeps the first `length` tokens: an integer from 0 to the {held} tokens each "
                            f"row holds; got {length!r}")
        for b in rows:
            self.crop_sequence(b, length)
        self.length = self.seen = length

    # -- accounting ------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """The whole pool (preallocated): kv_cache_bytes(cfg, 1, num_blocks * block_size, dtype)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def tokens_stored(self) -> int:
        """Slots holding K/V, counting a block shared by several sequences once."""
        filled = {}
        for seq in self.seqs.values():
            for i, b in enumerate(seq.table):
                filled[b] = max(filled.get(b, 0), min(self.block_size, seq.length - i * self.block_size))
        return sum(filled.values())
