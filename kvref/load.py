"""Load and latency: how a serving engine is judged from the outside.

A user sees two numbers: how long until the first token appears (TTFT, time to first token:
queueing + prefill) and how fast the rest stream (TPOT, time per output token after the first;
the gaps one by one are the inter-token latencies, ITL). A server is judged on their tails
(p90, p99: one user in a hundred waits that long or longer), on throughput (output tokens per
second) and on *goodput*: the share of requests that met a service-level objective (SLO),
e.g. TTFT <= 200 ms and TPOT <= 50 ms. Throughput alone rewards piling requests up; goodput does not.

Offered load is modelled the usual way (vLLM's and SGLang's benchmarks do the same): requests
arrive as a Poisson process, independent exponential gaps with mean 1 / rate.

    states = engine.run(requests)
    m = metrics(states, slo={"ttft": 0.2, "tpot": 0.05})
    m["ttft_p99"], m["goodput"]
"""

from __future__ import annotations

import math
import random
from typing import Iterable, Mapping

QUANTILES = (50, 90, 99)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100]; got {q}")
    xs = sorted(values)
    pos = q / 100 * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def check_slo(slo: Mapping[str, float]) -> dict[str, float]:
    """An SLO is {"ttft": seconds, "tpot": seconds}, both given, both finite and >= 0."""
    if not isinstance(slo, Mapping) or set(slo) != {"ttft", "tpot"}:
        got = sorted(slo) if isinstance(slo, Mapping) else type(slo).__name__
        raise ValueError(f"an SLO is a dict with exactly the keys 'ttft' and 'tpot' (seconds); got {got}")
    for k, v in slo.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"SLO {k!r} must be a finite number of seconds >= 0; got {v!r}")
    return dict(slo)


def metrics(states: Mapping | Iterable, slo: Mapping[str, float] | None = None) -> dict[str, float | int | None]:
    """Latency percentiles, throughput and goodput of finished requests (RequestState-like objects).

    Each state needs ``arrival_s`` and ``token_s`` (the time of each output token). Requests that
    asked for no token are left out of everything; a request with one token has no TPOT (it still
    counts for TTFT and goodput). ITL pools the gaps of all requests. Throughput is output tokens
    over the span from the first arrival to the last token. ``goodput``: share of the requests
    within ``slo`` (None without one).
    """
    slo = None if slo is None else check_slo(slo)
    states = list(states.values()) if isinstance(states, Mapping) else list(states)
    served = [s for s in states if s.req.max_new_tokens > 0]
    if not served:
        raise ValueError("metrics needs at least one request that asked for a token")
    missing = [s.req.rid for s in served if not s.token_s or s.arrival_s is None]
    if missing:
        raise ValueError(f"requests {missing} have no output token yet: run the engine to the end first")
    ttft = [s.token_s[0] - s.arrival_s for s in served]
    tpot = [(s.token_s[-1] - s.token_s[0]) / (len(s.token_s) - 1) for s in served if len(s.token_s) > 1]
    itl = [b - a for s in served for a, b in zip(s.token_s, s.token_s[1:])]
    tokens = sum(len(s.token_s) for s in served)
    span = max(s.token_s[-1] for s in served) - min(s.arrival_s for s in served)
    out: dict[str, float | int | None] = {"requests": len(served), "output_tokens": tokens, "duration_s": span,
                                          "throughput_tok_s": tokens / span if span > 0 else math.inf}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for q in QUANTILES:
            out[f"{name}_p{q}"] = percentile(xs, q) if xs else None
    if slo is None:
        out["goodput"] = None
    else:
        ok = [t <= slo["ttft"] and (len(s.token_s) < 2 or (s.token_s[-1] - s.token_s[0]) / (len(s.token_s) - 1)
                                    <= slo["tpot"]) for s, t in zip(served, ttft)]
        out["goodput"] = sum(ok) / len(ok)
    return out


def poisson_arrivals(n: int, rate: float, seed: int = 0, start: int = 0) -> list[int]:
    """Engine steps at which ``n`` requests arrive, ``rate`` requests per step on average (Poisson).

    Gaps are exponential with mean 1 / rate; times are rounded down to whole steps (several
    requests may share a step). Seeded: the same arguments give the same list.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0; got {n!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate must be a finite number of requests per step > 0; got {rate!r}")
    rng, t, out = random.Random(seed), float(start), []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(math.floor(t))
    return out
