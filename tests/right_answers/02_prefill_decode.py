"""Correct answers for notebooks/02_prefill_decode.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

CHUNKED = (
    "    for start in range(0, input_ids.shape[1], chunk_size):\n"
    "        part = None if attention_mask is None else attention_mask[:, start:start + chunk_size]  # (B, chunk)\n"
    "        logits = model(input_ids[:, start:start + chunk_size], cache=cache, attention_mask=part)  # (B, chunk, V)\n"
    "    return logits[:, -1]\n")
CHECK = ("    if not isinstance(chunk_size, int) or chunk_size < 1:\n"
         "        raise ValueError(f\"chunk_size must be a positive int (tokens per call), got {chunk_size!r}\")\n")

RIGHT = {
    # Explicit indexing instead of [:, -1], unsqueeze/squeeze, tokens kept in a preallocated tensor.
    "index_and_preallocate": [
        ("prefill_decode", "return logits[:, -1]  # the last prompt position",
         "return logits[:, input_ids.shape[1] - 1, :]"),
        ("prefill_decode", "logits = model(token[:, None], cache=cache)  # (B, 1, V)\n    return logits[:, -1]",
         "return model(token.unsqueeze(-1), cache=cache).squeeze(1)"),
        ("two_phase_generate",
         "        out = [input_ids, nxt[:, None]]\n"
         "        for _ in range(max_new_tokens - 1):\n"
         "            start = time.perf_counter()\n"
         "            logits = run_decode_step(model, nxt, cache)  # (B, V)\n"
         "            nxt = logits.argmax(dim=-1)\n"
         "            stats[\"decode_s\"].append(time.perf_counter() - start)\n"
         "            out.append(nxt[:, None])\n"
         "    return torch.cat(out, dim=1), stats",
         "        tokens = torch.zeros(B, T + max_new_tokens, dtype=input_ids.dtype)\n"
         "        tokens[:, :T] = input_ids\n"
         "        tokens[:, T] = nxt\n"
         "        for i in range(1, max_new_tokens):\n"
         "            t0 = time.perf_counter()\n"
         "            nxt = torch.argmax(run_decode_step(model, tokens[:, T + i - 1], cache), dim=-1)\n"
         "            stats[\"decode_s\"].append(time.perf_counter() - t0)\n"
         "            tokens[:, T + i] = nxt\n"
         "    return tokens, stats"),
        # torch.split of the ids and the mask, zipped
        ("prefill_chunked", CHUNKED,
         "    masks = [None] * input_ids.shape[1] if attention_mask is None else attention_mask.split(chunk_size, dim=1)\n"
         "    for piece, m in zip(input_ids.split(chunk_size, dim=1), masks):\n"
         "        out = model(piece, cache=cache, attention_mask=m)\n"
         "    return out[:, -1, :]\n"),
    ],
    # Timestamps first, differences afterwards; numpy floats in the stats (the text asks for floats).
    "timestamps_then_differences": [
        ("two_phase_generate",
         "    with torch.inference_mode():\n"
         "        start = time.perf_counter()\n"
         "        nxt = run_prefill(model, input_ids, cache, attention_mask).argmax(dim=-1)  # (B,)\n"
         "        stats = {\"ttft_s\": time.perf_counter() - start, \"decode_s\": []}\n"
         "        out = [input_ids, nxt[:, None]]\n"
         "        for _ in range(max_new_tokens - 1):\n"
         "            start = time.perf_counter()\n"
         "            logits = run_decode_step(model, nxt, cache)  # (B, V)\n"
         "            nxt = logits.argmax(dim=-1)\n"
         "            stats[\"decode_s\"].append(time.perf_counter() - start)\n"
         "            out.append(nxt[:, None])\n"
         "    return torch.cat(out, dim=1), stats",
         "    import numpy as np\n"
         "    stamps = [time.perf_counter()]\n"
         "    with torch.inference_mode():\n"
         "        new = [run_prefill(model, input_ids, cache, attention_mask).argmax(-1)]\n"
         "        stamps.append(time.perf_counter())\n"
         "        while len(new) < max_new_tokens:\n"
         "            new.append(run_decode_step(model, new[-1], cache).argmax(-1))\n"
         "            stamps.append(time.perf_counter())\n"
         "    gaps = np.diff(stamps)\n"
         "    stats = {\"ttft_s\": gaps[0], \"decode_s\": list(gaps[1:])}\n"
         "    return torch.cat([input_ids, torch.stack(new, dim=1)], dim=1), stats"),
        # the check written with type() and <= 0, the value given at the end of the message in other words; a
        # while loop over the start position
        ("prefill_chunked", CHECK,
         "    if type(chunk_size) is not int or chunk_size <= 0:\n"
         "        raise ValueError('chunk_size: a whole number of tokens >= 1, not ' + str(chunk_size))\n"),
        ("prefill_chunked", CHUNKED,
         "    start, T = 0, input_ids.shape[1]\n"
         "    while start < T:\n"
         "        end = min(start + chunk_size, T)\n"
         "        kw = {} if attention_mask is None else {'attention_mask': attention_mask[:, start:end]}\n"
         "        logits = model(input_ids[:, start:end], cache=cache, **kw)\n"
         "        start = end\n"
         "    return logits[:, -1]\n"),
    ],
}
