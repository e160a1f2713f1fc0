"""Realistic wrong answers for solutions/04_gqa.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Query head h reads K/V head h % H_kv (what k.repeat(1, G, 1, 1) gives) instead of h // G
    # (what k.repeat_interleave(G, dim=1) gives): the groups are interleaved instead of consecutive.
    "head_mapping_modulo": [
        ("grouped_attention", "qg = q.reshape(B, H_kv, G, T, D)", "qg = q.reshape(B, G, H_kv, T, D).transpose(1, 2)"),
        ("grouped_attention", "return out.reshape(B, H, T, D)", "return out.transpose(1, 2).reshape(B, H, T, D)"),
    ],
    # Forgets to divide the scores by sqrt(D): softmax too peaked.
    "no_scale": [
        ("grouped_attention", " / math.sqrt(D)", ""),
    ],
    # Normalises over the queries instead of the keys.
    "softmax_wrong_axis": [
        ("grouped_attention", "torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"),
    ],
    # Builds the mask but never applies it: queries see the future and the padding.
    "mask_not_applied": [
        ("grouped_attention", "scores = scores.masked_fill(~mask, float(\"-inf\"))", "pass"),
    ],
    # A square causal mask that assumes T == S: wrong for new tokens after a cache.
    "causal_mask_without_offset": [
        ("grouped_attention", ".tril(diagonal=S - T)", ".tril()"),
    ],
    # Handles the string "causal" but ignores explicit (padding / window) masks.
    "explicit_mask_ignored": [
        ("grouped_attention", "if mask is not None:", "if isinstance(mask, torch.Tensor) and mask.dim() == 2:"),
    ],
}
