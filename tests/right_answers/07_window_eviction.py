"""Correct answers for notebooks/07_window_eviction.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

MASK = ("    q_slot = torch.arange(S - T, S)[:, None]  # (T, 1): the queries are the last T slots\n"
        "    k_slot = torch.arange(S)[None, :]  # (1, S)\n"
        "    return (k_slot <= q_slot) & (q_slot - k_slot < window)  # (T, S): causal, and at most W back")
H2O = ("    pri = scores[..., :n_old].masked_fill(~real[:, None, :n_old], float(\"-inf\"))"
       "  # (B, H_kv, n_old), padding last\n"
       "    order = torch.sort(pri, dim=-1, descending=True, stable=True).indices  # stable: of equal scores, the older first\n"
       "    top = order[..., :heavy]  # (B, H_kv, heavy): per row and head, never across the batch\n"
       "    heavy_idx = top.sort(dim=-1).values  # oldest first, like the cache\n")

RIGHT = {
    # The band as the difference of two triangular masks; argsort for the heavy hitters; a loop for the ring.
    "tril_band_argsort": [
        ("sliding_window_mask", MASK,
         "    causal = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)\n"
         "    too_old = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T - window)\n"
         "    return causal & ~too_old"),
        ("h2o_keep", H2O,
         "    pri = torch.where(real[:, None, :n_old], scores[..., :n_old], torch.tensor(-math.inf))\n"
         "    order = pri.argsort(dim=-1, descending=True, stable=True)[..., :heavy]\n"
         "    heavy_idx = torch.sort(order, dim=-1).values\n"),
        ("ring_window_cache",
         "        self.k[layer][:, :, slots] = k[:, :, T - keep:]  # in place: overwrites the tokens that left the window\n"
         "        self.v[layer][:, :, slots] = v[:, :, T - keep:]\n",
         "        for j, slot in enumerate(slots.tolist()):\n"
         "            self.k[layer][:, :, slot] = k[:, :, T - keep + j]\n"
         "            self.v[layer][:, :, slot] = v[:, :, T - keep + j]\n"),
    ],
    # Broadcasting with unsqueeze and a distance; torch.roll to read the ring oldest first.
    "distance_and_roll": [
        ("sliding_window_mask", MASK,
         "    dist = torch.arange(S - T, S).unsqueeze(1) - torch.arange(S).unsqueeze(0)  # (T, S)\n"
         "    return (dist >= 0) & (dist <= window - 1)"),
        ("ring_window_cache",
         "        order = torch.arange(self.seen - held, self.seen, device=k.device) % W  # their slots, oldest first\n"
         "        k_all = torch.cat([self.k[layer][:, :, order], k], dim=2)  # (B, H_kv, held + T, D)\n"
         "        v_all = torch.cat([self.v[layer][:, :, order], v], dim=2)\n",
         "        shift = -(self.seen % W) if self.seen >= W else 0\n"
         "        k_old = torch.roll(self.k[layer], shifts=shift, dims=2)[:, :, W - held:] if self.seen >= W \\\n"
         "            else self.k[layer][:, :, :held]\n"
         "        v_old = torch.roll(self.v[layer], shifts=shift, dims=2)[:, :, W - held:] if self.seen >= W \\\n"
         "            else self.v[layer][:, :, :held]\n"
         "        k_all = torch.cat((k_old, k), dim=-2)\n"
         "        v_all = torch.cat((v_old, v), dim=-2)\n"),
    ],
}
