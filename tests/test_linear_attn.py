"""Linear-attention layers (kvref.linear_attn): the recurrent gated delta rule equals a full-sequence reference
written here; a hybrid linear + full model's cache equals no cache; crop refuses and snapshot/restore rolls back;
greedy speculative decoding on a hybrid model gives exactly the target's greedy tokens.

Bounds: fp32 paths agree to <= 1e-5 (the course's bound for cached paths: only summation order differs),
for a whole model's logits relative to the largest one (these random models' logits reach ~6, and fp32
rounding is relative; a wrong state or a missed token changes them by far more); greedy tokens identical.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kvref
from kvref import speculative as sp
from kvref.cache import CropError
from kvref.layers import LayeredCache
from kvref.linear_attn import GatedDeltaNet, delta_rule
from tests.conftest import tiny_model

def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 1e-5 of the largest magnitude in ``want`` (see the module docstring)."""
    return float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


HYBRID = kvref.ModelConfig(arch="llama", n_layers=3, n_heads=4, n_kv_heads=2, d_model=64, vocab_size=256,
                           max_seq_len=96, layer_types=("linear", "full", "linear"), linear_num_key_heads=2,
                           linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                           linear_conv_kernel_dim=4)
IDS = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(7))


def reference_layer(layer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """The whole layer over a full sequence, written from the equations: a padded F.conv1d, and per head the
    matrix recurrence M_t = a_t M_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T, o_t = M_t q_t (M: d_v x d_k)."""
    cfg = layer.cfg
    B, T, _ = x.shape
    H_k, H_v, d_k, d_v = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                          cfg.linear_value_head_dim)
    K = cfg.linear_conv_kernel_dim
    proj = x @ layer.in_proj.weight.T
    mixed, z, b, a = proj.split([layer.C, H_v * d_v, H_v, H_v], dim=-1)
    conv = F.conv1d(mixed.transpose(1, 2), layer.conv_weight[:, None, :], padding=K - 1, groups=layer.C)[..., :T]
    q, k, v = F.silu(conv).transpose(1, 2).split([H_k * d_k, H_k * d_k, H_v * d_v], dim=-1)
    out = torch.zeros(B, T, H_v, d_v)
    for bi in range(B):
        for h in range(H_v):
            hk = h // (H_v // H_k)  # the key head this value head reads
            M = torch.zeros(d_v, d_k)
            for t in range(T):
                qt = q[bi, t, hk * d_k:(hk + 1) * d_k]
                kt = k[bi, t, hk * d_k:(hk + 1) * d_k]
                qt, kt = qt / qt.norm() / d_k ** 0.5, kt / kt.norm()
                vt = v[bi, t, h * d_v:(h + 1) * d_v]
                alpha = torch.exp(-layer.A_log[h].exp() * F.softplus(a[bi, t, h] + layer.dt_bias[h]))
                beta = torch.sigmoid(b[bi, t, h])
                M = alpha * M @ (torch.eye(d_k) - beta * torch.outer(kt, kt)) + beta * torch.outer(vt, kt)
                out[bi, t, h] = M @ qt
    rms = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * layer.norm.weight
    return (rms * F.silu(z.view(B, T, H_v, d_v))).reshape(B, T, -1) @ layer.out_proj.weight.T


@torch.no_grad()
def test_layer_equals_full_sequence_reference_and_chunks():
    torch.manual_seed(0)
    layer = GatedDeltaNet(HYBRID, 0)
    with torch.no_grad():
        layer.dt_bias.normal_(0, 1.0)  # decays far from 1 and from 0
    x = torch.randn(2, 11, HYBRID.d_model)
    want = reference_layer(layer, x)
    assert torch.allclose(layer(x, None, None), want, atol=1e-5)
    cache = LayeredCache(HYBRID, 2, 32)  # fed in chunks of 4, 1, 6 through the cache: the same outputs
    got = torch.cat([layer(x[:, s:e], None, cache) for s, e in ((0, 4), (4, 5), (5, 11))], dim=1)
    assert torch.allclose(got, want, atol=1e-5)


