"""Realistic wrong answers for solutions/03_memory.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Counts the keys and forgets the values.
    "no_factor_2": [
        ("kv_cache_bytes", "per_token = 2 * cfg.n_layers", "per_token = cfg.n_layers"),
    ],
    # Uses the number of query heads: right for MHA, too big for GQA/MQA.
    "n_heads_not_n_kv_heads": [
        ("kv_cache_bytes", "cfg.n_kv_heads * cfg.head_dim", "cfg.n_heads * cfg.head_dim"),
    ],
    # The MHA shortcut H_kv * D = d_model applied to every model.
    "hidden_size_shortcut": [
        ("kv_cache_bytes", "cfg.n_kv_heads * cfg.head_dim", "cfg.d_model"),
    ],
    # Bits per element where bytes are needed (8x too big).
    "bits_not_bytes": [
        ("kv_cache_bytes", "torch.finfo(dtype).bits // 8", "torch.finfo(dtype).bits"),
    ],
    # Assumes every cache is fp16.
    "always_fp16": [
        ("kv_cache_bytes", "torch.finfo(dtype).bits // 8", "2"),
    ],
    # Plans as if the whole GPU were free for the cache.
    "planner_forgets_weights": [
        ("max_batch", "kv_budget = gpu_bytes - weight_bytes - reserve_bytes", "kv_budget = gpu_bytes - reserve_bytes"),
    ],
    # Leaves nothing for activations and temporary buffers.
    "planner_forgets_reserve": [
        ("max_batch", "kv_budget = gpu_bytes - weight_bytes - reserve_bytes", "kv_budget = gpu_bytes - weight_bytes"),
    ],
    # Rounds the number of sequences up: the last one does not fit.
    "planner_rounds_up": [
        ("max_batch", "return max(kv_budget, 0) // per_sequence", "return math.ceil(max(kv_budget, 0) / per_sequence)"),
    ],
    # Rounds to the nearest integer: wrong whenever more than half a sequence of room is left.
    "planner_rounds_to_nearest": [
        ("max_batch", "return max(kv_budget, 0) // per_sequence", "return round(max(kv_budget, 0) / per_sequence)"),
    ],
    # Negative budget when the weights do not fit: returns a negative batch.
    "planner_negative_batch": [
        ("max_batch", "return max(kv_budget, 0) // per_sequence", "return kv_budget // per_sequence"),
    ],
    # The head dimension taken as d_model / H: right unless the config gives head_dim explicitly.
    "head_dim_from_d_model": [
        ("kv_cache_bytes", "cfg.n_kv_heads * cfg.head_dim", "cfg.n_kv_heads * (cfg.d_model // cfg.n_heads)"),
    ],
    # A strict inequality: when the budget holds exactly n sequences, only n - 1 are planned.
    "planner_exact_fit_excluded": [
        ("max_batch", "return max(kv_budget, 0) // per_sequence", "return max(kv_budget - 1, 0) // per_sequence"),
    ],
    # The planner always budgets an fp32 cache, whatever dtype it is given.
    "planner_ignores_dtype": [
        ("max_batch", "kv_cache_bytes(cfg, 1, seq_len, dtype)", "kv_cache_bytes(cfg, 1, seq_len, torch.float32)"),
    ],
    # Admits the requests in the order they came: stops at the first that does not fit.
    "requests_in_arrival_order": [
        ("max_requests", "lens = sorted(seq_lens)", "lens = list(seq_lens)"),
    ],
    # A StaticCache budgeted like per-sequence caches: the padding of shorter rows is forgotten.
    "static_without_padding": [
        ("max_requests", "need = kv_cache_bytes(cfg, k + 1, n, dtype)  # k + 1 rows, each padded to n slots",
         "need = used + kv_cache_bytes(cfg, 1, n, dtype)"),
    ],
    # Every static row padded to the longest of ALL waiting requests, not of the chosen ones.
    "static_pads_to_longest_waiting": [
        ("max_requests", "need = kv_cache_bytes(cfg, k + 1, n, dtype)  # k + 1 rows, each padded to n slots",
         "need = kv_cache_bytes(cfg, k + 1, max(lens), dtype)"),
    ],
}
