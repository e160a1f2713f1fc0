"""Correct answers for notebooks/01_motivation.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

MASK_SLICE = "self.mask[past:past + T, :past + T]"

RIGHT = {
    # Sums instead of closed forms; a mask built with triu instead of sliced; the new tokens collected in a list.
    "loops_triu_list": [
        ("work_formulas", "return B * (N * T + N * (N - 1) // 2)", "return sum(B * (T + i) for i in range(N))"),
        ("work_formulas", "return B * (T + N - 1)", "return B * T + B * (N - 1)"),
        ("cached_mha", MASK_SLICE,
         "torch.ones(T, past + T, dtype=torch.bool, device=x.device).triu(diagonal=past + 1)"),
        ("generate_cached",
         "        for step in range(max_new_tokens):\n"
         "            next_idx = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1): the most likely next token\n"
         "            idx = torch.cat([idx, next_idx], dim=1)\n"
         "            if step < max_new_tokens - 1:  # the last token is returned, never fed back\n"
         "                logits = model(next_idx, use_cache=True)  # (B, 1, V): the newest token only\n",
         "        new = []\n"
         "        while True:\n"
         "            nxt = torch.argmax(logits[:, -1, :], dim=-1).unsqueeze(1)  # (B, 1)\n"
         "            new.append(nxt)\n"
         "            if len(new) == max_new_tokens:\n"
         "                break\n"
         "            logits = model(nxt, use_cache=True)\n"
         "        idx = torch.cat([idx] + new, dim=1)\n"),
    ],
    # Buffers started empty and always concatenated (dim=-2), the mask sliced from the new length,
    # positions from an offset, reset through model.modules().
    "empty_start_offsets": [
        ("work_formulas", "return B * (N * T + N * (N - 1) // 2)", "return B * N * T + B * N * (N - 1) // 2"),
        ("work_formulas", "return B * (T + N - 1)", "return B * (T - 1) + B * N"),
        ("cached_mha",
         "        past = 0 if self.cache_k is None else self.cache_k.shape[2]  # S before this call\n"
         "        if self.cache_k is None:\n"
         "            self.cache_k, self.cache_v = keys_new, values_new\n"
         "        else:\n"
         "            self.cache_k = torch.cat([self.cache_k, keys_new], dim=2)  # (B, H, past + T, D)\n"
         "            self.cache_v = torch.cat([self.cache_v, values_new], dim=2)\n"
         "        return self.attend(queries, self.cache_k, self.cache_v, self.mask[past:past + T, :past + T])\n",
         "        if self.cache_k is None:\n"
         "            self.cache_k = keys_new[:, :, :0]\n"
         "            self.cache_v = values_new[:, :, :0]\n"
         "        self.cache_k = torch.cat((self.cache_k, keys_new), dim=-2)\n"
         "        self.cache_v = torch.cat((self.cache_v, values_new), dim=-2)\n"
         "        S = self.cache_k.shape[-2]\n"
         "        return self.attend(queries, self.cache_k, self.cache_v, self.mask[S - T:S, :S])\n"),
        ("cached_mha", "self.cache_k, self.cache_v = None, None", "self.cache_k = None\n        self.cache_v = None"),
        ("gpt_with_cache",
         "        if use_cache:\n"
         "            pos_ids = torch.arange(self.current_pos, self.current_pos + T, device=in_idx.device)\n"
         "            self.current_pos += T\n"
         "        else:\n"
         "            pos_ids = torch.arange(T, device=in_idx.device)  # positions 0 .. T-1\n",
         "        start = self.current_pos if use_cache else 0\n"
         "        pos_ids = start + torch.arange(T, device=in_idx.device)\n"
         "        if use_cache:\n"
         "            self.current_pos = start + T\n"),
        ("gpt_with_cache",
         "        for blk in self.trf_blocks:\n"
         "            blk.att.reset_cache()\n",
         "        for m in self.modules():\n"
         "            if isinstance(m, MultiHeadAttentionCached):\n"
         "                m.reset_cache()\n"),
    ],
}
