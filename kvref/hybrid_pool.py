"""Prefix caching for models with per-layer kinds: which blocks of a prefix each group of layers needs.

vLLM's hybrid KV cache manager (vllm/v1/core/kv_cache_coordinator.py and single_type_kv_cache_manager.py,
v0.11) finds a prefix hit of n blocks group by group: full-attention layers (and latent ones, MLA) need
blocks 0..n-1 of the prefix, every one of them; a sliding-window layer of window W needs only the blocks
covering the W - 1 tokens before token n * block_size, the oldest one the first computed token sees.
So a sliding group that gave its old blocks back (kvref.paged_hybrid) can still hit. ``hybrid_hit``
is the rule on "is block i cached for group g" flags; ``match_hash`` / ``match_radix`` apply it to the
chain hashes of kvref.prefix (one key per group and block) or to one SGLang radix tree per group
(kvref.radix), whose matches run from the root: a sliding tree hits only while it still holds the
whole path (SGLang's SWARadixCache keeps "tombstone" nodes to do better; not done here).
"""

from __future__ import annotations

from .kinds import layer_kind
from .pool import BlockPool
from .prefix import ROOT, block_hash
from .radix import RadixTree

PAGEABLE = ("full", "sliding", "latent", "shared")  # kinds the paged engine serves ("shared:j" keeps nothing)
NEEDS_ALL = ("full", "latent")  # groups whose hit needs every block of the prefix


def layer_groups(cfg) -> dict[int, str]:
    """The group of each layer that keeps a cache (shared layers keep none). A config without
    layer_types but with a sliding_window (Mistral) windows every layer: all "sliding"."""
    if cfg.layer_types is None:
        return {i: "sliding" if cfg.sliding_window is not None else "full" for i in range(cfg.n_layers)}
    out = {}
    for i in range(cfg.n_layers):
        kind = layer_kind(cfg, i)
        if kind not in PAGEABLE:
            raise ValueError(f"layer_types[{i}] = {cfg.layer_types[i]!r}: the paged engine cannot page this kind; "
                             f"it pages {', '.join(PAGEABLE[:-1])} and shared:j layers")
        if kind != "shared":
            out[i] = kind
    return out


def needs_groups(cfg) -> bool:
    """Does this config need PagedHybridCache (some layer is not a plain full layer: sliding, latent, shared)?"""
    groups = layer_groups(cfg)
    return set(groups.values()) != {"full"} or len(groups) < cfg.n_layers


def first_needed(n_blocks: int, window: int, block_size: int) -> int:
    """The first block a sliding layer still needs once ``n_blocks`` blocks are held: the block of
    token n_blocks * block_size - window + 1, the oldest one the next token sees."""
    return max(0, n_blocks * block_size - window + 1) // block_size


def hybrid_hit(cached: dict[str, list[bool]], window: int | None, block_size: int) -> int:
    """Blocks of the longest prefix every group can serve: all of them for "full"/"latent", those of the
    last window for "sliding" (``cached[g][i]``: is block i of the prompt cached for group g)."""
    n = min(len(c) for c in cached.values())
    for g in NEEDS_ALL:
        if g in cached:
            n = min(n, cached[g].index(False) if False in cached[g] else len(cached[g]))
    if "sliding" in cached:
        while n and not all(cached["sliding"][first_needed(n, window, block_size):n]):
            n -= 1
    return n


class HybridRadixPool(BlockPool):
    """A BlockPool whose full blocks are cached in one RadixTree per group (kvref.radix: pages = blocks)."""

    def __init__(self, num_blocks: int, block_size: int, groups) -> None:
        super().__init__(num_blocks, block_size)
        self.trees = {g: RadixTree(page_size=block_size) for g in groups}
        self.in_tree: set[int] = set()
        self.lookup_tokens = self.hit_tokens = self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self.free_list) + sum(t.evictable_size for t in self.trees.values()) // self.block_size

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def _take(self) -> int:
        bs = self.block_size
        for tree in sorted(self.trees.values(), key=lambda t: -t.evictable_size):  # the fullest tree first
            if self.free_list:
                break
            for slot in tree.evict(bs)[::bs]:
                block = slot // bs
                assert self.refs[block] == 0, "evicted a block somebody holds"
                self.in_tree.discard(block)
                self.free_list.append(block)
                self.evictions += 1
        return super()._take()

    def _release(self, block: int) -> None:
        if block not in self.in_tree:
            self.free_list.append(block)


