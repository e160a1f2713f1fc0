"""Realistic wrong answers for solutions/09_review.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Thinks the queries are cached too.
    "caches_queries": [("q1", 'answer_q1 = "B"', 'answer_q1 = "A"')],
    # Misconception 2 of the chapter: the cache improves quality.
    "cache_improves_quality": [("q2", 'answer_q2 = "D"', 'answer_q2 = "A"')],
    # Mixes up the two block-level techniques of vLLM: paged attention and prefix caching.
    "paged_and_prefix_swapped": [
        ("q3", '"paged attention": "E", "prefix caching": "A"', '"paged attention": "A", "prefix caching": "E"'),
    ],
    # Misconception 3: a bigger cache costs nothing until it is used.
    "bigger_cache_is_free": [("q4", 'answer_q4 = "A"', 'answer_q4 = "B"')],
    # Picks a true fact that says nothing about memory (misconception 1 not understood).
    "memory_from_cache_size": [("q5", 'answer_q5 = "C"', 'answer_q5 = "A"')],
    # Counts the keys and forgets the values.
    "no_factor_2": [("kv_cache_gib", "per_token = 2 * cfg.n_layers", "per_token = cfg.n_layers")],
    # Uses the query heads: right for MHA, four to seven times too big for the GQA presets.
    "n_heads_not_n_kv_heads": [("kv_cache_gib", "cfg.n_kv_heads * cfg.head_dim", "cfg.n_heads * cfg.head_dim")],
    # Divides by 10**9 (GB) where GiB (2**30) are asked for.
    "gb_not_gib": [("kv_cache_gib", "return batch * seq_len * per_token / GiB", "return batch * seq_len * per_token / 1e9")],
    # Counts a decode call for the last token as well: T + N instead of T + N - 1.
    "cached_rows_off_by_one": [("kv_rows", "return batch * (T + N - 1)", "return batch * (T + N)")],
    # Without a cache, forgets that the sequence grows: N * T rows.
    "uncached_rows_no_growth": [("kv_rows", "return batch * sum(T + i for i in range(N))", "return batch * N * T")],
    # Counts one sequence only.
    "rows_forget_batch": [("kv_rows", "return batch * (T + N - 1)", "return T + N - 1")],
    # The practice question: H counts query heads, not K/V heads.
    "practice_query_heads": [("q0", 'answer_q0 = "B"', 'answer_q0 = "A"')],
    # head_dim taken as d_model / n_heads: true of most presets, not of every model.
    "head_dim_from_d_model": [("kv_cache_gib", "cfg.n_kv_heads * cfg.head_dim", "cfg.n_kv_heads * (cfg.d_model // cfg.n_heads)")],
}
