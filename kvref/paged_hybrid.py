"""The paged cache for models whose layers differ: full, sliding-window and latent (MLA) layers on one pool.

``kvref.paged`` gives every layer the same block table. A hybrid model cannot share one: a sliding
layer of window W never reads a token again once W newer ones exist, while a full layer reads every
token to the end. vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_coordinator.py,
single_type_kv_cache_manager.py, v0.11) keeps one block table per *group* of layers of one kind,
all drawn from one block pool. This module does the same:

* groups "full", "sliding" and "latent" each keep a block table per sequence; block ids come
  from one ``BlockPool`` (a block belongs to one group at a time). Full and sliding blocks hold
  K and V (H_kv heads of D numbers per token and layer); latent blocks hold (r + d_R) numbers per
  token and layer (kvref.mla). Full and sliding groups share their storage rows, as vLLM's
  layout shares one tensor per layer position between groups.
* after each step a sliding group gives back every block whose tokens all lie more than W - 1
  tokens before the sequence's next token: no later query can see them.
* the forward sees, per group, the usual left-padded (B, S_g + T) view: every held token for
  full and latent layers, only the last W - 1 held tokens for sliding ones (the mask still applies
  the window to the new tokens).

Prefix caching (``"hash"`` or ``"radix"``) follows vLLM's hybrid rule, kvref.hybrid_pool: full and
latent groups need every block of a prefix, a sliding group only those of its last window.

Driven by ``begin`` (kvref.serve.Engine), like PagedKVCache; plain ``generate`` use is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Hashable

import torch

from .cache import CropError
from .hybrid_pool import (NEEDS_ALL, PAGEABLE, HybridRadixPool, commit, first_needed, hybrid_hit,  # noqa: F401
                          layer_groups, match_hash, match_radix, needs_groups)
from .layers import LayeredCache
from .pool import BlockPool, CacheFull
from .prefix import PrefixCachingPool


@dataclass
class GroupSequence:
    tables: dict[str, list[int | None]]  # per group; None = a sliding block given back (out of the window)
    length: int = 0  # tokens stored
    tokens: list[int] = field(default_factory=list)
    hashes: list = field(default_factory=list)  # "hash": the chain hash of each full block
    nodes: dict = field(default_factory=dict)  # "radix": the tree node each group's path is locked at


class PagedHybridCache(LayeredCache):
    """Paged K/V (and latents) for a model with per-layer kinds; the engine's cache when ``needs_groups``."""

    def __init__(self, cfg, num_blocks: int, block_size: int = 16, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, prefix_caching: bool | str = False) -> None:
        super(LayeredCache, self).__init__()  # the KVCache bookkeeping only: storage is ours
        self.group_of = layer_groups(cfg)
        kinds = sorted(set(self.group_of.values()))
        self.slot, counts = {}, {}
        for i, g in self.group_of.items():
            self.slot[i] = (g, counts.get(g, 0))
            counts[g] = counts.get(g, 0) + 1
        self.cfg, self.block_size, self.kinds, self.window = cfg, block_size, kinds, None
        self.W = cfg.sliding_window
        self.windowed = "sliding" in kinds  # begin() refuses ragged rows (kvref.serve.Engine never sends them)
        self.mode = "hash" if prefix_caching is True else prefix_caching
        if self.mode == "hash":
            self.pool: BlockPool = PrefixCachingPool(num_blocks, block_size)
        elif self.mode == "radix":
            self.pool = HybridRadixPool(num_blocks, block_size, kinds)
        else:
            self.pool = BlockPool(num_blocks, block_size)
        dtype = dtype or torch.get_default_dtype()
        slots = num_blocks * block_size
        n_kv = max(counts.get("full", 0), counts.get("sliding", 0))
        kv = (n_kv, cfg.n_kv_heads, slots, cfg.head_dim)  # (L_kv, H_kv, slots, D): rows shared by both groups
        self.register_buffer("k", torch.zeros(kv, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(kv, dtype=dtype, device=device), persistent=False)
        width = (cfg.kv_lora_rank or 0) + (cfg.qk_rope_head_dim or 0)
        lat = (counts.get("latent", 0), slots, width)  # (L_lat, slots, r + d_R)
        self.register_buffer("lat", torch.zeros(lat, dtype=dtype, device=device), persistent=False)
        self.seqs: dict[Hashable, GroupSequence] = {}
        self.groups = {}  # forward_layered reads the sliding group's view (length, real) here
        self.max_len, self.dtype, self.n_layers = cfg.max_seq_len, dtype, cfg.n_layers
        self._step: dict | None = None

    # -- sequences -------------------------------------------------------------------------------
    def max_blocks(self, tokens: int) -> int:
        """Blocks ``tokens`` stored tokens can hold at most (every group, before a sliding group gives any back)."""
        return len(self.kinds) * -(-tokens // self.block_size)

    def add_sequence(self, seq_id: Hashable, prompt: list[int] | None = None) -> int:
        """Start a sequence; with prefix caching, take the cached blocks of the longest prefix the hybrid
        rule allows. Returns how many prompt tokens are cached (whole blocks, never the last token)."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} already exists; free it first")
        seq = GroupSequence({g: [] for g in self.kinds})
        prompt = list(prompt or [])
        if self.mode and prompt:
            (match_hash if self.mode == "hash" else match_radix)(self, seq, prompt)
            self.pool.lookup_tokens += len(prompt)
            self.pool.hit_tokens += seq.length
        self.seqs[seq_id] = seq
        return seq.length

    def free_sequence(self, seq_id: Hashable) -> None:
        """Give the sequence's blocks back, last first (a radix tree's path is let go of first)."""
        seq = self.seqs.pop(seq_id)
        for g, node in seq.nodes.items():
            self.pool.trees[g].unlock(node)
        for g in self.kinds:
            for b in reversed(seq.tables[g]):
                if b is not None:
                    self.pool.free(b)

    def reset(self) -> None:
        for seq_id in list(self.seqs):
            self.free_sequence(seq_id)
        self._step = None
        super(LayeredCache, self).reset()

    def tokens_stored(self) -> int:
        """Slots holding K/V (or latents), each block counted once, summed over groups."""
        filled = {}
        for seq in self.seqs.values():
            for table in seq.tables.values():
                for i, b in enumerate(table):
                    if b is not None:
                        filled[b] = max(filled.get(b, 0), min(self.block_size, seq.length - i * self.block_size))
        return sum(filled.values())

    # -- one forward -----------------------------------------------------------------------------
    def blocks_needed(self, seq_id: Hashable, n_new: int) -> int:
        """New blocks ``n_new`` more tokens need, summed over groups (a hit only ever shares whole blocks,
        so nothing is copied on write)."""
        seq = self.seqs[seq_id]
        end = -(-(seq.length + n_new) // self.block_size)
        return sum(max(0, end - len(t)) for t in seq.tables.values())

    def begin(self, seq_ids: list[Hashable], n_new: list[int] | int, token_ids: list[list[int]] | None = None) -> None:
        """Declare the next forward (as PagedKVCache.begin): claim every group's blocks, all or nothing."""
        n_new = [n_new] * len(seq_ids) if isinstance(n_new, int) else list(n_new)
        unknown = [s for s in seq_ids if s not in self.seqs]
        if unknown or len(set(seq_ids)) != len(seq_ids) or len(n_new) != len(seq_ids) or not seq_ids:
            raise ValueError(f"begin needs distinct, existing sequences, one count each; unknown: {unknown}")
        if token_ids is None or [len(x) for x in token_ids] != n_new:
            raise ValueError("PagedHybridCache needs token_ids: exactly n_new[b] ids for each row b")
        for s, t in zip(seq_ids, n_new):
            if t < 1 or self.seqs[s].length + t > self.cfg.max_seq_len:
                raise ValueError(f"sequence {s!r}: n_new must be >= 1 and the sequence at most "
                                 f"max_seq_len={self.cfg.max_seq_len} tokens; got {t} after {self.seqs[s].length}")
        if self.windowed and len(set(n_new)) > 1:
            raise ValueError(f"rows of one forward must all get the same number of new tokens here (got {n_new}): "
                             f"the sliding window's mask counts slot distances, which left padding between a "
                             f"row's cached and new tokens would stretch; run each chunk length on its own")
        need = sum(self.blocks_needed(s, t) for s, t in zip(seq_ids, n_new))
        if need > self.pool.num_free:
            raise CacheFull(need, self.pool.num_free, self.pool.num_blocks, self.block_size)
        for s, t in zip(seq_ids, n_new):
            seq = self.seqs[s]
            for table in seq.tables.values():
                table += self.pool.allocate(max(0, -(-(seq.length + t) // self.block_size) - len(table)))
        self._step = {"ids": list(seq_ids), "n_new": n_new, "token_ids": token_ids}
        self._build_views()

    def _view(self, g: str, seqs: list[GroupSequence], n_new: list[int]) -> dict:
        """Slot ids of group g's (B, S_g + T) view: each row's held tokens end at slot S_g, its new ones at
        S_g + T. A sliding group holds only the W - 1 tokens before the first new one."""
        bs, dev = self.block_size, self.k.device
        lengths = [s.length for s in seqs]
        starts = [max(0, n - self.W + 1) if g == "sliding" else 0 for n in lengths]
        held = [n - st for n, st in zip(lengths, starts)]
        B, S, T = len(seqs), max(held), max(n_new)
        n, st, h = (torch.tensor(x, device=dev)[:, None] for x in (lengths, starts, held))  # (B, 1) each
        t = torch.tensor(n_new, device=dev)[:, None]
        width = max(len(s.tables[g]) for s in seqs)
        tables = torch.tensor([[b or 0 for b in s.tables[g]] + [0] * (width - len(s.tables[g])) for s in seqs],
                              device=dev)  # (B, blocks); a given-back block reads block 0, masked out
        j = torch.arange(S + T, device=dev)[None]  # (1, S + T)
        tok = torch.where(j < S, st + j - (S - h), n + j - S - (T - t)).clamp(min=0)  # token held by each slot
        valid = torch.where(j < S, j >= S - h, j - S >= T - t)  # (B, S + T)
        slot = tables.gather(1, tok // bs) * bs + tok % bs
        ragged = min(n_new) < T
        return {"read": torch.where(valid, slot, 0).flatten(), "shape": (B, S, T), "real": valid[:, :S].clone(),
                "write": slot[:, S:][valid[:, S:]] if ragged else slot[:, S:].flatten(),
                "src": torch.arange(B * T, device=dev).view(B, T)[valid[:, S:]] if ragged else None}

    def _build_views(self) -> None:
        step = self._step
        seqs = [self.seqs[s] for s in step["ids"]]
        step["views"] = {g: self._view(g, seqs, step["n_new"]) for g in self.kinds}
        main = step["views"][next((g for g in NEEDS_ALL if g in self.kinds), "sliding")]
        lengths, T = [s.length for s in seqs], max(step["n_new"])
        self.length, self.real = main["shape"][1], main["real"]
        if "sliding" in self.kinds:
            v = step["views"]["sliding"]
            self.groups = {"sliding": SimpleNamespace(length=v["shape"][1], real=v["real"])}
        self.seen = max(a + b for a, b in zip(lengths, step["n_new"])) - T
        self.next_pos = torch.tensor(lengths, device=self.k.device)
        self.padded = min(step["n_new"]) < T or min(lengths) < max(lengths)

    def check(self, cfg, batch: int, new_tokens: int, dtype: torch.dtype, device) -> None:
        if self._step is None:
            raise ValueError("PagedHybridCache is driven by begin() (kvref.serve.Engine); for generate() use "
                             "kvref.LayeredCache")
        if (cfg.n_layers, dtype, torch.device(device).type) != (self.n_layers, self.dtype, self.k.device.type):
            raise ValueError(f"this PagedHybridCache serves {self.n_layers} layers in {self.dtype} on "
                             f"{self.k.device.type}; the model has {cfg.n_layers} in {dtype} on {device}")
        B, S, T = next(iter(self._step["views"].values()))["shape"]
        if (batch, new_tokens) != (B, T):
            raise ValueError(f"begin() announced a ({B}, {T}) input; the model got ({batch}, {new_tokens})")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g, j = self.slot[layer]
        view = self._step["views"][g]
        B, S, T = view["shape"]
        if g == "latent":  # k: the latent c (B, T, r), v: the RoPE key (B, T, d_R)
            r = k.shape[-1]
            new = torch.cat([k, v], dim=-1).reshape(B * T, -1)  # (B*T, r + d_R)
            if view["src"] is not None:
                new = new.index_select(0, view["src"])
            self.lat[j].index_copy_(0, view["write"], new)
            held = self.lat[j].index_select(0, view["read"]).view(B, S + T, -1)  # (B, S+T, r + d_R)
            return held[..., :r], held[..., r:]
        out = []
        for pool, new in ((self.k[j], k), (self.v[j], v)):  # pool (H_kv, slots, D)
            new = new.transpose(0, 1).reshape(new.shape[1], B * T, -1)  # (H_kv, B*T, D)
            if view["src"] is not None:
                new = new.index_select(1, view["src"])
            pool.index_copy_(1, view["write"], new)
            held = pool.index_select(1, view["read"])  # (H_kv, B*(S+T), D)
            out.append(held.view(held.shape[0], B, S + T, -1).transpose(0, 1))  # (B, H_kv, S+T, D)
        return out[0], out[1]

    def advance(self, real: torch.Tensor) -> None:
        step, self._step = self._step, None
        B, _, T = next(iter(step["views"].values()))["shape"]
        t = torch.tensor(step["n_new"], device=real.device)[:, None]
        if not bool((real == (torch.arange(T, device=real.device)[None] >= T - t)).all()):
            for s in step["ids"]:  # give back the blocks claimed for this step
                seq = self.seqs[s]
                for table in seq.tables.values():
                    while len(table) > -(-seq.length // self.block_size):
                        self.pool.free(table.pop())
            raise ValueError("the attention_mask must mark exactly each row's last n_new[b] tokens as real "
                             "(rows left-padded to the widest), as announced to begin()")
        for s, n, ids in zip(step["ids"], step["n_new"], step["token_ids"]):
            seq = self.seqs[s]
            seq.length += n
            seq.tokens += list(ids)
            if self.mode:
                commit(self, seq)
            if "sliding" in self.kinds:  # blocks no later query can see go back to the pool
                table = seq.tables["sliding"]
                for i in range(max(0, seq.length - self.W + 1) // self.block_size):  # wholly before the window
                    if table[i] is not None:
                        self.pool.free(table[i])
                        table[i] = None

    # -- rollback and accounting -----------------------------------------------------------------
    def _check_crop(self, length: int) -> None:
        raise CropError("PagedHybridCache cannot roll back (speculative decoding runs on kvref.LayeredCache)")

    def nbytes_by_kind(self) -> dict[str, int]:
        return {"kv": self.k.numel() * self.k.element_size() * 2, "latent": self.lat.numel() * self.lat.element_size()}

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_kind().values())
