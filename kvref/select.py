"""Top-k selection over a full cache: keep every row, read only the k that matter (a teaching version of
DeepSeek Sparse Attention, DeepSeek-V3.2).

Eviction (kvref.evict, H2O) saves memory: it drops rows, and a fact in a dropped row is gone for good.
Selection saves reads: every row stays in memory, and each query picks its own k rows. A row no query
needs now is still there for a later query that does.

``TopKCache(k)`` is a DynamicCache the model hands its attention to (``reads_in_place``). For each new
query and K/V head an *indexer* scores every visible cached row and attention reads only the k best.
DSA trains a small separate indexer (its own keys of 128 numbers, a few ReLU heads, fp8); here the
indexer is the model's own score q . k summed over the query heads that share the K/V head, the best
case an indexer can hope for, so the recall measured is an upper bound for a learned one. Counters:

    rows_read    K/V rows attention reads: min(k, visible) per query and K/V head, every layer
    rows_full    what full attention would read: every visible row
    index_reads  rows the indexer scores (all visible ones: the indexer is what stays O(S))
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cache import DynamicCache
from .evict import H2OCache


class TopKCache(DynamicCache):
    """Every row kept; each query reads its ``k`` best-scored rows per K/V head (k >= S: full attention)."""

    reads_in_place = True

    def __init__(self, k: int) -> None:
        super().__init__()
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (rows each query reads) must be an integer >= 1; got {k!r}")
        self.topk = k
        self.rows_read = self.rows_full = self.index_reads = 0

    def attend(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, mask, attend
               ) -> torch.Tensor:
        k, v = self.update(layer, k_new, v_new)  # (B, H_kv, S, D): the whole cache, kept
        B, H, T, D = q.shape
        H_kv, S = k.shape[1], k.shape[2]
        g = H // H_kv
        if mask is None:
            allowed = torch.ones(1, 1, T, S, dtype=torch.bool, device=q.device)
        elif isinstance(mask, str):
            allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)[None, None]
        else:
            allowed = mask  # (B, 1, T, S)
        allowed = allowed.expand(B, H_kv, T, S)
        # the indexer: one score per (query, K/V head, cached row)
        score = torch.einsum("bhgtd,bhsd->bhts", q.view(B, H_kv, g, T, D).float(), k.float()) / math.sqrt(D)
        score = score.masked_fill(~allowed, float("-inf"))  # (B, H_kv, T, S)
        top = score.topk(min(self.topk, S), dim=-1).indices  # (B, H_kv, T, k)
        chosen = torch.zeros_like(allowed).scatter_(-1, top, True) & allowed  # never a masked row
        self.rows_read += int(chosen.sum())
        self.rows_full += int(allowed.sum())
        self.index_reads += int(allowed.sum())
        chosen = chosen.repeat_interleave(g, dim=1)  # (B, H, T, S): query head h reads K/V head h // g
        return F.scaled_dot_product_attention(q, k, v, attn_mask=chosen, enable_gqa=g > 1)  # (B, H, T, D)

    def reset(self) -> None:
        super().reset()
        self.rows_read = self.rows_full = self.index_reads = 0


@torch.no_grad()
def _answers(model, cache, ids: torch.Tensor, mask: torch.Tensor, one_call: bool) -> tuple[list[bytes], float]:
    """Greedy 4 answer digits per probe (chapter 7's scoring), the prompt in one call or token by token;
    and, for a TopKCache, the share of rows read in the answer (decode) steps."""
    if one_call:
        logits = model(ids, cache=cache, attention_mask=mask)[:, -1]
    else:
        for i in range(ids.shape[1]):
            logits = model(ids[:, i:i + 1], cache=cache, attention_mask=mask[:, i:i + 1])[:, -1]
    before = (getattr(cache, "rows_read", 0), getattr(cache, "rows_full", 0))
    nxt, out = logits.argmax(-1), []
    for j in range(4):
        out.append(nxt)
        if j < 3:  # the 4th digit needs no further step
            nxt = model(nxt[:, None], cache=cache)[:, -1].argmax(-1)
    full = getattr(cache, "rows_full", 0) - before[1]
    frac = (getattr(cache, "rows_read", 0) - before[0]) / full if full else 1.0
    return [bytes(row) for row in torch.stack(out, dim=1).tolist()], frac


def selection_vs_eviction(model, ks: tuple[int, ...] = (8, 16, 32, 64, 128), n_probes: int = 20,
                          seq: int | None = None, start: int = 10_000, h2o: bool = True) -> list[dict]:
    """Recall on chapter 7's held-out lookup probes (kvref.train.recall_probes(n, seq, start=10_000), 4 greedy
    digits, exact match) with top-k selection at each k, and with H2O holding k rows (k // 2 heavy + the rest
    recent, fed token by token as chapter 7 does).

    Returns one dict per k: k, recall_select, read_frac (rows read / rows full attention would read, whole run),
    read_frac_answer (the same over the answer steps: about k / S), recall_h2o, memory_frac_h2o (k / S),
    and recall_full (the full cache, for reference) and S (prompt length, left padding included).
    """
    from .train import recall_probes

    seq = seq or model.cfg.max_seq_len
    probes = recall_probes(n_probes, seq, start=start)
    T = max(len(p) for p, _, _ in probes)
    ids = torch.tensor([[0] * (T - len(p)) + list(p) for p, _, _ in probes], device=model.device)
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p, _, _ in probes], device=model.device)
    answers = [a for _, a, _ in probes]

    def recall(got: list[bytes]) -> float:
        return sum(g == a for g, a in zip(got, answers)) / len(answers)

    full = recall(_answers(model, DynamicCache(), ids, mask, one_call=True)[0])
    rows = []
    for k in ks:
        sel = TopKCache(k)
        got, answer_frac = _answers(model, sel, ids, mask, one_call=True)
        row = {"k": k, "S": T, "recall_full": full, "recall_select": recall(got),
               "read_frac": sel.rows_read / sel.rows_full, "read_frac_answer": answer_frac}
        if h2o:
            row["recall_h2o"] = recall(_answers(model, H2OCache(k // 2, k - k // 2), ids, mask, one_call=False)[0])
            row["memory_frac_h2o"] = k / T
        rows.append(row)
    return rows


def selection_table(rows: list[dict]) -> str:
    """selection_vs_eviction's rows as a markdown table."""
    pct = lambda x: f"{100 * x:.0f} %"  # noqa: E731
    lines = ["| k | top-k recall | rows read (whole run) | rows read (answer step) | H2O recall (k rows kept) "
             "| H2O memory | full-cache recall |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['k']} | {pct(r['recall_select'])} | {pct(r['read_frac'])} | {pct(r['read_frac_answer'])} "
                     f"| {pct(r['recall_h2o']) if 'recall_h2o' in r else '-'} "
                     f"| {pct(r['memory_frac_h2o']) if 'memory_frac_h2o' in r else '-'} | {pct(r['recall_full'])} |")
    return "\n".join(lines)
