"""Serving engines with planted faults, and the instrumentation that gives them away.

The troubleshooting lab. Each engine here is kvref's continuous-batching ``Engine`` (serve.py)
with one thing done wrong, the kind of bug or setting behind the three symptoms a deployment
shows: a slow first token, a decode that slows down, running out of memory.

``TracedEngine`` records what a serving dashboard would show. Per step: K/V rows computed,
blocks held, free blocks (and the longest run of adjacent free ones), KV bytes and an estimate
of the step's activation peak. Per request: the K/V rows computed for each output token and
the time each token came out.

    trace = run_traced(RecomputeEngine, model, lab_requests())
    trace.requests["r0"].rows_per_token   # [prompt_len, 1, 1, ...] when healthy

``FAULTS`` maps each fault's name to its engine, ``FIX_FOR`` each fault to the fix that cures it.
"""

from __future__ import annotations

import copy
import random
import time
import weakref
from dataclasses import dataclass, field
from itertools import groupby
from typing import Hashable

import torch

from .chunked import activation_estimate
from .config import ModelConfig
from .memory import kv_cache_bytes
from .model import Transformer
from .paged import PagedKVCache
from .serve import Engine, Request, RequestState, StepStats

BLOCK_SIZE, NUM_BLOCKS, TOKEN_BUDGET = 8, 48, 32  # the lab's deployment (every engine gets the same)


@dataclass
class RequestTrace:
    prompt_len: int
    new_tokens: int
    cached_tokens: int  # prompt tokens the prefix cache supplied
    arrival_s: float
    token_s: list[float]  # time each output token came out
    rows_per_token: list[int]  # K/V rows computed for this request to produce each output token

    @property
    def ttft_s(self) -> float:
        return self.token_s[0] - self.arrival_s


@dataclass
class Trace:
    """One engine's run: step columns (one entry per engine step) and per-request records."""

    block_size: int
    num_blocks: int
    token_budget: int  # the deployment's setting, tokens per step (the same for every engine of the lab)
    bytes_per_block: int
    step_rows: list[int] = field(default_factory=list)  # K/V rows computed in the step (model.kv_rows; padding too)
    step_tokens: list[int] = field(default_factory=list)  # tokens fed in the step (a healthy engine: <= token_budget)
    blocks_used: list[int] = field(default_factory=list)  # after the step
    free_blocks: list[int] = field(default_factory=list)
    largest_free_run: list[int] = field(default_factory=list)  # most adjacent free blocks
    head_need: list[int] = field(default_factory=list)  # blocks the first waiting request needs (0: none waits)
    waiting: list[int] = field(default_factory=list)
    kv_bytes: list[int] = field(default_factory=list)  # blocks_used * bytes_per_block
    act_bytes: list[int] = field(default_factory=list)  # largest temporary of the step's forwards (estimate)
    requests: dict[Hashable, RequestTrace] = field(default_factory=dict)


def largest_free_run(refs: list[int]) -> int:
    """Longest run of adjacent free blocks (reference count 0)."""
    return max((len(list(run)) for free, run in groupby(r == 0 for r in refs) if free), default=0)


