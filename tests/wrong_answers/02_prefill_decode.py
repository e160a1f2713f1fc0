"""Realistic wrong answers for notebooks/02_prefill_decode.ipynb; each must lose points.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text).
"""

WRONG = {
    # Prefill ignores the attention mask: left padding is attended to and shifts every position.
    "prefill_forgets_mask": [
        ("prefill_decode", "model(input_ids, cache=cache, attention_mask=attention_mask)", "model(input_ids, cache=cache)"),
    ],
    # Returns the logits of the first prompt position instead of the last.
    "prefill_first_position": [
        ("prefill_decode", "return logits[:, -1]  # the last prompt position", "return logits[:, 0]"),
    ],
    # The decoding step forgets the cache: the new token sees nothing but itself, at position 0.
    "decode_without_cache": [
        ("prefill_decode", "model(token[:, None], cache=cache)", "model(token[:, None])"),
    ],
    # Same tokens, but every decoding step re-runs the whole sequence without the cache.
    "decode_feeds_whole_sequence": [
        ("two_phase_generate", "logits = run_decode_step(model, nxt, cache)  # (B, V)",
         "logits = model(torch.cat(out, dim=1))[:, -1]"),
    ],
    # One decoding step too many: the last token is fed back and one token too many is returned.
    "one_step_too_many": [
        ("two_phase_generate", "for _ in range(max_new_tokens - 1):", "for _ in range(max_new_tokens):"),
    ],
    # The clock starts after the prefill, so the time to first token leaves the prefill out.
    "ttft_excludes_prefill": [
        ("two_phase_generate",
         "start = time.perf_counter()\n        nxt = run_prefill(model, input_ids, cache, attention_mask).argmax(dim=-1)  # (B,)",
         "nxt = run_prefill(model, input_ids, cache, attention_mask).argmax(dim=-1)  # (B,)\n        start = time.perf_counter()"),
    ],
}
