"""Latency percentiles, goodput and Poisson arrivals (kvref.load, re-exported by kvref.serve)."""

from __future__ import annotations

import math

import pytest
import torch

import kvref
from kvref.serve import Engine, Request, RequestState, metrics, poisson_arrivals


def state(rid, arrival: float, times: list[float], new: int | None = None) -> RequestState:
    s = RequestState(Request(rid, [1, 2], len(times) if new is None else new))
    s.arrival_s, s.token_s = arrival, list(times)
    return s


@pytest.fixture
def states() -> dict:
    # a: TTFT 1.0, gaps 0.5 and 1.0 (TPOT 0.75); b: TTFT 1.0, one gap 0.5; c: one token after 3.0 s (no TPOT);
    # d asked for nothing and is left out
    return {s.req.rid: s for s in (state("a", 0.0, [1.0, 1.5, 2.5]), state("b", 0.5, [1.5, 2.0]),
                                   state("c", 1.0, [4.0]), state("d", 2.0, [], new=0))}


def test_percentiles_by_hand(states):
    m = metrics(states)
    # TTFT [1, 1, 3]: p50 = 1; p90 sits at rank 0.9 * 2 = 1.8, 80 % of the way from 1 to 3 = 2.6; p99: 2.96
    assert (m["ttft_p50"], m["ttft_p90"], m["ttft_p99"]) == pytest.approx((1.0, 2.6, 2.96))
    # TPOT [0.5, 0.75] (c has one token, no TPOT): ranks 0.5, 0.9, 0.99 between them
    assert (m["tpot_p50"], m["tpot_p90"], m["tpot_p99"]) == pytest.approx((0.625, 0.725, 0.7475))
    # ITL pools every gap: [0.5, 0.5, 1.0]
    assert (m["itl_p50"], m["itl_p90"], m["itl_p99"]) == pytest.approx((0.5, 0.9, 0.99))
    # 6 tokens from the first arrival (0.0) to the last token (4.0)
    assert m["requests"] == 3 and m["output_tokens"] == 6 and m["throughput_tok_s"] == pytest.approx(1.5)
    assert m["goodput"] is None  # no SLO given


def test_goodput_is_the_share_within_the_slo(states):
    # a misses on TPOT (0.75 > 0.6), c on TTFT (3 > 1): only b is good
    assert metrics(states, slo={"ttft": 1.0, "tpot": 0.6})["goodput"] == pytest.approx(1 / 3)
    # c's single token has no TPOT to miss; bounds are inclusive
    assert metrics(states, slo={"ttft": 3.0, "tpot": 0.75})["goodput"] == 1.0
    assert metrics(list(states.values()), slo={"ttft": 0, "tpot": 0})["goodput"] == 0.0


@pytest.mark.parametrize("slo", [{"ttft": -1, "tpot": 1}, {"ttft": 1}, {"ttft": 1, "tpot": None},
                                 {"ttft": float("nan"), "tpot": 1}, {"ttft": 1, "tpot": 1, "e2e": 2}, "fast"])
def test_bad_slo_is_refused(states, slo):
    with pytest.raises(ValueError, match="SLO"):
        metrics(states, slo=slo)


def test_unfinished_or_empty_input_is_refused(states):
    states["e"] = state("e", 1.0, [], new=3)  # asked for 3 tokens, has none yet
    with pytest.raises(ValueError, match=r"\['e'\] have no output token yet"):
        metrics(states)
    with pytest.raises(ValueError, match="at least one request"):
        metrics([state("z", 0.0, [], new=0)])


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate():
    a = poisson_arrivals(4000, rate=0.5, seed=7)
    assert a == poisson_arrivals(4000, rate=0.5, seed=7) and a != poisson_arrivals(4000, rate=0.5, seed=8)
    assert all(x <= y for x, y in zip(a, a[1:])) and a[0] >= 0
    # mean gap 1 / 0.5 = 2 steps; the mean of 4000 exponential gaps has sd 2 / sqrt(4000) = 0.032: 5 sd = 0.16,
    # plus at most 1 / 4000 from rounding the last time down
    assert abs(a[-1] / 4000 - 2) < 0.16 + 1 / 4000
    for bad in (0, -1, float("inf"), True):
        with pytest.raises(ValueError, match="rate must be"):
            poisson_arrivals(3, rate=bad)


def test_metrics_of_a_real_run_and_nothing_half_admitted():
    torch.manual_seed(0)
    model = kvref.Transformer(kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256,
                                                max_seq_len=64)).eval()
    ticks = iter(range(10_000))
    eng = Engine(model, num_blocks=6, block_size=4, token_budget=8, clock=lambda: float(next(ticks)))
    with pytest.raises(ValueError, match="whole pool has 6"):  # 30 tokens to store > 24 slots
        eng.add(Request("long", list(range(20)), 11))
    assert not eng.states and not eng.pending and eng.cache.pool.num_free == 6  # nothing half-admitted
    states = eng.run([Request(i, [i + 1] * 3, 4, arrival=i) for i in range(3)])
    m = metrics(states)
    assert m["output_tokens"] == 12 and m["requests"] == 3
    # the clock only moves forward, so every latency is positive and TTFT >= one tick
    assert m["ttft_p50"] >= 1 and m["tpot_p50"] > 0 and math.isfinite(m["throughput_tok_s"])


def test_an_engine_that_cannot_progress_says_so():
    torch.manual_seed(0)
    model = kvref.Transformer(kvref.ModelConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256,
                                                max_seq_len=64)).eval()

    def leaky_finish(engine, s):  # takes the request off the running list but never frees its blocks
        engine.running.remove(s)

    eng = Engine(model, num_blocks=4, block_size=4, token_budget=8, finish=leaky_finish)
    # each request holds 2 blocks: after two, the 4 blocks are leaked and the third can never be admitted
    with pytest.raises(RuntimeError, match="stalled at step .* 0 running, 1 waiting and 0 of 4 blocks free"):
        eng.run([Request(i, [i + 1] * 5, 2) for i in range(3)])
