"""Correct answers for notebooks/13_distributed.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

RIGHT = {
    # `or 1`, a planner that sums numbers per token with match/case, a shard that picks heads through a
    # (H_kv, D, d_model) view, and the payload read back as one (2, L, B, H_kv, S, D) view.
    "other_styles": [
        ("kv_heads_per_rank", "return max(1, n_kv_heads // world_size)  # past H_kv: one replica per rank",
         "return n_kv_heads // world_size or 1"),
        ("rank_cache_bytes",
         "    total = 0\n"
         "    for layer_type in kinds:\n"
         "        if layer_type == \"full\":\n"
         "            total += 2 * batch * seq_len * h * D * e  # K and V of the rank's heads\n"
         "        elif layer_type == \"latent\":\n"
         "            total += batch * seq_len * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * e  # whole on every rank\n"
         "        else:\n"
         "            raise ValueError(f\"layer kind {layer_type!r} is not planned here (only full and latent)\")\n"
         "    return total",
         "    per_token = 0\n"
         "    for kind in kinds:\n"
         "        match kind:\n"
         "            case \"full\":\n"
         "                per_token += 2 * h * D\n"
         "            case \"latent\":\n"
         "                per_token += cfg.kv_lora_rank + cfg.qk_rope_head_dim\n"
         "            case _:\n"
         "                raise ValueError(f\"cannot plan a {kind} layer\")\n"
         "    return int(per_token * batch * seq_len * e)"),
        ("shard_kv_weight",
         "    return w[first * D:(first + h) * D]  # (h * D, d_model)",
         "    heads = w.view(n_kv_heads, D, -1)  # (H_kv, D, d_model)\n"
         "    return heads[torch.arange(first, first + h)].reshape(h * D, -1)"),
        ("transfer_message",
         "    parts = [payload[i * per:(i + 1) * per].view(dtype).view(B, H_kv, S, D) for i in range(2 * L)]\n"
         "    return parts[:L], parts[L:], next_pos, first_token",
         "    whole = payload.view(dtype).view(2, L, B, H_kv, S, D)  # all K, then all V\n"
         "    return list(whole[0]), list(whole[1]), next_pos, first_token"),
    ],
    # The replicated head found by searching the query heads, and the rows of the message assembled by stacking.
    "search_and_stack": [
        ("shard_kv_weight",
         "        first = (rank * (n_heads // world_size)) // (n_heads // n_kv_heads)",
         "        group = n_heads // n_kv_heads  # query heads per K/V head\n"
         "        my_queries = list(range(n_heads))[rank * (n_heads // world_size):(rank + 1) * (n_heads // world_size)]\n"
         "        first = next(j for j in range(n_kv_heads) if my_queries[0] in range(j * group, (j + 1) * group))"),
        ("transfer_message",
         "    rows = torch.cat([next_pos, first_token]).to(torch.int64)  # (2B,)",
         "    rows = torch.stack([next_pos.long(), first_token.long()]).reshape(-1)  # (2, B) flattened row by row"),
    ],
}
