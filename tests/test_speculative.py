"""Speculative decoding (kvref.speculative): greedy output is the target's own, for every cache kind and
architecture; sampling keeps the target's distribution; prompt lookup; HF's assisted generation agrees.

Bounds: greedy tokens identical (exact). The sampling test is a chi-square test (see its docstring).
"""

from __future__ import annotations

import pytest
import torch

import kvref
from kvref import speculative as sp
from tests.conftest import tiny_config, tiny_model

PROMPT = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(5))
N = 20


def noisy_copy(model: kvref.Transformer, std: float, seed: int = 1) -> kvref.Transformer:
    """The target with noise on its weights: a draft that agrees often but not always."""
    draft = kvref.Transformer(model.cfg).eval()
    draft.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=g) * std)
    return draft


ARCHS = {
    "gpt2": tiny_config("gpt2"),
    "llama-gqa": tiny_config(n_kv_heads=2),
    "qwen3": tiny_config(n_kv_heads=2, qk_norm=True, head_dim=24),
    "gemma3": tiny_config("gemma", n_layers=3, n_kv_heads=2, sliding_window=5,
                          layer_types=("sliding", "sliding", "full")),
    "deepseek-mla": kvref.ModelConfig(n_layers=2, n_heads=4, d_model=32, head_dim=12, max_seq_len=96,
                                      layer_types=("latent", "latent"), kv_lora_rank=16, q_lora_rank=12,
                                      qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8),
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_equals_target_every_architecture(arch):
    target = tiny_model(ARCHS[arch])
    if arch == "gemma3":  # Gemma scales embeddings by sqrt(d_model): a large one makes the input token win
        with torch.no_grad():
            target.tok_emb.weight.mul_(0.2)
    want = kvref.generate(target, PROMPT, N).tokens
    assert len(set(want[0, 8:].tolist())) > 3  # output varies, so equality means something
    rates = []
    for draft in (target, noisy_copy(target, 0.05), tiny_model(ARCHS[arch], seed=7)):
        for kind in ("static", "dynamic"):
            got = sp.generate(target, PROMPT, N, draft=draft, k=3, cache=kind)
            assert torch.equal(got.tokens, want), (arch, kind)
        rates.append(got.stats.acceptance_rate)
    assert rates[0] == 1.0 and rates[2] < rates[0]  # a perfect draft and a poor one: both paths ran


@pytest.mark.parametrize("kind", ["paged", "quantized", "window", "sink"])
def test_greedy_equals_target_other_caches(kind):
    cfg = tiny_config(n_kv_heads=2, sliding_window=6 if kind == "window" else None)
    target = tiny_model(cfg)
    draft = noisy_copy(target, 0.05)
    if kind == "sink":  # a cache object: a SinkCache that never evicts within these 8 + 20 + k tokens
        cache, plain = kvref.SinkCache(2, 40), kvref.SinkCache(2, 40)
    else:
        cache, plain = kind, {"paged": "static", "window": kvref.SlidingWindowCache(6),
                              "quantized": kvref.QuantizedCache(8, residual=32)}[kind]
    want = kvref.generate(target, PROMPT, N, cache=plain).tokens
    got = sp.generate(target, PROMPT, N, draft=draft, k=4, cache=cache)
    assert torch.equal(got.tokens, want)
    assert 0 < got.stats.accepted < got.stats.proposed  # accepted and rejected drafts both happened


def reference_accepted(target, draft, prompt, n_new, k) -> tuple[list[int], int]:
    """The greedy loop without any cache (every forward sees the whole sequence): the tokens and how many
    drafts the target accepts. Written independently of kvref.speculative."""
    seq = prompt[0].tolist()
    accepted, T = 0, len(seq)
    seq.append(int(target(torch.tensor([seq]))[0, -1].argmax()))
    while len(seq) - T < n_new:
        kk = min(k, n_new - (len(seq) - T) - 1)
        guess = []
        for _ in range(kk):
            guess.append(int(draft(torch.tensor([seq + guess]))[0, -1].argmax()))
        choice = target(torch.tensor([seq + guess]))[0, len(seq) - 1:].argmax(-1).tolist()
        n = next((i for i in range(kk) if guess[i] != choice[i]), kk)
        accepted += n
        seq += guess[:n] + [choice[n]]
    return seq, accepted


@torch.no_grad()
def test_accepted_count_and_draft_cache_crop_match_an_uncached_loop():
    """If the draft's cache were not cropped, its next proposals would follow rejected tokens and the
    accepted count would differ from this cache-free loop's (the tokens would still be right)."""
    target = tiny_model(tiny_config(n_kv_heads=2))
    draft = noisy_copy(target, 0.08)
    seq, accepted = reference_accepted(target, draft, PROMPT, N, 4)
    got = sp.generate(target, PROMPT, N, draft=draft, k=4, cache="static")
    assert got.tokens[0].tolist() == seq
    assert got.stats.accepted == accepted and 0 < accepted < got.stats.proposed
    assert got.stats.target_forwards == 1 + (N - 1 - accepted)  # every verify step emits its accepted + 1


def test_perfect_draft_needs_few_target_forwards():
    """Draft = target: every draft accepted, each verify step emits k + 1 tokens."""
    target = tiny_model(tiny_config(n_kv_heads=2))
    got = sp.generate(target, PROMPT, 21, draft=target, k=4)
    assert got.stats.acceptance_rate == 1.0
    assert got.stats.target_forwards == 1 + 20 // 5  # prefill, then 4 steps of 5 tokens
    assert got.stats.tokens_per_forward == 5.0


def test_ngram_lookup_and_repetitive_text():
    assert sp.ngram_draft([5, 6, 7, 8, 1, 5, 6], 3) == [7, 8, 1]  # "5 6" seen before: what followed it
    assert sp.ngram_draft([5, 6, 7, 9, 6], 3) == [7, 9, 6]  # no bigram match, unigram "6"
    assert sp.ngram_draft([1, 2, 3], 3) == []
    target = tiny_model(tiny_config(n_kv_heads=2))
    plain = kvref.generate(target, PROMPT, 40).tokens
    got = sp.generate(target, PROMPT, 40, draft="ngram", k=4)
    assert torch.equal(got.tokens, plain)
    tail = plain[0, 8:].tolist()
    if len(set(tail[-12:])) < 12:  # this random model falls into a loop: lookup then pays off
        assert got.stats.acceptance_rate > 0.5 and got.stats.target_forwards < 40


def test_expected_tokens_per_step():
    assert sp.expected_tokens_per_step(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)  # sum of a^i, i = 0..k
    assert sp.expected_tokens_per_step(1.0, 4) == 5.0 and sp.expected_tokens_per_step(0.0, 4) == 1.0



def test_trained_pair_committed_small_and_accepted_often():
    """The committed pair of kvref.spec_pair: a 1-layer draft of an 8-layer target, greedy output unchanged."""
    from kvref import corpus
    from kvref.bench.speculative import acceptance_needed, predicted_speedup
    from kvref.spec_pair import DRAFT_CKPT, DRAFT_CONFIG, TARGET_CKPT, TARGET_CONFIG, spec_pair

    assert TARGET_CKPT.stat().st_size + DRAFT_CKPT.stat().st_size <= 8 * 2**20  # a few MB in git, no LFS
    target, draft = spec_pair()
    assert target.cfg == TARGET_CONFIG and draft.cfg == DRAFT_CONFIG
    assert draft.cfg.n_layers == 1 < target.cfg.n_layers and draft.cfg.vocab_size == target.cfg.vocab_size
    ids = torch.tensor([list(corpus.document(corpus.HELDOUT_SEED, 0, 128))])  # the benchmark's held-out prompt
    plain = kvref.generate(target, ids, 48).tokens
    got = sp.generate(target, ids, 48, draft=draft, k=1)
    assert torch.equal(got.tokens, plain)
    # the bar; a draft that had not learned the target (chance ~1/30 per byte) fails it by far
    assert got.stats.acceptance_rate >= 0.6
    # the speed-up formula: a = 0.5, k = 2, c = 0.25 gives 1.75 / 1.5; a = 1 gives k + 1 at c = 0
    assert predicted_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5) and predicted_speedup(1.0, 3, 0.0) == 4.0
    assert predicted_speedup(acceptance_needed(1.5, 4, 0.1), 4, 0.1) == pytest.approx(1.5, abs=1e-6)
    assert acceptance_needed(1.5, 1, 0.5) == float("inf")  # k = 1 at c = 0.5: 2 / 1.5 < 1.5 even when a = 1

