"""``python -m kvref.bench speculative``: when does a draft pay off? (chapter 12)

1. the trained tiny model (``kvref.tiny_model()``) as the target, drafted by its own first two layers (an early
   exit, LayerSkip-style: no extra training) and by prompt lookup, on held-out prose: acceptance rate, tokens per
   target forward (measured, and (1 - a^(k+1)) / (1 - a) from the measured a), tokens/s against plain decoding,
   k = 1..8; every run's tokens are checked equal to plain greedy decoding;
2. prompt lookup on a repetitive text (the corpus's repeat documents), k = 1..8;
3. the verify step's cost: one forward of k + 1 tokens against one of 1 token, on the trained model and on a
   GPT-2-124M-shaped one (random weights), which says what a draft may cost;
4. kvref against Hugging Face transformers on the same weights (a tiny random Llama and a noisy copy of it):
   assisted generation (``assistant_model=``) and prompt lookup (``prompt_lookup_num_tokens=``), same tokens,
   tokens/s;
5. the trained pair (``kvref.spec_pair()``): an 8-layer target and a 1-layer draft distilled from it, on held-out
   prose: the cost of a draft step against a target step (c), then the section-1 table with the speed-up
   (1 - a^(k+1)) / ((1 - a)(k c + 1)) predicts and the acceptance that speed-up formula needs for 1.5x.

1 thread, interleaved repeats, medians (min-max in brackets where it matters).
"""

from __future__ import annotations

import argparse
import time

import torch

from .. import corpus
from ..config import ModelConfig
from ..generate import generate
from ..model import Transformer
from ..speculative import expected_tokens_per_step
from ..speculative import generate as spec_generate
from .timing import interleave, med, table


def early_exit(target: Transformer, n_layers: int) -> Transformer:
    """A draft made of the target's first ``n_layers`` blocks, its final norm and its head (weights shared by value)."""
    draft = Transformer(target.cfg.with_(n_layers=n_layers)).eval()
    state = {k: v for k, v in target.state_dict().items()
             if not k.startswith("blocks.") or int(k.split(".")[1]) < n_layers}
    draft.load_state_dict(state, strict=False)
    return draft


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def predicted_speedup(a: float, k: int, c: float) -> float:
    """Tokens per verify step over its cost in target steps, k draft steps of cost c plus one verify of cost 1
    (Leviathan et al., 2023, https://arxiv.org/abs/2211.17192, the walltime improvement:
    (1 - a^(k+1)) / ((1 - a)(k c + 1)))."""
    return expected_tokens_per_step(a, k) / (k * c + 1)


def acceptance_needed(speedup: float, k: int, c: float) -> float:
    """The smallest a with predicted_speedup(a, k, c) >= speedup (bisection; > 1 when even a = 1 is not enough)."""
    if predicted_speedup(1.0, k, c) < speedup:
        return float("inf")
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_speedup(mid, k, c) < speedup else (lo, mid)
    return hi


@torch.inference_mode()
def sweep(target: Transformer, draft, ids: torch.Tensor, n_new: int, ks, repeats: int,
          cost: float | None = None) -> list[list[str]]:
    """One row per k: acceptance, tokens per verify step (measured, expected), tokens/s and the speed-up;
    given ``cost`` (a draft step / a target step), also the predicted speed-up and the a that 1.5x needs."""
    plain = generate(target, ids, n_new).tokens
    rows = []
    for k in ks:
        g = spec_generate(target, ids, n_new, draft=draft, k=k)
        if not torch.equal(g.tokens, plain):
            raise AssertionError(f"k={k}: speculative tokens differ from plain greedy decoding")
        times = interleave({"plain": lambda: _timed(lambda: generate(target, ids, n_new)),
                            "spec": lambda: _timed(lambda: spec_generate(target, ids, n_new, draft=draft, k=k))},
                           repeats)
        ratios = [p / s for p, s in zip(times["plain"], times["spec"])]
        a = g.stats.acceptance_rate
        rows.append([str(k), f"{a:.2f}", f"{g.stats.tokens_per_forward:.2f}", f"{expected_tokens_per_step(a, k):.2f}",
                     f"{n_new / med(times['plain']):.0f}", f"{n_new / med(times['spec']):.0f}",
                     f"{med(times['plain']) / med(times['spec']):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"])
        if cost is not None:
            need = acceptance_needed(1.5, k, cost)
            rows[-1] += [f"{predicted_speedup(a, k, cost):.2f}x", "> 1" if need > 1 else f"{need:.2f}"]
    return rows


