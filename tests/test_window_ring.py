"""SlidingWindowCache is a real ring: a decode step writes one K row and one V row per layer into
a buffer allocated once, hands attention that buffer (no copy), and still equals the reference
model with a sliding-window mask, for RoPE and for GPT-2's learned positions, with left padding,
with calls of several tokens, and against Hugging Face's Mistral with a sliding window."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvref import ModelConfig, Transformer, generate
from kvref.evict import SlidingWindowCache

LLAMA = ModelConfig(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=64, max_seq_len=256)
GPT2 = ModelConfig(arch="gpt2", n_layers=2, n_heads=4, d_model=64, max_seq_len=256)


def _model(cfg=LLAMA, seed=0, device="cpu"):
    torch.manual_seed(seed)
    return Transformer(cfg, device=device).eval()


def _windowed(model, window):
    ref = Transformer(model.cfg.with_(sliding_window=window), device=model.device).eval()
    ref.load_state_dict(model.state_dict())
    return ref


class FloatBytesWritten(TorchDispatchMode):
    """Counts the bytes of floating-point data every aten op writes: a new tensor's bytes, or the
    bytes an in-place op writes into an existing one; views write nothing."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if written:  # in place: index_put_ writes `values`, copy_ and friends write their target
            t = args[2] if func.name().startswith("aten::index_put") else args[0]
            if t.is_floating_point():
                self.bytes += t.numel() * t.element_size()
        elif not (schema.returns and schema.returns[0].alias_info is not None):  # not a view
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    self.bytes += t.numel() * t.element_size()
        return out


class WatchedRing(SlidingWindowCache):
    """Records, per update, whether attention got a view of the ring and what update wrote."""

    def __init__(self, window):
        super().__init__(window)
        self.log = []  # (layer, T, returned a view of the ring?, float bytes written by update)

    def update(self, layer, k, v):
        with FloatBytesWritten() as count:
            k_all, v_all = super().update(layer, k, v)
        view = (k_all.untyped_storage().data_ptr() == self.k[layer].untyped_storage().data_ptr()
                and v_all.untyped_storage().data_ptr() == self.v[layer].untyped_storage().data_ptr())
        self.log.append((layer, k.shape[2], view, count.bytes))
        return k_all, v_all


def _run(model, ids, cache, chunks, mask=None):
    out, start = [], 0
    with torch.no_grad():
        for n in chunks:
            m = None if mask is None else mask[:, start:start + n]
            out.append(model(ids[:, start:start + n], cache=cache, attention_mask=m))
            start += n
    return torch.cat(out, dim=1)


def test_decode_step_writes_one_row_per_layer_in_place():
    model, W = _model(), 16
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(1))
    cache = WatchedRing(W)
    with torch.no_grad():
        model(ids[:, :40], cache=cache)  # a prompt longer than W: the ring keeps its last W tokens
        pointers = [t.data_ptr() for t in cache.k + cache.v]
        for i in range(40, 70):
            before = [t.clone() for t in cache.k + cache.v]
            cache.log.clear()
            model(ids[:, i:i + 1], cache=cache)
            after = cache.k + cache.v
            for b, a in zip(before, after):
                changed = (b != a).any(dim=3).any(dim=1).any(dim=0)  # (W,) slots that changed
                # Exactly the slot of token i (the one leaving the window lived there): fresh
                # random K/V never equal the old row, so every other slot must be untouched.
                assert changed.nonzero().flatten().tolist() == [i % W]
            assert [t.data_ptr() for t in after] == pointers  # the same buffers, never reallocated
            row = 2 * model.cfg.n_kv_heads * model.cfg.head_dim * 4  # B = 2 rows of H_kv * D fp32
            for layer, T, view, written in cache.log:
                assert T == 1 and view  # attention read the ring itself ...
                assert written == 2 * row  # ... and update wrote one K row and one V row, nothing else
    assert cache.length == W - 1 and cache.seen == 70  # W - 1 keys visible to the next query + its own
    assert cache.nbytes == 2 * model.cfg.n_layers * 2 * model.cfg.n_kv_heads * W * model.cfg.head_dim * 4


