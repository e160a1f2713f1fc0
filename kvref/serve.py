"""A continuous-batching engine on the paged cache: how a server keeps a GPU busy.

Static batching waits for a whole batch to finish before starting the next one. Continuous
batching (Orca, vLLM) decides again at *every step* which requests run:

1. Running requests go first, oldest first: one token each if decoding, or the next chunk of
   their prompt (chunked prefill). All of it must fit in the step's ``token_budget``.
2. If a request's next tokens need a block and none is free, the *newest* running request is
   preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
   later (its prompt and what it has generated so far are simply prefilled again).
3. Waiting requests are admitted in arrival order while budget lasts and the blocks for their
   whole prompt are free, plus a small watermark (1 % of the pool) left for running requests to
   grow into: admitting on the first chunk alone would admit too many and preempt them later.
4. Finished requests free their blocks at once, so the next step can admit someone new.

A request's state is just ``tokens = prompt + output`` and ``computed`` (tokens whose K/V are
cached): it needs ``len(tokens) - computed`` more tokens fed, more than one while it prefills, one
while it decodes. Decodes and prefill chunks run as two forwards per step (one of width 1, one
left-padded to the longest chunk) so decode rows are not padded to prefill width.

``Engine(..., batching="static")`` is the baseline that continuous batching replaced: a new batch
(up to ``max_running`` requests) is admitted only when every request of the running one has finished.
Every step records what it scheduled: ``StepStats.fed`` lists (request, tokens fed, phase).

The policy is two plain functions, ``default_schedule(engine)`` (rules 1-3: returns the step's plan
and how many requests it preempted) and ``default_finish(engine, state)`` (rule 4); pass your own
with ``Engine(..., schedule=..., finish=...)``. ``prefix_caching`` is ``False``, ``True`` or
``"hash"`` (vLLM's chain of block hashes, kvref.prefix) or ``"radix"`` (SGLang's radix tree,
kvref.radix; ``page_size``, a divisor of the block size, sets how finely its matches are cut).
Models with sliding-window, latent or mixed layers get one block table per group of layers
(kvref.paged_hybrid). ``metrics(states, slo)`` and ``poisson_arrivals`` (kvref.load) judge a run.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterable, NamedTuple

import torch

from .load import metrics, poisson_arrivals  # noqa: F401  (importable from here: kvref.serve.metrics)
from .model import Transformer
from .paged import PagedKVCache
from .paged_hybrid import PagedHybridCache, needs_groups
from .radix import RadixCachingPool


@dataclass
class Request:
    rid: Hashable
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0  # engine step at which the request shows up


@dataclass
class RequestState:
    req: Request
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose K/V are in the cache
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at (first) admission
    preemptions: int = 0
    arrival_s: float | None = None  # wall time the request entered the queue
    token_s: list[float] = field(default_factory=list)  # wall time each output token was produced
    first_token_step: int | None = None
    finish_step: int | None = None

    @property
    def tokens(self) -> list[int]:
        return self.req.prompt + self.output

    @property
    def done(self) -> bool:
        return len(self.output) >= self.req.max_new_tokens

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: queueing + prefill + the first sampled token."""
        return self.token_s[0] - self.arrival_s if self.token_s else None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        n = len(self.token_s)
        return (self.token_s[-1] - self.token_s[0]) / (n - 1) if n > 1 else None


class Fed(NamedTuple):
    """What one request was fed in one step."""

    rid: Hashable
    tokens: int
    phase: str  # "decode": its newest output token, alone; "prefill": a chunk of prompt (+ output, on recompute)


BATCHING = ("continuous", "static")
PREFIX_CACHING = (False, True, "hash", "radix")  # True is "hash": vLLM's chain of block hashes (kvref.prefix)


@dataclass
class StepStats:
    step: int
    prefill_tokens: int
    decode_tokens: int
    running: int  # requests holding blocks after the step
    waiting: int
    blocks_used: int
    slots_used: int  # slots holding a token (the rest of blocks_used * block_size is reserved, unused)
    preempted: int
    time_s: float
    fed: list[Fed] = field(default_factory=list)  # in the order the scheduler planned them

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


