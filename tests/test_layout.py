"""The weights' memory layout (kvref.layout) changes speed only: logits and tokens stay the same.

Bound: fp32 logits within 1e-5 between the two layouts (the same products, read in another order, round
a few ulps differently; LOGIT_STD keeps logits near 3 as in test_cache_equivalence), greedy tokens
identical; against HF transformers 1e-4 with either layout forced. Nothing here is timed for a verdict:
"auto" is only checked to pick one of the two and to remember its pick.
"""

from __future__ import annotations

import pytest
import torch

import kvref
from conftest import ATTENTION_KINDS, tiny_config, tiny_model
from kvref.layout import CHOICES, LAYOUTS, PACKED, _chosen, can_pack, choice_of, choose_layout, layout_of, linear_layers, set_layout

LOGIT_STD = 0.1


def forced(cfg: kvref.ModelConfig, layout: str, std: float) -> kvref.Transformer:
    model = tiny_model(cfg, std=std)
    assert set_layout(model, layout) == layout
    return model


@pytest.mark.parametrize("arch,n_kv", ATTENTION_KINDS)
def test_storage_changes_weights_do_not(arch, n_kv):
    model = tiny_model(tiny_config(arch, n_kv))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    set_layout(model, "in_out")
    assert layout_of(model) == "in_out"
    for m in linear_layers(model):  # the (out, in) shape as F.linear sees it, stored transposed
        assert m.weight.shape == (m.out_features, m.in_features) and m.weight.t().is_contiguous()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    set_layout(model, "out_in")
    assert layout_of(model) == "out_in" and all(m.weight.is_contiguous() for m in linear_layers(model))


@pytest.mark.parametrize("rows", [1, 16])  # 16: Linear's batched (W @ x.T).T path, taken on (out, in) only
@pytest.mark.parametrize("arch,n_kv", ATTENTION_KINDS)
def test_logits_equal_either_layout(arch, n_kv, rows):
    cfg = tiny_config(arch, n_kv)
    a, b = (forced(cfg, k, LOGIT_STD) for k in LAYOUTS)
    ids = torch.randint(0, 256, (rows, 12), generator=torch.Generator().manual_seed(rows)).to(a.device)
    with torch.no_grad():
        ca, cb = (kvref.StaticCache(cfg, rows, 16) for _ in range(2))
        la, lb = a(ids, cache=ca), b(ids, cache=cb)  # prefill, then one decode step of one token per row
        step = ids[:, -1:]
        la, lb = torch.cat([la, a(step, cache=ca)], 1), torch.cat([lb, b(step, cache=cb)], 1)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch,n_kv", ATTENTION_KINDS)
def test_greedy_tokens_equal_either_layout(arch, n_kv):
    cfg = tiny_config(arch, n_kv)
    ids = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(2))
    out = [kvref.generate(forced(cfg, k, 0.2), ids, 24).tokens for k in LAYOUTS]
    assert torch.equal(out[0], out[1])


def test_auto_picks_one_and_remembers():
    model = tiny_model(tiny_config("gpt2"))
    layout, seconds = choose_layout(model, rows=1)
    assert layout in LAYOUTS and set(seconds) == set(LAYOUTS) and layout == min(seconds, key=seconds.get)
    n = len(_chosen)
    assert set_layout(tiny_model(tiny_config("gpt2"), seed=1), "auto") == layout and len(_chosen) == n


def test_bad_layout_is_one_clear_error(monkeypatch):
    model = tiny_model(tiny_config("llama"))
    with pytest.raises(ValueError, match="'auto', 'out_in', 'in_out' or 'onednn'; got 'row_major'"):
        set_layout(model, "row_major")
    monkeypatch.setenv("KVREF_LAYOUT", "cols")
    with pytest.raises(ValueError, match=r"\$KVREF_LAYOUT.*got 'cols'"):
        set_layout(model)


