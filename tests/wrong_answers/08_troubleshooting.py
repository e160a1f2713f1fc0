"""Realistic wrong answers for solutions/08_troubleshooting.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Compares total rows with the number of tokens: the prompt's rows make every request look recomputed.
    "recompute_total_rows": [
        ("recomputes_prefix", "return any(rows > 1 for rows in rows_per_token[1:])",
         "return sum(rows_per_token) > len(rows_per_token)"),
    ],
    # Checks the first token too, which always costs the whole prompt.
    "recompute_counts_first_token": [
        ("recomputes_prefix", "return any(rows > 1 for rows in rows_per_token[1:])",
         "return any(rows > 1 for rows in rows_per_token)"),
    ],
    # Puts the TTFT at the head of the per-token latency curve: a long first wait tilts the line down.
    "slope_includes_ttft": [
        ("latency_slope", "latencies = np.diff(token_s)", "latencies = np.diff([arrival_s, *token_s])"),
    ],
    # Fits the time since arrival (cumulative) instead of the time between tokens: the slope is the latency itself.
    "slope_of_cumulative_time": [
        ("latency_slope", "latencies = np.diff(token_s)", "latencies = np.asarray(token_s[1:]) - arrival_s"),
    ],
    # Looks at the peak of the blocks-in-use curve: that measures load, not a leak.
    "leak_checks_peak": [
        ("blocks_leaked", "return int(blocks_used[-1])", "return int(max(blocks_used))"),
    ],
    # Takes the step where activations peak, not the step where memory in use peaks.
    "share_at_activation_peak": [
        ("activation_share_at_peak", "peak = int(np.argmax(total))", "peak = int(np.argmax(act_bytes))"),
    ],
    # Mixes up the fragmenting engine and the leaking one (both "run out of memory").
    "swapped_diagnosis": [
        ("mystery_answers", '"engine_C": "contiguous_fragmentation",', '"engine_C": "blocks_not_freed",'),
        ("mystery_answers", '"engine_D": "blocks_not_freed",', '"engine_D": "contiguous_fragmentation",'),
    ],
    # Right fault, wrong cure: a leak is not fixed by making each block smaller.
    "leak_fixed_by_quantizing": [
        ("mystery_answers", '"engine_D": "free_finished",', '"engine_D": "quantize_kv",'),
    ],
}
