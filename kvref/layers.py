"""The per-layer path: models whose layers differ (Qwen3, Gemma 3, DeepSeek-V3's MLA, shared K/V).

``Transformer(cfg)`` takes this path when ``cfg.layered`` (kvref.kinds); GPT-2 and Llama keep the
path of kvref.model untouched. What changes per layer:

* the attention: "full" or "sliding" (GQA, optional q/k RMSNorm, its own softmax scale and RoPE
  base), "latent" (kvref.mla), or "shared:j" (only a query projection: keys and values are layer
  j's, from this same forward call);
* the mask: a sliding layer sees its ``sliding_window`` newest keys, itself included;
* the cache: ``LayeredCache`` stores each layer as its kind needs (all rows, a ring, latents, nothing,
  or a linear layer's fixed-size state: kvref.linear_attn).

Gemma's body (``arch="gemma"``) also differs: RMSNorm scales by (1 + w), four norms per block (after
attention and after the MLP too), a GeGLU MLP (tanh GELU) and embeddings multiplied by sqrt(d_model).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import ATTENTION, build_mask
from .cache import DynamicCache, KVCache, StaticCache
from .evict import SlidingWindowCache
from .kinds import check_runnable, kv_source, layer_kind
from .linear_attn import GatedDeltaNet, LinearStates
from .mla import LatentCache, MLAttention
from .modules import Linear, RMSNorm, apply_rope


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: x / rms(x) * (1 + w), with w stored as zeros-initialised offsets, all in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(cfg, dim: int) -> nn.Module:
    return GemmaRMSNorm(dim, cfg.norm_eps) if cfg.arch == "gemma" else RMSNorm(dim, cfg.norm_eps)


def group_of(cfg, layer: int) -> str:
    """Which mask, RoPE table and cache group a layer uses: "full", "sliding" or "latent" (a shared
    layer uses its source's)."""
    return layer_kind(cfg, kv_source(cfg, layer))


class LayerAttention(nn.Module):
    """GQA attention of a "full", "sliding" or "shared:j" layer; q/k RMSNorm over D when cfg.qk_norm."""

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer, self.source = cfg, layer, kv_source(cfg, layer)
        H, H_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.own_kv = self.source == layer
        self.qkv = Linear(cfg.d_model, (H + 2 * H_kv * self.own_kv) * D, bias=cfg.qkv_bias)  # shared: q only
        self.proj = Linear(H * D, cfg.d_model, bias=False)
        self.q_norm = make_norm(cfg, D) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, D) if cfg.qk_norm and self.own_kv else None
        # sdpa divides by sqrt(D): a different softmax scale is folded into q
        self.q_mult = None if cfg.attn_scale is None else cfg.attn_scale * math.sqrt(D)
        self.attend = ATTENTION[cfg.attn_impl]

    def forward(self, x: torch.Tensor, rope: tuple, mask, cache: KVCache | None, kv: dict) -> torch.Tensor:
        B, T, _ = x.shape
        H, H_kv, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        qkv = self.qkv(x)
        q = qkv[..., :H * D].view(B, T, H, D)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q.transpose(1, 2), *rope)  # (B, H, T, D)
        if self.own_kv:
            k, v = qkv[..., H * D:].view(B, T, 2 * H_kv, D).split(H_kv, dim=2)
            if self.k_norm is not None:
                k = self.k_norm(k)
            k, v = apply_rope(k.transpose(1, 2), *rope), v.transpose(1, 2)  # (B, H_kv, T, D)
            if cache is not None:
                k, v = cache.update(self.layer, k, v)  # (B, H_kv, S, D)
                if cache.observes:
                    cache.observe(self.layer, q, k, mask)
            kv[self.layer] = (k, v)  # for the layers that share this one's K/V
        else:
            k, v = kv[self.source]
        if self.q_mult is not None:
            q = q * self.q_mult
        y = self.attend(q, k, v, mask)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(B, T, H * D))


