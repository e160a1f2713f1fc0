"""Realistic wrong answers for solutions/12_speculative.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # The bonus token forgotten: only the accepted guesses are emitted.
    "bonus_token_forgotten": [
        ("accept", "return n, guesses[:n] + [choices[n]]", "return n, guesses[:n]"),
    ],
    # The bonus token doubled: the target's choices up to n are emitted after the guesses they confirmed.
    "bonus_token_doubled": [
        ("accept", "return n, guesses[:n] + [choices[n]]", "return n, guesses[:n] + choices[:n + 1]"),
    ],
    # Every guess that matches counts, even after a wrong one (not the longest matching prefix).
    "matches_counted_not_prefix": [
        ("accept", "    n = 0\n    while n < len(guesses) and guesses[n] == choices[n]:\n        n += 1\n",
         "    n = sum(g == c for g, c in zip(guesses, choices))\n"),
    ],
    # Static crop: `seen` left as it was, so the next tokens get positions past the forgotten ones.
    "static_seen_not_rolled_back": [
        ("static_crop", "self.length = self.seen = length", "self.length = length"),
    ],
    # Static crop: next_pos not moved back (only matters with padding: positions come from next_pos there).
    "static_next_pos_not_rolled_back": [
        ("static_crop", "        self.next_pos = self.next_pos - dropped.sum(dim=1)  # padding never advanced a position\n",
         ""),
    ],
    # Static crop: no bound check, a crop past the end "succeeds".
    "static_no_bound_check": [
        ("static_crop", "        if not 0 <= length <= self.length:\n"
                        "            raise ValueError(f\"crop keeps 0 to {self.length} tokens; got {length}\")\n", ""),
    ],
    # Static crop: rollback off by one, the newest kept token forgotten as well.
    "static_off_by_one": [
        ("static_crop", "self.real = self.real[:, :length]", "self.real = self.real[:, :length - 1]"),
        ("static_crop", "self.length = self.seen = length", "self.length = self.seen = length - 1"),
        ("static_crop", "dropped = self.real[:, length:]", "dropped = self.real[:, length - 1:]"),
    ],
    # Paged crop: floor instead of ceiling, so the partly kept (maybe shared) block is freed too.
    "paged_frees_the_cut_block": [
        ("paged_crop", "keep = -(-length // block_size)", "keep = length // block_size"),
    ],
    # Paged crop: the forgotten rows of the kept block are erased, a block another sequence shares is written.
    "paged_writes_shared_block": [
        ("paged_crop", "    return table[:keep]\n",
         "    if length % block_size:  # tidy up: erase the forgotten rows of the kept block\n"
         "        first = table[keep - 1] * block_size + length % block_size\n"
         "        end = table[keep - 1] * block_size + block_size\n"
         "        k_pool[:, first:end] = 0\n"
         "        v_pool[:, first:end] = 0\n"
         "    return table[:keep]\n"),
    ],
    # Paged crop: bound check forgotten; length 11 of 10 tokens passes silently.
    "paged_no_bound_check": [
        ("paged_crop", "    if not 0 <= length <= n_tokens:\n"
                       "        raise ValueError(f\"crop keeps 0 to {n_tokens} tokens; got {length}\")\n", ""),
    ],
    # The loop rolls the target back one token too far: its own last token is forgotten as well.
    "target_rollback_off_by_one": [
        ("speculative_loop", "t_cache.crop(held + 1 + n)", "t_cache.crop(held + n)"),
    ],
    # The target's cache is never cropped: rejected guesses stay in it.
    "target_cache_not_cropped": [
        ("speculative_loop", "        t_cache.crop(held + 1 + n)  # keep its last token and the n accepted guesses\n", ""),
    ],
    # The draft's cache is never cropped: its next guesses follow tokens that were rejected.
    "draft_cache_not_cropped": [
        ("speculative_loop", "        d_len = min(d_len, held + 1 + n)\n"
                             "        d_cache.crop(d_len)  # the draft forgets its rejected guesses\n", ""),
    ],
    # The accepted count taken from the draft (every guess it made) instead of what the target kept.
    "accepted_from_the_draft": [
        ("speculative_loop", 'stats["accepted"] += n', 'stats["accepted"] += len(guesses)'),
    ],
    # Always k guesses, even near the end: the last verify step emits past n_new.
    "guesses_not_capped_at_the_end": [
        ("speculative_loop", "kk = min(k, n_new - (len(tokens) - T) - 1)", "kk = k"),
    ],
}
