"""Bounded caches: keep a fixed budget of tokens, so memory stays flat however long generation runs.

Instead of compressing every K/V (``quant.py``), these caches change *what is remembered*:

* ``SlidingWindowCache(window)``: only the W newest tokens, in a ring buffer written in place
  (sliding-window attention, as Mistral-7B v0.1 was trained with). Exact: its logits equal those
  of the same model with a sliding-window mask in every layer.
* ``SinkCache(sinks, window)``: the first few tokens ("attention sinks", which soak up attention
  whatever they say) plus the W newest (StreamingLLM, Xiao et al., 2023).
* ``H2OCache(heavy, recent)``: the ``recent`` newest tokens plus the ``heavy`` tokens that have
  received the most attention so far, chosen per sequence and K/V head (H2O, Zhang et al., 2023;
  the reference code sums the scores over the batch instead).

The price is long-range memory: a fact that falls out of the budget is gone for good.

Keys are cached after their position is applied (RoPE, or GPT-2's learned position embedding
added before the K projection), so every kept key keeps its true position. Sinks and H2O return
their slots oldest first; they hold ``budget`` tokens between forward calls, a call's queries see
those plus the call's own new tokens (causally), and eviction happens after the call, in
``advance``. The window's decode step hands attention its ring in slot order (see the class).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .cache import CropError, DynamicCache
from .config import ModelConfig


class BudgetError(ValueError):
    """A window or budget that cannot hold a single token."""


def _positive(name: str, value) -> int:
    if not isinstance(value, int) or value < 1:
        raise BudgetError(f"{name} must be an integer >= 1 (tokens kept); got {value!r}")
    return value


class SlidingWindowCache(DynamicCache):
    """The W newest tokens in a ring buffer: slot ``t % W`` holds the t-th token appended.

    Per layer, K and V each get one (B, H_kv, W, D) buffer, allocated on the first call and only
    ever written in place (its ``data_ptr`` never changes; ``nbytes`` and ``reset`` are
    DynamicCache's). A query sees its W newest keys, itself included, so of the W tokens in a
    full ring the oldest is dead: no later query can see it, and its slot is where the next
    token goes. ``length``, the held keys the next query may see, therefore stops at W - 1.

    Two ways through ``update``:

    * a decode step (one new token per row, no padding held): write the new row into its slot,
      then hand attention the ring itself, a view with the slots in ring order. Every key in it
      is inside the window and carries its position (rotated by RoPE, or computed from a hidden
      state that already had GPT-2's learned position added), so the order does not matter and
      the model needs no mask: one row written per layer and tensor, nothing copied.
    * anything else (a prompt, a chunk of several tokens, left padding still in the window): the
      queries of one call need different keys, and the model builds that mask in time order, so
      the held keys are gathered oldest first and the new ones appended (a copy of the window),
      then the newest new rows are written into the ring. A call of more than W tokens keeps
      only its last W: that is the window's contract, not a silent cut.

    Rollback (``crop``, speculative decoding): a ring that already overwrote a slot cannot give the
    old token back, so the ring gets ``slack`` extra slots, W + slack in all, that keep tokens the
    window no longer shows. The rule: **a ring of W + s slots can drop up to s + 1 of its newest
    tokens** (the dead slot is the +1), so a target verifying k drafts, which drops at most k, needs
    s >= k - 1. A crop past that raises CropError. With slack, the decode step takes the copying
    path too (the whole ring would show keys older than the window).
    """

    def __init__(self, window: int, slack: int = 0) -> None:
        super().__init__()
        self.window = _positive("window", window)
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise BudgetError(f"slack must be an integer >= 0 (extra ring slots for rollback); got {slack!r}")
        self.slack, self.slots = slack, self.window + slack  # ring slots
        self.visible = max(self.window - 1, 1)  # held keys a new query can see (W = 1: kept as one)
        self._all_real = True  # no held slot is padding (the decode path needs that)
        self._tail: torch.Tensor | None = None  # (B, <= slots) real flags of the tokens the ring holds

    def check(self, cfg: ModelConfig, batch: int, new_tokens: int, dtype: torch.dtype,
              device: torch.device) -> None:
        trained = cfg.sliding_window
        if trained is not None and self.window > trained:
            # The model masks with the cache's window: a wider one shows keys it never saw in training.
            raise BudgetError(
                f"this model attends to its {trained} newest tokens (cfg.sliding_window); a window cache of "
                f"{self.window} would let it see further than it was trained to. Use a window <= {trained} "
                f"(= {trained} is exact)"
            )
        super().check(cfg, batch, new_tokens, dtype, device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, H_kv, T, D = k.shape
        W = self.slots  # the ring: the window plus its slack
        if layer == len(self.k):  # first call for this layer: the ring, once
            self.k.append(torch.zeros(B, H_kv, W, D, dtype=k.dtype, device=k.device))
            self.v.append(torch.zeros(B, H_kv, W, D, dtype=v.dtype, device=v.device))
        ring_k, ring_v = self.k[layer], self.v[layer]  # (B, H_kv, W, D)
        if T == 1 and W > 1 and self._all_real and not self.slack:
            slot = self.seen % W  # the dead token's slot (or a free one while the ring fills)
            ring_k[:, :, slot] = k[:, :, 0]  # one row, in place
            ring_v[:, :, slot] = v[:, :, 0]
            n = min(self.seen + 1, W)  # slots filled, the new one included
            return ring_k[:, :, :n], ring_v[:, :, :n]  # (B, H_kv, n, D) views, ring order
        held = self.length  # the last `held` tokens appended, oldest first:
        k_all, v_all = k, v  # a first prompt: nothing held, nothing to copy
        if held:
            order = torch.arange(self.seen - held, self.seen, device=k.device) % W
            k_all = torch.cat([ring_k[:, :, order], k], dim=2)  # (B, H_kv, held + T, D) copies
            v_all = torch.cat([ring_v[:, :, order], v], dim=2)
        keep = min(T, W)  # only the W newest of the new tokens stay in the ring
        slots = torch.arange(self.seen + T - keep, self.seen + T, device=k.device) % W
        ring_k[:, :, slots] = k[:, :, T - keep:]
        ring_v[:, :, slots] = v[:, :, T - keep:]
        return k_all, v_all

    def advance(self, real: torch.Tensor) -> None:
        self._tail = real.clone() if self._tail is None else torch.cat([self._tail, real], dim=1)
        self._tail = self._tail[:, max(0, self._tail.shape[1] - self.slots):]  # (B, <= slots)
        super().advance(real)
        self.length = min(self.length, self.visible)
        self.real = self.real[:, self.real.shape[1] - self.length:]  # (B, length), oldest first
        self._all_real = bool(self.real.all())

    def reset(self) -> None:
        super().reset()
        self._all_real = True
        self._tail = None

    def _check_crop(self, length: int) -> None:
        super()._check_crop(length)
        in_ring = self._tail.shape[1] if self._tail is not None else 0  # newest tokens the ring still holds
        need = min(length, self.visible)  # what a query after the crop must see again
        if self.seen - length + need > in_ring:
            raise CropError(f"this ring of {self.slots} slots (window {self.window} + slack {self.slack}) can "
                            f"drop at most {self.slack + 1} of its newest tokens; asked to drop "
                            f"{self.seen - length}. Build it with slack >= {self.seen - length - 1}")

    def crop(self, length: int) -> None:
        self._check_crop(length)
        drop = self.seen - length
        if drop == 0 or length == 0:
            return super().crop(length)  # nothing, or reset()
        tail = self._tail[:, : self._tail.shape[1] - drop]  # (B, n) flags of the tokens still held, oldest first
        self.next_pos = self.next_pos - self._tail[:, tail.shape[1]:].sum(dim=1)
        self._tail = tail
        self.length, self.seen = min(length, self.visible), length
        self.real = tail[:, tail.shape[1] - self.length:]  # the ring slots themselves stay: they are never
        self._all_real = bool(self.real.all())  # read past what `seen` says, and the next tokens overwrite them


class _EvictingCache(DynamicCache):
    """Held K/V per layer (B, H_kv, S, D), grown like DynamicCache, then cut back to a budget after
    every forward call.

    Subclasses say which slots survive: ``_keep(layer)`` returns indices (B, H_kv, budget), sorted.
    """

    budget: int

    def _crop_storage(self, length: int, drop: int) -> None:
        if self.seen > self.length or self.observes:  # evicted tokens are gone; H2O's scores hold the dropped queries
            raise CropError(f"{type(self).__name__} cannot roll back once it has evicted tokens or scored them "
                            f"(held {self.length} of {self.seen} tokens); use a SlidingWindowCache with slack")
        super()._crop_storage(length, drop)

    def advance(self, real: torch.Tensor) -> None:
        super().advance(real)
        if self.length <= self.budget:
            return
        real_kept = None
        for layer in range(len(self.k)):
            idx = self._keep(layer)  # (B, H_kv, budget)
            B, H_kv = idx.shape[:2]
            row = torch.arange(B, device=idx.device)[:, None, None]
            head = torch.arange(H_kv, device=idx.device)[None, :, None]
            # Each kept slot's whole D-vector: indexing copies the same numbers as a gather along S
            # with idx expanded over D, about twice as fast on a CPU.
            self.k[layer] = self.k[layer][row, head, idx]  # (B, H_kv, budget, D)
            self.v[layer] = self.v[layer][row, head, idx]
            self._kept(layer, idx)
            if real_kept is None:
                # Padding is never preferred over a real token, so every head of every layer keeps
                # padding in the same slots: one (B, budget) mask serves them all.
                real_kept = self.real.gather(1, idx[:, 0])
        self.real = real_kept
        self.length = self.budget

    def _keep(self, layer: int) -> torch.Tensor:
        raise NotImplementedError

    def _kept(self, layer: int, idx: torch.Tensor) -> None:
        """Hook: the slots ``idx`` survived (H2O keeps its scores in step)."""


class SinkCache(_EvictingCache):
    """StreamingLLM: the first ``sinks`` tokens plus the ``window`` newest.

    (StreamingLLM also re-numbers positions inside the cache to run past the trained length;
    kvref keeps true positions, so generation stays within max_seq_len.)
    """

    def __init__(self, sinks: int = 4, window: int = 64) -> None:
        super().__init__()
        if not isinstance(sinks, int) or sinks < 0:
            raise BudgetError(f"sinks must be an integer >= 0; got {sinks!r}")
        self.sinks, self.recent = sinks, _positive("window", window)
        self.budget = sinks + window

    def _keep(self, layer: int) -> torch.Tensor:
        B, H_kv, S, _ = self.k[layer].shape
        n_old = S - self.recent
        # The sinks are each row's first `sinks` real tokens (left padding is skipped, never a sink).
        order = torch.sort((~self.real[:, :n_old]).byte(), dim=-1, stable=True).indices  # real slots first
        sinks = order[:, : self.sinks].sort(dim=-1).values  # (B, sinks)
        recent = torch.arange(n_old, S, device=sinks.device).expand(B, -1)
        return torch.cat([sinks, recent], dim=-1)[:, None].expand(B, H_kv, -1)


class H2OCache(_EvictingCache):
    """Heavy-hitter oracle: per row and K/V head, keep the ``recent`` newest tokens and the ``heavy``
    older tokens with the largest accumulated attention.

    Each cached token's score is the attention it has received, summed over every query so far
    and over the query heads sharing its K/V head. Scores are kept per sequence, (B, H_kv, S):
    the reference H2O code sums them over the batch, which lets one request evict another's
    tokens; here a row's choice depends on that row alone.
    """

    observes = True

    def __init__(self, heavy: int = 32, recent: int = 32) -> None:
        super().__init__()
        for name, val in (("heavy", heavy), ("recent", recent)):
            if not isinstance(val, int) or val < 0:
                raise BudgetError(f"{name} must be an integer >= 0; got {val!r}")
        self.heavy, self.recent = heavy, recent
        self.budget = _positive("heavy + recent (the budget)", heavy + recent)
        self.scores: list[torch.Tensor] = []  # per layer (B, H_kv, S) fp32 accumulated attention

    def observe(self, layer: int, q: torch.Tensor, k: torch.Tensor, mask) -> None:
        B, H, T, D = q.shape
        H_kv, S = k.shape[1], k.shape[2]
        k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, S, D)
        att = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, S)
        if isinstance(mask, str):
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        if mask is not None:
            att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1).sum(dim=2)  # (B, H, S): attention each key got from this call's queries
        att = att.view(B, H_kv, H // H_kv, S).sum(dim=2)  # (B, H_kv, S): per K/V head, never over B
        if layer == len(self.scores):
            self.scores.append(att)
        else:
            old = self.scores[layer]
            self.scores[layer] = F.pad(old, (0, S - old.shape[-1])) + att

    def _keep(self, layer: int) -> torch.Tensor:
        score = self.scores[layer]  # (B, H_kv, S)
        B, H_kv, S = score.shape
        n_old = S - self.recent
        pri = score[..., :n_old].masked_fill(~self.real[:, None, :n_old], float("-inf"))  # padding: last choice
        order = torch.sort(pri, dim=-1, descending=True, stable=True).indices  # ties: older first
        heavy = order[..., : self.heavy].sort(dim=-1).values  # (B, H_kv, heavy), chronological
        recent = torch.arange(n_old, S, device=score.device).expand(B, H_kv, -1)
        return torch.cat([heavy, recent], dim=-1)

    def _kept(self, layer: int, idx: torch.Tensor) -> None:
        self.scores[layer] = self.scores[layer].gather(2, idx)

    def reset(self) -> None:
        super().reset()
        self.scores = []

    @property
    def nbytes(self) -> int:
        """K/V plus the score bookkeeping (one fp32 per held token and K/V head)."""
        return super().nbytes + sum(t.numel() * t.element_size() for t in self.scores)