def test_the_slicing_recipe_copies_the_window():
    """The counter above is not blind: torch.cat over the window is counted as W + 1 rows."""
    k, new = torch.randn(2, 2, 16, 8), torch.randn(2, 2, 1, 8)
    with FloatBytesWritten() as count:
        torch.cat([k, new], dim=2)[:, :, -16:]
    assert count.bytes == 17 * 2 * 2 * 8 * 4


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["rope", "learned-positions"])
@pytest.mark.parametrize("window,chunks,pad", [
    (16, [40] + [1] * 40, 0),  # prompt longer than W, then decode on the ring
    (16, [5] + [1] * 40, 0),  # the ring fills while decoding
    (8, [3] * 10 + [1] * 20, 0),  # calls of several tokens that wrap around the ring
    (5, [2, 7, 1, 13, 4, 1, 1, 9, 1, 1], 0),  # calls longer than W in the middle of a sequence
    (1, [6] + [1] * 10, 0),  # W = 1: every query sees itself only
    (12, [30] + [1] * 40, 9),  # left padding that leaves the window after a few steps
    (12, [1] * 60, 20),  # a padded prompt fed one token at a time (padding queries too)
])
def test_ring_equals_windowed_reference(cfg, window, chunks, pad):
    model = _model(cfg)
    ids = torch.randint(0, 256, (2, sum(chunks)), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    with torch.no_grad():
        ref = _windowed(model, window)(ids, attention_mask=mask)
    cache = WatchedRing(window)
    out = _run(model, ids, cache, chunks, mask)
    # fp32, same arithmetic up to summation order: the course-wide 1e-5. Padding outputs are unused.
    assert float((out - ref)[0].abs().max()) <= 1e-5
    assert float((out - ref)[1, pad:].abs().max()) <= 1e-5
    n_decode_on_ring = sum(view for _, _, view, _ in cache.log)
    if window > 1 and chunks.count(1) > window + pad:
        assert n_decode_on_ring > 0  # the comparison above really exercised the in-place path


def test_ring_generate_greedy_identical_with_padding():
    model = _model()
    ids = torch.randint(0, 256, (3, 30), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[2, :11] = 0
    a = generate(model, ids, 100, cache=SlidingWindowCache(24), attention_mask=mask).tokens
    b = generate(_windowed(model, 24), ids, 100, cache="dynamic", attention_mask=mask).tokens
    assert torch.equal(a, b)


def test_reset_forgets_the_old_prompt():
    model, W = _model(), 8
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(4))
    cache = SlidingWindowCache(W)
    _run(model, ids, cache, [20] + [1] * 20)
    cache.reset()
    again = _run(model, ids[:, 20:], cache, [4] + [1] * 16)
    fresh = _run(model, ids[:, 20:], SlidingWindowCache(W), [4] + [1] * 16)
    assert torch.equal(again, fresh)  # same ops on the same inputs: bit for bit


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ring_on_cuda_equals_windowed_reference():
    model = _model(device="cuda")
    ids = torch.randint(0, 256, (2, 80), generator=torch.Generator().manual_seed(5)).cuda()
    cache = WatchedRing(16)
    out = _run(model, ids, cache, [40] + [1] * 40)
    with torch.no_grad():
        ref = _windowed(model, 16)(ids)
    # fp32 on the GPU: TF32 is off by default for matmuls; 1e-5 as on the CPU.
    assert float((out - ref).abs().max()) <= 1e-5
    assert any(view for _, _, view, _ in cache.log)


def test_ring_matches_hf_mistral_sliding_window(tmp_path):
    """Mistral-7B v0.1-style attention (a window of 8 here) in HF transformers vs kvref's ring."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from transformers import MistralConfig, MistralForCausalLM

    import kvref

    torch.manual_seed(0)
    hf = MistralForCausalLM(MistralConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=128, vocab_size=256,
                                          max_position_embeddings=128, sliding_window=8)).eval()
    with torch.no_grad():
        for p in hf.parameters():  # wider than init, so greedy output varies
            p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    ours = kvref.load_hf(tmp_path)
    assert ours.cfg.sliding_window == 8
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(6))
    cache = WatchedRing(8)
    with torch.no_grad():
        out = hf(ids[:, :12], use_cache=True)  # a prompt longer than the window
        # HF is another implementation: the course's 1e-4 bound (see test_hf.py).
        torch.testing.assert_close(ours(ids[:, :12], cache=cache), out.logits, atol=1e-4, rtol=0)
        past = out.past_key_values
        for t in range(12, 20):
            out = hf(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            torch.testing.assert_close(ours(ids[:, t:t + 1], cache=cache), out.logits, atol=1e-4, rtol=0)
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, min_new_tokens=40,
                               do_sample=False, pad_token_id=0)
    assert any(view for _, _, view, _ in cache.log)
    got = generate(ours, ids, 40, cache=SlidingWindowCache(8)).tokens
    assert len(set(expected[0, 20:].tolist())) > 3  # non-degenerate output, so equality means something
    assert torch.equal(got, expected)


def test_a_window_wider_than_the_model_was_trained_with_is_refused():
    model = _windowed(_model(), 16)  # a model trained (here: configured) with a window of 16
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match=r"attends to its 16 newest.*window <= 16"):
        model(ids, cache=SlidingWindowCache(32))
    with torch.no_grad():
        exact = _run(model, ids, SlidingWindowCache(16), [12] + [1] * 8)
        smaller = _run(model, ids, SlidingWindowCache(8), [12] + [1] * 8)
        ref = model(ids)
    assert float((exact - ref).abs().max()) <= 1e-5  # the trained window: exact (fp32 rounding)
    assert float((smaller - ref).abs().max()) > 1e-2  # a smaller one: an approximation, visibly
