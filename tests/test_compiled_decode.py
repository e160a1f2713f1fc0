"""The compile-friendly decode step: same tokens as eager generate, one graph, no graph breaks.

Most cases trace with backend="eager" (dynamo captures the graph, no code is generated: about a
second); one test compiles with inductor (about 20 s on this machine), the real thing.
``fullgraph=True`` turns any graph break into an error, so a passing run has none; the counters
then show that one graph served every step (a recompile per step would show up as more graphs).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

import kvref
from kvref.compiled import CompiledDecoder, decode_step, graph_breaks

from conftest import tiny_config, tiny_model


def prompt(B=2, T=7, seed=0):
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_traced_step_gives_eager_tokens_with_one_graph(arch):
    model = tiny_model(tiny_config(arch, n_kv_heads=2 if arch == "llama" else None))
    ids, N = prompt(), 12
    reference = kvref.generate(model, ids, N, cache="static").tokens
    torch._dynamo.reset()
    counters.clear()
    out = CompiledDecoder(model, backend="eager").generate(ids, N, kvref.StaticCache(model.cfg, 2, 7 + N))
    assert torch.equal(out, reference)
    assert counters["stats"]["unique_graphs"] == 1  # 11 steps, one graph: no recompile as the cache grows


def test_explain_finds_no_graph_break_and_the_model_forward_has_some():
    model = tiny_model(tiny_config())
    ids = prompt()
    cache = kvref.StaticCache(model.cfg, 2, 16)
    kvref.prefill(model, ids, cache)
    assert graph_breaks(model, cache, ids[:, -1]) == 0
    # the readable forward, for contrast: its input checks and bookkeeping do break the graph
    with torch.inference_mode():
        readable = torch._dynamo.explain(kvref.decode_one_token)(model, ids[:, -1], cache)
    assert readable.graph_break_count > 0


def test_left_padded_prompt_continues_like_generate():
    model = tiny_model(tiny_config())
    ids, mask = prompt(T=6), torch.ones(2, 6, dtype=torch.long)
    mask[1, :3] = 0  # row 1: 3 tokens of left padding
    reference = kvref.generate(model, ids, 8, cache="static", attention_mask=mask).tokens
    cache, dec = kvref.StaticCache(model.cfg, 2, 14), CompiledDecoder(model, compile=False)
    with torch.inference_mode():
        out = [ids, kvref.prefill(model, ids, cache, mask).argmax(-1)[:, None]]
        for _ in range(7):
            out.append(dec.step(out[-1][:, 0], cache).argmax(-1)[:, None])
    assert torch.equal(torch.cat(out, 1), reference)


def test_inductor_compiled_step_equals_eager():
    torch.manual_seed(0)
    model = tiny_model(tiny_config())
    ids, N = prompt(), 10
    cache = kvref.StaticCache(model.cfg, 2, 7 + N)
    torch._dynamo.reset()
    counters.clear()
    dec = CompiledDecoder(model)  # inductor: C++ code generated and built with gcc
    out, code = run_and_get_code(dec.generate, ids, N, cache)
    assert torch.equal(out, kvref.generate(model, ids, N, cache="static").tokens)
    assert counters["stats"]["unique_graphs"] == 1
    # The K/V write must stay a write of B * H_kv rows. Written into a per-layer view (k_buf[i]) it
    # became loops copying whole buffers (a GPT-2 step 20 % slower, docs/benchmarks.md); such a loop
    # runs over a layer's numel (or the whole buffer's), a number no other tensor here has.
    layer_numel = cache.k[0].numel()  # B * H_kv * S_max * D
    for n in (layer_numel, cache.k.numel()):
        assert not re.search(rf"<static_cast<int64_t>\({n}L\)", "\n".join(code)), f"a loop over {n} elements"
    # logits of one more step, compiled vs eager from identical cache states (fp32: 1e-5)
    twin = kvref.StaticCache(model.cfg, 2, 7 + N)
    with torch.inference_mode():
        kvref.prefill(model, ids, twin)
        cache.reset()
        kvref.prefill(model, ids, cache)
        tok = ids[:, -1]
        assert (dec.step(tok, cache) - kvref.decode_one_token(model, tok, twin)).abs().max() <= 1e-5


def test_wrong_cache_or_empty_cache_is_refused():
    model = tiny_model(tiny_config())
    dec = CompiledDecoder(model, compile=False)
    with pytest.raises(ValueError, match="StaticCache"):
        dec.step(torch.zeros(1, dtype=torch.long), kvref.DynamicCache())
    with pytest.raises(ValueError, match="prefill"):
        dec.step(torch.zeros(1, dtype=torch.long), kvref.StaticCache(model.cfg, 1, 8))
    cache = kvref.StaticCache(model.cfg, 1, 4)
    kvref.prefill(model, prompt(B=1, T=4), cache)
    with pytest.raises(ValueError, match="max_len"):  # full: the capacity check runs outside the graph
        dec.step(torch.zeros(1, dtype=torch.long), cache)
    assert decode_step is dec.fn


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="packed weights are MKL's (this torch has no MKL)")
def test_frozen_step_equals_eager_and_runs_on_packed_weights():
    torch.manual_seed(0)
    model = tiny_model(tiny_config())
    ids, N = prompt(), 6
    torch._dynamo.reset()
    cache = kvref.StaticCache(model.cfg, 2, 7 + N)
    plain = CompiledDecoder(model)  # an unfrozen graph first, kept alive: the frozen one must not reuse it
    plain.generate(ids, 3, cache)
    dec = CompiledDecoder(model, freeze=True)
    assert torch.equal(dec.generate(ids, N, cache), kvref.generate(model, ids, N, cache="static").tokens)
    # freezing took effect: the step multiplies by weights repacked for MKL (an unfrozen graph calls addmm)
    with torch.inference_mode():
        tok = ids[:, -1].clone()  # an inference tensor like generate's tokens: this step does not recompile
    with torch.profiler.profile() as prof, torch.inference_mode():
        dec.step(tok, cache)
    assert "mkl::_mkl_linear" in {e.key for e in prof.key_averages()}
    del plain
