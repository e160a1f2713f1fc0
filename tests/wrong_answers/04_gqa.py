"""Realistic wrong answers for solutions/04_gqa.ipynb; each must lose points (see docs/COURSE_PIPELINE.md)."""

# name -> list of (grade_id of an answer cell, exact text in the solution, replacement text)
WRONG = {
    # Query head h reads K/V head h % H_kv (what k.repeat(1, n_rep, 1, 1) gives) instead of h // n_rep
    # (what k.repeat_interleave(n_rep, dim=1) gives): the groups are interleaved instead of consecutive.
    "head_mapping_modulo": [
        ("grouped_attention", "qg = q.reshape(B, H_kv, n_rep, T, D)", "qg = q.reshape(B, n_rep, H_kv, T, D).transpose(1, 2)"),
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
    # repeat_kv tiles the whole set of heads (0, 1, 0, 1, ...) instead of copying each in a row.
    "repeat_kv_tiles": [
        ("repeat_kv", "x[:, :, None].expand(B, H_kv, n_rep, S, D)", "x[:, None].expand(B, n_rep, H_kv, S, D)"),
    ],
    # repeat_kv copies even when n_rep == 1 (the text: return x itself).
    "repeat_kv_copies_for_one": [
        ("repeat_kv", "    if n_rep == 1:\n        return x  # nothing to copy\n", ""),
    ],
    # An explicit mask is used only when it has a batch dimension of B: a (1, 1, T, S) window is dropped.
    "broadcast_mask_ignored": [
        ("grouped_attention", "if mask is not None:", "if mask is not None and mask.shape[0] == B:"),
    ],
    # mask=None read as "causal": the text says None means every query sees every key (the two agree only for T = 1).
    "none_read_as_causal": [
        ("grouped_attention", "    if isinstance(mask, str):", "    if mask is None or isinstance(mask, str):"),
    ],
    # The mask reshaped to (B, 1, 1, T, S) as if it always had T rows: a (B, 1, 1, S) padding mask, valid for any T
    # (the text: broadcastable to (B, 1, T, S)), fails as soon as T > 1.
    "mask_reshaped_to_t_rows": [
        ("grouped_attention", "        mask = mask.unsqueeze(2) if mask.dim() == 4 else mask  # (B, 1, 1, T, S) or (T, S)",
         "        mask = mask.reshape(-1, 1, 1, T, S)  # (B, 1, 1, T, S)"),
    ],
}