@torch.inference_mode()
def step_cost(target: Transformer, draft: Transformer, ids: torch.Tensor, n_new: int, repeats: int) -> tuple:
    """Seconds per token of plain greedy decoding, target and draft (medians), interleaved."""
    times = interleave({"t": lambda: _timed(lambda: generate(target, ids, n_new)),
                        "d": lambda: _timed(lambda: generate(draft, ids, n_new))}, repeats)
    return med(times["t"]) / n_new, med(times["d"]) / n_new


def pair_section(n: int, ks, repeats: int) -> list[str]:
    """Section 5: the trained pair."""
    from ..spec_pair import spec_pair

    target, draft = spec_pair()
    prose = torch.tensor([list(corpus.document(corpus.HELDOUT_SEED, 0, 128))])  # 128 + n + k within 256 positions
    t_s, d_s = step_cost(target, draft, prose, n, repeats * 2)
    c = d_s / t_s
    rows = sweep(target, draft, prose, n, ks, repeats, cost=c)
    best = max(rows, key=lambda r: float(r[6].split("x")[0]))
    size = lambda m: f"{m.cfg.n_layers} layer{'s' * (m.cfg.n_layers > 1)}, d_model {m.cfg.d_model}, " \
        f"{sum(p.numel() for p in m.parameters()) / 1e6:.2f} M parameters"
    return [f"\n## 5. Trained pair (kvref.spec_pair): target {size(target)}; draft {size(draft)}, distilled from the "
            "target's greedy outputs; held-out prose, prompt 128 bytes\n",
            f"Plain greedy decoding: target {1e3 * t_s:.2f} ms/token, draft {1e3 * d_s:.2f} ms/token: "
            f"a draft step costs c = {c:.3f} target steps\n",
            table(HEADER + ["predicted (1 - a^(k+1)) / ((1 - a)(k c + 1))", "a needed for 1.5x"], rows),
            f"\nBest k: {best[0]} ({best[6]})"]


HEADER = ["k", "acceptance a", "tokens / verify step", "(1 - a^(k+1)) / (1 - a)", "plain tok/s", "speculative tok/s",
          "speed-up"]