class GatedMLP(nn.Module):
    """gate and up in one matmul, then down(act(gate) * up): SwiGLU (silu) or GeGLU (tanh GELU, Gemma)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.up = Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.down = Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.gelu = cfg.arch == "gemma"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down(gate * up)


class LayerBlock(nn.Module):
    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.group = group_of(cfg, layer)
        self.norm1, self.norm2 = make_norm(cfg, cfg.d_model), make_norm(cfg, cfg.d_model)
        self.latent = layer_kind(cfg, layer) == "latent"
        self.linear = layer_kind(cfg, layer) == "linear"
        self.attn = (MLAttention(cfg, layer) if self.latent else GatedDeltaNet(cfg, layer) if self.linear
                     else LayerAttention(cfg, layer))
        self.mlp = GatedMLP(cfg)
        self.sandwich = cfg.arch == "gemma"  # Gemma also normalises each branch's output
        if self.sandwich:
            self.norm1_post, self.norm2_post = make_norm(cfg, cfg.d_model), make_norm(cfg, cfg.d_model)

    def forward(self, x: torch.Tensor, ropes: dict, masks: dict, cache, kv: dict) -> torch.Tensor:
        rope, mask = ropes.get(self.group), masks[self.group]  # a linear layer: no RoPE, mask = real or None
        if self.linear:
            h = self.attn(self.norm1(x), mask, cache)
        else:
            h = self.attn(self.norm1(x), rope, mask, cache) if self.latent else self.attn(
                self.norm1(x), rope, mask, cache, kv)
        x = x + (self.norm1_post(h) if self.sandwich else h)
        h = self.mlp(self.norm2(x))
        return x + (self.norm2_post(h) if self.sandwich else h)


def build_blocks(cfg) -> nn.ModuleList:
    check_runnable(cfg)
    return nn.ModuleList(LayerBlock(cfg, i) for i in range(cfg.n_layers))


def rope_tables(cfg, device=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos, sin (max_seq_len, dim) in fp32 for each group present: "full" (rope_theta, positions divided
    by rope_scaling), "sliding" (rope_local_theta), "latent" (dim qk_rope_head_dim)."""
    out = {}
    for group in {group_of(cfg, i) for i in range(cfg.n_layers)} - {"linear"}:
        dim = cfg.qk_rope_head_dim if group == "latent" else cfg.head_dim
        local = group == "sliding" and cfg.rope_local_theta is not None
        theta = cfg.rope_local_theta if local else cfg.rope_theta
        factor = 1.0 if group == "sliding" or cfg.rope_scaling is None else cfg.rope_scaling
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
        inv_freq = inv_freq / factor  # linear scaling: position p looks like p / factor
        angles = torch.arange(cfg.max_seq_len, device=device).float()[:, None] * inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)  # (S_max, dim), "rotate half" layout
        out[group] = (angles.cos(), angles.sin())
    return out