def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > x): the regularised upper incomplete gamma Q(df/2, x/2)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


@torch.no_grad()
def test_sampling_keeps_the_target_distribution():
    """Vocabulary 4, a target and an unrelated draft; 1000 seeded runs of 3 new tokens with k = 2 (the 2nd
    and 3rd token come out of one verify step: accepted drafts, a resampled token or the bonus). The
    counts of (x2, x3) are compared with the target's exact probabilities (summed over x1) by a
    chi-square test with 15 degrees of freedom. Threshold p = 1e-3: a correct sampler fails one run in
    a thousand, and the seeds are fixed, so the test is deterministic. Power: the same counts against the
    draft's own distribution must be rejected."""
    cfg = tiny_config(vocab_size=4, n_layers=1, d_model=32, n_kv_heads=2)
    target, draft = tiny_model(cfg), tiny_model(cfg, seed=3)
    prompt = torch.tensor([[1, 3, 0, 2]])

    def exact(model):  # p(x2, x3) = sum over x1 of p(x1) p(x2 | x1) p(x3 | x1, x2)
        seqs = torch.cartesian_prod(*[torch.arange(4)] * 3)  # (64, 3)
        p = torch.softmax(model(torch.cat([prompt.expand(64, 4), seqs], dim=1))[:, 3:6].double(), dim=-1)
        joint = p[:, 0].gather(1, seqs[:, :1]) * p[:, 1].gather(1, seqs[:, 1:2]) * p[:, 2].gather(1, seqs[:, 2:3])
        return torch.zeros(16, dtype=torch.float64).index_add_(0, seqs[:, 1] * 4 + seqs[:, 2], joint[:, 0])

    runs = 1000
    counts = torch.zeros(16, dtype=torch.float64)
    accepted = 0
    for seed in range(runs):
        g = sp.generate(target, prompt, 3, draft=draft, k=2, temperature=1.0, seed=seed, cache="dynamic")
        x = g.tokens[0, 5:].tolist()
        counts[x[0] * 4 + x[1]] += 1
        accepted += g.stats.accepted
    p_target, p_draft = exact(target), exact(draft)
    assert (p_target * runs).min() > 5  # chi-square needs expected counts >= 5 per cell
    stat = lambda p: float(((counts - runs * p) ** 2 / (runs * p)).sum())  # noqa: E731
    assert chi2_sf(stat(p_target), 15) > 1e-3
    assert chi2_sf(stat(p_draft), 15) < 1e-3  # the test can tell the two distributions apart
    assert 0 < accepted < 2 * runs  # some drafts accepted, some rejected (both branches sampled)


