"""kvref.dist: tensor parallelism and disaggregated prefill/decode across real gloo processes.

2 processes everywhere, 4 where K/V heads must be replicated (W > H_kv). Every collective has a timeout
(the launcher's process group), so a failing test fails in seconds instead of hanging.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import kvref
from kvref.dist import (PeerFailed, TPConfigError, TransferMismatch, launch, run_disaggregated, run_tp)
from kvref.dist.transfer import from_wire, install, pack, to_wire
from kvref.planner import per_rank_kv_bytes

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=256,
             max_position_embeddings=64)


def _save(path, hf) -> str:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():  # wider than init, so greedy tokens vary and a wrong split changes them
            p.normal_(0, 0.2) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    hf.eval().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny HF Llama with H=4 query heads and H_kv=2 K/V heads, and the HF model itself."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **SMALL))
    return _save(tmp_path_factory.mktemp("llama"), hf), hf


@pytest.fixture(scope="module")
def llama_mqa(tmp_path_factory):
    """The same widths with one K/V head: its cache does not fit the H_kv=2 model's."""
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=1, **SMALL))
    return _save(tmp_path_factory.mktemp("mqa"), hf)


IDS = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(3))
NEW = 5


def _hf_tokens(hf, ids, new=NEW) -> list[list[int]]:
    with torch.no_grad():
        return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                           pad_token_id=0).tolist()  # an explicit mask: token 0 in a prompt is not padding


