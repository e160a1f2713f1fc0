"""Correct answers for notebooks/03_memory.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

BYTES = "    elem_bytes = torch.finfo(dtype).bits // 8  # bits -> bytes: 2 for fp16/bf16, 4 for fp32\n"
PER_TOKEN = ("    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * elem_bytes"
             "  # a K and a V row in every layer\n")
RETURN = "    return batch * seq_len * per_token  # every sequence, every token"
MAX_BATCH = ("    kv_budget = gpu_bytes - weight_bytes - reserve_bytes  # what the weights and the reserve leave for K/V\n"
             "    per_sequence = kv_cache_bytes(cfg, 1, seq_len, dtype)  # one sequence of seq_len tokens\n"
             "    return max(kv_budget, 0) // per_sequence  # round down: a sequence that fits only partly does not fit")

RIGHT = {
    # element_size of an empty tensor; K and V counted separately; a loop that adds sequences while they fit.
    "element_size_and_loop": [
        ("kv_cache_bytes", BYTES + PER_TOKEN + RETURN,
         "    e = torch.empty((), dtype=dtype).element_size()\n"
         "    k_bytes = cfg.n_layers * batch * cfg.n_kv_heads * seq_len * cfg.head_dim * e\n"
         "    v_bytes = k_bytes\n"
         "    return int(k_bytes + v_bytes)"),
        ("max_batch", MAX_BATCH,
         "    free = gpu_bytes - weight_bytes - reserve_bytes\n"
         "    one = kv_cache_bytes(cfg, 1, seq_len, dtype)\n"
         "    n = 0\n"
         "    if free > 0:\n"
         "        n = free // one\n"
         "        while kv_cache_bytes(cfg, n + 1, seq_len, dtype) <= free:\n"
         "            n += 1\n"
         "    return int(n)"),
    ],
    # itemsize of the dtype and math.prod; the budget checked before dividing.
    "itemsize_and_prod": [
        ("kv_cache_bytes", BYTES + PER_TOKEN + RETURN,
         "    shape = (2, cfg.n_layers, batch, cfg.n_kv_heads, seq_len, cfg.head_dim)\n"
         "    return math.prod(shape) * dtype.itemsize"),
        ("max_batch", MAX_BATCH,
         "    budget = gpu_bytes - (weight_bytes + reserve_bytes)\n"
         "    if budget <= 0:\n"
         "        return 0\n"
         "    return budget // kv_cache_bytes(cfg, batch=1, seq_len=seq_len, dtype=dtype)"),
    ],
}
