"""QuantizedCache: error bounds of each scheme and axis, int4 packing, the byte bill, attention error."""

import pytest
import torch

from kvref import DynamicCache, ModelConfig, Transformer
from kvref.quant import (QuantizationError, QuantizedCache, dequantize, pack_int4, quantize, quantized_kv_bytes,
                         residual_tokens, unpack_int4)

CFG = ModelConfig(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, max_seq_len=128)  # D = 16


def _model(cfg=CFG, seed=0):
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def _run(model, ids, cache, prefill=40):
    """Prefill, then one token at a time: the way a cache is used while generating."""
    with torch.no_grad():
        out = [model(ids[:, :prefill], cache=cache)]
        out += [model(ids[:, i:i + 1], cache=cache) for i in range(prefill, ids.shape[1])]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dim", [-1, -2])  # -1: per token (values), -2: per channel (keys)
def test_quantize_error_within_half_a_step(bits, dim):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32, 16)
    x[..., 5] *= 20  # an outlier channel, as keys have
    codes, scale, zero = quantize(x, bits, 8, dim)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 2**bits - 1
    err = (dequantize(codes, scale, zero, 8, dim) - x).abs()
    step = scale.repeat_interleave(8, dim=dim)
    # Rounding to the nearest code is off by at most half a step; 1e-5 relative covers fp32 arithmetic.
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-6).all())
    # The bound is not vacuous: int8 steps are ~256x finer than the data range, int4 ~16x.
    assert float(err.max()) < float(x.abs().max()) / (2**bits - 1)


def test_keys_per_channel_beat_per_token_on_outlier_channels():
    # Why KIVI quantizes keys per channel: one huge channel ruins a per-token group's scale.
    torch.manual_seed(2)
    k = torch.randn(1, 1, 64, 16)
    k[..., 3] += 30.0
    per_channel = (dequantize(*quantize(k, 4, 16, -2), 16, -2) - k).abs().mean()
    per_token = (dequantize(*quantize(k, 4, 16, -1), 16, -1) - k).abs().mean()
    assert per_channel < per_token / 2


def test_constant_group_is_exact():
    x = torch.full((1, 1, 8, 4), 0.7)
    assert torch.equal(dequantize(*quantize(x, 4, 4, -1), 4, -1), x)  # scale 0: every code 0, x_hat = zero


def test_int4_packing_round_trip():
    codes = torch.cartesian_prod(torch.arange(16), torch.arange(16)).to(torch.uint8).reshape(2, 128, 2).flatten(-2)
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape[-1] == codes.shape[-1] // 2  # two values per byte
    assert torch.equal(unpack_int4(packed), codes)  # every pair of nibbles survives


@pytest.mark.parametrize("bits,group,residual", [(8, 16, 0), (8, 8, 16), (4, 16, 0), (4, 4, 20), (4, 8, 200)])
def test_nbytes_equals_the_formula(bits, group, residual):
    model, cache = _model(), QuantizedCache(bits, group, residual)
    ids = torch.randint(0, 256, (3, 101))
    with torch.no_grad():
        model(ids[:, :37], cache=cache)
        for n in range(37, 101):
            S = n
            assert cache.nbytes == quantized_kv_bytes(CFG, 3, S, torch.float32, bits, group, residual)
            model(ids[:, n:n + 1], cache=cache)
    assert cache.k_res[0].shape[2] == residual_tokens(101, residual, group)  # what stayed full precision


def test_nbytes_matches_memory_module():
    memory = pytest.importorskip("kvref.memory")
    for bits, G, R in [(8, 16, 0), (4, 8, 32), (4, 16, 5)]:
        model, cache = _model(), QuantizedCache(bits, G, R)
        ids = torch.randint(0, 256, (2, 90))
        with torch.no_grad():
            model(ids[:, :30], cache=cache)
            for n in range(30, 90):
                assert cache.nbytes == memory.kv_cache_bytes(CFG, 2, n, torch.float32, kv_bits=bits, group_size=G,
                                                             residual=R)
                model(ids[:, n:n + 1], cache=cache)


def test_int4_is_about_a_quarter_of_int8_codes():
    b8 = quantized_kv_bytes(CFG, 1, 1024, torch.float16, 8, 16, 0)
    b4 = quantized_kv_bytes(CFG, 1, 1024, torch.float16, 4, 16, 0)
    fp = 2 * CFG.n_layers * CFG.n_kv_heads * 1024 * CFG.head_dim * 2
    # codes: 1 byte vs 0.5 byte; both pay 2 fp16 numbers per 16 elements = 0.25 byte/element
    assert b8 == fp * 1.25 / 2 and b4 == fp * 0.75 / 2


@pytest.mark.parametrize("bits,bound", [(8, 0.02), (4, 0.3)])
def test_attention_error_bounded(bits, bound):
    model = _model()
    ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(3))
    ref = _run(model, ids, DynamicCache())
    out = _run(model, ids, QuantizedCache(bits, 8, 16))
    err = float((out - ref).abs().max())
    # Measured ~1.5e-3 (int8) and ~4e-2 (int4) on this seeded model (logits of std ~1); bounds leave ~10x
    # room. The lower bound shows the keys really were quantized (a full-precision path would give ~1e-6).
    assert 1e-5 < err < bound


def test_residual_window_covering_everything_is_exact():
    model = _model()
    ids = torch.randint(0, 256, (2, 60))
    ref = _run(model, ids, DynamicCache())
    out = _run(model, ids, QuantizedCache(4, 8, residual=64))  # no token ever leaves full precision
    assert float((out - ref).abs().max()) <= 1e-5


def test_residual_window_helps_int4():
    model = _model()
    ids = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(4))
    ref = _run(model, ids, DynamicCache())
    no_res = float((_run(model, ids, QuantizedCache(4, 8, 0)) - ref)[:, -20:].abs().mean())
    res = float((_run(model, ids, QuantizedCache(4, 8, 32)) - ref)[:, -20:].abs().mean())
    assert res < no_res  # the newest 32 tokens exact -> smaller error where it is measured


def test_reset_forgets():
    model, cache = _model(), QuantizedCache(8, 16, 8)
    ids = torch.randint(0, 256, (1, 50))
    a = _run(model, ids, cache)
    cache.reset()
    assert cache.nbytes == 0 and cache.length == 0
    assert torch.equal(_run(model, ids, cache), a)


def test_bad_settings_raise_clear_errors():
    with pytest.raises(QuantizationError, match="bits"):
        QuantizedCache(bits=3)
    with pytest.raises(QuantizationError, match="residual"):
        QuantizedCache(8, residual=-1)
    with pytest.raises(QuantizationError, match="group_size"):
        QuantizedCache(8, group_size=0)
    ids = torch.randint(0, 256, (1, 8))
    with pytest.raises(QuantizationError, match="must divide head_dim 16"):
        _model()(ids, cache=QuantizedCache(8, group_size=6))
    odd = ModelConfig(arch="gpt2", n_layers=1, n_heads=4, d_model=36, max_seq_len=32)  # head_dim 9
    with pytest.raises(QuantizationError, match="even"):
        _model(odd)(ids, cache=QuantizedCache(4, group_size=3))
    assert issubclass(QuantizationError, ValueError)
