"""Correct answers for notebooks/05_paging.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

GATHER = ("    pos = torch.arange(n_tokens)  # (S,) token positions\n"
          "    blocks = torch.tensor(table, dtype=torch.long)[pos // block_size]  # (S,) the block holding each token\n"
          "    slots = blocks * block_size + pos % block_size  # (S,) its slot in the pool\n"
          "    return pool[:, slots]  # (H_kv, S, D)")
CEIL = "    return -(-n_tokens // block_size)  # ceil(n / bs) in integers: 16 -> 1, 17 -> 2, 0 -> 0"

RIGHT = {
    # A loop over the blocks with torch.cat; math.ceil; a loop for the hits that stops at the first miss.
    "loops_and_ceil": [
        ("paged_attention", GATHER,
         "    parts = []\n"
         "    for i, b in enumerate(table):\n"
         "        take = min(block_size, n_tokens - i * block_size)\n"
         "        if take <= 0:\n"
         "            break\n"
         "        parts.append(pool[:, b * block_size:b * block_size + take])\n"
         "    return torch.cat(parts, dim=1) if parts else pool[:, :0]"),
        ("waste", CEIL, "    return math.ceil(n_tokens / block_size)"),
        ("block_allocator", "block = self.free_ids.pop(0)", "block = min(self.free_ids)\n        self.free_ids.remove(block)"),
        # fork checks every block before it shares any (instead of undoing the shares made)
        ("copy_on_write",
         "    done = []\n    try:\n        for block in table:\n            alloc.share(block)\n            done.append(block)\n    except ValueError:\n        for block in done:  # a refused fork leaves every holder count as it was\n            alloc.free(block)\n        raise\n    return list(table)",
         "    if any(alloc.refs[b] == 0 for b in table):\n"
         "        raise ValueError(f\"table {table} lists a block nobody holds\")\n"
         "    new_table = table[:]\n    for block in new_table:\n        alloc.share(block)\n    return new_table"),
        ("copy_on_write",
         "        src = slice(old * block_size, old * block_size + offset)  # the rows already written\n"
         "        dst = slice(new * block_size, new * block_size + offset)\n"
         "        k_pool[:, dst] = k_pool[:, src]  # (H_kv, offset, D)\n"
         "        v_pool[:, dst] = v_pool[:, src]\n",
         "        for pool in (k_pool, v_pool):  # the whole block: the unwritten rows do no harm\n"
         "            pool[:, new * block_size:(new + 1) * block_size] = pool[:, old * block_size:(old + 1) * block_size]\n"),
    ],
    # A flat index list built in Python, and the paged attention written out with its own causal mask.
    "python_index_and_own_attention": [
        ("paged_attention", GATHER,
         "    idx = [table[i // block_size] * block_size + i % block_size for i in range(n_tokens)]\n"
         "    return pool.index_select(1, torch.tensor(idx, dtype=torch.long))"),
        ("paged_attention",
         "    return manual_attention(q[None], k[None], v[None], \"causal\")[0]  # (H, T, D)",
         "    H, T, D = q.shape\n"
         "    k = k.repeat_interleave(H // k.shape[0], dim=0)  # (H, S, D)\n"
         "    v = v.repeat_interleave(H // v.shape[0], dim=0)\n"
         "    s = q @ k.transpose(1, 2) / math.sqrt(D)  # (H, T, S)\n"
         "    allowed = torch.arange(n_tokens)[None, :] <= torch.arange(n_tokens - T, n_tokens)[:, None]\n"
         "    return torch.softmax(s.masked_fill(~allowed, float('-inf')), dim=-1) @ v"),
        ("waste", CEIL, "    return (n_tokens + block_size - 1) // block_size"),
        ("copy_on_write",
         "    offset = n_tokens % block_size  # where the token goes inside its block\n"
         "    if offset == 0:  # the last block is full (or there is none yet): a fresh block\n"
         "        table.append(alloc.allocate())\n"
         "    elif alloc.refs[table[-1]] > 1:",
         "    offset = n_tokens % block_size  # where the token goes inside its block\n"
         "    if n_tokens == len(table) * block_size:\n"
         "        table += [alloc.allocate()]\n"
         "    elif alloc.refs[table[-1]] != 1:"),
        ("copy_on_write",
         "        k_pool[:, dst] = k_pool[:, src]  # (H_kv, offset, D)\n"
         "        v_pool[:, dst] = v_pool[:, src]\n",
         "        rows = torch.arange(offset)\n"
         "        k_pool.index_copy_(1, new * block_size + rows, k_pool.index_select(1, old * block_size + rows))\n"
         "        v_pool.index_copy_(1, new * block_size + rows, v_pool.index_select(1, old * block_size + rows))\n"),
    ],
    # A LIFO free list: the block freed last is handed out first (the notebook leaves the choice open).
    "lifo_free_list": [
        ("block_allocator", "block = self.free_ids.pop(0)", "block = self.free_ids.pop()"),
    ],
}
