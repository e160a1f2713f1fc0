"""Realistic wrong answers for solutions/13_distributed.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Replication forgotten: H_kv // W is 0 past H_kv (no head at all on a rank).
    "replication_forgotten": [
        ("kv_heads_per_rank", "return max(1, n_kv_heads // world_size)", "return n_kv_heads // world_size"),
    ],
    # The planner divides the whole cache by W, as if K/V heads kept splitting past H_kv.
    "bytes_divided_by_world_size": [
        ("rank_cache_bytes", "total += 2 * batch * seq_len * h * D * e  # K and V of the rank's heads",
         "total += 2 * batch * seq_len * H_kv * D * e / world_size"),
    ],
    # MLA's latent split by heads across ranks, like K/V heads.
    "latent_split_by_heads": [
        ("rank_cache_bytes", "total += batch * seq_len * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * e  # whole on every rank",
         "total += batch * seq_len * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * e // world_size"),
    ],
    # K counted, V forgotten (the factor 2).
    "planner_without_factor_2": [
        ("rank_cache_bytes", "total += 2 * batch * seq_len * h * D * e  # K and V of the rank's heads",
         "total += batch * seq_len * h * D * e"),
    ],
    # A world size that cannot split the K/V heads is planned anyway.
    "planner_accepts_bad_split": [
        ("rank_cache_bytes", "    if \"full\" in kinds and H_kv % world_size and world_size % H_kv:\n"
                             "        raise ValueError(f\"world size {world_size} neither divides H_kv = {H_kv} nor is a multiple of it\")\n",
         ""),
    ],
    # The rows per head taken as the weight's rows over H (the query heads), not over H_kv.
    "heads_split_by_H": [
        ("shard_kv_weight", "D = w.shape[0] // n_kv_heads  # rows per K/V head", "D = w.shape[0] // n_heads"),
    ],
    # Past H_kv, rank r keeps K/V head r % H_kv: a head, but not the one its query heads read.
    "replica_of_the_wrong_head": [
        ("shard_kv_weight", "first = (rank * (n_heads // world_size)) // (n_heads // n_kv_heads)",
         "first = rank % n_kv_heads"),
    ],
    # Past H_kv every rank keeps the first head.
    "replica_always_head_0": [
        ("shard_kv_weight", "first = (rank * (n_heads // world_size)) // (n_heads // n_kv_heads)", "first = 0"),
    ],
    # Positions lost in transfer: every row continues at S, the left padding forgotten.
    "positions_lost_in_transfer": [
        ("transfer_message", "next_pos, first_token = rows[:B].clone(), rows[B:].clone()",
         "next_pos, first_token = torch.full((B,), S), rows[B:].clone()"),
    ],
    # The dtype is never compared: fp32 bytes read as bf16 numbers.
    "dtype_not_checked": [
        ("transfer_message", "got = {\"n_layers\": L, \"n_kv_heads\": H_kv, \"head_dim\": D, \"dtype\": CODE_DTYPE.get(code)}",
         "got = {\"n_layers\": L, \"n_kv_heads\": H_kv, \"head_dim\": D, \"dtype\": dtype}"),
    ],
    # The payload length is not checked: a message cut short fails inside view(), not with TransferMismatch.
    "cut_message_accepted": [
        ("transfer_message", "if rows.numel() != 2 * B or payload.numel() != n or n != 2 * L * per:",
         "if rows.numel() != 2 * B:"),
    ],
    # K and V interleaved per layer (K0, V0, K1, V1) instead of all K, then all V.
    "payload_interleaved": [
        ("transfer_message", "payload = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in k + v])",
         "payload = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for kv in zip(k, v) for t in kv])"),
    ],
    # S and D swapped in the header.
    "header_fields_swapped": [
        ("transfer_message", "header = torch.tensor([MAGIC, VERSION, len(k), B, H_kv, S, D, DTYPE_CODE[k[0].dtype], payload.numel(), 0],",
         "header = torch.tensor([MAGIC, VERSION, len(k), B, H_kv, D, S, DTYPE_CODE[k[0].dtype], payload.numel(), 0],"),
    ],
    # Positions never range-checked: a corrupt position 0 is installed.
    "positions_not_checked": [
        ("transfer_message", "    if bool((next_pos < 1).any()) or bool((next_pos > S).any()):\n"
                             "        raise TransferMismatch(f\"positions {next_pos.tolist()} outside [1, {S}]\")\n", ""),
    ],
    # The room for new tokens is not checked.
    "max_seq_len_not_checked": [
        ("transfer_message", "    if S + max_new_tokens > cfg.max_seq_len:\n"
                             "        raise TransferMismatch(f\"S = {S} + {max_new_tokens} new tokens exceeds max_seq_len = {cfg.max_seq_len}\")\n",
         ""),
    ],
}
