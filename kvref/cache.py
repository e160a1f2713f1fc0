"""The KV cache: keep every layer's keys and values so no token's K/V is computed twice.

A cache is one narrow interface the model talks to:

    k_all, v_all = cache.update(layer, k_new, v_new)   # append T new rows, get all S rows back
    cache.advance(real)                                 # once per forward: T slots are now filled

``update`` is called by every layer; ``advance`` is called once by the model after the last layer,
with a (B, T) bool tensor saying which new tokens are real (False marks left padding).
From that record the cache answers the two questions the model asks before each forward:
how many slots are filled (``length``) and at which position each row continues (``next_pos``).

Only the H_kv key/value heads are stored, never the repeated copies attention uses for GQA.

Every cache can also roll back: ``cache.crop(length)`` (Hugging Face's name) keeps the first
``length`` tokens fed and forgets the rest, as if they had never been fed. Speculative decoding
(kvref.speculative) needs it: draft tokens the target rejects must leave no trace.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .config import ModelConfig


class CropError(ValueError):
    """A rollback the cache cannot do (beyond what it holds, below zero, past a ring's slack, ...)."""


class KVCache(nn.Module):
    """What every kvref cache shares: bookkeeping of filled slots, padding and positions."""

    def __init__(self) -> None:
        super().__init__()
        self.length = 0  # slots filled; the same for every row (padding fills slots too)
        self.seen = 0  # slots ever appended; equals length unless the cache evicts (bounded caches)
        self.real: torch.Tensor | None = None  # (B, S) bool: slot holds a real token, not padding
        self.next_pos: torch.Tensor | None = None  # (B,) long: position the row's next token gets
        self.padded = False  # has any slot ever held padding? (lets attention skip the mask)
        self.spec: tuple | None = None  # (L, B, H_kv, D, dtype, device) this cache serves

    window: int | None = None  # a bounded cache sets this: queries see at most `window` newest keys
    observes = False  # set True to have the model call observe() with each layer's queries (H2O)
    reads_in_place = False  # True: the model calls attend() instead of update() + attention (paged_inplace)

    # -- the interface ---------------------------------------------------------------------------
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H_kv, T, D) after the filled slots; return all (B, H_kv, length + T, D)."""
        raise NotImplementedError

    def advance(self, real: torch.Tensor) -> None:
        """Record that T more slots are filled; ``real`` (B, T) marks which hold real tokens."""
        B, T = real.shape
        if self.real is None:
            self.next_pos = torch.zeros(B, dtype=torch.long, device=real.device)
        self._store_real(real)
        self.next_pos = self.next_pos + real.sum(dim=1)
        self.padded = self.padded or not bool(real.all())
        self.length += T
        self.seen += T

    def observe(self, layer: int, q: torch.Tensor, k: torch.Tensor, mask) -> None:
        """Called after update() when ``observes`` is True: q (B, H, T, D), k (B, H_kv, S, D)."""

    def reset(self) -> None:
        """Forget everything (a new prompt must never see the previous prompt's K/V)."""
        self.length = 0
        self.seen = 0
        self.real = None
        self.next_pos = None
        self.padded = False

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage this cache holds right now."""
        raise NotImplementedError

    # -- rollback --------------------------------------------------------------------------------
    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens fed (``seen`` counts them), forget the newest ``seen - length``.

        Afterwards the cache equals one that was fed only the kept tokens (per kind, see each class),
        so the next forward continues at position ``length``. ``crop(0)`` is ``reset()``. A length
        below 0 or above ``seen`` (HF reads a negative length as "drop that many"; kvref refuses it)
        raises CropError and leaves the cache unchanged.
        """
        self._check_crop(length)
        drop = self.seen - length
        if drop == 0:
            return
        if length == 0:
            self.reset()
            return
        self._crop_storage(length, drop)
        keep = self.length - drop  # held slots that stay (length == seen unless the cache evicts)
        self.next_pos = self.next_pos - self.real[:, keep:].sum(dim=1)  # padding never advanced a position
        self.real = self.real[:, :keep]
        self.length, self.seen = keep, length
        self.padded = not bool(self.real.all())

    def _check_crop(self, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.seen:
            raise CropError(f"crop keeps the first `length` tokens: an integer from 0 to the {self.seen} tokens "
                            f"this {type(self).__name__} holds; got {length!r}")

    def _crop_storage(self, length: int, drop: int) -> None:
        """Forget the newest ``drop`` tokens' K/V (the bookkeeping is done by ``crop``)."""
        raise CropError(f"{type(self).__name__} cannot roll back")

    # -- shared helpers --------------------------------------------------------------------------
    def _store_real(self, real: torch.Tensor) -> None:
        self.real = real.clone() if self.real is None else torch.cat([self.real, real], dim=1)

    def check(self, cfg: ModelConfig, batch: int, new_tokens: int, dtype: torch.dtype, device: torch.device) -> None:
        """Refuse to serve a model, batch, dtype or device the cache was not built for."""
        spec = (cfg.n_layers, batch, cfg.n_kv_heads, cfg.head_dim, dtype, torch.device(device).type)
        if self.spec is None:
            self.spec = spec
        elif self.spec != spec:
            names = ("n_layers", "batch", "n_kv_heads", "head_dim", "dtype", "device")
            diff = ", ".join(f"{n}: cache {a} vs model/input {b}" for n, a, b in zip(names, self.spec, spec) if a != b)
            raise ValueError(
                f"this {type(self).__name__} was built for another model or input ({diff}); "
                f"build a new cache for this model, or call reset() if only the batch changed"
            )
        self._check_capacity(new_tokens)

    def _check_capacity(self, new_tokens: int) -> None:
        pass

    def extra_repr(self) -> str:
        return f"length={self.length}, nbytes={self.nbytes}"


class DynamicCache(KVCache):
    """Grows by ``torch.cat`` each step: simple, and what the seed code does.

    Every step allocates a new, slightly bigger tensor and copies the old one into it,
    so total copying grows quadratically with length; StaticCache avoids that.
    """

    def __init__(self) -> None:
        super().__init__()
        self.k: list[torch.Tensor] = []  # per layer (B, H_kv, S, D)
        self.v: list[torch.Tensor] = []
        # A model whose layers differ (sliding, latent, shared: kvref.layers) stores its rows in a LayeredCache
        # that kvref.layers creates here on first use (static=False, rings that never overwrite), as HF's
        # DynamicCache serves such models too; this cache then reports that one's length, bytes and rollback.
        self.inner: KVCache | None = None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.k):  # first time this layer is seen
            self.k.append(k)
            self.v.append(v)
        else:
            self.k[layer] = torch.cat([self.k[layer], k], dim=2)  # (B, H_kv, S + T, D)
            self.v[layer] = torch.cat([self.v[layer], v], dim=2)
        return self.k[layer], self.v[layer]

    def reset(self) -> None:
        super().reset()
        self.k, self.v = [], []
        self.spec = None  # a dynamic cache can serve a new batch size after reset
        self.inner = None

    def sync(self) -> None:
        """Report the inner LayeredCache's bookkeeping as this cache's own."""
        i = self.inner
        self.length, self.seen, self.real, self.next_pos, self.padded = i.length, i.seen, i.real, i.next_pos, i.padded

    def crop(self, length: int) -> None:
        if self.inner is None or length == 0:
            return super().crop(length)
        self.inner.crop(length)
        self.sync()

    def _crop_storage(self, length: int, drop: int) -> None:
        keep = self.length - drop
        self.k = [t[:, :, :keep] for t in self.k]  # (B, H_kv, keep, D): the next cat copies, nothing is shared
        self.v = [t[:, :, :keep] for t in self.v]

    @property
    def nbytes(self) -> int:
        if self.inner is not None:
            return self.inner.nbytes
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class StaticCache(KVCache):
    """Preallocated (L, B, H_kv, max_len, D) buffers written at explicit slots (gpt-fast style).

    Memory is claimed once, up front, so nothing is reallocated while decoding and the
    buffers keep fixed addresses (which is what ``torch.compile`` and CUDA graphs like).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        max_len = cfg.max_seq_len if max_len is None else max_len
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size and max_len must be >= 1; got {batch_size} and {max_len}")
        dtype = dtype or torch.get_default_dtype()
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)  # (L, B, H_kv, S_max, D)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.max_len = max_len
        self.spec = (cfg.n_layers, batch_size, cfg.n_kv_heads, cfg.head_dim, dtype, self.k.device.type)
        self._real = torch.zeros(batch_size, max_len, dtype=torch.bool, device=self.k.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + k.shape[2]
        self.k[layer, :, :, start:end] = k  # write at explicit slots, no reallocation
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, H_kv, end, D) views

    def _store_real(self, real: torch.Tensor) -> None:
        self._real[:, self.length : self.length + real.shape[1]] = real
        self.real = self._real[:, : self.length + real.shape[1]]

    def _check_capacity(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.max_len:
            raise ValueError(
                f"StaticCache holds at most max_len={self.max_len} tokens per row; it holds {self.length} "
                f"and this call adds {new_tokens}. Build it with max_len >= {self.length + new_tokens}."
            )

    def reset(self) -> None:
        super().reset()  # the buffers stay allocated; stale values are never read past `length`

    def _crop_storage(self, length: int, drop: int) -> None:
        pass  # nothing to erase: slots past `length` are never read and the next update overwrites them

    def crop(self, length: int) -> None:
        super().crop(length)
        if self.real is not None:
            self.real = self._real[:, : self.length]  # a view again, so _store_real keeps writing in place

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()