@pytest.mark.parametrize("layout", CHOICES)
def test_hf_match_with_layout_forced(layout, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=0)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)
    monkeypatch.setenv("KVREF_LAYOUT", layout)  # load_hf reads it when no layout is passed
    if layout == PACKED and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    ours = kvref.load_hf(tmp_path)
    assert choice_of(ours) == layout
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=0)
        expected = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                               min_new_tokens=16, pad_token_id=0)
    assert torch.equal(kvref.generate(ours, ids, 16).tokens, expected)


def test_frozen_compiled_decode_with_weights_stored_in_out():
    """Inductor's freezing repacks the weights as they lie: stored (in, out), the tokens are still eager's."""
    from kvref.compiled import CompiledDecoder

    model = forced(tiny_config("gpt2"), "in_out", 0.2)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    dec = CompiledDecoder(model, freeze=True)
    got = dec.generate(ids, 12, kvref.StaticCache(model.cfg, 2, 19))
    assert torch.equal(got, kvref.generate(model, ids, 12).tokens)


# -- oneDNN's packed copies ("onednn", issue 37): the same products by another kernel ------------------
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("arch,n_kv", [("gpt2", None), ("llama", 2)])
def test_packed_logits_equal_dense(arch, n_kv, rows):
    """Bound 1e-5 as between the layouts: oneDNN sums the same products in another order."""
    cfg = tiny_config(arch, n_kv)
    dense, packed = forced(cfg, "out_in", LOGIT_STD), forced(cfg, PACKED, LOGIT_STD)
    assert all(m.packed is not None for m in linear_layers(packed))
    with torch.profiler.profile() as prof, torch.inference_mode():  # oneDNN's kernel does run
        packed(torch.zeros(rows, 1, dtype=torch.long))
    assert sum(e.name == "mkldnn::_linear_pointwise" for e in prof.events()) == len(linear_layers(packed))
    ids = torch.randint(0, 256, (rows, 12), generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        ca, cb = (kvref.StaticCache(cfg, rows, 16) for _ in range(2))
        la, lb = dense(ids, cache=ca), packed(ids, cache=cb)
        step = ids[:, -1:]
        la, lb = torch.cat([la, dense(step, cache=ca)], 1), torch.cat([lb, packed(step, cache=cb)], 1)
        uncached = packed(torch.cat([ids, step], 1))  # the packed model, cached vs uncached
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=0)
    torch.testing.assert_close(lb, uncached, atol=1e-5, rtol=0)


@needs_onednn
def test_packed_greedy_tokens_equal_dense():
    cfg = tiny_config("gpt2")
    ids = torch.randint(0, 256, (16, 8), generator=torch.Generator().manual_seed(2))
    out = [kvref.generate(forced(cfg, k, 0.2), ids, 24).tokens for k in ("out_in", PACKED)]
    assert torch.equal(out[0], out[1])


@needs_onednn
def test_packed_copy_never_used_stale():
    """Weights changed after packing (in place, or replaced): the layer computes with the new ones."""
    cfg = tiny_config("gpt2")
    packed, other = forced(cfg, PACKED, LOGIT_STD), tiny_model(cfg, seed=7, std=LOGIT_STD)
    ids = torch.randint(0, 256, (4, 6), generator=torch.Generator().manual_seed(4))
    packed.load_state_dict(other.state_dict())  # copies in place: same storage, new values
    with torch.no_grad():
        torch.testing.assert_close(packed(ids), other(ids), atol=1e-5, rtol=0)
    layer = linear_layers(packed)[1]
    layer.weight.data = layer.weight.data * 2  # replaced: another tensor
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@needs_onednn
def test_packed_model_still_trains():
    """With gradients wanted the layer takes the dense path (oneDNN's op has no backward): gradients flow."""
    model = forced(tiny_config("llama"), PACKED, LOGIT_STD).train()
    model(torch.randint(0, 256, (2, 5))).sum().backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for m in linear_layers(model))


