"""Correct answers for notebooks/04_gqa.ipynb written differently from the solution; each must get full marks.

name -> list of (grade_id of an answer cell, exact text in the solution, replacement text), as in tests/wrong_answers/.
"""

SOLUTION = (
    "    qg = q.reshape(B, H_kv, n_rep, T, D)  # group j holds query heads j*n_rep ... j*n_rep + n_rep-1\n"
    "    scores = qg @ k.unsqueeze(2).transpose(-2, -1) / math.sqrt(D)  # (B, H_kv, n_rep, T, S): K head j serves group j\n"
    "    if isinstance(mask, str):  # \"causal\": the T queries are the last T of the S slots\n"
    "        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)"
    "  # query i sees slots <= S-T+i\n"
    "    if mask is not None:  # True = may attend; the same for the n_rep heads of a group\n"
    "        mask = mask.unsqueeze(2) if mask.dim() == 4 else mask  # (B, 1, 1, T, S) or (T, S)\n"
    "        scores = scores.masked_fill(~mask, float(\"-inf\"))  # hidden keys get zero weight\n"
    "    weights = torch.softmax(scores, dim=-1)  # over the S keys\n"
    "    out = weights @ v.unsqueeze(2)  # (B, H_kv, n_rep, T, D)\n"
    "    return out.reshape(B, H, T, D)  # query head j*n_rep + r is back at index j*n_rep + r")

RIGHT = {
    # repeat_interleave of K/V to H heads (as Llama's repeat_kv), then einsum; the causal mask from two aranges.
    # repeat_kv with repeat_interleave, and n_rep == 1 handled by an expand that keeps the storage.
    "repeat_kv_einsum": [
        ("repeat_kv", "    if n_rep == 1:\n        return x  # nothing to copy\n",
         "    if n_rep <= 1:\n        return x\n"),
        ("repeat_kv", "    return x[:, :, None].expand(B, H_kv, n_rep, S, D).reshape(B, H_kv * n_rep, S, D)  # (B, H, S, D)",
         "    return torch.repeat_interleave(x, repeats=n_rep, dim=1)"),
        ("grouped_attention", SOLUTION,
         "    k_full = k.repeat_interleave(n_rep, dim=1)  # (B, H, S, D): head h gets K/V head h // n_rep\n"
         "    v_full = v.repeat_interleave(n_rep, dim=1)\n"
         "    scores = torch.einsum('bhtd,bhsd->bhts', q, k_full) * D ** -0.5\n"
         "    if type(mask) is str:  # the one mode, causal\n"
         "        mask = torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None]\n"
         "    if mask is not None:\n"
         "        scores = torch.where(mask, scores, torch.tensor(float('-inf')))\n"
         "    return torch.einsum('bhts,bhsd->bhtd', scores.softmax(-1), v_full)"),
    ],
    # One K/V head at a time, its n_rep query heads together; softmax by hand (max subtracted).
    "loop_over_kv_heads": [
        ("repeat_kv", "    return x[:, :, None].expand(B, H_kv, n_rep, S, D).reshape(B, H_kv * n_rep, S, D)  # (B, H, S, D)",
         "    return torch.cat([x[:, j:j + 1] for j in range(H_kv) for _ in range(n_rep)], dim=1)"),
        ("grouped_attention", SOLUTION,
         "    if isinstance(mask, str):\n"
         "        mask = torch.ones(T, S, dtype=torch.bool).triu(diagonal=S - T + 1).logical_not()\n"
         "    outs = []\n"
         "    for j in range(H_kv):\n"
         "        qj = q[:, j * n_rep:(j + 1) * n_rep]  # (B, n_rep, T, D)\n"
         "        s = torch.matmul(qj, k[:, j:j + 1].transpose(2, 3)) / math.sqrt(D)  # (B, n_rep, T, S)\n"
         "        if mask is not None:\n"
         "            s = s.masked_fill(mask.logical_not(), -math.inf)\n"
         "        s = s - s.amax(dim=-1, keepdim=True)\n"
         "        w = s.exp() / s.exp().sum(dim=-1, keepdim=True)\n"
         "        outs.append(w @ v[:, j:j + 1])  # (B, n_rep, T, D)\n"
         "    return torch.cat(outs, dim=1)"),
    ],
}
