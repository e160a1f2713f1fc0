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
}
