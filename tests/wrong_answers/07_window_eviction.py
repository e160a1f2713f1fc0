"""Realistic wrong answers for solutions/07_window_eviction.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Off by one: a window of W shows W + 1 keys.
    "mask_window_plus_one": [
        ("sliding_window_mask", "q_slot - k_slot < window", "q_slot - k_slot <= window"),
    ],
    # Puts the T queries at the first T slots: right for a prompt with no cache, wrong after it.
    "mask_queries_at_the_start": [
        ("sliding_window_mask", "q_slot = torch.arange(S - T, S)[:, None]", "q_slot = torch.arange(T)[:, None]"),
    ],
    # A ring of W + 1 slots addressed in a buffer of W: slot W does not exist.
    "ring_modulo_w_plus_one": [
        ("ring_window_cache", "% W", "% (W + 1)"),
    ],
    # Reads the ring in slot order instead of oldest first: once it wraps, the mask hides the wrong key.
    "ring_read_in_slot_order": [
        ("ring_window_cache", "order = torch.arange(self.seen - held, self.seen, device=k.device) % W",
         "order = torch.arange(held, device=k.device)"),
    ],
    # Counts with the slots held (stops at W) instead of the slots ever appended: writes the same slots forever.
    "ring_counts_held_not_seen": [
        ("ring_window_cache", "self.seen", "self.length"),
    ],
    # The reference H2O code: scores summed over the batch, so one request evicts another's tokens.
    "h2o_scores_summed_over_batch": [
        ("h2o_keep", "order = torch.sort(pri, dim=-1,", "order = torch.sort(pri.sum(0, keepdim=True).expand(B, -1, -1), dim=-1,"),
    ],
    # Heavy hitters chosen among all S tokens: recent tokens counted twice, fewer distinct tokens kept.
    "h2o_recent_inside_heavy": [
        ("h2o_keep", "pri = scores[..., :n_old].masked_fill(~real[:, None, :n_old]",
         "pri = scores.masked_fill(~real[:, None, :]"),
    ],
    # Sorted over the heads instead of the tokens.
    "h2o_sort_wrong_dim": [
        ("h2o_keep", "order = torch.sort(pri, dim=-1,", "order = torch.sort(pri, dim=1,"),
    ],
    # topk for the heavy hitters: right for distinct scores, but it promises nothing about ties, and on the CPU it
    # keeps the newer of equal scores, where the rule (and kvref's cache) keeps the older.
    "h2o_topk_ties": [
        ("h2o_keep", "    order = torch.sort(pri, dim=-1, descending=True, stable=True).indices", "    order = None"),
        ("h2o_keep", "    top = order[..., :heavy]", "    top = pri.topk(heavy, dim=-1).indices"),
    ],
    # Heavy hitters left in score order: the cache's slots are no longer oldest first.
    "h2o_heavy_not_sorted": [
        ("h2o_keep", "heavy_idx = top.sort(dim=-1).values", "heavy_idx = top"),
    ],
    # Padding competes with real tokens (and its self-attention makes it look heavy).
    "h2o_keeps_padding": [
        ("h2o_keep", "pri = scores[..., :n_old].masked_fill(~real[:, None, :n_old], float(\"-inf\"))",
         "pri = scores[..., :n_old]"),
    ],
}
