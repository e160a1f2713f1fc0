"""What the Engine schedules: the per-step record (``StepStats.fed``) and static batching.

The book's scheduling timeline (chapter 02) is drawn from these records, so they must say exactly
what each forward was fed; static batching is the baseline that continuous batching improves on.
"""

from __future__ import annotations

import random

import pytest
import torch

import kvref
from kvref.serve import Engine, Request


@pytest.fixture(scope="module")
def model() -> kvref.Transformer:
    cfg = kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256, max_seq_len=64)
    torch.manual_seed(0)
    return kvref.Transformer(cfg).eval()


def alone(model, prompt: list[int], n: int) -> list[int]:
    return kvref.generate(model, torch.tensor([prompt]), n, cache="dynamic").tokens[0, len(prompt):].tolist()


def mixed_trace(seed: int = 0) -> list[Request]:
    """Six requests, all there at step 0, with output lengths from 2 to 14 tokens: in a static batch
    the short ones finish early and their places stay empty until the longest one is done."""
    rng = random.Random(seed)
    new = [2, 14, 3, 12, 4, 6]
    return [Request(i, [rng.randrange(256) for _ in range(rng.randint(3, 12))], n) for i, n in enumerate(new)]


def joined_a_running_batch(eng: Engine) -> bool:
    """Did any request get its first tokens while a request admitted at an earlier step was still unfinished?"""
    first: dict = {}
    for st in eng.steps:
        for f in st.fed:
            first.setdefault(f.rid, st.step)
    states = eng.states
    return any(first[a] < first[b] and states[a].finish_step >= first[b] for a in first for b in first)


def test_fed_records_every_token_and_its_phase(model):
    reqs = mixed_trace()
    eng = Engine(model, num_blocks=64, block_size=4, token_budget=8)  # budget 8: prompts go in chunks
    states = eng.run(reqs)
    for st in eng.steps:
        assert sum(f.tokens for f in st.fed) == st.tokens  # the record covers the step's whole work
        assert len({f.rid for f in st.fed}) == len(st.fed)  # at most one entry per request and step
    for r in reqs:
        mine = [f for st in eng.steps for f in st.fed if f.rid == r.rid]
        prefill = [f.tokens for f in mine if f.phase == "prefill"]
        decode = [f.tokens for f in mine if f.phase == "decode"]
        # no preemption here (the pool holds everything): the prompt is fed once, in chunks of at most
        # the budget, then every new token but the last is fed back alone
        assert sum(prefill) == len(r.prompt) and max(prefill) <= 8
        assert decode == [1] * (r.max_new_tokens - 1)
        assert [f.phase for f in mine] == ["prefill"] * len(prefill) + ["decode"] * len(decode)  # in this order
        assert states[r.rid].output == alone(model, r.prompt, r.max_new_tokens)
    assert max(len(r.prompt) for r in reqs) > 8  # at least one prompt really was chunked


def test_recompute_after_preemption_is_recorded_as_prefill(model):
    rng = random.Random(1)
    reqs = [Request(i, [rng.randrange(256) for _ in range(8)], 20) for i in range(4)]
    eng = Engine(model, num_blocks=12, block_size=4, token_budget=16)  # 48 slots for 4 x 27: preemption
    states = eng.run(reqs)
    assert sum(st.preempted for st in eng.steps) > 0
    for r in reqs:
        mine = [f for st in eng.steps for f in st.fed if f.rid == r.rid]
        fed_prefill = sum(f.tokens for f in mine if f.phase == "prefill")
        # each preemption throws the request's K/V away: its prompt and output so far are prefilled again
        assert (fed_prefill > len(r.prompt)) == (states[r.rid].preemptions > 0)
        assert states[r.rid].output == alone(model, r.prompt, r.max_new_tokens)


def test_static_batching_admits_only_between_batches(model):
    reqs = mixed_trace()
    runs = {}
    for batching in ("static", "continuous"):
        eng = Engine(model, num_blocks=64, block_size=4, token_budget=64, max_running=3, batching=batching)
        states = eng.run(mixed_trace())
        for r in reqs:
            assert states[r.rid].output == alone(model, r.prompt, r.max_new_tokens)
        assert max(st.running for st in eng.steps) <= 3
        runs[batching] = eng
    assert not joined_a_running_batch(runs["static"])
    assert joined_a_running_batch(runs["continuous"])  # the same trace: the check can fail
    # Static: batch {0, 1, 2} runs 14 steps (request 1 makes 14 tokens), then {3, 4, 5} runs 12.
    # Continuous refills each place the step after it frees up, so it needs fewer steps.
    assert len(runs["static"].steps) == 14 + 12
    assert len(runs["continuous"].steps) < len(runs["static"].steps)


def test_bad_batching_mode(model):
    with pytest.raises(ValueError, match=r"batching must be one of \('continuous', 'static'\); got 'dynamic'"):
        Engine(model, num_blocks=8, batching="dynamic")
