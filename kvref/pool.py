"""The block pool: which blocks of the paged cache are free and how many holders each one has.

Bookkeeping only, no tensors. The paged cache (kvref.paged) stores K/V in the blocks this pool hands out; a
prefix-caching pool (kvref.prefix) builds on it by overriding its hooks, and the pool itself knows neither.
"""

from __future__ import annotations

from collections import deque


class CacheFull(RuntimeError):
    """The block pool cannot supply the blocks a step needs (vLLM would preempt a sequence)."""

    def __init__(self, needed: int, free: int, total: int, block_size: int) -> None:
        self.needed, self.free, self.total = needed, free, total
        hint = (f"even an empty pool of {total} blocks ({total * block_size} tokens) cannot hold it"
                if needed > total else "free a finished sequence, preempt one, or build a bigger pool")
        super().__init__(f"KV block pool exhausted: {needed} blocks of {block_size} tokens needed, "
                         f"{free} of {total} free; {hint}")


class BlockPool:
    """Bookkeeping only (no tensors): a free list and a reference count per block."""

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 1 or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be integers >= 1; got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_list: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks  # holders of each block; 0 = nobody

    @property
    def num_free(self) -> int:
        """Blocks ``allocate`` can hand out right now."""
        return len(self.free_list)

    @property
    def num_used(self) -> int:
        return sum(r > 0 for r in self.refs)

    def allocate(self, n: int = 1) -> list[int]:
        if n > self.num_free:
            raise CacheFull(n, self.num_free, self.num_blocks, self.block_size)
        return [self._take() for _ in range(n)]

    def share(self, block: int) -> None:
        """One more holder for an allocated block."""
        if not 0 <= block < self.num_blocks:  # refs[-1] would silently be the last block
            raise ValueError(f"block {block} is not in this pool (ids 0..{self.num_blocks - 1})")
        if self.refs[block] == 0:
            raise ValueError(f"block {block} is free; only an allocated block can be shared")
        self.refs[block] += 1

    def free(self, block: int) -> None:
        """Drop one holder. A block still shared stays allocated (its other holders keep reading it)."""
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} is not in this pool (ids 0..{self.num_blocks - 1})")
        if self.refs[block] == 0:
            raise ValueError(f"block {block} is already free: each holder may free a block once")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self._release(block)

    # hooks a prefix-caching pool overrides (kvref/prefix.py)
    def _take(self) -> int:
        block = self.free_list.popleft()
        self.refs[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.free_list.append(block)

    def match(self, tokens: list[int]) -> tuple[list[int], list]:
        """Cached blocks holding a prefix of ``tokens`` (taken, one reference each), and their hashes."""
        return [], []

    def commit(self, table: list[int], tokens: list[int], hashes: list) -> None:
        """Called when a sequence's blocks fill up: a prefix cache remembers what they hold."""
