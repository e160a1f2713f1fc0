"""Realistic wrong answers for solutions/05_paging.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # No check for an empty pool: list.pop raises IndexError, which a server cannot tell from a bug.
    "full_pool_not_reported": [
        ("block_allocator", "        if not self.free_ids:\n            raise PoolFull(", "        if False:\n            raise PoolFull("),
    ],
    # free() ignores the reference count: a block forked to two samples returns to the free list
    # while the other sample still reads it.
    "free_ignores_refcount": [
        ("block_allocator",
         "        self.refs[block] -= 1\n        if self.refs[block] == 0:\n            self.free_ids.append(block)",
         "        self.refs[block] = 0\n        self.free_ids.append(block)"),
    ],
    # No guard against a double free: the count goes negative and the error goes unnoticed.
    "double_free_accepted": [
        ("block_allocator",
         "        if self.refs[block] == 0:\n            raise ValueError(f\"block {block} is already free",
         "        if False:\n            raise ValueError(f\"block {block} is already free"),
    ],
    # The block index taken modulo the block size instead of divided by it.
    "block_index_mod": [
        ("paged_attention", "[pos // block_size]", "[pos % block_size]"),
    ],
    # The block id used as a slot: forgets that each block holds block_size slots.
    "slot_not_scaled": [
        ("paged_attention", "slots = blocks * block_size + pos % block_size", "slots = blocks + pos % block_size"),
    ],
    # Reads the pool as if the sequence were stored contiguously from slot 0: ignores the table.
    "table_ignored": [
        ("paged_attention", "slots = blocks * block_size + pos % block_size", "slots = pos"),
    ],
    # Rounds the number of blocks down: the last, partly filled block (and its waste) is forgotten.
    "blocks_rounded_down": [
        ("waste", "return -(-n_tokens // block_size)", "return n_tokens // block_size"),
    ],
    # Off by one: an extra block whenever the tokens fill their last block exactly.
    "blocks_plus_one": [
        ("waste", "return -(-n_tokens // block_size)", "return n_tokens // block_size + 1"),
    ],
    # The empty slots of the last block as block_size - n % block_size: a full block counts as empty.
    "internal_waste_remainder": [
        ("waste", '"paged_internal": paged_slots - used,',
         '"paged_internal": sum(block_size - h % block_size for h in held),'),
    ],
    # Each block hashed on its own: the same tokens after a different prefix (or at another
    # position) would hit and hand out K/V computed in another context.
    "hash_not_chained": [
        ("prefix_hash", "parent = block_hash(parent, tokens[i * block_size:(i + 1) * block_size])",
         "parent = block_hash(ROOT, tokens[i * block_size:(i + 1) * block_size])"),
    ],
    # Looks up the block holding the prompt's last token too: that token would never be computed.
    "last_block_looked_up": [
        ("prefix_hash", "for h in hashes[:(len(prompt) - 1) // block_size]:", "for h in hashes:"),
    ],
    # Counts hits in blocks where tokens are asked for.
    "hits_in_blocks": [
        ("prefix_hash", "hits.append(found * block_size)", "hits.append(found)"),
    ],
    # share() of a free block accepted: the block gets a holder while it stays on the free list.
    "share_free_block_accepted": [
        ("block_allocator",
         "        if self.refs[block] == 0:\n            raise ValueError(f\"block {block} is free; only",
         "        if False:\n            raise ValueError(f\"block {block} is free; only"),
    ],
    # A Python loop over tokens in the gather: right rows, one indexing operation per token.
    "gather_loops_over_tokens": [
        ("paged_attention",
         "    return pool[:, slots]  # (H_kv, S, D)",
         "    return torch.stack([pool[:, s] for s in slots.tolist()], dim=1) if len(slots) else pool[:, :0]"),
    ],
    # The slot of a token counted from the block's end instead of its start.
    "slot_from_block_end": [
        ("slot_of", "return table[i // block_size] * block_size + i % block_size",
         "return (table[i // block_size] + 1) * block_size - 1 - i % block_size"),
    ],
    # fork() copies the table but adds no holder: the first writer never sees the block as shared and writes into
    # the other sample's tokens.
    "fork_without_share": [
        ("copy_on_write", "    done = []\n    try:\n        for block in table:\n            alloc.share(block)\n            done.append(block)\n    except ValueError:\n        for block in done:  # a refused fork leaves every holder count as it was\n            alloc.free(block)\n        raise\n", ""),
    ],
    # Issue 38: fork() shares block after block and stops at the first refusal: the blocks before it keep a holder
    # nobody will free.
    "fork_refused_halfway": [
        ("copy_on_write", "    done = []\n    try:\n        for block in table:\n            alloc.share(block)\n            done.append(block)\n    except ValueError:\n        for block in done:  # a refused fork leaves every holder count as it was\n            alloc.free(block)\n        raise\n", "    for block in table:\n        alloc.share(block)\n"),
    ],
    # Issue 38: no range check: share(-1) / free(-1) quietly change refs[-1], the last block.
    "ids_outside_pool_accepted": [
        ("block_allocator", "        if not 0 <= block < self.num_blocks:\n"
                            "            raise ValueError(f\"block {block} is not in this pool (ids 0..{self.num_blocks - 1})\")\n",
         ""),
    ],
    # fork() returns the same list: both samples append to one table.
    "fork_returns_same_table": [
        ("copy_on_write", "    return list(table)  # a new list", "    return table  # a new list"),
    ],
    # No copy on write: the first sample writes its token into the block it shares with the others.
    "cow_never_copies": [
        ("copy_on_write", "    elif alloc.refs[table[-1]] > 1:", "    elif False:"),
    ],
    # Copies whenever the token goes into a partly filled block, even when it is the block's only holder.
    "cow_always_copies": [
        ("copy_on_write", "    elif alloc.refs[table[-1]] > 1:", "    elif alloc.refs[table[-1]] >= 1:"),
    ],
    # Gives up the hold on the old block before the new one is allocated: a full pool raises with the holders changed.
    "cow_frees_before_allocating": [
        ("copy_on_write",
         "        old, new = table[-1], alloc.allocate()  # allocate first: a full pool raises before anything changed",
         "        old = table[-1]\n        alloc.free(old)\n        new = alloc.allocate()"),
        ("copy_on_write", "        alloc.free(old)  # the other holders keep the old block\n", ""),
    ],
    # Keeps its hold on the old block after the copy: the block leaks, and its last real holder copies it again.
    "cow_keeps_old_hold": [
        ("copy_on_write", "        alloc.free(old)  # the other holders keep the old block\n", ""),
    ],
    # Copies the keys but not the values.
    "cow_copies_keys_only": [
        ("copy_on_write", "        v_pool[:, dst] = v_pool[:, src]\n", ""),
    ],
    # free() decrements first and checks afterwards: a double free is refused with the right ValueError but leaves the
    # count at -1; an allocate() that increments then brings it to 0, a block in use with no holder (issue 29).
    "free_decrements_before_check": [
        ("block_allocator",
         "        if self.refs[block] == 0:\n            raise ValueError(f\"block {block} is already free: each holder frees a block once (double free?)\")\n"
         "        self.refs[block] -= 1\n",
         "        self.refs[block] -= 1\n"
         "        if self.refs[block] < 0:\n            raise ValueError(f\"block {block} is already free: each holder frees a block once (double free?)\")\n"),
        ("block_allocator", "        self.refs[block] = 1\n", "        self.refs[block] += 1\n"),
    ],
}