def test_auto_races_packed_only_for_batches():
    """One row: the two storages (a weight-read step, packing would only double the memory); 16 rows:
    oneDNN's copies too, where it can pack."""
    model = tiny_model(tiny_config("gpt2"))
    assert set(choose_layout(model, rows=1)[1]) == set(LAYOUTS)
    choice, seconds = choose_layout(model, rows=16)
    assert set(seconds) == set(CHOICES if can_pack(model) else LAYOUTS) and choice == min(seconds, key=seconds.get)
    assert set_layout(model, "auto", rows=16) == choice == choice_of(model)
    assert set_layout(model, "in_out", rows=16) == "in_out" and choice_of(model) == "in_out"
    assert all(m.packed is None for m in linear_layers(model))  # dropped with the switch


@needs_onednn
def test_packed_model_copies_without_its_packed_copies():
    """copy.deepcopy (as kvref.bench does to move a model) cannot copy oneDNN's opaque tensor: the copy
    drops it and computes on its dense weights, to the same logits."""
    import copy

    model = forced(tiny_config("gpt2"), PACKED, LOGIT_STD)
    twin = copy.deepcopy(model)
    assert all(m.packed is None for m in linear_layers(twin)) and choice_of(model) == PACKED
    ids = torch.randint(0, 256, (4, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(twin(ids), model(ids), atol=1e-5, rtol=0)


def test_onednn_refused_where_it_cannot_pack():
    """bf16 weights: oneDNN's fp32 copies do not apply; one clear error, the model left as it was."""
    model = tiny_model(tiny_config("gpt2")).to(torch.bfloat16)
    assert not can_pack(model)
    with pytest.raises(ValueError, match="'onednn' needs fp32 weights on a CPU"):
        set_layout(model, "onednn", rows=16)
    assert choice_of(model) == "out_in" and all(m.packed is None for m in linear_layers(model))
    assert set(choose_layout(model, rows=16)[1]) == set(LAYOUTS)  # nor does "auto" race it


# -- Linear's other CPU paths: narrow products and 16-bit numbers without a 16-bit matrix unit ------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 16])
def test_16bit_product_is_fp32_rounded_once(dtype, rows):
    """Where oneDNN has no 16-bit kernel, 4+ rows run in fp32 and are rounded once: bit for bit that, and
    within 16-bit rounding of PyTorch's own 16-bit product (1 ulp of the largest output: 2^-7 relative for
    bf16's 8 significant bits, 2^-10 for fp16's 11, times the outputs' size of about 1). One row, and CPUs
    that have the kernel, keep F.linear's own product."""
    from kvref.modules import Linear, _slow_16bit

    torch.manual_seed(0)
    layer = Linear(128, 96).to(dtype)  # 12,288 weights: the 4-row threshold
    x = torch.randn(rows, 128, dtype=dtype) / 8
    with torch.no_grad():
        got, own = layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias)
        fp32 = torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())
    assert got.dtype == dtype
    expected = fp32.to(dtype) if dtype in _slow_16bit() and rows >= 4 else own
    assert torch.equal(got, expected)
    ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10) * float(fp32.abs().max())
    assert float((got.float() - own.float()).abs().max()) <= ulp


@pytest.mark.parametrize("width,reversed_form", [(128, False), (768, True)])
def test_reversed_form_only_for_wide_products(width, reversed_form):
    """16 rows: the (W @ x.T).T form from 512 wide on (measured slower on narrow products), F.linear below;
    either way the product of F.linear within fp32 rounding."""
    from kvref.modules import Linear

    torch.manual_seed(0)
    layer = Linear(width, 384)
    x = torch.randn(16, width)
    with torch.no_grad(), torch.profiler.profile() as prof:
        got = layer(x)
    assert any(e.name == "aten::linear" for e in prof.events()) != reversed_form
    torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
