"""SGLang's radix tree (RadixAttention): prefix caching as a tree of token runs.

vLLM's hash chain (kvref.prefix) names each full block by the hash of everything before it and
looks a prompt up block by block. SGLang keeps the cached prefixes of all requests as one radix
tree instead: each edge holds a run of token ids and, for each token, where its K/V live (a slot).
A prompt walks down the tree; the path it can follow is its cached prefix.

* ``match(tokens)``: the longest cached prefix, as slots, and the node it ends in. A match that
  ends inside a node *splits* it, so the node boundary falls exactly where requests diverge.
* ``insert(tokens, slots)``: add a request's tokens; returns how many were already cached (the
  caller frees its own copies of those, the tree keeps the first).
* ``lock(node)`` / ``unlock(node)``: running requests hold their path; a reference count on every
  node from there up to the root keeps it from being evicted.
* ``evict(n)``: free at least ``n`` slots, least recently used *unlocked leaves* first. Evicting a
  leaf may turn its parent into a leaf, evictable in turn: the tree is pruned from the tips.
* ``page_size``: matches and inserts are cut down to whole pages, so a paged cache with blocks of
  ``page_size`` tokens only ever shares whole blocks (SGLang's ``page_size`` does the same).

    tree = RadixTree(page_size=4)
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(8)))
    slots, node = tree.match([1, 2, 3, 4, 9])        # slots [0, 1, 2, 3]: one page
"""

from __future__ import annotations

from typing import Hashable

from .pool import BlockPool, CacheFull


class Node:
    """An edge of the tree and the node it leads to: ``key`` (token ids) and one slot per token."""

    def __init__(self, key: tuple[int, ...] = (), value: list[Hashable] | None = None, parent: Node | None = None):
        self.key, self.value, self.parent = key, list(value or []), parent
        self.children: dict[tuple[int, ...], Node] = {}  # by the first page of the child's key
        self.lock_ref = 0  # running requests whose path goes through here
        self.last_access = 0  # a tick of the tree's clock (least recently used is evicted first)

    def __repr__(self) -> str:
        return f"Node(key={list(self.key)}, lock_ref={self.lock_ref}, children={len(self.children)})"