class TracedEngine(Engine):
    """The healthy engine: prefix caching on, at most ``token_budget`` tokens per step (chunked prefill)."""

    fault = "none"
    cache_class: type[PagedKVCache] = PagedKVCache

    def __init__(self, model: Transformer, num_blocks: int = NUM_BLOCKS, block_size: int = BLOCK_SIZE,
                 token_budget: int = TOKEN_BUDGET, prefix_caching: bool = True, **kw) -> None:
        kw.setdefault("clock", time.process_time)  # this process's CPU time: a busy machine disturbs it less
        super().__init__(model, num_blocks, block_size, token_budget, prefix_caching=prefix_caching, **kw)
        if self.cache_class is not PagedKVCache:
            self.cache = self.cache_class(model.cfg, num_blocks, block_size, dtype=model.dtype,
                                          device=model.device, prefix_caching=prefix_caching)
        self.trace = Trace(block_size, num_blocks, self.budget, kv_cache_bytes(model.cfg, 1, block_size, model.dtype))
        self._rows: dict[Hashable, int] = {}  # rows computed for a request since its last output token
        self._act = 0

    def add(self, req: Request) -> None:
        super().add(req)
        self._rows[req.rid] = 0

    def step(self) -> StepStats:
        rows_before, self._act = self.model.kv_rows, 0
        stats = super().step()
        t, pool = self.trace, self.cache.pool
        head = self.waiting[0] if self.waiting else None
        t.step_rows.append(self.model.kv_rows - rows_before)
        t.step_tokens.append(stats.tokens)
        t.blocks_used.append(pool.num_used)
        t.free_blocks.append(pool.num_free)
        t.largest_free_run.append(largest_free_run(pool.refs))
        total = 0 if head is None else len(head.req.prompt) + head.req.max_new_tokens - 1  # slots it fills
        t.head_need.append(-(-total // pool.block_size))
        t.waiting.append(len(self.waiting))
        t.kv_bytes.append(pool.num_used * t.bytes_per_block)
        t.act_bytes.append(self._act)
        return stats

    def _forward(self, rows: list[tuple[RequestState, int]]) -> None:
        past = max(self.cache.seqs[s.req.rid].length for s, _ in rows)
        act = activation_estimate(self.model.cfg, len(rows), max(n for _, n in rows), past, self.model.dtype)
        self._act = max(self._act, act["largest"])
        before = {s.req.rid: len(s.output) for s, _ in rows}
        super()._forward(rows)
        for s, n in rows:
            self._rows[s.req.rid] += n
            if len(s.output) > before[s.req.rid]:  # a token came out: it cost the rows counted so far
                self.trace.requests[s.req.rid].rows_per_token.append(self._rows[s.req.rid])
                self._rows[s.req.rid] = 0

    def _schedule(self) -> tuple[list[tuple[RequestState, int]], int]:
        plan, preempted = super()._schedule()
        for s, _ in plan:  # first admission: open the request's record
            if s.req.rid not in self.trace.requests:
                self.trace.requests[s.req.rid] = RequestTrace(len(s.req.prompt), s.req.max_new_tokens,
                                                              s.cached_tokens, s.arrival_s, s.token_s, [])
        return plan, preempted

    def run_traced(self, requests: list[Request], max_steps: int = 2000) -> Trace:
        """Serve ``requests`` to the end and return the trace; a server that stalls raises RuntimeError."""
        for r in requests:
            self.add(r)
        while self.pending or self.waiting or self.running:
            if len(self.trace.step_rows) >= max_steps:
                raise RuntimeError(f"{type(self).__name__} stalled: {len(self.waiting)} requests still waiting "
                                   f"after {max_steps} steps")
            if not (self.waiting or self.running):  # idle: jump to the next arrival
                self.step_no = max(self.step_no, min(s.req.arrival for s in self.pending))
            self.step()
        return self.trace


class RecomputeEngine(TracedEngine):
    """Drops each request's cache after every token it produces, so the next step prefills the
    prompt and every token so far again: the cache is filled but never reused."""

    fault = "recompute_every_step"

    def _forward(self, rows: list[tuple[RequestState, int]]) -> None:
        before = [len(s.output) for s, _ in rows]
        super()._forward(rows)
        for (s, _), n_out in zip(rows, before):
            if len(s.output) > n_out and any(r is s for r in self.running):  # made a token, not finished
                self.cache.free_sequence(s.req.rid)  # the bug: throw the K/V away ...
                self.cache.add_sequence(s.req.rid)
                s.computed = 0  # ... so all len(tokens) rows are computed again next step


class NoPrefixCacheEngine(TracedEngine):
    """Started without prefix caching: every request prefills the shared system prompt again."""

    fault = "shared_prefix_not_cached"

    def __init__(self, model: Transformer, **kw) -> None:
        super().__init__(model, **{**kw, "prefix_caching": False})


class LeakyCache(PagedKVCache):
    """``free_sequence`` with an off-by-one: the sequence's last block is never given back."""

    def free_sequence(self, seq_id: Hashable) -> None:
        seq = self.seqs.pop(seq_id)
        for b in reversed(seq.table[:-1]):  # the bug: should be seq.table
            self.pool.free(b)


class LeakyEngine(TracedEngine):
    fault = "blocks_not_freed"
    cache_class = LeakyCache


class ContiguousCache(PagedKVCache):
    """One run of adjacent blocks per sequence, reserved at admission for its whole length (first
    fit), like a contiguous allocator. A request that finds no run long enough cannot start, even
    when the free blocks together would hold it."""

    sizes: dict[Hashable, int]  # tokens each sequence will fill by its end (set by the engine)

    def add_sequence(self, seq_id: Hashable, prompt: list[int] | None = None) -> int:
        cached = super().add_sequence(seq_id, prompt)
        need, pool = -(-self.sizes[seq_id] // self.block_size), self.pool
        for start in range(pool.num_blocks - need + 1):  # first fit
            run = range(start, start + need)
            if all(pool.refs[b] == 0 for b in run):
                for b in run:
                    pool.free_list.remove(b)
                    pool.refs[b] = 1
                self.seqs[seq_id].table = list(run)
                break
        return cached

    def blocks_needed(self, seq_id: Hashable, n_new: int) -> int:
        if self.seqs[seq_id].table:
            return 0  # everything was reserved at admission
        return self.pool.num_blocks + 1  # no run long enough: it cannot start now


class ContiguousEngine(TracedEngine):
    fault = "contiguous_fragmentation"
    cache_class = ContiguousCache

    def __init__(self, model: Transformer, **kw) -> None:
        super().__init__(model, **{**kw, "prefix_caching": False})  # a contiguous allocator shares nothing
        self.cache.sizes = {}

    def add(self, req: Request) -> None:
        super().add(req)
        self.cache.sizes[req.rid] = len(req.prompt) + req.max_new_tokens - 1


class WholePromptEngine(TracedEngine):
    """No token budget to speak of: a long prompt goes through the model in one forward."""

    fault = "whole_prompt_prefill"

    def __init__(self, model: Transformer, **kw) -> None:
        budget = kw.pop("token_budget", TOKEN_BUDGET)  # the deployment's setting, which this engine ignores
        super().__init__(model, token_budget=model.cfg.max_seq_len * 8, **kw)
        self.trace.token_budget = budget  # the trace shows the setting, not the bug: only step_tokens do


FAULTS: dict[str, type[TracedEngine]] = {e.fault: e for e in (
    RecomputeEngine, NoPrefixCacheEngine, LeakyEngine, ContiguousEngine, WholePromptEngine)}
FIX_FOR = dict(zip(FAULTS, ["reuse_cache", "prefix_caching", "free_finished", "paged_allocation",
                           "chunked_prefill"]))  # in the order of FAULTS
# The fixes a student picks from: the right ones and settings that would not cure these faults.
FIXES = sorted([*FIX_FOR.values(), "quantize_kv", "smaller_max_context", "gqa_model", "bigger_gpu"])


def lab_model(seed: int = 0) -> Transformer:
    """A tiny seeded Llama-style model (fp32, 2 layers, d_model 64, 256 positions)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(arch="llama", n_layers=2, n_heads=4, d_model=64, vocab_size=256, max_seq_len=256)
    return Transformer(cfg).eval()


def lab_requests(seed: int = 0, jitter: bool = False) -> list[Request]:
    """Chat requests sharing a 32-token system prompt, arriving a few steps apart, and one long document.

    ``jitter=True``: another day's traffic of the same kind (each question a few tokens longer or
    shorter, each answer too, arrivals up to 2 steps later), drawn from ``seed``."""
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(32)]
    user = lambda n: [rng.randrange(256) for _ in range(n)]  # noqa: E731
    shapes = [(8, 24, 0), (20, 40, 0), (12, 8, 4), (6, 32, 8), (30, 16, 12), (10, 24, 16), (16, 40, 20)]
    if jitter:
        shapes = [(u + rng.randint(-3, 3), new + rng.randint(-4, 4), at + rng.randint(0, 2) if at else 0)
                  for u, new, at in shapes]
    reqs = [Request(f"r{i}", system + user(u), new, arrival=at) for i, (u, new, at) in enumerate(shapes)]
    reqs.append(Request("doc", user(150), 8, arrival=10))  # a long document to summarize
    return reqs


def solo_request(seed: int = 0, prompt: int = 16, new: int = 96) -> Request:
    """One request alone with a long answer: its per-token latency curve is easy to read."""
    rng = random.Random(seed + 1)
    return Request("solo", [rng.randrange(256) for _ in range(prompt)], new)


def run_traced(engine: type[TracedEngine], model: Transformer, requests: list[Request], **kw) -> Trace:
    """Run ``requests`` through a fresh engine of class ``engine``; return its trace."""
    return engine(model, **kw).run_traced(requests)


@dataclass
class Observations:
    """What we see of one engine: the shared workload (``serve``) and one long request alone (``solo``)."""

    serve: Trace
    solo: Trace


# The solo run is the same for every workload: one request, the same steps, only the clock's readings differ. So
# each engine class runs it once per model (the lab observes every engine on several days' traffic), and every
# Observations gets its own copy. Weak keys: a model that is gone takes its runs with it.
_solo_runs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(engine, weights): Trace}


def _weights_key(model: Transformer) -> tuple[float, float]:
    """A fingerprint of the weights: a model changed in place is not the model the runs were made with."""
    with torch.no_grad():
        flat = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    return float(flat.sum()), float(flat.abs().sum())


def solo_trace(engine: type[TracedEngine], model: Transformer) -> Trace:
    """``run_traced(engine, model, [solo_request()])``, run once per model (and its weights) and engine class;
    a copy each call."""
    runs = _solo_runs.setdefault(model, {})
    key = (engine, _weights_key(model))
    if key not in runs:
        runs[key] = run_traced(engine, model, [solo_request()])
    return copy.deepcopy(runs[key])


def observe(engine: type[TracedEngine], model: Transformer, requests: list[Request] | None = None) -> Observations:
    """Run ``engine`` on the lab workload (or ``requests``) and, separately, on the solo request (``solo_trace``)."""
    return Observations(run_traced(engine, model, requests or lab_requests()), solo_trace(engine, model))


def _shuffled(seed: int) -> list[type[TracedEngine]]:
    engines = list(FAULTS.values())
    random.Random(seed).shuffle(engines)
    return engines


def mystery_lab(seed: int, model: Transformer | None = None,
                requests: list[Request] | None = None) -> dict[str, Observations]:
    """The faulty engines, observed, under shuffled names engine_A, engine_B, ... (same workload:
    ``lab_requests()`` unless ``requests`` is given). Nothing in an Observations names its fault."""
    model = model or lab_model()
    return {f"engine_{'ABCDEFGH'[i]}": observe(e, model, requests) for i, e in enumerate(_shuffled(seed))}


def answer_key(seed: int) -> dict[str, str]:
    """{engine name: its fault} of ``mystery_lab(seed)``; the lab's hidden tests use it."""
    return {f"engine_{'ABCDEFGH'[i]}": e.fault for i, e in enumerate(_shuffled(seed))}
