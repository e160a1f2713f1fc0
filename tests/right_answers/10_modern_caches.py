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
}