def forward_layered(model, input_ids: torch.Tensor, cache: KVCache | None, attention_mask: torch.Tensor | None,
                    last_only: bool) -> torch.Tensor:
    """Transformer.forward for a layered config: masks and RoPE per group, then the blocks."""
    cfg = model.cfg
    real = model._check_inputs(input_ids, attention_mask)
    B, T = input_ids.shape
    dev = input_ids.device
    groups = sorted({group_of(cfg, i) for i in range(cfg.n_layers)})
    mixed = groups != ["full"] or "shared" in {layer_kind(cfg, i) for i in range(cfg.n_layers)}
    outer = None
    if type(cache) is DynamicCache and mixed:  # a plain DynamicCache serves mixed kinds through a LayeredCache
        if cache.inner is None:
            if cache.length:
                raise ValueError("this DynamicCache holds another model's rows; reset() it first")
            cache.inner = LayeredCache(cfg, B, cfg.max_seq_len, dtype=model.dtype, device=model.device, static=False,
                                       slack=cfg.max_seq_len)  # rings that keep every row: crop anywhere
        outer, cache = cache, cache.inner
    layered_cache = isinstance(cache, LayeredCache)
    seen = 0
    if cache is not None:
        if not layered_cache and mixed:
            raise ValueError(f"this model has layers of kinds {sorted(set(cfg.layer_types))}: use "
                             f"kvref.LayeredCache(cfg, batch, max_len), or generate(..., cache='static' or 'dynamic')")
        if cache.reads_in_place:
            raise ValueError(f"{type(cache).__name__} attends in place, which the per-layer path does not support")
        cache.check(cfg, B, T, model.dtype, model.device)
        seen = cache.seen
    if seen + T > cfg.max_seq_len:
        raise ValueError(f"sequence too long: {seen} tokens already seen + {T} new = {seen + T} "
                         f"(left padding included), but max_seq_len is {cfg.max_seq_len}")
    padded = real is not None or (cache is not None and cache.padded)
    if not padded:
        pos = torch.arange(seen, seen + T, device=dev).expand(B, T)  # (B, T)
    else:
        if real is None:
            real = torch.ones(B, T, dtype=torch.bool, device=dev)
        start = cache.next_pos[:, None] if cache is not None and cache.length else 0
        pos = (start + real.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
    masks = {}
    for g in groups:  # which held slots (and new tokens) each group's queries may see
        if g == "linear":  # no mask: which new tokens are real (padding writes nothing to the state)
            masks[g] = real if padded else None
            continue
        window = cfg.sliding_window if g == "sliding" else None
        past, held_real = 0, None
        if cache is not None:  # a LayeredCache keeps every row but the sliding ring's; a plain cache may be bounded
            part = cache.groups["sliding"] if g == "sliding" and layered_cache else cache
            past, held_real = part.length, part.real
            if g != "sliding" and not layered_cache:
                window = cache.window
        slots_real = (torch.cat([held_real, real], dim=1) if past else real) if padded else None
        masks[g] = build_mask(slots_real, past, T, padded, window, dev)
    x = model.tok_emb(input_ids)  # (B, T, d_model)
    if cfg.arch == "gemma":
        x = x * torch.tensor(cfg.d_model ** 0.5, dtype=x.dtype)
    ropes = {g: (getattr(model, f"rope_cos_{g}")[pos][:, None].to(x.dtype),
                 getattr(model, f"rope_sin_{g}")[pos][:, None].to(x.dtype)) for g in groups if g != "linear"}  # (B, 1, T, dim)
    kv: dict = {}
    for block in model.blocks:
        x = block(x, ropes, masks, cache, kv)
    if cache is not None:
        cache.advance(real if real is not None else torch.ones(B, T, dtype=torch.bool, device=dev))
    if outer is not None:
        outer.sync()
    model.kv_rows += B * T
    if last_only:
        x = x[:, -1:]
    return model.lm_head(model.norm(x))  # (B, T, V)


class GrowingRing(SlidingWindowCache):
    """The window's ring, grown with the sequence until it has W slots (a dynamic cache's sliding layers
    then hold min(S, W) rows, as the formula says). Slot t % W of a ring that is not full yet is slot t."""

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, H_kv, T, D = k.shape
        need = min(self.slots, self.seen + T)
        if layer == len(self.k):
            self.k.append(k.new_zeros(B, H_kv, need, D))
            self.v.append(v.new_zeros(B, H_kv, need, D))
        elif self.k[layer].shape[2] < need:
            grow = need - self.k[layer].shape[2]
            self.k[layer] = torch.cat([self.k[layer], k.new_zeros(B, H_kv, grow, D)], dim=2)
            self.v[layer] = torch.cat([self.v[layer], v.new_zeros(B, H_kv, grow, D)], dim=2)
        return super().update(layer, k, v)


class LayeredCache(KVCache):
    """One cache, stored per layer as each layer's kind needs:

    * "full" layers: a StaticCache (``static=True``: (L_full, B, H_kv, max_len, D) buffers) or a DynamicCache;
    * "sliding" layers: a SlidingWindowCache ring of min(sliding_window, max_len) slots per layer
      (``static=False``: a GrowingRing of min(sliding_window, S) slots);
    * "latent" layers: a LatentCache, (B, S, r + d_R) per layer;
    * "shared:j" layers: nothing (they read layer j's rows during the forward call);
    * "linear" layers: LinearStates, a (B, H_v, d_k, d_v) state and the conv's last K - 1 inputs per layer.

    ``nbytes`` equals ``kvref.kv_cache_bytes(cfg, batch, max_len, dtype)`` when ``static=True``, and
    ``kv_cache_bytes(cfg, batch, S, dtype)`` at length S when ``static=False`` (both with ``slack=0``).

    ``crop(length)`` rolls every group back; the rings get ``slack`` extra slots for that (see
    SlidingWindowCache: slack >= k - 1 for k draft tokens). A linear-attention layer keeps one state that
    cannot be cropped (crop raises LinearStateError, a CropError): ``snap = snapshot()`` before feeding
    tokens that may be rejected, ``restore(snap)`` after (then feed the accepted tokens again).
    """

    def __init__(self, cfg, batch: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, static: bool = True, slack: int = 0) -> None:
        super().__init__()
        max_len = cfg.max_seq_len if max_len is None else max_len
        if batch < 1 or max_len < 1:
            raise ValueError(f"batch and max_len must be >= 1; got {batch} and {max_len}")
        dtype = dtype or torch.get_default_dtype()
        self.slot: dict[int, tuple[str, int]] = {}  # layer -> (group, index within the group)
        counts: dict[str, int] = {}
        check_runnable(cfg)  # every kind runnable, no planner-only field
        for i in range(cfg.n_layers):
            kind = layer_kind(cfg, i)
            if kind != "shared":
                self.slot[i] = (kind, counts.get(kind, 0))
                counts[kind] = counts.get(kind, 0) + 1
        self.shapes = {g: SimpleNamespace(n_layers=n, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                                          max_seq_len=max_len, sliding_window=cfg.sliding_window)
                       for g, n in counts.items()}
        groups: dict[str, nn.Module] = {}
        if "full" in counts:
            full = self.shapes["full"]
            groups["full"] = StaticCache(full, batch, max_len, dtype, device) if static else DynamicCache()
        if "sliding" in counts:
            ring = SlidingWindowCache if static else GrowingRing
            groups["sliding"] = ring(min(cfg.sliding_window, max_len), slack)
        if "latent" in counts:
            groups["latent"] = LatentCache(counts["latent"], cfg.kv_lora_rank, cfg.qk_rope_head_dim, batch, max_len,
                                           dtype, device, static)
        if "linear" in counts:
            groups["linear"] = LinearStates(cfg, counts["linear"], batch, dtype, device, static)
        self.groups = nn.ModuleDict(groups)
        self.max_len, self.batch, self.dtype = max_len, batch, dtype
        self.n_layers = cfg.n_layers

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        group, j = self.slot[layer]
        return self.groups[group].update(j, k, v)

    def linear_state(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A linear layer's (conv inputs (B, C, K - 1), state (B, H_v, d_k, d_v))."""
        return self.groups["linear"].get(self.slot[layer][1])

    def set_linear_state(self, layer: int, conv: torch.Tensor, state: torch.Tensor) -> None:
        self.groups["linear"].set(self.slot[layer][1], conv, state)

    def check(self, cfg, batch: int, new_tokens: int, dtype: torch.dtype, device: torch.device) -> None:
        spec = (cfg.n_layers, batch, dtype, torch.device(device).type)
        if spec[:3] != (self.n_layers, self.batch, self.dtype):
            raise ValueError(f"this LayeredCache was built for (n_layers, batch, dtype) = "
                             f"{(self.n_layers, self.batch, self.dtype)}, not {spec[:3]}; build a new one")
        if self.length + new_tokens > self.max_len:
            raise ValueError(f"LayeredCache holds at most max_len={self.max_len} tokens per row; it holds "
                             f"{self.length} and this call adds {new_tokens}. Build it with max_len >= "
                             f"{self.length + new_tokens}.")
        for g, part in self.groups.items():
            if isinstance(part, KVCache):
                part.check(self.shapes[g], batch, new_tokens, dtype, device)

    def advance(self, real: torch.Tensor) -> None:
        super().advance(real)
        for part in self.groups.values():
            part.advance(real if isinstance(part, KVCache) else real.shape[1])

    def reset(self) -> None:
        super().reset()
        for part in self.groups.values():
            part.reset()

    def _check_crop(self, length: int) -> None:
        super()._check_crop(length)
        for part in self.groups.values():  # a ring may refuse: check all before anything changes
            if isinstance(part, KVCache):
                part._check_crop(length)
            elif isinstance(part, LinearStates):
                part.check_crop(length)

    def _crop_storage(self, length: int, drop: int) -> None:
        for part in self.groups.values():
            part.crop(length)

    def snapshot(self) -> dict:
        """What ``restore`` needs to bring this cache back to now: the linear states (copied) and the length
        (the other groups are cropped back to it)."""
        part = self.groups["linear"] if "linear" in self.groups else None
        return {"cache": id(self), "seen": self.seen, "length": self.length, "next_pos": self.next_pos,
                "real": self.real, "padded": self.padded, "linear": part.snapshot() if part is not None else None}

    def restore(self, snap: dict) -> None:
        """Back to the moment of ``snap = self.snapshot()``: tokens fed since are forgotten."""
        if not isinstance(snap, dict) or snap.get("cache") != id(self):
            raise ValueError("restore takes a snapshot() of this same cache")
        if not snap["seen"] <= self.seen:
            raise ValueError(f"this snapshot holds {snap['seen']} tokens but the cache only {self.seen}: a snapshot "
                             f"is restored after feeding more tokens, not after a reset or a crop below it")
        for part in self.groups.values():  # a ring may refuse: check all before anything changes
            if isinstance(part, KVCache):
                part._check_crop(snap["seen"])
        for g, part in self.groups.items():
            if g == "linear":
                part.restore(snap["linear"])
            else:
                part.crop(snap["seen"])
        self.length, self.seen, self.padded = snap["length"], snap["seen"], snap["padded"]
        self.real, self.next_pos = snap["real"], snap["next_pos"]

    def nbytes_by_kind(self) -> dict[str, int]:
        return {g: part.nbytes for g, part in self.groups.items()}

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_kind().values())
