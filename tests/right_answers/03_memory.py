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

REQUESTS = ('    budget = max(gpu_bytes - weight_bytes - reserve_bytes, 0)\n'
            '    lens = sorted(seq_lens)  # in both modes the cheapest k requests are the k shortest\n'
            '    used, k = 0, 0\n'
            '    for n in lens:  # n: the longest of the k + 1 shortest\n'
            '        if static:\n'
            '            need = kv_cache_bytes(cfg, k + 1, n, dtype)  # k + 1 rows, each padded to n slots\n'
            '        else:\n'
            '            need = used + kv_cache_bytes(cfg, 1, n, dtype)  # one more cache of exactly n tokens\n'
            '        if need > budget:\n'
            '            break  # the cost only grows with k: no larger set fits either\n'
            '        used, k = need, k + 1\n'
            '    return k\n')

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
        # a count over every k with the closed cost of the k shortest (the kth shortest is the longest of them)
        ("max_requests", REQUESTS,
         "    lens = sorted(seq_lens)\n"
         "    room = gpu_bytes - weight_bytes - reserve_bytes\n"
         "    def cost(k):\n"
         "        if static:\n"
         "            return kv_cache_bytes(cfg, k, lens[k - 1], dtype)\n"
         "        return sum(kv_cache_bytes(cfg, 1, n, dtype) for n in lens[:k])\n"
         "    return max([0] + [k for k in range(1, len(lens) + 1) if cost(k) <= room])\n"),
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
        # numpy: prefix sums of per-token bytes, a running maximum times the row count
        ("max_requests", REQUESTS,
         "    import numpy as np\n"
         "    budget = gpu_bytes - weight_bytes - reserve_bytes\n"
         "    if budget <= 0 or not seq_lens:\n"
         "        return 0\n"
         "    lens = np.sort(np.asarray(seq_lens, dtype=np.int64))\n"
         "    per_token = kv_cache_bytes(cfg, 1, 1, dtype)\n"
         "    rows = np.arange(1, len(lens) + 1)\n"
         "    cost = rows * lens * per_token if static else np.cumsum(lens) * per_token\n"
         "    return int((cost <= budget).sum())\n"),
    ],
}
