"""Correct answers for notebooks/08_troubleshooting.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

SLOPE = ("    latencies = np.diff(token_s)  # between consecutive tokens: decode only (the TTFT is not one of them)\n"
         "    if len(latencies) < 2:\n"
         "        return 0.0\n"
         "    return float(np.polyfit(np.arange(len(latencies)), latencies, 1)[0])  # least-squares line, its slope")

RIGHT = {
    # Plain Python: a loop, the least-squares slope written out, max() with a key.
    "plain_python": [
        ("recomputes_prefix",
         "    return any(rows > 1 for rows in rows_per_token[1:])  # token 0 pays for the prompt; each later one for itself",
         "    for rows in rows_per_token[1:]:\n"
         "        if rows != 1:\n"
         "            return True\n"
         "    return False"),
        ("latency_slope", SLOPE,
         "    lat = [b - a for a, b in zip(token_s, token_s[1:])]\n"
         "    n = len(lat)\n"
         "    if n < 2:\n"
         "        return 0.0\n"
         "    x_mean, y_mean = (n - 1) / 2, sum(lat) / n\n"
         "    sxy = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(lat))\n"
         "    sxx = sum((i - x_mean) ** 2 for i in range(n))\n"
         "    return sxy / sxx"),
        ("activation_share_at_peak",
         "    total = np.asarray(kv_bytes) + np.asarray(act_bytes)  # memory in use at each step\n"
         "    peak = int(np.argmax(total))  # the step where an allocation would fail first\n"
         "    return float(act_bytes[peak] / total[peak])",
         "    peak = max(range(len(kv_bytes)), key=lambda i: kv_bytes[i] + act_bytes[i])\n"
         "    return act_bytes[peak] / (kv_bytes[peak] + act_bytes[peak])"),
    ],
    # numpy throughout: lstsq for the slope, numpy scalars returned (the text allows them).
    "numpy_scalars": [
        ("latency_slope", SLOPE,
         "    lat = np.diff(np.asarray(token_s, dtype=np.float64))\n"
         "    if lat.size < 2:\n"
         "        return 0.0\n"
         "    A = np.stack([np.arange(lat.size, dtype=np.float64), np.ones(lat.size)], axis=1)\n"
         "    return np.linalg.lstsq(A, lat, rcond=None)[0][0]"),
        ("blocks_leaked", "    return int(blocks_used[-1])", "    return np.asarray(blocks_used)[-1].item()"),
        ("recomputes_prefix",
         "    return any(rows > 1 for rows in rows_per_token[1:])  # token 0 pays for the prompt; each later one for itself",
         "    return bool((np.asarray(rows_per_token[1:]) > 1).any())"),
    ],
    # Recomputation read in the served requests, robust to a one-off preemption: some request recomputes on most of
    # its later tokens (the planted fault recomputes at every token; a preempted request once).
    "recompute_read_in_served_requests_majority": [
        ("diagnose", "    if recomputes_prefix(solo.rows_per_token):",
         "    if any(2 * sum(rows > 1 for rows in r.rows_per_token[1:]) > len(r.rows_per_token) - 1\n"
         "           for r in s.requests.values()):"),
    ],
}
