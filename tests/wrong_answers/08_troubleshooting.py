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
    # Asks about the missing prefix cache first: the contiguous allocator, which shares no blocks either, is
    # taken for it (a side effect named as the cause).
    "prefix_asked_first": [
        ("diagnose", "    if stuck > 3:\n",
         "    if not any(r.cached_tokens for r in s.requests.values()):\n"
         "        return \"shared_prefix_not_cached\"\n"
         "    if stuck > 3:\n"),
    ],
    # Counts every wait with enough free blocks as fragmentation, adjacent or not: a paged pool shows one now
    # and then, so the engine without prefix caching is called fragmented.
    "fragmentation_any_wait": [
        ("diagnose", "if w and free >= need > run and fed < faults.TOKEN_BUDGET)",
         "if w and free >= need and fed < faults.TOKEN_BUDGET)"),
        ("diagnose", "    if stuck > 3:", "    if stuck:"),
    ],
    # Reads the fragmentation clue literally: one step queued with room and no long enough run of free blocks is
    # taken for fragmentation, although a paged engine shows that on a step or two (visible day 4, hidden 13, 22).
    "fragmentation_any_short_run": [
        ("diagnose", "    if stuck > 3:", "    if stuck:"),
    ],
    # Counts the steps but stops at two: the paged engine without prefix caching shows two such steps on day 4.
    "fragmentation_two_steps": [
        ("diagnose", "    if stuck > 3:", "    if stuck > 1:"),
    ],
    # Reads the engine's setting instead of its symptom: every trace records the deployment's budget, so the
    # engine that prefills whole prompts is not found this way.
    "spike_read_from_setting": [
        ("diagnose", "if max(s.step_tokens) > faults.TOKEN_BUDGET:", "if s.token_budget > faults.TOKEN_BUDGET:"),
    ],
    # Falls back to a fault when nothing is wrong: the healthy engine gets a diagnosis.
    "always_a_fault": [
        ("diagnose", "    return None\n", "    return \"shared_prefix_not_cached\"\n"),
    ],
    # Right fault, wrong cure: a leak is not fixed by making each block smaller.
    "leak_cured_by_quantizing": [
        ("cure", '"blocks_not_freed": "free_finished",', '"blocks_not_freed": "quantize_kv",'),
    ],
    # Reads recomputation in the served requests too, with the warm-up's any-later-token test: a request preempted for
    # lack of blocks is recomputed once, a side effect of another fault (day 4: the uncached shared prefix), issue 29.
    "recompute_read_in_served_requests": [
        ("diagnose", "    if recomputes_prefix(solo.rows_per_token):",
         "    if recomputes_prefix(solo.rows_per_token) or any(recomputes_prefix(r.rows_per_token)\n"
         "                                                     for r in s.requests.values()):"),
    ],
}