class RadixTree:
    """A radix tree over token ids; values are opaque slots (one per token), freed by ``evict``."""

    def __init__(self, page_size: int = 1) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1; got {page_size!r}")
        self.page_size = page_size
        self.root = Node()
        self.root.lock_ref = 1  # the root is never evicted
        self.clock = 0
        self.size = 0  # tokens held by the tree
        self.evictable_size = 0  # of those, in nodes no running request locks

    def _tick(self) -> int:
        self.clock += 1
        return self.clock

    def _page(self, key) -> tuple[int, ...]:
        return tuple(key[:self.page_size])

    def _prefix_len(self, a, b) -> int:
        """Length of the common prefix of ``a`` and ``b``, cut down to whole pages."""
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n - n % self.page_size

    def _split(self, node: Node, n: int) -> Node:
        """Cut ``node``'s edge after ``n`` tokens; returns the new upper node (node becomes its child)."""
        upper = Node(node.key[:n], node.value[:n], node.parent)
        upper.lock_ref, upper.last_access = node.lock_ref, node.last_access
        node.parent.children[self._page(node.key)] = upper
        node.key, node.value, node.parent = node.key[n:], node.value[n:], upper
        upper.children[self._page(node.key)] = node
        return upper

    # -- lookups ---------------------------------------------------------------------------------
    def match(self, tokens: list[int]) -> tuple[list[Hashable], Node]:
        """The longest cached prefix of ``tokens`` (whole pages): its slots and the node it ends in."""
        tokens = tuple(tokens[:len(tokens) - len(tokens) % self.page_size])
        node, slots, now = self.root, [], self._tick()
        node.last_access = now
        while tokens:
            child = node.children.get(self._page(tokens))
            if child is None:
                break
            n = self._prefix_len(child.key, tokens)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            slots += child.value
            node, tokens = child, tokens[n:]
        return slots, node

    def insert(self, tokens: list[int], slots: list[Hashable]) -> int:
        """Add ``tokens`` (whole pages; a ragged tail is ignored) with their slots.

        Returns how many leading tokens the tree held already: their ``slots`` are *not* taken
        (the tree keeps its own copy), so the caller frees them.
        """
        if len(slots) != len(tokens):
            raise ValueError(f"insert needs one slot per token; got {len(tokens)} tokens, {len(slots)} slots")
        n_all = len(tokens) - len(tokens) % self.page_size
        tokens, slots = tuple(tokens[:n_all]), list(slots[:n_all])
        node, done, now = self.root, 0, self._tick()
        node.last_access = now
        while done < n_all:
            child = node.children.get(self._page(tokens[done:]))
            if child is None:  # the rest is new: one leaf
                leaf = Node(tokens[done:], slots[done:], node)
                leaf.last_access = now
                node.children[self._page(leaf.key)] = leaf
                self.size += len(leaf.key)
                self.evictable_size += len(leaf.key)
                return done
            n = self._prefix_len(child.key, tokens[done:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, done = child, done + n
        return done

    # -- running requests ------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """A running request holds the path root..node: none of it may be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        """The request is done with root..node (finished or preempted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                raise ValueError(f"{node} is not locked: unlock once per lock")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
            node = node.parent

    def evict(self, n: int) -> list[Hashable]:
        """Free at least ``n`` slots (fewer only if nothing else is evictable): unlocked leaves, LRU first."""
        freed: list[Hashable] = []
        leaves = [x for x in self._nodes() if not x.children and x.lock_ref == 0]
        while len(freed) < n and leaves:
            leaf = min(leaves, key=lambda x: x.last_access)
            leaves.remove(leaf)
            freed += leaf.value
            parent = leaf.parent
            del parent.children[self._page(leaf.key)]
            self.size -= len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                leaves.append(parent)  # now a leaf itself
        return freed

    def _nodes(self) -> list[Node]:
        out, todo = [], [self.root]
        while todo:
            node = todo.pop()
            out.append(node)
            todo += node.children.values()
        return out[1:]

    def tokens(self, node: Node) -> list[int]:
        """The token ids on the path root..node."""
        parts = []
        while node is not self.root:
            parts.append(node.key)
            node = node.parent
        return [t for part in reversed(parts) for t in part]


class RadixCachingPool(BlockPool):
    """A BlockPool whose full blocks are cached in a RadixTree (a slot = block * bs + offset).

    The tree owns the blocks it holds: a cached block nobody uses is not on the free list but
    *evictable*, taken back (least recently used unlocked leaf first) only when no truly free block
    is left. A sequence's ``hashes`` list (kept by the paged cache) holds, per committed block, the
    deepest tree node of the sequence when that block was committed; the last one is locked until
    ``unlock_sequence`` (the engine calls it when the request finishes or is preempted).

    ``page_size`` (a divisor of ``block_size``; the block size by default) is the tree's page: a
    match is cut down to whole pages, so it may end inside a block. That last block is then shared
    partly filled, and the paged cache copies it before writing (copy on write), as SGLang's
    page_size = 1 shares any prefix. A block leaves the tree only once every slot of it is evicted.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, page_size: int | None = None) -> None:
        page_size = block_size if page_size is None else page_size
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1 or (
                isinstance(block_size, int) and block_size % page_size):
            allowed = [d for d in range(1, block_size + 1) if block_size % d == 0] if isinstance(block_size, int) \
                else []
            raise ValueError(f"page_size={page_size!r} does not divide block_size={block_size!r}: the radix tree's "
                             f"pages must tile the cache's blocks; allowed page sizes: {allowed}")
        super().__init__(num_blocks, block_size)
        self.tree = RadixTree(page_size=page_size)
        self.in_tree: set[int] = set()
        self.tree_slots: dict[int, int] = {}  # block -> how many of its slots the tree holds
        self.lookup_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of those, found in the tree
        self.evictions = 0  # blocks taken back from the tree

    @property
    def page_size(self) -> int:
        return self.tree.page_size

    @property
    def num_free(self) -> int:
        if self.page_size == self.block_size:  # every tree node holds whole blocks
            return len(self.free_list) + self.tree.evictable_size // self.block_size
        # pages: a block may straddle nodes; it can be freed once nobody holds it and no locked node has a slot of it
        locked = {slot // self.block_size for node in self.tree._nodes() if node.lock_ref for slot in node.value}
        return len(self.free_list) + sum(1 for b in self.in_tree if self.refs[b] == 0 and b not in locked)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def pinned(self, block: int) -> bool:
        """Must a write to ``block`` copy it first? (another holder, or the tree, reads its slots)"""
        return self.refs[block] > 1 or block in self.in_tree

    def _take(self) -> int:
        bs = self.block_size
        if self.page_size == bs:
            if not self.free_list:
                for slot in self.tree.evict(bs)[::bs]:  # one leaf or more
                    block = slot // bs
                    assert self.refs[block] == 0, "evicted a block somebody holds"
                    self._leave_tree(block, bs)
            return super()._take()
        while not self.free_list:
            freed = self.tree.evict(self.page_size)
            if not freed:
                raise CacheFull(1, 0, self.num_blocks, bs)
            for slot in freed:
                self._leave_tree(slot // bs, 1)
        return super()._take()

    def _leave_tree(self, block: int, slots: int) -> None:
        self.tree_slots[block] -= slots
        if self.tree_slots[block] == 0:
            del self.tree_slots[block]
            self.in_tree.discard(block)
            if self.refs[block] == 0:
                self.free_list.append(block)
                self.evictions += 1

    def _release(self, block: int) -> None:
        if block not in self.in_tree:  # a block in the tree stays there, evictable once unlocked
            self.free_list.append(block)

    def match(self, tokens: list[int]) -> tuple[list[int], list]:
        blocks, hashes, _ = self.match_tokens(tokens)
        return blocks, hashes

    def match_tokens(self, tokens: list[int]) -> tuple[list[int], list, int]:
        """Cached blocks of the longest prefix (whole pages, never the last token), their nodes, and how many
        tokens they hold: with pages smaller than blocks the last block may be shared partly filled."""
        bs, p = self.block_size, self.page_size
        slots, node = self.tree.match(tokens[:(len(tokens) - 1) // p * p])
        if p == bs:
            blocks, n = [s // bs for s in slots[::bs]], len(slots)
        else:  # a block's slots may come from several requests' blocks: use only runs of one block
            blocks, n = [], 0
            while n < len(slots):
                b, k = slots[n] // bs, 0
                while k < bs and n + k < len(slots) and slots[n + k] == slots[n] + k:
                    k += 1
                if slots[n] % bs:  # never happens (block starts are page starts); stop rather than misread
                    break
                blocks.append(b)
                n += k
                if k < bs:
                    break
        for b in blocks:
            self.refs[b] += 1
        self.tree.lock(node)
        self.lookup_tokens += len(tokens)
        self.hit_tokens += n
        return blocks, [node] * len(blocks), n

    def commit(self, table: list[int], tokens: list[int], hashes: list) -> None:
        bs, full = self.block_size, len(tokens) // self.block_size
        if len(hashes) >= full:
            return
        slots = [b * bs + i for b in table[:full] for i in range(bs)]
        done = self.tree.insert(tokens[:full * bs], slots)
        for slot in slots[done:]:  # the tree took these; the ones before were cached already
            block = slot // bs
            self.tree_slots[block] = self.tree_slots.get(block, 0) + 1
            self.in_tree.add(block)
        _, node = self.tree.match(tokens[:full * bs])
        self.tree.lock(node)
        if hashes:
            self.tree.unlock(hashes[-1])
        hashes += [node] * (full - len(hashes))

    def unlock_sequence(self, hashes: list) -> None:
        """The sequence whose ``hashes`` these are lets go of its path (call before freeing its blocks)."""
        if hashes:
            self.tree.unlock(hashes[-1])
            hashes.clear()
