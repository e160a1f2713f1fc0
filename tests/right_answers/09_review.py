"""Correct answers for notebooks/09_review.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

GIB = ("    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_element  # a K and a V row per layer\n"
       "    return batch * seq_len * per_token / GiB")
ROWS = ("    if cached:\n"
        "        return batch * (T + N - 1)  # the prompt once, then one row per fed-back token\n"
        "    return batch * sum(T + i for i in range(N))  # step i runs all T + i tokens again")

RIGHT = {
    # Dict keys in another order; GiB as 1024 ** 3 with the division first; closed form for the rows.
    "other_order_closed_form": [
        ("q3", "answer_q3 = {\"GQA\": \"B\", \"paged attention\": \"E\", \"prefix caching\": \"A\", "
               "\"quantization\": \"C\", \"sliding window\": \"D\"}",
         "answer_q3 = dict([(\"sliding window\", \"D\"), (\"quantization\", \"C\"), (\"prefix caching\", \"A\"), "
         "(\"paged attention\", \"E\"), (\"GQA\", \"B\")])"),
        ("kv_cache_gib", GIB,
         "    return 2 * cfg.n_layers * batch * seq_len * cfg.n_kv_heads * cfg.head_dim * (bytes_per_element / 1024 ** 3)"),
        ("kv_rows", ROWS,
         "    per_row = T + N - 1 if cached else N * T + N * (N - 1) // 2\n"
         "    return batch * per_row"),
    ],
    # A loop that counts rows step by step, as generate runs; GiB from math.ldexp.
    "simulate_steps": [
        ("kv_cache_gib", GIB,
         "    import math\n"
         "    n_bytes = batch * seq_len * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * bytes_per_element\n"
         "    return math.ldexp(n_bytes, -30)"),
        ("kv_rows", ROWS,
         "    rows, length = 0, T\n"
         "    for step in range(N):\n"
         "        if not cached:\n"
         "            rows += length\n"
         "        elif step == 0:\n"
         "            rows += T\n"
         "        else:\n"
         "            rows += 1\n"
         "        length += 1\n"
         "    return batch * rows"),
    ],
}
