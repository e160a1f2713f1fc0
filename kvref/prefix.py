"""Prefix caching: requests that start with the same tokens share the K/V of those tokens.

Many requests carry the same system prompt, tool list or chat template. Its K/V depend only on
those tokens (and their positions, which are the same), so they can be computed once and reused.
vLLM's scheme, which this follows:

* Only *full* blocks are cached, each under a hash of (parent block's hash, this block's token
  ids). The parent link makes a hash name the whole prefix up to that block, not just 16 tokens.
* A new request walks its prompt block by block and takes the longest chain of hits. It never
  takes the block holding its last prompt token: that token must be computed to give logits.
* A block nobody holds any more is not wiped: it waits in least-recently-used order and is
  evicted only when the pool has no truly free block left. Blocks in use are never evicted.

Turn it on with ``PagedKVCache(cfg, num_blocks, prefix_caching=True)`` and start sequences with
``cache.add_sequence(seq_id, prompt)``, which returns how many prompt tokens are already cached.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from .pool import BlockPool

ROOT = b""  # the parent hash of a sequence's first block


def block_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """Hash naming a block by its tokens and everything before it.

    A cryptographic hash, because a collision would silently hand one request another's K/V.
    """
    h = hashlib.sha256(parent)
    h.update(b",".join(str(t).encode() for t in token_ids))
    return h.digest()


class PrefixCachingPool(BlockPool):
    """A BlockPool whose released full blocks stay findable by content until they are evicted."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_blocks, block_size)
        self.by_hash: dict[bytes, int] = {}  # every block that is findable, in use or not
        self.hash_of: dict[int, bytes] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # held by nobody; least recently used first
        self.lookup_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of those, found in the cache (prefill they did not need)
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_list) + len(self.evictable)

    @property
    def hit_rate(self) -> float:
        """Fraction of looked-up prompt tokens that were found cached."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def _take(self) -> int:
        if self.free_list:  # a never-used or uncached block first, so cached ones live longer
            block = self.free_list.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)  # the least recently used cached block
            del self.by_hash[self.hash_of.pop(block)]
            self.evictions += 1
        self.refs[block] = 1
        return block

    def _release(self, block: int) -> None:
        if block in self.hash_of:
            self.evictable[block] = None  # newest at the end
        else:
            self.free_list.append(block)

    def match(self, tokens: list[int]) -> tuple[list[int], list[bytes]]:
        bs = self.block_size
        blocks, hashes, parent = [], [], ROOT
        for i in range((len(tokens) - 1) // bs):  # full blocks that stop before the last token
            h = block_hash(parent, tokens[i * bs:(i + 1) * bs])
            block = self.by_hash.get(h)
            if block is None:
                break
            if self.refs[block] == 0:
                del self.evictable[block]  # back in use: no longer evictable
            self.refs[block] += 1
            blocks.append(block)
            hashes.append(h)
            parent = h
        self.lookup_tokens += len(tokens)
        self.hit_tokens += len(blocks) * bs
        return blocks, hashes

    def commit(self, table: list[int], tokens: list[int], hashes: list) -> None:
        bs = self.block_size
        while len(hashes) < len(tokens) // bs:  # each block that is full and not yet named
            i = len(hashes)
            h = block_hash(hashes[-1] if hashes else ROOT, tokens[i * bs:(i + 1) * bs])
            block = table[i]
            if h not in self.by_hash and block not in self.hash_of:  # first copy wins; a duplicate
                self.by_hash[h] = block  # computed meanwhile stays private and is freed normally
                self.hash_of[block] = h
            hashes.append(h)

    def clear(self) -> None:
        """Forget every cached block nobody holds (e.g. after the weights change)."""
        while self.evictable:
            block, _ = self.evictable.popitem(last=False)
            del self.by_hash[self.hash_of.pop(block)]
            self.free_list.append(block)