def test_delta_rule_recalls_what_it_wrote():
    """With no forgetting (g = 0) and full write strength (beta = 1), writing v under a unit key k and reading
    with q = k returns v exactly: the delta rule replaces what k mapped to (plain linear attention would add)."""
    k = F.normalize(torch.randn(1, 1, 2, 8), dim=-1)
    k[:, :, 1] = k[:, :, 0]  # the same key twice, two different values
    v = torch.randn(1, 1, 2, 4)
    o, S = delta_rule(k, k, v, torch.zeros(1, 1, 2), torch.ones(1, 1, 2), torch.zeros(1, 1, 8, 4))
    assert torch.allclose(o[0, 0, 1], v[0, 0, 1], atol=1e-5)  # the newer value, not the sum of both
    assert S.shape == (1, 1, 8, 4)


@torch.no_grad()
def test_hybrid_model_cache_equals_no_cache_and_planner_bytes():
    model = tiny_model(HYBRID)
    want = model(IDS)  # (1, T, V), no cache
    for static in (True, False):
        cache = LayeredCache(HYBRID, 1, 40, static=static)
        got = torch.cat([model(IDS[:, :9], cache=cache)] + [model(IDS[:, t:t + 1], cache=cache) for t in range(9, 24)],
                        dim=1)
        assert close(got, want)
        # the planner's bill: linear layers H_v * d_k * d_v + C * (K - 1) numbers each, the full layer its rows
        assert cache.nbytes == kvref.kv_cache_bytes(HYBRID, 1, 40 if static else 24, torch.float32)


@torch.no_grad()
def test_left_padding_writes_nothing_to_the_state():
    model = tiny_model(HYBRID)
    want = model(IDS[:, :10])[0]  # (T, V)
    ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), IDS[:, :10]], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)], dim=1)
    got = model(ids, cache=LayeredCache(HYBRID, 1, 40), attention_mask=mask)[0, 3:]
    assert close(got, want)


@torch.no_grad()
def test_crop_refuses_and_snapshot_restore_rolls_back():
    model = tiny_model(HYBRID)
    cache = LayeredCache(HYBRID, 1, 40, slack=8)
    model(IDS[:, :12], cache=cache)
    with pytest.raises(CropError, match="snapshot"):
        cache.crop(8)
    assert cache.seen == 12  # unchanged: the next token still continues at 12
    fresh = LayeredCache(HYBRID, 1, 40)
    want = torch.cat([model(IDS[:, :12], cache=fresh), model(IDS[:, 12:16], cache=fresh)], dim=1)[:, -4:]
    snap = cache.snapshot()
    model(IDS[:, 20:24], cache=cache)  # four tokens that will be rejected
    cache.restore(snap)
    assert cache.seen == 12 and cache.groups["full"].length == 12
    got = model(IDS[:, 12:16], cache=cache)
    assert close(got, want)
    cache.crop(16)  # cropping to what it holds is allowed (nothing to undo), and crop(0) is a reset
    cache.crop(0)
    assert cache.seen == 0 and float(cache.groups["linear"].state.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="snapshot"):
        cache.restore(snap)  # 12 tokens in the snapshot, none in the cache
    with pytest.raises(ValueError, match="this same cache"):
        LayeredCache(HYBRID, 1, 40).restore(snap)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_speculative_greedy_on_a_hybrid_model(kind):
    target = tiny_model(HYBRID)
    draft = tiny_model(HYBRID)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a noisy copy of the target: agrees often, not always
        for (_, p), (_, t) in zip(draft.named_parameters(), target.named_parameters()):
            p.copy_(t + torch.randn(t.shape, generator=g) * 0.05 * (t.dim() > 1))
    plain = kvref.generate(target, IDS[:, :8], 30).tokens
    got = sp.generate(target, IDS[:, :8], 30, draft=draft, k=4, cache=kind)
    assert torch.equal(got.tokens, plain)
    # some drafts rejected (each rejection restores and re-feeds), some accepted: both paths ran
    assert 0 < got.stats.accepted < got.stats.proposed and got.stats.target_refeeds > 0
    ngram = sp.generate(target, IDS[:, :8], 30, draft="ngram", k=3, cache=kind)
    assert torch.equal(ngram.tokens, plain)
