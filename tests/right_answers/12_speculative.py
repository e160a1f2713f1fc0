"""Correct answers for notebooks/12_speculative.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

LOOP_VERIFY = ('        choices = logits.argmax(dim=-1).tolist()\n'
               '        n = 0\n'
               '        while n < kk and guesses[n] == choices[n]:\n'
               '            n += 1\n'
               '        stats["proposed"] += kk\n'
               '        stats["accepted"] += n\n'
               '        t_cache.crop(held + 1 + n)  # keep its last token and the n accepted guesses\n'
               '        d_len = min(d_len, held + 1 + n)\n'
               '        d_cache.crop(d_len)  # the draft forgets its rejected guesses\n'
               '        tokens += guesses[:n] + [choices[n]]\n')

RIGHT = {
    # A for loop with break; the crop rebuilds next_pos from the kept slots; the paged crop pops blocks one by one;
    # the loop reuses the warm-up's accept().
    "loops_and_accept": [
        ("accept", "    n = 0\n    while n < len(guesses) and guesses[n] == choices[n]:\n        n += 1\n",
         "    n = len(guesses)\n    for i, (g, c) in enumerate(zip(guesses, choices)):\n        if g != c:\n"
         "            n = i\n            break\n"),
        ("static_crop", "        dropped = self.real[:, length:]  # (B, length - kept) the forgotten slots\n"
                        "        self.next_pos = self.next_pos - dropped.sum(dim=1)  # padding never advanced a position\n"
                        "        self.real = self.real[:, :length]\n",
         "        self.real = self.real[:, :length].clone()\n"
         "        self.next_pos = self.real.long().sum(dim=1)  # positions count the real tokens kept\n"),
        ("paged_crop", "    keep = -(-length // block_size)  # blocks holding at least one kept token\n"
                       "    for block in reversed(table[keep:]):  # the last block first\n"
                       "        pool.free(block)\n"
                       "    return table[:keep]\n",
         "    table = list(table)\n"
         "    while len(table) * block_size - block_size >= length and table:\n"
         "        pool.free(table.pop())\n"
         "    return table\n"),
        ("speculative_loop", LOOP_VERIFY,
         "        n, emitted = accept(guesses, logits.argmax(dim=-1).tolist())\n"
         "        stats[\"proposed\"], stats[\"accepted\"] = stats[\"proposed\"] + len(guesses), stats[\"accepted\"] + n\n"
         "        for cache in (t_cache, d_cache):\n"
         "            keep = min(held + 1 + n, d_len if cache is d_cache else held + 1 + n)\n"
         "            cache.crop(keep)\n"
         "        d_len = min(d_len, held + 1 + n)\n"
         "        tokens.extend(emitted)\n"),
    ],
    # The draft re-reads only what it lacks by counting its cache's own length; the bound check is written as two
    # comparisons; the paged crop computes the blocks to free with math.ceil.
    "cache_length_and_ceil": [
        ("static_crop", "        if not 0 <= length <= self.length:\n",
         "        if length < 0 or length > self.length:\n"),
        ("paged_crop", "    keep = -(-length // block_size)  # blocks holding at least one kept token\n",
         "    import math\n    keep = math.ceil(length / block_size)\n"),
        ("speculative_loop", "            feed = (tokens + guesses)[d_len:]  # what the draft has not seen yet\n",
         "            feed = (tokens + guesses)[d_cache.length if d_cache.length else 0:]\n"),
    ],
}