class Engine:
    """Serve many requests at once on one model and one PagedKVCache (greedy decoding).

    ``clock`` times latencies: wall time by default; ``time.process_time`` counts only this
    process's CPU time, which a busy shared machine disturbs far less (use it with 1 thread).
    ``batching="static"`` admits waiting requests only while nothing runs (see the module docstring).
    """

    def __init__(self, model: Transformer, num_blocks: int, block_size: int = 16, token_budget: int = 256,
                 max_running: int | None = None, prefix_caching: bool | str = False,
                 clock: Callable[[], float] = time.perf_counter, batching: str = "continuous",
                 schedule: Callable[[Engine], tuple[list[tuple[RequestState, int]], int]] | None = None,
                 finish: Callable[[Engine, RequestState], None] | None = None, page_size: int | None = None) -> None:
        if token_budget < 1 or (max_running is not None and max_running < 1):
            raise ValueError(f"token_budget and max_running must be >= 1; got {token_budget}, {max_running}")
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}; got {batching!r}")
        if not any(prefix_caching is m or (isinstance(m, str) and prefix_caching == m) for m in PREFIX_CACHING):
            raise ValueError(f"prefix_caching must be one of {PREFIX_CACHING} (True is the hash chain); "
                             f"got {prefix_caching!r}")
        if page_size is not None and prefix_caching != "radix":
            raise ValueError(f"page_size sets the radix tree's page: it needs prefix_caching='radix'; got "
                             f"prefix_caching={prefix_caching!r}, page_size={page_size!r}")
        self.model, self.budget, self.max_running, self.clock = model, token_budget, max_running, clock
        self.batching, self.prefix_caching = batching, prefix_caching
        self.schedule_fn, self.finish_fn = schedule or default_schedule, finish or default_finish
        if needs_groups(model.cfg):  # sliding, latent or mixed layers: one block table per group of layers
            if page_size not in (None, block_size):
                raise ValueError(f"page_size={page_size!r}: on a model with per-layer kinds the radix trees share "
                                 f"whole blocks only; leave page_size unset or equal to block_size={block_size}")
            self.cache = PagedHybridCache(model.cfg, num_blocks, block_size, dtype=model.dtype, device=model.device,
                                          prefix_caching=prefix_caching)
        else:
            self.cache = PagedKVCache(model.cfg, num_blocks, block_size, dtype=model.dtype, device=model.device,
                                      prefix_caching=prefix_caching in (True, "hash"))
            if prefix_caching == "radix":  # the cache only talks to its pool: swap in the tree-backed one
                self.cache.pool = RadixCachingPool(num_blocks, block_size, page_size)
        self.states: dict[Hashable, RequestState] = {}
        self.pending: list[RequestState] = []  # not arrived yet
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []  # admission order: the last one is preempted first
        self.steps: list[StepStats] = []
        self.step_no = 0
        self.watermark = num_blocks // 100  # blocks admission leaves free for running requests to grow into

    def add(self, req: Request) -> None:
        """Queue a request. Zero new tokens: it is finished at once with an empty output."""
        cfg, pool = self.model.cfg, self.cache.pool
        if req.rid in self.states:
            raise ValueError(f"request id {req.rid!r} is already in use")
        if not req.prompt or not all(isinstance(t, int) and 0 <= t < cfg.vocab_size for t in req.prompt):
            raise ValueError(f"request {req.rid!r}: the prompt must be a non-empty list of ids in [0, {cfg.vocab_size})")
        if not isinstance(req.max_new_tokens, int) or req.max_new_tokens < 0:
            raise ValueError(f"request {req.rid!r}: max_new_tokens must be an integer >= 0; got {req.max_new_tokens!r}")
        total = len(req.prompt) + req.max_new_tokens
        if total > cfg.max_seq_len:
            raise ValueError(f"request {req.rid!r}: prompt ({len(req.prompt)}) + max_new_tokens ({req.max_new_tokens}) "
                             f"= {total} exceeds max_seq_len={cfg.max_seq_len}")
        if isinstance(self.cache, PagedHybridCache):  # a block table per group of layers
            blocks = self.cache.max_blocks(total - 1)
        else:  # the last new token is never fed back, so never stored
            blocks = -(-(total - 1) // pool.block_size)
        if blocks > pool.num_blocks:
            raise ValueError(f"request {req.rid!r} needs up to {blocks} blocks of {pool.block_size} tokens but the "
                             f"whole pool has {pool.num_blocks}: it could never run; shorten it or grow the pool")
        state = self.states[req.rid] = RequestState(req)
        if req.max_new_tokens == 0:
            state.finish_step = self.step_no
        else:
            self.pending.append(state)

    def run(self, requests: Iterable[Request] = ()) -> dict[Hashable, RequestState]:
        """Add ``requests`` and step until every request has finished."""
        for r in requests:
            self.add(r)
        while self.pending or self.waiting or self.running:
            if not (self.waiting or self.running):  # idle: jump the clock to the next arrival
                self.step_no = max(self.step_no, min(s.req.arrival for s in self.pending))
            if not self.step().fed:  # nothing ran, so the next step would decide the same: it never ends
                raise RuntimeError(f"the engine stalled at step {self.step_no - 1}: nothing was scheduled with "
                                   f"{len(self.running)} running, {len(self.waiting)} waiting and "
                                   f"{self.cache.pool.num_free} of {self.cache.pool.num_blocks} blocks free "
                                   f"(are finished requests' blocks freed?)")
        return self.states

    # -- one step ---------------------------------------------------------------------------------
    def step(self) -> StepStats:
        t0 = self.clock()
        for s in sorted((s for s in self.pending if s.req.arrival <= self.step_no), key=lambda s: s.req.arrival):
            self.pending.remove(s)
            s.arrival_s = t0
            self.waiting.append(s)
        plan, preempted = self._schedule()
        fed = [Fed(s.req.rid, n, "decode" if n == 1 and s.output and s.computed == len(s.tokens) - 1 else "prefill")
               for s, n in plan]  # before the forwards move s.computed on
        decodes, prefills = [p for p in plan if p[1] == 1], [p for p in plan if p[1] > 1]
        batches = [decodes, prefills]  # decodes, then prefills
        if getattr(self.cache, "windowed", False):  # a window mask counts slot distances: no ragged rows there
            batches = [decodes] + [[p for p in prefills if p[1] == n] for n in sorted({n for _, n in prefills})]
        for rows in batches:
            if rows:
                self._forward(rows)
        stats = StepStats(
            step=self.step_no, prefill_tokens=sum(n for _, n in plan if n > 1),
            decode_tokens=sum(n for _, n in plan if n == 1), running=len(self.running), waiting=len(self.waiting),
            blocks_used=self.cache.pool.num_used, slots_used=self.cache.tokens_stored(), preempted=preempted,
            time_s=self.clock() - t0, fed=fed)
        self.steps.append(stats)
        self.step_no += 1
        return stats

    def _schedule(self) -> tuple[list[tuple[RequestState, int]], int]:
        """Pick (request, tokens to feed) pairs for this step: the ``schedule`` function decides."""
        return self.schedule_fn(self)

    def free(self, s: RequestState) -> None:
        """Give back the blocks of ``s`` (with a radix tree: let go of its path first)."""
        if isinstance(self.cache.pool, RadixCachingPool):
            self.cache.pool.unlock_sequence(self.cache.seqs[s.req.rid].hashes)
        self.cache.free_sequence(s.req.rid)

    def _preempt(self, s: RequestState) -> None:
        preempt(self, s)

    @torch.inference_mode()
    def _forward(self, rows: list[tuple[RequestState, int]]) -> None:
        """One forward for these rows, left-padded to the widest; then sample, finish and free."""
        T, dev = max(n for _, n in rows), self.model.device
        ids = torch.zeros(len(rows), T, dtype=torch.long, device=dev)
        mask = torch.zeros(len(rows), T, dtype=torch.bool, device=dev)
        chunks = []
        for b, (s, n) in enumerate(rows):
            chunks.append(s.tokens[s.computed:s.computed + n])
            ids[b, T - n:] = torch.tensor(chunks[-1], device=dev)
            mask[b, T - n:] = True
        self.cache.begin([s.req.rid for s, _ in rows], [n for _, n in rows], chunks)
        logits = self.model(ids, cache=self.cache, attention_mask=None if bool(mask.all()) else mask,
                            last_only=True)[:, -1]  # (B, V)
        nxt = logits.argmax(dim=-1).tolist()
        now = self.clock()
        for b, (s, n) in enumerate(rows):
            s.computed += n
            if s.computed < len(s.tokens):
                continue  # mid-prefill: these logits are not needed
            s.output.append(nxt[b])
            s.token_s.append(now)
            if s.first_token_step is None:
                s.first_token_step = self.step_no
            if s.done:
                s.finish_step = self.step_no
                self.finish_fn(self, s)


# -- the scheduler: what Engine calls every step (swap in your own with Engine(..., schedule=, finish=)) --
def default_schedule(engine: Engine) -> tuple[list[tuple[RequestState, int]], int]:
    """Pick (request, tokens to feed) pairs within the token budget and the free blocks.

    Running requests first, oldest first (decodes and prefill chunks alike), preempting the newest
    when blocks run out; then waiting requests in arrival order while the budget lasts and their
    whole prompt fits with the watermark to spare. Returns the plan and how many were preempted.
    """
    cache, plan, budget, claimed, preempted = engine.cache, [], engine.budget, 0, 0
    i = 0
    while i < len(engine.running) and budget > 0:
        s = engine.running[i]
        n = min(len(s.tokens) - s.computed, budget)
        need = cache.blocks_needed(s.req.rid, n)
        while need > cache.pool.num_free - claimed and engine.running[-1] is not s:
            preempt(engine, engine.running[-1])  # newest first: it has done the least work
            preempted += 1
        if need > cache.pool.num_free - claimed:  # s itself is the newest: it waits
            preempt(engine, s)
            preempted += 1
            break
        plan.append((s, n))
        claimed, budget, i = claimed + need, budget - n, i + 1
    admit = engine.batching == "continuous" or not engine.running  # static: only between batches
    while admit and engine.waiting and budget > 0 and len(engine.running) < (engine.max_running or 1 << 30):
        s = engine.waiting[0]
        cached = cache.add_sequence(s.req.rid, s.tokens)  # with prefix caching: takes cached blocks
        n = min(len(s.tokens) - cached, budget)
        need = cache.blocks_needed(s.req.rid, n)
        whole = cache.blocks_needed(s.req.rid, len(s.tokens) - cached) + (engine.watermark if engine.running else 0)
        if whole > cache.pool.num_free - claimed:
            engine.free(s)  # not now: keep arrival order, try again next step
            break
        engine.waiting.popleft()
        if s.preemptions == 0:  # count the prefix cache's help once, not again on recompute
            s.cached_tokens = cached
        s.computed = cached
        engine.running.append(s)
        plan.append((s, n))
        claimed, budget = claimed + need, budget - n
    return plan, preempted


def preempt(engine: Engine, s: RequestState) -> None:
    """Take ``s`` off the running list: free its blocks, recompute it from scratch when readmitted."""
    engine.free(s)
    engine.running.remove(s)
    s.computed = 0  # prompt + output so far are prefilled again
    s.preemptions += 1
    engine.waiting.appendleft(s)


def default_finish(engine: Engine, s: RequestState) -> None:
    """``s`` produced its last token: free its blocks now, so the next step can admit someone."""
    engine.free(s)
    engine.running.remove(s)
