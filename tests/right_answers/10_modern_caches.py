"""Correct answers for notebooks/10_modern_caches.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

ABSORBED = ("    q_lat = torch.einsum(\"bhtd,hdr->bhtr\", q_nope, w_uk)  # (B, H, T, r): W_UK absorbed into the query\n"
            "    att = torch.einsum(\"bhtr,bsr->bhts\", q_lat, c_kv)  # (B, H, T, S): each latent row read once for all heads\n"
            "    att = att + torch.einsum(\"bhtd,bsd->bhts\", q_rope, k_rope)  # the RoPE part, one shared key per token\n"
            "    att = att * (d_n + d_R) ** -0.5  # the scale of the naive form's d_n + d_R key\n"
            "    att = att.masked_fill(~mask, float(\"-inf\")).softmax(dim=-1)\n"
            "    o_lat = torch.einsum(\"bhts,bsr->bhtr\", att, c_kv)  # (B, H, T, r): attention over the latents\n"
            "    out = torch.einsum(\"bhtr,hvr->bhtv\", o_lat, w_uv)  # (B, H, T, d_v): W_UV absorbed into the output\n")

PLANNER = "    b, kind = torch.empty((), dtype=dtype).element_size(), layer_kind(cfg, layer)\n"

RIGHT = {
    # Heads folded into the query rows with reshape and bmm; a dict of per-token widths for the planner; the latent
    # cache as two buffers per layer.
    "fold_heads_bmm": [
        ("absorbed_attention", ABSORBED,
         "    q_lat = (q_nope.unsqueeze(-2) @ w_uk.unsqueeze(0).unsqueeze(2)).squeeze(-2)  # (B, H, T, r)\n"
         "    q_lat = q_lat.reshape(B, H * T, r)  # heads folded into the rows\n"
         "    att = q_lat @ c_kv.transpose(1, 2) + q_rope.reshape(B, H * T, d_R) @ k_rope.transpose(1, 2)  # (B, H*T, S)\n"
         "    att = (att / math.sqrt(d_n + d_R)).view(B, H, T, -1)\n"
         "    att = torch.where(mask, att, torch.tensor(-math.inf)).softmax(dim=-1)\n"
         "    o_lat = att.reshape(B, H * T, -1) @ c_kv  # (B, H*T, r)\n"
         "    out = torch.einsum(\"bhtr,hvr->bhtv\", o_lat.view(B, H, T, r), w_uv)\n"),
        ("planner", PLANNER,
         "    b, kind = torch.tensor([], dtype=dtype).element_size(), layer_kind(cfg, layer)\n"
         "    if kind in (\"latent\", \"sparse\"):\n"
         "        width = {\"latent\": 0, \"sparse\": cfg.index_head_dim}[kind] + cfg.kv_lora_rank + cfg.qk_rope_head_dim\n"
         "        return batch * seq_len * width * b\n"),
        ("latent_cache",
         "        self.buf = [torch.zeros(batch, max_len, kv_lora_rank + rope_dim, dtype=dtype)  # (B, max_len, r + d_R)\n"
         "                    for _ in range(n_layers)]\n",
         "        self.buf = [torch.empty(batch, max_len, kv_lora_rank + rope_dim, dtype=dtype) for _ in range(n_layers)]\n"),
    ],
    # A loop over heads (each head reads the same latent rows; no copies); a loop over layers for the planner.
    "loop_over_heads": [
        ("absorbed_attention", ABSORBED,
         "    outs = []\n"
         "    for h in range(H):\n"
         "        qh = q_nope[:, h] @ w_uk[h]  # (B, T, r)\n"
         "        s = (qh @ c_kv.transpose(1, 2) + q_rope[:, h] @ k_rope.transpose(1, 2)) / (d_n + d_R) ** 0.5\n"
         "        p = s.masked_fill(~mask, -float(\"inf\")).softmax(-1)  # (B, T, S)\n"
         "        outs.append((p @ c_kv) @ w_uv[h].T)  # (B, T, d_v)\n"
         "    out = torch.stack(outs, dim=1)\n"),
        ("planner", "    return sum(layer_bytes(cfg, i, batch, seq_len, dtype) for i in range(cfg.n_layers))\n",
         "    total = 0\n"
         "    for i in range(cfg.n_layers):\n"
         "        total += layer_bytes(cfg, i, batch, seq_len, dtype)\n"
         "    return total\n"),
        ("per_token_bytes", "    b = torch.empty((), dtype=dtype).element_size()\n",
         "    b = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}[dtype]\n"),
    ],
    # The issue-38 styles: one stacked buffer for all layers written with narrow().copy_(), SDPA with the heads
    # folded into the query rows (and a (H*T, S) mask), a match/case planner.
    "stacked_buffer_sdpa_match": [
        ("latent_cache",
         "        self.buf = [torch.zeros(batch, max_len, kv_lora_rank + rope_dim, dtype=dtype)  # (B, max_len, r + d_R)\n"
         "                    for _ in range(n_layers)]\n",
         "        self.buf = torch.zeros(n_layers, batch, max_len, kv_lora_rank + rope_dim, dtype=dtype)  # (L, B, max_len, r + d_R)\n"),
        ("latent_cache",
         "        buf[:, self.length:end, :self.r] = c_new  # in place\n"
         "        buf[:, self.length:end, self.r:] = k_rope_new\n",
         "        rows = buf.narrow(1, self.length, T)  # (B, T, r + d_R), a view\n"
         "        rows.narrow(2, 0, self.r).copy_(c_new)\n"
         "        rows.narrow(2, self.r, buf.shape[-1] - self.r).copy_(k_rope_new)\n"),
        ("latent_cache", "return sum(t.numel() * t.element_size() for t in self.buf)",
         "return self.buf.numel() * self.buf.element_size()"),
        ("absorbed_attention", ABSORBED,
         "    q_lat = torch.einsum(\"bhtd,hdr->bhtr\", q_nope, w_uk)  # (B, H, T, r)\n"
         "    q = torch.cat([q_lat, q_rope], dim=-1).reshape(B, H * T, r + d_R)  # heads folded into the rows\n"
         "    k = torch.cat([c_kv, k_rope], dim=-1)  # (B, S, r + d_R): one shared key per row\n"
         "    o_lat = F.scaled_dot_product_attention(q, k, c_kv, attn_mask=mask.repeat(H, 1),\n"
         "                                           scale=(d_n + d_R) ** -0.5)  # (B, H*T, r)\n"
         "    out = torch.einsum(\"bhtr,hvr->bhtv\", o_lat.view(B, H, T, r), w_uv)\n"),
        ("planner", PLANNER,
         "    b, kind = torch.empty((), dtype=dtype).element_size(), layer_kind(cfg, layer)\n"
         "    match kind:\n"
         "        case \"full\" | \"sliding\":\n"
         "            rows = seq_len if kind == \"full\" else min(seq_len, cfg.sliding_window)\n"
         "            return batch * 2 * rows * cfg.n_kv_heads * cfg.head_dim * b\n"
         "        case \"latent\" | \"sparse\":\n"
         "            extra = cfg.index_head_dim if kind == \"sparse\" else 0\n"
         "            return batch * seq_len * (cfg.kv_lora_rank + cfg.qk_rope_head_dim + extra) * b\n"
         "        case \"linear\":\n"
         "            if seq_len == 0:\n"
         "                return 0\n"
         "            k_dim, v_dim = cfg.linear_key_head_dim, cfg.linear_value_head_dim\n"
         "            channels = 2 * cfg.linear_num_key_heads * k_dim + cfg.linear_num_value_heads * v_dim\n"
         "            state = cfg.linear_num_value_heads * k_dim * v_dim\n"
         "            return batch * (state + channels * (cfg.linear_conv_kernel_dim - 1)) * b\n"
         "        case _:\n"
         "            return 0\n"),
    ],
    # index_copy_ into the buffer (cast to its dtype first: index_copy_ wants one dtype), bmm with a hand-written
    # softmax.
    "index_copy_bmm_softmax": [
        ("latent_cache",
         "        buf[:, self.length:end, :self.r] = c_new  # in place\n"
         "        buf[:, self.length:end, self.r:] = k_rope_new\n",
         "        rows = torch.cat([c_new, k_rope_new], dim=-1).to(buf.dtype)  # (B, T, r + d_R)\n"
         "        buf.index_copy_(1, torch.arange(self.length, end), rows)\n"),
        # the overflow message in other words, the two numbers still in it
        ("latent_cache", 'f"the cache holds at most {self.max_len} rows; {self.length} held + {T} new = {end}"',
         'f"no room: {end} rows requested > max_len={self.max_len}"'),
        ("absorbed_attention", ABSORBED,
         "    q_h = q_nope.permute(1, 0, 2, 3).reshape(H, B * T, d_n)  # (H, B*T, d_n)\n"
         "    q_lat = torch.bmm(q_h, w_uk).view(H, B, T, r).permute(1, 0, 2, 3)  # (B, H, T, r)\n"
         "    q_all = torch.cat([q_lat, q_rope], dim=-1).reshape(B, H * T, r + d_R)\n"
         "    k_all = torch.cat([c_kv, k_rope], dim=-1)  # (B, S, r + d_R)\n"
         "    s = torch.bmm(q_all, k_all.transpose(1, 2)).view(B, H, T, -1) / math.sqrt(d_n + d_R)\n"
         "    s = s.masked_fill(~mask, float(\"-inf\"))\n"
         "    p = torch.exp(s - s.amax(dim=-1, keepdim=True))\n"
         "    p = p / p.sum(dim=-1, keepdim=True)\n"
         "    o_lat = torch.bmm(p.reshape(B, H * T, -1), c_kv).view(B, H, T, r)\n"
         "    out = torch.einsum(\"bhtr,hvr->bhtv\", o_lat, w_uv)\n"),
    ],
}