def test_bad_input():
    cfg = tiny_config(n_kv_heads=2)
    target = tiny_model(cfg)
    with pytest.raises(ValueError, match="k .* must be an integer >= 1"):
        sp.generate(target, PROMPT, 4, draft="ngram", k=0)
    with pytest.raises(ValueError, match="vocabulary"):
        sp.generate(target, PROMPT, 4, draft=tiny_model(tiny_config(vocab_size=128)))
    elsewhere = tiny_model(cfg)  # a stand-in for a draft on a GPU (none here): only its `device` differs
    elsewhere.__class__ = type("OnCuda", (kvref.Transformer,), {"device": property(lambda m: torch.device("cuda", 0))})
    with pytest.raises(ValueError, match="the draft is on cuda:0 but the target is on cpu"):
        sp.generate(target, PROMPT, 4, draft=elsewhere)
    with pytest.raises(ValueError, match="slack >= 3"):
        sp.generate(tiny_model(tiny_config(sliding_window=6)), PROMPT, 4, k=4, cache=kvref.SlidingWindowCache(6))
    with pytest.raises(ValueError, match="one sequence"):
        sp.generate(target, PROMPT.expand(2, -1), 4)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        sp.generate(target, PROMPT, 90, k=4)


transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """A tiny random HF Llama, a noisy copy as its assistant, and kvref's copies of both."""
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=256, max_position_embeddings=128)
    torch.manual_seed(0)
    models = []
    for i, std in enumerate((0.0, 0.01)):  # a 0.01 noise: the copy agrees with the target about half the time
        hf = transformers.LlamaForCausalLM(cfg).eval()
        if i == 0:
            with torch.no_grad():
                for p in hf.parameters():
                    p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
        else:
            hf.load_state_dict(models[0][0].state_dict())
            with torch.no_grad():
                for p in hf.parameters():
                    p.add_(torch.randn_like(p) * std) if p.dim() > 1 else None
        path = tmp_path_factory.mktemp(f"llama{i}")
        hf.save_pretrained(path)
        models.append((hf, kvref.load_hf(path)))
    return models


@torch.no_grad()
def test_hf_assisted_generation_and_prompt_lookup_agree(hf_pair):
    (hf_t, t), (hf_d, d) = hf_pair
    ids = PROMPT
    for m in (hf_t, hf_d):  # no end-of-sequence token: HF would stop at (or, with min_new_tokens, forbid) token 2
        m.generation_config.eos_token_id = None
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, pad_token_id=0)
    want_assisted = hf_t.generate(ids, assistant_model=hf_d, **kw)
    want_lookup = hf_t.generate(ids, prompt_lookup_num_tokens=4, **kw)
    ours = sp.generate(t, ids, N, draft=d, k=4)
    assert torch.equal(ours.tokens, want_assisted) and torch.equal(want_assisted, want_lookup)
    assert torch.equal(sp.generate(t, ids, N, draft="ngram", k=4).tokens, want_lookup)
    assert 0 < ours.stats.accepted < ours.stats.proposed