@torch.inference_mode()
def verify_cost(model: Transformer, prompt_len: int, ks, repeats: int) -> list[str]:
    """Seconds of one cached forward of k + 1 tokens, relative to one of 1 token, after a prompt."""
    from ..cache import DynamicCache

    ids = torch.randint(0, model.cfg.vocab_size, (1, prompt_len + 9), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache()
    model(ids[:, :prompt_len], cache=cache)

    def step(n: int) -> float:
        t = _timed(lambda: model(ids[:, prompt_len:prompt_len + n], cache=cache))
        cache.crop(prompt_len)
        return t

    times = interleave({n: (lambda n=n: step(n)) for n in [1] + [k + 1 for k in ks]}, repeats)
    return [f"{med(times[k + 1]) / med(times[1]):.2f}x" for k in ks] + [f"{1e3 * med(times[1]):.2f} ms"]


def hf_section(n_new: int, repeats: int) -> list[str]:
    import logging
    import tempfile

    import transformers

    from ..hf import load_hf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=256, max_position_embeddings=256)
    torch.manual_seed(0)
    hf_t, hf_d = transformers.LlamaForCausalLM(cfg).eval(), transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf_t.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
        hf_d.load_state_dict(hf_t.state_dict())
        for p in hf_d.parameters():
            if p.dim() > 1:
                p.add_(torch.randn_like(p) * 0.01)  # a draft that agrees about half the time
    with tempfile.TemporaryDirectory() as d:
        hf_t.save_pretrained(f"{d}/t")
        hf_d.save_pretrained(f"{d}/d")
        kv_t, kv_d = load_hf(f"{d}/t"), load_hf(f"{d}/d")
    rep = torch.tensor([list(corpus.repeat_document(corpus.HELDOUT_SEED, 1, 64))])
    rnd = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    for m in (hf_t, hf_d):  # no end-of-sequence token: HF would otherwise stop at (or, told min_new_tokens,
        m.generation_config.eos_token_id = None  # forbid) token 2, which kvref's greedy decoding may well choose
    kw = dict(max_new_tokens=n_new, do_sample=False, pad_token_id=0)
    cases = {
        "assisted (draft model, k = 4)": (rnd, dict(assistant_model=hf_d), dict(draft=kv_d, k=4)),
        "prompt lookup (k = 4), repetitive prompt": (rep, dict(prompt_lookup_num_tokens=4), dict(draft="ngram", k=4)),
    }
    rows = []
    with torch.inference_mode():
        for name, (ids, hf_kw, kv_kw) in cases.items():
            mask = torch.ones_like(ids)
            if name.startswith("assisted"):  # HF adapts the assistant's number of tokens unless told not to
                hf_d.generation_config.num_assistant_tokens = 4
                hf_d.generation_config.num_assistant_tokens_schedule = "constant"
            want = hf_t.generate(ids, attention_mask=mask, **hf_kw, **kw)
            got = spec_generate(kv_t, ids, n_new, **kv_kw)
            plain = hf_t.generate(ids, attention_mask=mask, **kw)
            same = torch.equal(got.tokens, want) and torch.equal(want, plain)
            times = interleave({"hf": lambda: _timed(lambda: hf_t.generate(ids, attention_mask=mask, **hf_kw, **kw)),
                                "kvref": lambda: _timed(lambda: spec_generate(kv_t, ids, n_new, **kv_kw))}, repeats)
            rows.append([name, "yes" if same else "**no**", f"{got.stats.acceptance_rate:.2f}",
                         f"{n_new / med(times['hf']):.0f}", f"{n_new / med(times['kvref']):.0f}",
                         f"{med(times['hf']) / med(times['kvref']):.2f}x"])
    return [table(["case", "same tokens (kvref, HF, HF plain greedy)", "kvref acceptance", "HF tok/s", "kvref tok/s",
                   "kvref / HF speed"], rows)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench speculative", description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ks", type=str, default="1,2,3,4,5,6,8")
    ap.add_argument("--sections", type=str, default="12345", help="which sections to run, e.g. 4")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ks = [int(x) for x in a.ks.split(",")]
    from ..train import tiny_model

    target = tiny_model()
    prose = torch.tensor([list(corpus.document(corpus.HELDOUT_SEED, 0, 200))])
    rep = torch.tensor([list(corpus.repeat_document(corpus.HELDOUT_SEED, 0, 200))])
    n = a.new_tokens
    out = [f"# Speculative decoding, {n} new tokens, 1 thread, {a.repeats} interleaved repeats\n"]
    if "1" in a.sections:
        out += [f"## 1. Trained tiny model ({sum(p.numel() for p in target.parameters()) / 1e6:.2f} M parameters, "
                "4 layers), held-out prose, prompt 200 bytes\n", "Draft: the target's first 2 layers (early exit)\n",
                table(HEADER, sweep(target, early_exit(target, 2), prose, n, ks, a.repeats)),
                "\nDraft: prompt lookup (n-gram, no model)\n", table(HEADER, sweep(target, "ngram", prose, n, ks, a.repeats))]
    if "2" in a.sections:
        out += ["\n## 2. Prompt lookup on a repetitive text (prompt 200 bytes)\n",
                table(HEADER, sweep(target, "ngram", rep, n, ks, a.repeats))]
    if "3" in a.sections:
        out.append("\n## 3. What a verify step costs: one forward of k + 1 tokens / one forward of 1 token "
                   "(cached, after 200)\n")
        gpt2 = Transformer(ModelConfig.preset("gpt2")).eval()
        rows = [["trained tiny (0.8 M)"] + verify_cost(target, 200, ks, a.repeats * 10),
                ["GPT-2-124M shape (random)"] + verify_cost(gpt2, 200, ks, a.repeats * 10)]
        out.append(table(["model"] + [f"k = {k}" for k in ks] + ["1 token"], rows))
    if "4" in a.sections:
        out += ["\n## 4. kvref against HF transformers, same weights (tiny random Llama), "
                f"{n} new tokens\n"] + hf_section(n, a.repeats)
    if "5" in a.sections:
        out += pair_section(n, ks, a.repeats)
    print("\n".join(out))


if __name__ == "__main__":
    main()
