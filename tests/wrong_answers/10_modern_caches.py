"""Realistic wrong answers for solutions/10_modern_caches.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # The MLA row without its RoPE part: only the latent is counted.
    "bytes_mla_without_rope": [
        ("per_token_bytes", "L * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * b", "L * cfg.kv_lora_rank * b"),
    ],
    # A head's key taken as d_n only (the RoPE part forgotten on the MHA side).
    "bytes_head_key_without_rope": [
        ("per_token_bytes", "per_head = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim",
         "per_head = cfg.qk_nope_head_dim + cfg.v_head_dim"),
    ],
    # The cache forgets the RoPE key: a buffer of r, and the RoPE key of the new tokens only.
    "cache_forgets_rope_key": [
        ("latent_cache", "torch.zeros(batch, max_len, kv_lora_rank + rope_dim, dtype=dtype)",
         "torch.zeros(batch, max_len, kv_lora_rank, dtype=dtype)"),
        ("latent_cache", "        buf[:, self.length:end, self.r:] = k_rope_new\n", ""),
        ("latent_cache", "return buf[:, :end, :self.r], buf[:, :end, self.r:]", "return buf[:, :end, :self.r], k_rope_new"),
    ],
    # Rows written at the start of the buffer every call (the position of the write forgotten).
    "cache_writes_at_zero": [
        ("latent_cache", "buf[:, self.length:end, :self.r] = c_new", "buf[:, :T, :self.r] = c_new"),
        ("latent_cache", "buf[:, self.length:end, self.r:] = k_rope_new", "buf[:, :T, self.r:] = k_rope_new"),
    ],
    # Grows by torch.cat and never checks max_len: no error when the cache is full.
    "cache_no_overflow_error": [
        ("latent_cache", "        if end > self.max_len:\n"
                         "            raise ValueError(f\"the cache holds at most {self.max_len} rows; "
                         "{self.length} held + {T} new = {end}\")\n", ""),
    ],
    # Grows by torch.cat (a new tensor every update, the max_len check kept) while nbytes reports the size
    # allocated in __init__: shapes, values and bytes all look right; only the buffers are not the same ones.
    "cache_cat_not_in_place": [
        ("latent_cache", "                    for _ in range(n_layers)]\n",
         "                    for _ in range(n_layers)]\n"
         "        self.allocated = sum(t.numel() * t.element_size() for t in self.buf)\n"),
        ("latent_cache", "        buf = self.buf[layer]\n"
                         "        buf[:, self.length:end, :self.r] = c_new  # in place\n"
                         "        buf[:, self.length:end, self.r:] = k_rope_new\n",
         "        rows = torch.cat([c_new, k_rope_new], -1)\n"
         "        buf = self.buf[layer] = torch.cat([self.buf[layer][:, :self.length], rows], 1)\n"),
        ("latent_cache", "return sum(t.numel() * t.element_size() for t in self.buf)", "return self.allocated"),
    ],
    # The cache counted once per query row: the same number as once per call when T = 1, too much for a chunk.
    "reads_cache_per_query_row": [
        ("absorbed_attention", 'reads["cache"] += c_kv.numel() + k_rope.numel()',
         'reads["cache"] += T * (c_kv.numel() + k_rope.numel())'),
    ],
    # Scaled by the latent's width: the key the query now meets has r + d_R numbers... but the softmax was trained
    # with the naive form's d_n + d_R.
    "scale_by_latent_width": [
        ("absorbed_attention", "att = att * (d_n + d_R) ** -0.5", "att = att * (r + d_R) ** -0.5"),
    ],
    # Scaled by the position-free part only.
    "scale_by_nope_dim": [
        ("absorbed_attention", "att = att * (d_n + d_R) ** -0.5", "att = att * d_n ** -0.5"),
    ],
    # The RoPE part of the score forgotten.
    "scores_without_rope": [
        ("absorbed_attention", "    att = att + torch.einsum(\"bhtd,bsd->bhts\", q_rope, k_rope)"
                               "  # the RoPE part, one shared key per token\n", ""),
    ],
    # W_UK and W_UV taken from the wrong halves of w_kv_b (values first).
    "kv_b_halves_swapped": [
        ("absorbed_attention", "w_uk, w_uv = w[:, :d_n], w[:, d_n:]", "w_uv, w_uk = w[:, :-d_n], w[:, -d_n:]"),
    ],
    # W_UV absorbed on the wrong side: applied to the cache before attention (per-head values, H copies).
    "uv_applied_to_the_cache": [
        ("absorbed_attention", "    o_lat = torch.einsum(\"bhts,bsr->bhtr\", att, c_kv)  # (B, H, T, r): attention over the latents\n"
                               "    out = torch.einsum(\"bhtr,hvr->bhtv\", o_lat, w_uv)",
         "    v = torch.einsum(\"bsr,hvr->bhsv\", c_kv, w_uv)\n"
         "    out = att @ v"),
    ],
    # W_UK on the cache instead of the query: the naive keys again.
    "uk_applied_to_the_cache": [
        ("absorbed_attention", "    q_lat = torch.einsum(\"bhtd,hdr->bhtr\", q_nope, w_uk)  # (B, H, T, r): W_UK absorbed into the query\n"
                               "    att = torch.einsum(\"bhtr,bsr->bhts\", q_lat, c_kv)",
         "    k_nope = torch.einsum(\"bsr,hdr->bhsd\", c_kv, w_uk)\n"
         "    att = q_nope @ k_nope.transpose(-2, -1)"),
    ],
    # Heads broadcast against the cache with matmul: the cache copied once per head.
    "cache_copied_per_head": [
        ("absorbed_attention", "att = torch.einsum(\"bhtr,bsr->bhts\", q_lat, c_kv)",
         "att = q_lat @ c_kv[:, None].expand(B, H, -1, -1).contiguous().transpose(-2, -1)"),
    ],
    # The mask forgotten: right for one decode step, wrong for a prompt.
    "no_causal_mask": [
        ("absorbed_attention", "att = att.masked_fill(~mask, float(\"-inf\")).softmax(dim=-1)", "att = att.softmax(dim=-1)"),
    ],
    # Reads counted once per head.
    "reads_cache_per_head": [
        ("absorbed_attention", "reads[\"cache\"] += c_kv.numel() + k_rope.numel()",
         "reads[\"cache\"] += H * (c_kv.numel() + k_rope.numel())"),
    ],
    # Reads: the RoPE keys forgotten.
    "reads_without_rope": [
        ("absorbed_attention", "reads[\"cache\"] += c_kv.numel() + k_rope.numel()", "reads[\"cache\"] += c_kv.numel()"),
    ],
    # A sliding layer counted as a full one.
    "plan_sliding_as_full": [
        ("planner", "per_seq = 2 * min(seq_len, cfg.sliding_window) * cfg.n_kv_heads * cfg.head_dim",
         "per_seq = 2 * seq_len * cfg.n_kv_heads * cfg.head_dim"),
    ],
    # A sliding layer always holds W rows, even for a short sequence.
    "plan_sliding_always_w": [
        ("planner", "per_seq = 2 * min(seq_len, cfg.sliding_window) * cfg.n_kv_heads * cfg.head_dim",
         "per_seq = 2 * cfg.sliding_window * cfg.n_kv_heads * cfg.head_dim"),
    ],
    # A shared layer counted twice (as if it had K/V of its own).
    "plan_shared_counted": [
        ("planner", "        per_seq = 0\n",
         "        per_seq = layer_bytes(cfg, kv_source(cfg, layer), 1, seq_len, dtype) // b\n"),
    ],
    # The latent layer as MHA: K and V per head.
    "plan_latent_per_head": [
        ("planner", "per_seq = seq_len * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)\n",
         "per_seq = seq_len * cfg.n_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)\n"),
    ],
    # The indexer key of a sparse layer forgotten ("it reads k rows, so it stores k rows").
    "plan_sparse_stores_topk": [
        ("planner", "per_seq = seq_len * (cfg.kv_lora_rank + cfg.qk_rope_head_dim + cfg.index_head_dim)",
         "per_seq = min(seq_len, cfg.index_topk) * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)"),
    ],
    # The linear state grows with S like a cache.
    "plan_linear_grows": [
        ("planner", "per_seq = state + C * (cfg.linear_conv_kernel_dim - 1) if seq_len > 0 else 0",
         "per_seq = seq_len * (state + C * (cfg.linear_conv_kernel_dim - 1))"),
    ],
    # The convolution's inputs forgotten: only the state matrix.
    "plan_linear_no_conv": [
        ("planner", "per_seq = state + C * (cfg.linear_conv_kernel_dim - 1) if seq_len > 0 else 0",
         "per_seq = state if seq_len > 0 else 0"),
    ],
    # The convolution keeps K inputs, not K - 1 (HF's padded buffer), and the empty cache is not empty.
    "plan_linear_k_inputs": [
        ("planner", "per_seq = state + C * (cfg.linear_conv_kernel_dim - 1) if seq_len > 0 else 0",
         "per_seq = state + C * cfg.linear_conv_kernel_dim"),
    ],
    # The whole cache counted from the first layer's kind.
    "plan_first_layer_kind_for_all": [
        ("planner", "return sum(layer_bytes(cfg, i, batch, seq_len, dtype) for i in range(cfg.n_layers))",
         "return cfg.n_layers * layer_bytes(cfg, 0, batch, seq_len, dtype)"),
    ],
    # Issue 38: the read counts set (=) instead of added (+=). Every call with a fresh dict looks right; the model
    # passes one dict to every layer, so a 2-layer forward counts one layer.
    "reads_assigned_not_added": [
        ("absorbed_attention", 'reads["cache"] += c_kv.numel() + k_rope.numel()',
         'reads["cache"] = c_kv.numel() + k_rope.numel()'),
        ("absorbed_attention", 'reads["weights"] += w_kv_b.numel()', 'reads["weights"] = w_kv_b.numel()'),
    ],
    # Issue 38: the mask applied only to chunks (T > 1): a decode step that hides rows (padding, a window) sees them.
    "mask_only_for_chunks": [
        ("absorbed_attention", 'att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)',
         'att = (att.masked_fill(~mask, float("-inf")) if T > 1 else att).softmax(dim=-1)'),
    ],
    # Issue 38: the RoPE key copied once per head (a matmul against an expanded view materialises B * H * S * d_R).
    "rope_key_copied_per_head": [
        ("absorbed_attention", 'att = att + torch.einsum("bhtd,bsd->bhts", q_rope, k_rope)',
         'att = att + q_rope @ k_rope[:, None].expand(B, H, -1, -1).transpose(-2, -1)'),
    ],
    # Issue 38: the overflow error without the numbers the text asks for (the rows it would hold, max_len).
    "overflow_message_without_numbers": [
        ("latent_cache", 'f"the cache holds at most {self.max_len} rows; {self.length} held + {T} new = {end}"',
         '"the cache is full"'),
    ],
}