# -- called by PagedHybridCache (``cache``): take a hit's blocks, name full blocks ---------------------
def take_hit(cache, seq, blocks: dict[str, list[int]], n: int) -> None:
    """Hold the hit's blocks: all n of a full/latent group, the last window's of a sliding one."""
    first = first_needed(n, cache.W, cache.block_size) if "sliding" in blocks else 0
    for g, ids in blocks.items():
        keep = range(first if g == "sliding" else 0, n)
        seq.tables[g] = [ids[i] if i in keep else None for i in range(n)]
        for i in keep:
            b = ids[i]
            if cache.pool.refs[b] == 0 and cache.mode == "hash":
                del cache.pool.evictable[b]  # back in use
            cache.pool.refs[b] += 1
    seq.length = n * cache.block_size


def match_hash(cache, seq, prompt: list[int]) -> None:
    """The hit by chain hashes (kvref.prefix), one key (group, hash) per group and block."""
    bs, hashes, parent = cache.block_size, [], ROOT
    for i in range((len(prompt) - 1) // bs):  # full blocks before the last token
        parent = block_hash(parent, prompt[i * bs:(i + 1) * bs])
        hashes.append(parent)
    found = {g: [cache.pool.by_hash.get((g, h)) for h in hashes] for g in cache.kinds}
    n = hybrid_hit({g: [b is not None for b in ids] for g, ids in found.items()}, cache.W, bs)
    take_hit(cache, seq, found, n)
    seq.tokens, seq.hashes = prompt[:n * bs], hashes[:n]


def match_radix(cache, seq, prompt: list[int]) -> None:
    """The hit by one radix tree per group: the shortest of the trees' matches, each locked."""
    bs = cache.block_size
    usable = prompt[:(len(prompt) - 1) // bs * bs]
    n = min(len(cache.pool.trees[g].match(usable)[0]) for g in cache.kinds) // bs  # each tree: from the root
    found = {}
    for g in cache.kinds:
        slots, node = cache.pool.trees[g].match(usable[:n * bs])
        cache.pool.trees[g].lock(node)
        seq.nodes[g] = node
        found[g] = [s // bs for s in slots[::bs]]
    take_hit(cache, seq, found, n)
    seq.tokens = prompt[:n * bs]


def commit(cache, seq) -> None:
    """Name the sequence's newly full blocks in the prefix cache, in every group."""
    bs, full = cache.block_size, seq.length // cache.block_size
    if cache.mode == "hash":
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            h = block_hash(seq.hashes[-1] if seq.hashes else ROOT, seq.tokens[i * bs:(i + 1) * bs])
            seq.hashes.append(h)
            for g in cache.kinds:
                b = seq.tables[g][i]
                if b is not None and (g, h) not in cache.pool.by_hash and b not in cache.pool.hash_of:
                    cache.pool.by_hash[(g, h)] = b  # first copy wins, as in kvref.prefix
                    cache.pool.hash_of[b] = (g, h)
        return
    done_before = len(seq.hashes)
    if full <= done_before:
        return
    for g in cache.kinds:
        tree, table = cache.pool.trees[g], seq.tables[g]
        slots = [-1 if b is None else b * bs + i for b in table[:full] for i in range(bs)]
        done = tree.insert(seq.tokens[:full * bs], slots)
        assert -1 not in slots[done:], "a given-back block would enter the tree"
        cache.pool.in_tree.update(table[done // bs:full])
        _, node = tree.match(seq.tokens[:full * bs])
        tree.lock(node)
        if g in seq.nodes:
            tree.unlock(seq.nodes[g])
        seq.nodes[g] = node
    seq.hashes += [None] * (full - done_before)  # counts the committed blocks