# -- tensor parallelism -------------------------------------------------------------------------------
def test_tp_two_ranks_split_the_kv_heads(llama):
    path, hf = llama
    expected = _hf_tokens(hf, IDS)
    single = kvref.generate(kvref.load_hf(path), IDS, NEW).tokens.tolist()
    out = run_tp(path, IDS, NEW, world_size=2)
    assert out.tokens == expected == single
    assert out.kv_heads_per_rank == [[0], [1]]  # H_kv = 2 over 2 ranks: one head each, none shared
    cfg = kvref.load_hf(path).cfg
    whole = kvref.kv_cache_bytes(cfg, 1, IDS.shape[1] + NEW, torch.float32)  # the single process's cache
    assert out.cache_bytes_per_rank == [whole // 2] * 2
    assert out.cache_bytes_per_rank[0] == per_rank_kv_bytes(cfg, 2, 1, IDS.shape[1] + NEW, torch.float32)


def test_tp_four_ranks_replicate_kv_heads(llama):
    """W = 4 > H_kv = 2: each rank keeps the one K/V head its query head reads, so two ranks hold each head
    and the cache per rank is no smaller than at W = 2."""
    path, hf = llama
    out = run_tp(path, IDS, 3, world_size=4)
    assert out.tokens == _hf_tokens(hf, IDS, 3)
    assert out.kv_heads_per_rank == [[0], [0], [1], [1]]  # query head h reads K/V head h // (H / H_kv)
    cfg = kvref.load_hf(path).cfg
    S = IDS.shape[1] + 3
    one_head = cfg.n_layers * 2 * S * cfg.head_dim * 4  # K and V of one head, every layer, fp32
    assert out.cache_bytes_per_rank == [one_head] * 4
    assert per_rank_kv_bytes(cfg, 4, 1, S, torch.float32) == one_head == per_rank_kv_bytes(cfg, 2, 1, S, torch.float32)


def test_tp_gpt2_biases_added_once(tmp_path):
    """GPT-2 has biases on the row-parallel projections: added after the all-reduce, not once per rank."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256,
                                                              n_positions=64, bos_token_id=0, eos_token_id=0))
    path = _save(tmp_path / "gpt2", hf)
    assert run_tp(path, IDS, 3, world_size=2).tokens == _hf_tokens(hf, IDS, 3)


def test_tp_world_size_that_cannot_split_is_refused_before_starting(llama):
    path, _ = llama
    with pytest.raises(TPConfigError, match=r"world_size 3 .*allowed: \[1, 2, 4\]"):
        run_tp(path, IDS, 2, world_size=3)


def test_bad_requests_are_refused_before_any_process_starts(llama):
    path, _ = llama
    with pytest.raises(ValueError, match=r"token id 300 is outside the vocabulary \[0, 255\]"):
        run_tp(path, torch.tensor([[1, 300]]), 2, world_size=2)
    with pytest.raises(ValueError, match="exceeds max_seq_len = 64"):
        run_disaggregated(path, IDS, 64 - IDS.shape[1] + 1)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        run_disaggregated(path, IDS, 0)


def test_tp_under_torchrun(llama):
    path, hf = llama
    ids = ",".join(str(t) for t in IDS[0].tolist())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(_free_port()), "-m", "kvref.dist.tp", "--model", path, "--ids", ids, "--new", "3"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("tokens"))
    assert line == f"tokens {_hf_tokens(hf, IDS, 3)[0]}"


# -- the launcher: no hang ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dies(rank: int, world: int) -> None:
    if rank == 1:
        os._exit(3)  # killed without a word, as an OOM kill would
    dist.all_reduce(torch.ones(1))


def _sleeps(rank: int, world: int) -> None:
    if rank == 1:
        time.sleep(20)
    dist.all_reduce(torch.ones(1))


def test_dead_peer_is_reported_not_waited_for():
    t0 = time.monotonic()
    with pytest.raises(PeerFailed, match="rank 1 of 2 died with exit code 3"):
        launch(_dies, 2, timeout_s=30)
    assert time.monotonic() - t0 < 15  # well under the 30 s collective timeout: the parent saw the death


def test_collective_timeout_gives_an_error():
    t0 = time.monotonic()
    with pytest.raises(PeerFailed, match="rank 0 of 2 failed"):
        launch(_sleeps, 2, timeout_s=2)
    assert time.monotonic() - t0 < 15  # rank 1 sleeps 20 s: the 2 s timeout ended the run first


def test_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ValueError, match=f"port {s.getsockname()[1]} .* is in use"):
            launch(_dies, 2, port=s.getsockname()[1])


# -- disaggregated prefill / decode -------------------------------------------------------------------
@pytest.mark.parametrize("connector", ["gloo", "file"])
def test_disaggregated_tokens_and_bytes(llama, connector):
    path, hf = llama
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(5))
    out = run_disaggregated(path, ids, NEW, connector=connector)
    assert out.tokens == _hf_tokens(hf, ids)
    cfg = kvref.load_hf(path).cfg
    kv = kvref.kv_cache_bytes(cfg, 2, 7, torch.float32)  # the prompt's cache, no new tokens
    assert out.bytes_sent == kv + 8 * (10 + 2 * 2)  # ten int64 header fields, next_pos and first token per row


def test_disaggregated_mismatch_is_refused(llama, llama_mqa):
    path, _ = llama
    with pytest.raises(PeerFailed, match=r"TransferMismatch.*n_kv_heads: message 2 vs model 1"):
        run_disaggregated(path, IDS, 3, decode_model_dir=llama_mqa)


def _prefilled(model, ids, mask=None):
    cache = kvref.DynamicCache()
    with torch.no_grad():
        first = model(ids, cache=cache, attention_mask=mask)[:, -1].argmax(-1)
    return cache, first


def test_message_round_trip_keeps_left_padding_positions(llama):
    """Row 0 is left-padded by 3: its positions (next_pos) must survive the trip, or decode rotates its
    keys by the wrong RoPE angle and the tokens differ from one process's."""
    model = kvref.load_hf(llama[0])
    ids = torch.randint(1, 256, (2, 8), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0
    expected = kvref.generate(model, ids, 4, attention_mask=mask).tokens[:, 8:]
    cache, first = _prefilled(model, ids, mask)
    msg = from_wire(*to_wire(pack(cache, first)))
    assert msg.next_pos.tolist() == [5, 8]
    fresh = kvref.DynamicCache()
    install(msg, model.cfg, model.dtype, fresh, 4)
    toks, nxt = [msg.first_token], msg.first_token
    with torch.no_grad():
        for _ in range(3):
            nxt = model(nxt[:, None], cache=fresh)[:, -1].argmax(-1)
            toks.append(nxt)
    assert torch.equal(torch.stack(toks, 1), expected)


def test_mismatched_message_leaves_the_cache_empty(llama):
    model = kvref.load_hf(llama[0])
    cache, first = _prefilled(model, IDS)
    msg = pack(cache, first)
    fresh = kvref.DynamicCache()
    with pytest.raises(TransferMismatch, match="dtype: message torch.float32 vs model torch.bfloat16"):
        install(msg, model.cfg, torch.bfloat16, fresh)
    lost = from_wire(*to_wire(msg))
    lost.next_pos = torch.zeros_like(lost.next_pos)  # positions lost on the way
    with pytest.raises(TransferMismatch, match="positions"):
        install(lost, model.cfg, model.dtype, fresh)
    with pytest.raises(TransferMismatch, match="max_seq_len"):
        install(msg, model.cfg, model.dtype, fresh, max_new_tokens=model.cfg.max_seq_len)
    assert fresh.length == 0 and fresh.k == [] and fresh.next_pos is None  # nothing partial stored
    header, rows, payload = to_wire(msg)
    with pytest.raises(TransferMismatch, match="cut short"):
        from_wire(header, rows, payload[:-4])


# -- the planner under TP -----------------------------------------------------------------------------
def test_planner_per_rank_bytes_replication_and_mla():
    llama3 = kvref.ModelConfig.preset("llama-3-8b")  # 32 layers, H = 32, H_kv = 8, D = 128
    S, b = 1000, 2
    per_head = 32 * 2 * S * 128 * b  # K and V of one head over all layers, bf16
    assert [per_rank_kv_bytes(llama3, w, 1, S, torch.bfloat16) for w in (1, 2, 8, 16, 32)] == [
        8 * per_head, 4 * per_head, per_head, per_head, per_head]  # stops shrinking at W = H_kv = 8
    ds = kvref.ModelConfig.preset("deepseek-v3")  # 61 MLA layers, r = 512, d_R = 64
    whole = 61 * S * (512 + 64) * b
    assert [per_rank_kv_bytes(ds, w, 1, S, torch.bfloat16) for w in (1, 8, 16)] == [whole] * 3
    odd = kvref.ModelConfig(arch="llama", n_layers=2, n_heads=12, n_kv_heads=4, d_model=768, vocab_size=256)
    with pytest.raises(ValueError, match="must divide H_kv=4 or be a multiple"):
        per_rank_kv_bytes(odd, 6, 1, S)  # 6 divides H = 12 but neither divides nor is a multiple of 4


# -- the host tier under the prefix cache -------------------------------------------------------------
@torch.inference_mode()
def test_host_tier_brings_evicted_prefix_blocks_back(tmp_path):
    from kvref.dist.tier import add_host_tier
    from kvref.paged import PagedKVCache

    cfg = kvref.ModelConfig(arch="llama", n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=256,
                            max_seq_len=96)
    torch.manual_seed(0)
    model = kvref.Transformer(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    talk = torch.randint(0, 256, (26,), generator=gen).tolist()  # 6 full blocks of 4 before its last token
    others = [torch.randint(0, 256, (33,), generator=gen).tolist() for _ in range(2)]

    def serve(cache, sid, prompt):
        cached = cache.add_sequence(sid, prompt)
        cache.begin([sid], [len(prompt) - cached], [prompt[cached:]])
        logits = model(torch.tensor([prompt[cached:]]), cache=cache)[0]
        cache.free_sequence(sid)
        return cached, logits

    def history(cache):
        serve(cache, "talk", talk)
        for i, p in enumerate(others):  # 9 blocks each: the pool of 12 must evict every block of the talk
            serve(cache, f"other{i}", p)
        return serve(cache, "back", talk + [5, 6, 7])

    plain = PagedKVCache(cfg, num_blocks=12, block_size=4, prefix_caching=True)
    assert history(plain)[0] == 0  # evicted and gone: the returning talk is recomputed
    tiered = PagedKVCache(cfg, num_blocks=12, block_size=4, prefix_caching=True)
    pool = add_host_tier(tiered, capacity_blocks=64)
    cached, logits = history(tiered)
    assert cached == 24 and pool.tier_hits == 6  # all six full blocks of the talk came back from the tier
    assert pool.offloads >= 6
    ref = model(torch.tensor([talk + [5, 6, 7]]))[0, 24:]  # no cache at all
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)  # fp32: the restored K/V are the same numbers
    with pytest.raises(ValueError, match="empty cache"):
        add_host_tier(tiered, capacity_blocks=4)
    # A host tier of 2 blocks over a disk tier: the talk's blocks come back from both, the same numbers.
    two = PagedKVCache(cfg, num_blocks=12, block_size=4, prefix_caching=True)
    small = add_host_tier(two, capacity_blocks=2, disk_dir=tmp_path / "disk")
    cached, logits = history(two)
    assert cached == 24 and small.disk_hits >= 1 and small.tier_hits == 6  # tier_hits counts both tiers
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
    assert len(small.tier) <= 2 and len(list((tmp_path / "disk").iterdir())) == len(small.on_disk)
