"""Realistic wrong answers for notebooks/01_motivation.ipynb; each must lose points.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text).
"""

WRONG = {
    # Counts the last generated token as if it were fed back (the seed's loop shape): T + N rows.
    "formula_counts_last_token": [
        ("work_formulas", "return B * (T + N - 1)", "return B * (T + N)"),
    ],
    # Appends the new keys/values along the head axis instead of the sequence axis.
    "kv_concat_wrong_axis": [
        ("cached_mha", "torch.cat([self.cache_k, keys_new], dim=2)", "torch.cat([self.cache_k, keys_new], dim=1)"),
        ("cached_mha", "torch.cat([self.cache_v, values_new], dim=2)", "torch.cat([self.cache_v, values_new], dim=1)"),
    ],
    # Uses the first T rows of the causal mask, as without a cache: a single new token then sees only key 0.
    "mask_not_shifted": [
        ("cached_mha", "self.mask[past:past + T, :past + T]", "self.mask[:T, :past + T]"),
    ],
    # reset_cache does nothing: the next prompt attends to the previous prompt's keys and values.
    "cache_not_reset": [
        ("cached_mha", "self.cache_k, self.cache_v = None, None", "pass"),
    ],
    # Positions are computed from current_pos but current_pos never moves: every new token gets position 0.
    "position_not_advanced": [
        ("gpt_with_cache", "self.current_pos += T", "pass"),
    ],
    # reset_kv_cache empties the caches but forgets current_pos: the next prompt starts at a late position.
    "reset_keeps_position": [
        ("gpt_with_cache", "self.current_pos = 0  # the next prompt starts at position 0", "pass"),
    ],
    # generate_cached never resets: the second prompt continues the first one's cache.
    "generate_without_reset": [
        ("generate_cached", "model.reset_kv_cache()  # a new prompt must not see the previous one", "pass"),
    ],
    # Same tokens, but every step resets and re-runs the whole sequence through the "cache".
    "decode_feeds_whole_sequence": [
        ("generate_cached", "logits = model(next_idx, use_cache=True)  # (B, 1, V): the newest token only",
         "model.reset_kv_cache()\n                logits = model(idx, use_cache=True)"),
    ],
    # Feeds the last generated token back too: same tokens, one wasted row per sequence.
    "feeds_last_token": [
        ("generate_cached", "if step < max_new_tokens - 1:  # the last token is returned, never fed back", "if True:"),
    ],
    # True division in the quadratic term: the right number of rows, as a float.
    "rows_as_float": [
        ("work_formulas", "return B * (N * T + N * (N - 1) // 2)", "return B * (N * T + N * (N - 1) / 2)"),
    ],
    # The call without the cache also numbers its tokens from current_pos (the text: positions start at 0).
    "no_cache_uses_position": [
        ("gpt_with_cache", "pos_ids = torch.arange(T, device=in_idx.device)  # positions 0 .. T-1",
         "pos_ids = torch.arange(self.current_pos, self.current_pos + T, device=in_idx.device)"),
    ],
    # current_pos advances on every call, with or without the cache.
    "no_cache_moves_position": [
        ("gpt_with_cache", "x = self.tok_emb(in_idx) + self.pos_emb(pos_ids)  # (B, T, emb_dim)",
         "x = self.tok_emb(in_idx) + self.pos_emb(pos_ids)  # (B, T, emb_dim)\n        self.current_pos += 0 if use_cache else T"),
    ],
}
