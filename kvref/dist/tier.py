"""A host tier under the paged prefix cache: evicted prefix blocks wait in host memory instead of vanishing.

    cache = PagedKVCache(cfg, num_blocks=64, block_size=16, prefix_caching=True)
    tier = add_host_tier(cache, capacity_blocks=1024)     # swaps in a HostTierPool (empty cache only)

A prefix cache keeps released full blocks in the pool until the pool needs the room, then evicts the least
recently used one: its K/V are lost, and a request that comes back with that prefix recomputes it. With a host
tier the evicted block's K/V rows (every layer's K and V of its ``block_size`` slots) are copied to host memory
first, under the block's hash. A later ``match`` that misses in the pool but finds the hash in the tier takes a
pool block, copies the rows back and counts a tier hit: the returning request skips that prefill, paying a copy
instead (over PCIe on a GPU; a memory copy here). The tier is LRU too: when full, its oldest entry goes to a disk
tier (one safetensors file per block in ``disk_dir``) if there is one, else it is dropped.

This is what vLLM's KV offloading (``kv_offloading_size``, the CPU offloading connector) and SGLang's HiCache do
with GPU, host and (SGLang) disk tiers; the chapter names versions.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..paged import PagedKVCache
from ..prefix import ROOT, PrefixCachingPool, block_hash


class HostTierPool(PrefixCachingPool):
    """A PrefixCachingPool that copies evicted blocks to a bounded host tier and restores them on a hit."""

    def __init__(self, num_blocks: int, block_size: int, capacity_blocks: int,
                 disk_dir: str | Path | None = None) -> None:
        super().__init__(num_blocks, block_size)
        if not isinstance(capacity_blocks, int) or capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be an integer >= 1; got {capacity_blocks!r}")
        self.capacity = capacity_blocks
        self.tier: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()  # hash -> (K, V) rows
        self.k: torch.Tensor | None = None  # the paged cache's buffers (L, H_kv, slots, D), set by add_host_tier
        self.v: torch.Tensor | None = None
        self.offloads = self.tier_hits = self.tier_drops = 0  # blocks copied out / back in (x block_size tokens)
        self.disk_dir = None if disk_dir is None else Path(disk_dir)
        self.on_disk: set[bytes] = set()  # hashes whose rows wait in disk_dir
        self.disk_writes = self.disk_hits = 0
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)

    def _slots(self, block: int) -> slice:
        return slice(block * self.block_size, (block + 1) * self.block_size)

    def _take(self) -> int:
        if not self.free_list and self.evictable:  # the parent evicts the LRU block: keep its rows first
            block = next(iter(self.evictable))
            s = self._slots(block)
            self.tier[self.hash_of[block]] = (self.k[:, :, s].to("cpu", copy=True),  # (L, H_kv, bs, D)
                                              self.v[:, :, s].to("cpu", copy=True))
            self.offloads += 1
            if len(self.tier) > self.capacity:
                h, (k, v) = self.tier.popitem(last=False)
                if self.disk_dir is None:
                    self.tier_drops += 1
                else:  # one file per block, named by its hash
                    save_file({"k": k.contiguous(), "v": v.contiguous()}, str(self._file(h)))
                    self.on_disk.add(h)
                    self.disk_writes += 1
        return super()._take()

    def match(self, tokens: list[int]) -> tuple[list[int], list[bytes]]:
        """The pool's longest chain of hits, continued from the host tier while its blocks are there."""
        blocks, hashes = super().match(tokens)
        bs, parent = self.block_size, hashes[-1] if hashes else ROOT
        for i in range(len(blocks), (len(tokens) - 1) // bs):
            h = block_hash(parent, tokens[i * bs:(i + 1) * bs])
            if (h not in self.tier and h not in self.on_disk) or self.num_free == 0:
                break
            if h in self.tier:
                k, v = self.tier.pop(h)
            else:
                rows = load_file(str(self._file(h)))
                k, v = rows["k"], rows["v"]
                self._file(h).unlink()
                self.on_disk.discard(h)
                self.disk_hits += 1
            block = self._take()  # refs = 1: held by the caller, like a pool hit
            s = self._slots(block)
            self.k[:, :, s], self.v[:, :, s] = k.to(self.k.device), v.to(self.v.device)
            self.by_hash[h], self.hash_of[block] = block, h
            blocks.append(block)
            hashes.append(h)
            parent = h
            self.tier_hits += 1
            self.hit_tokens += bs
        return blocks, hashes

    def _file(self, h: bytes) -> Path:
        return self.disk_dir / f"{h.hex()}.safetensors"

    @property
    def tier_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.tier.values())


def add_host_tier(cache: PagedKVCache, capacity_blocks: int, disk_dir: str | Path | None = None) -> HostTierPool:
    """Give an empty prefix-caching PagedKVCache a host tier of ``capacity_blocks`` blocks (and, with
    ``disk_dir``, a disk tier below it); return its pool."""
    if not isinstance(cache.pool, PrefixCachingPool):
        raise ValueError("the host tier sits under a prefix cache: build the PagedKVCache with prefix_caching=True")
    if cache.seqs or cache.pool.by_hash:
        raise ValueError("add the host tier to an empty cache (no sequences, nothing cached yet)")
    pool = HostTierPool(cache.pool.num_blocks, cache.block_size, capacity_blocks, disk_dir)
    pool.k, pool.v = cache.k, cache.v
    cache.pool = pool
    return pool
