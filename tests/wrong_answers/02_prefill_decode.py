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
    # The prompt fed one token per call: the same logits for an unpadded prompt, but T calls, not one
    # (and the padding mask is lost).
    "prefill_token_by_token": [
        ("prefill_decode", "logits = model(input_ids, cache=cache, attention_mask=attention_mask)  # (B, T, V)",
         "for t in range(input_ids.shape[1]):\n        logits = model(input_ids[:, t:t + 1], cache=cache)"),
    ],
    # The generation loop never passes the mask on: left-padded prompts attend to their padding.
    "loop_drops_mask": [
        ("two_phase_generate", "run_prefill(model, input_ids, cache, attention_mask)", "run_prefill(model, input_ids, cache)"),
    ],
    # The cache in its default dtype (fp32) whatever the model's: a bf16 model cannot use it.
    "cache_default_dtype": [
        ("two_phase_generate", "T + max_new_tokens, dtype=model.dtype, device=model.device)",
         "T + max_new_tokens, device=model.device)"),
    ],
    # Every chunk gets the whole mask (or the mask is dropped after the first chunk): padding handled wrongly.
    "chunk_mask_not_sliced": [
        ("prefill_chunked", "part = None if attention_mask is None else attention_mask[:, start:start + chunk_size]",
         "part = attention_mask if start == 0 else None"),
    ],
    # Returns inside the loop: the logits of the first chunk's last token.
    "chunk_returns_first": [
        ("prefill_chunked", "logits = model(input_ids[:, start:start + chunk_size], cache=cache, attention_mask=part)  # (B, chunk, V)",
         "return model(input_ids[:, start:start + chunk_size], cache=cache, attention_mask=part)[:, -1]"),
    ],
    # Issue 38: the error says what is allowed but not the value it got (the text asks for both).
    "chunk_error_without_value": [
        ("prefill_chunked", 'raise ValueError(f"chunk_size must be a positive int (tokens per call), got {chunk_size!r}")',
         'raise ValueError("chunk_size must be a positive int (tokens per call)")'),
    ],
    # No check of chunk_size: 0 happens to raise (range's own ValueError), but -2 runs no chunk at all.
    "chunk_size_not_checked": [
        ("prefill_chunked", "if not isinstance(chunk_size, int) or chunk_size < 1:", "if False:"),
    ],
}
