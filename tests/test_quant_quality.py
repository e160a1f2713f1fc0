"""Quality study tools of chapter 06: verdicts that never print a direction inside the noise,
simulated formats (int2 ... int8, fp8) that match kvref's QuantizedCache, and synthesised key outliers."""

import math
import re
from pathlib import Path

import pytest
import torch

from kvref import DynamicCache, ModelConfig, Transformer
from kvref.bench.quality import change_verdict, paired_change, stepwise_logits
from kvref.bench.simquant import SimulatedQuantCache, format_bytes, with_key_outliers
from kvref.quant import QuantizationError, QuantizedCache, dequantize, fp8_round_trip, fp8_scale, quantize

CFG = ModelConfig(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, max_seq_len=128)  # D = 16
PAGE = Path(__file__).resolve().parents[1] / "book" / "06_quantization.md"
SIGNED_ZERO = re.compile(r"[+-]0\.0+ ?%")  # "+0.00 %", "-0.0%": a direction nobody measured


@pytest.fixture(autouse=True)
def one_thread():
    """Token-by-token runs are many tiny ops: one thread is faster on the shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(seed=0, std=0.2):
    """Random weights with a larger spread than the default init, so attention depends on the keys."""
    torch.manual_seed(seed)
    model = Transformer(CFG).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    return model


# -- the verdict ------------------------------------------------------------------------------------
@pytest.mark.parametrize("change,noise", [(0.0, 0.0), (-0.003, 0.01), (0.004, 0.004), (-2.9, 3.4), (1e-9, 1e-6)])
def test_change_inside_the_noise_is_no_measurable_change(change, noise):
    text = change_verdict(change, noise)
    assert text.startswith("no measurable change (noise ±") and text.endswith(" %)")
    assert not SIGNED_ZERO.search(text)


@pytest.mark.parametrize("change,noise,sign", [(0.004, 0.001, "+"), (-0.0042, 0.0006, "-"), (5.4, 3.4, "+"),
                                               (-64.2, 9.6, "-"), (1575.0, 28.0, "+"), (3e-7, 1e-7, "+")])
def test_change_beyond_the_noise_keeps_its_sign_and_never_rounds_to_zero(change, noise, sign):
    text = change_verdict(change, noise)
    assert text.startswith(sign) and "noise ±" in text
    assert not SIGNED_ZERO.search(text)  # 0.004 must not print as +0.00 %
    shown = float(re.match(r"[+-]([0-9.e+-]+) %", text).group(1))
    assert shown == pytest.approx(abs(change), rel=0.05)  # two significant digits of the real change


def test_small_changes_never_print_a_signed_zero():
    # Every change from 1e-6 % to 0.01 %, against a noise of a third of it: all measurable, none "0.00".
    for k in range(200):
        change = 10 ** (-6 + 4 * k / 199) * (-1) ** k
        assert not SIGNED_ZERO.search(change_verdict(change, abs(change) / 3))


def test_verdict_units_and_bad_input():
    assert change_verdict(0.7, 0.2, unit=" nats/digit") == "+0.7 nats/digit (noise ±0.2 nats/digit)"
    for bad in [(float("nan"), 1.0), (1.0, -0.1), (1.0, float("nan"))]:
        with pytest.raises(ValueError):
            change_verdict(*bad)


def test_paired_change():
    torch.manual_seed(0)
    ref = torch.rand(12) + 0.3  # mean NLL of 12 documents
    shift, noise = paired_change(ref + 0.01, ref)  # the same shift on every document: no spread
    assert shift == pytest.approx(100 * math.expm1(0.01), rel=1e-6) and noise == pytest.approx(0, abs=1e-9)
    wobble = 0.05 * torch.randn(12)
    c1, n1 = paired_change(ref + 0.01 + wobble, ref)
    c2, n2 = paired_change(ref, ref + 0.01 + wobble)
    assert c1 > 0 > c2 and n1 > 0 and n2 == pytest.approx(n1, rel=0.2)  # swapping flips the sign only
    _, n_big = paired_change(ref + 0.01 + 3 * wobble, ref)
    assert n_big > 2.5 * n1  # three times the spread: about three times the noise
    _, n_z3 = paired_change(ref + 0.01 + wobble, ref, z=3)
    assert n_z3 > n1  # a wider band for z = 3


# -- the page uses them -----------------------------------------------------------------------------
def test_page_glues_changes_only_through_change_verdict():
    # The chapter's verdicts once read "changes perplexity by -0.00 %". Every signed percentage it
    # prints must come from change_verdict, which cannot print a signed zero (tests above).
    src = PAGE.read_text()
    assert "change_verdict" in src and "paired_change" in src
    assert not re.search(r":\+\.?\d*f\}", src), "a signed f-string format prints +0.00 for a tiny change"
    assert not SIGNED_ZERO.search(src)


# -- simulated formats ------------------------------------------------------------------------------
def _fed(model, cache, ids):
    return stepwise_logits(model, ids, cache)


@pytest.mark.parametrize("bits,G,R", [(8, 16, 0), (4, 16, 0), (4, 8, 24), (8, 4, 7)])
def test_simulated_int_format_is_quantized_cache(bits, G, R):
    model = _model()
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))
    real, sim = QuantizedCache(bits, G, R), SimulatedQuantCache(f"int{bits}", G, R)
    a, b = _fed(model, real, ids), _fed(model, sim, ids)
    assert torch.equal(a, b)  # the same arithmetic, so bit for bit the same logits
    assert sim.nbytes == real.nbytes  # and the bytes that kvref's cache really holds


def test_fewer_bits_more_error():
    model = _model()
    ids = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(2))
    ref = _fed(model, DynamicCache(), ids)
    err = {b: float((_fed(model, SimulatedQuantCache(f"int{b}", 16, 0), ids) - ref).abs().mean())
           for b in (8, 4, 3, 2)}
    # Each bit fewer doubles the step; the logit error must grow with it (measured 2x per bit below 4).
    assert err[8] < err[4] < err[3] < err[2]
    bytes_ = [format_bytes(f"int{b}", 2, 1, 2, 16, 80, torch.float16, 16, 0) for b in (8, 4, 3, 2)]
    assert bytes_ == sorted(bytes_, reverse=True) and bytes_[-1] < format_bytes("fp16", 2, 1, 2, 16, 80,
                                                                                torch.float16, 16, 0) / 3


def test_quantize_takes_2_to_8_bits_within_half_a_step():
    torch.manual_seed(3)
    x = torch.randn(2, 32, 16)
    for bits in range(2, 9):
        c, s, z = quantize(x, bits, 8, -2)
        assert int(c.max()) == 2**bits - 1  # the whole range of codes is used
        err = (dequantize(c, s, z, 8, -2) - x).abs()
        assert bool((err <= s.repeat_interleave(8, -2) / 2 * (1 + 1e-5) + 1e-6).all())
    for bad in (1, 9, 3.0):
        with pytest.raises(QuantizationError, match="2 to 8"):
            quantize(x, bad, 8, -1)


def test_fp8_round_trip():
    torch.manual_seed(4)
    x = torch.randn(4, 64) * 3
    s = fp8_scale(x)
    assert float((x / s).abs().max()) == pytest.approx(448, rel=1e-6)  # e4m3's largest number
    for fmt, rel in (("e4m3", 2**-4), ("e5m2", 2**-3)):  # half the mantissa spacing, relative
        y = fp8_round_trip(x, fp8_scale(x, fmt), fmt)
        big = x.abs() > 1e-2 * x.abs().max()  # well inside the normal range
        assert bool(((y - x).abs() <= rel * x.abs() * (1 + 1e-6))[big].all())
        assert float((y - x).abs().max()) > 0  # it did round
    huge = fp8_round_trip(torch.tensor([1e6, -1e6]), 1.0)
    assert huge.tolist() == [448.0, -448.0]  # saturates, no NaN
    with pytest.raises(QuantizationError, match="e4m3"):
        fp8_round_trip(x, 1.0, "e3m4")


def test_simulated_cache_bad_settings():
    for kwargs in ({"fmt": "int1"}, {"fmt": "int9"}, {"fmt": "fp4"}, {"keys": "head"}, {"residual": -1},
                   {"group_size": 0}):
        with pytest.raises(QuantizationError):
            SimulatedQuantCache(**kwargs)


# -- synthesised outlier channels -------------------------------------------------------------------
def test_key_outliers_keep_the_function_and_hurt_only_per_token_keys():
    model = _model()
    out = with_key_outliers(model, 10.0)
    ids = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert float((out(ids) - model(ids)).abs().max()) < 1e-4  # q.k unchanged: same logits
        c0, c1 = DynamicCache(), DynamicCache()
        model(ids, cache=c0)
        out(ids, cache=c1)
    D = CFG.head_dim
    ratio = c1.k[0].abs().amax(dim=(0, 2)) / c0.k[0].abs().amax(dim=(0, 2))  # (H_kv, D)
    assert torch.allclose(ratio[:, [D // 2 - 1, D - 1]], torch.tensor(10.0), rtol=1e-4)  # the pair
    assert torch.allclose(ratio[:, : D // 2 - 1], torch.tensor(1.0), rtol=1e-4)  # the others untouched
    # What attention reads: keys of layer 0 after the cache quantized them (R = 0: whole groups).
    k_exact = c1.k[0][:, :, :64]  # (B, H_kv, S, D) of the model with outliers
    normal = [c for c in range(D) if c not in (D // 2 - 1, D - 1)]

    def key_error(cache, k_true):
        with torch.no_grad():
            (out if k_true is k_exact else model)(ids, cache=cache)
        return float((cache.k_old[0] - k_true)[..., normal].abs().mean())  # error on ordinary channels

    plain = key_error(SimulatedQuantCache("int4", 16, 0), c0.k[0])
    per_channel = key_error(SimulatedQuantCache("int4", 16, 0), k_exact)
    per_token = key_error(SimulatedQuantCache("int4", 16, 0, keys="token"), k_exact)
    assert per_channel == pytest.approx(plain, rel=1e-3)  # per-channel scales: ordinary channels unharmed
    assert per_token > 3 * per_channel  # the 10x outlier sets every token's step (measured 4.3x)
    # And in the logits: per-token keys with outliers move them more than per-channel keys.
    ref = _fed(out, DynamicCache(), ids)
    lc = float((_fed(out, SimulatedQuantCache("int4", 16, 0), ids) - ref).abs().mean())
    lt = float((_fed(out, SimulatedQuantCache("int4", 16, 0, keys="token"), ids) - ref).abs().mean())
    assert lt > 1.5 * lc  # measured 3.3x


def test_fp8_cache_quantizes_every_token_beyond_the_residual():
    # FP8 has no groups: unlike int formats, no unfinished group waits in full precision.
    model = _model()
    ids = torch.randint(0, 256, (1, 37), generator=torch.Generator().manual_seed(6))
    for R in (0, 5):
        cache = SimulatedQuantCache("fp8_e4m3", 16, R)
        with torch.no_grad():
            model(ids, cache=cache)
        assert cache.k_res[0].shape[2] == R and cache.k_old[0].shape[2] == 37 - R
        fp32_res = 2 * CFG.n_layers * CFG.n_kv_heads * R * CFG.head_dim * 4
        codes = 2 * CFG.n_layers * CFG.n_kv_heads * (37 - R) * CFG.head_dim  # one byte per number
        assert cache.nbytes == codes + fp32_res + 2 * CFG.n_layers * 4  # + one fp32 scale per layer, K and V
