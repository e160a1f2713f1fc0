"""Disaggregated prefill and decode: one process computes the prompt's cache, another continues from it.

    out = run_disaggregated("path/to/hf_model", input_ids, max_new_tokens=16)     # connector="gloo" or "file"
    out.tokens, out.bytes_sent                 # bytes_sent == kv_bytes + header_bytes

The prefill process runs the prompt once, picks the first new token, packs the cache into a message and
ships it through a *connector*; the decode process unpacks it into an empty cache, checks it fits its own
model, and decodes the rest. What travels (``pack``):

    header  int64[10]     magic, version, L, B, H_kv, S, D, dtype code, payload bytes, 0
    rows    int64[2 B]    per row: the position its next token gets (next_pos), the first new token
    payload uint8[...]    every layer's K then V, each (B, H_kv, S, D), in the cache's dtype

so the message is the prompt's ``kv_cache_bytes`` plus ``header_bytes(B) = 8 * (10 + 2 B)``. Rows are
left-padded as everywhere in kvref: row b's first S - next_pos[b] slots are padding, so next_pos alone
restores the padding mask. A message whose shapes, dtype or positions do not fit the receiver raises
TransferMismatch before the receiver's cache is touched.

Two connectors share one interface: GlooConnector (torch.distributed send/recv: what NCCL or a
NIXL-style transport does across machines) and FileConnector (a safetensors file: a disk or shared
file system between the two).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..cache import DynamicCache
from ..config import ModelConfig
from .launch import DEFAULT_TIMEOUT_S, launch

MAGIC, VERSION, N_HEADER = 0x4B5643, 1, 10  # "KVC"
DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DTYPE_OF = {code: dt for dt, code in DTYPES.items()}


class TransferMismatch(ValueError):
    """A KV message that does not fit the receiving model (shapes, dtype, positions, or a broken header)."""


def header_bytes(batch: int) -> int:
    """Bytes a message carries besides K/V: the int64 header and, per row, next_pos and the first token."""
    return 8 * (N_HEADER + 2 * batch)


@dataclass
class KVMessage:
    k: list[torch.Tensor]  # per layer (B, H_kv, S, D)
    v: list[torch.Tensor]  # per layer (B, H_kv, S, D)
    next_pos: torch.Tensor  # (B,) long: position of each row's next token (= real tokens held)
    first_token: torch.Tensor  # (B,) long: the token the prefill picked

    @property
    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def nbytes(self) -> int:
        return self.kv_bytes + header_bytes(self.next_pos.shape[0])


def pack(cache: DynamicCache, first_token: torch.Tensor) -> KVMessage:
    """The message for a filled DynamicCache (B rows of S slots) and the first new token of each row."""
    if not cache.k or cache.length == 0:
        raise ValueError("the cache is empty: run the prompt through the model first")
    return KVMessage(k=[t.contiguous() for t in cache.k], v=[t.contiguous() for t in cache.v],
                     next_pos=cache.next_pos.clone(), first_token=first_token.to(torch.long).reshape(-1).clone())


def to_wire(msg: KVMessage) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(header, rows, payload): the three flat tensors a connector moves."""
    k0 = msg.k[0]
    B, H_kv, S, D = k0.shape
    if k0.dtype not in DTYPES:
        raise ValueError(f"cache dtype {k0.dtype} cannot be shipped; one of {list(DTYPES)}")
    payload = torch.cat([t.reshape(-1).view(torch.uint8) for t in msg.k + msg.v])
    header = torch.tensor([MAGIC, VERSION, len(msg.k), B, H_kv, S, D, DTYPES[k0.dtype], payload.numel(), 0])
    rows = torch.cat([msg.next_pos.to(torch.long), msg.first_token.to(torch.long)])  # (2 B,)
    return header, rows, payload


def check_header(header: torch.Tensor) -> tuple[int, ...]:
    """(L, B, H_kv, S, D, dtype code, payload bytes) of a well-formed header, else TransferMismatch."""
    h = [int(x) for x in header.tolist()]
    if len(h) != N_HEADER or h[0] != MAGIC or h[1] != VERSION:
        raise TransferMismatch(f"not a kvref KV message (magic {h[0] if h else None:#x}, version "
                               f"{h[1] if len(h) > 1 else None}); expected magic {MAGIC:#x}, version {VERSION}")
    L, B, H_kv, S, D, code, n = h[2:9]
    if code not in DTYPE_OF or min(L, B, H_kv, S, D) < 1:
        raise TransferMismatch(f"broken header {h[2:9]} (L, B, H_kv, S, D, dtype code, payload bytes)")
    expected = 2 * L * B * H_kv * S * D * DTYPE_OF[code].itemsize
    if n != expected:
        raise TransferMismatch(f"header says {n} payload bytes but L, B, H_kv, S, D and the dtype make {expected}")
    return L, B, H_kv, S, D, code, n


def from_wire(header: torch.Tensor, rows: torch.Tensor, payload: torch.Tensor) -> KVMessage:
    """The inverse of to_wire (checks the header and the payload's length, not the receiver's model)."""
    L, B, H_kv, S, D, code, n = check_header(header)
    if rows.numel() != 2 * B or payload.numel() != n:
        raise TransferMismatch(f"message cut short: {rows.numel()} row numbers (expected {2 * B}) and "
                               f"{payload.numel()} payload bytes (expected {n})")
    dt, per = DTYPE_OF[code], B * H_kv * S * D * DTYPE_OF[code].itemsize
    parts = [payload[i * per:(i + 1) * per].view(dt).view(B, H_kv, S, D) for i in range(2 * L)]
    return KVMessage(k=parts[:L], v=parts[L:], next_pos=rows[:B].clone(), first_token=rows[B:].clone())


def check_fits(msg: KVMessage, cfg: ModelConfig, dtype: torch.dtype, max_new_tokens: int = 1) -> None:
    """Raise TransferMismatch unless the message fits a model of shape ``cfg`` in ``dtype`` and leaves
    room for ``max_new_tokens`` more tokens."""
    B, H_kv, S, D = msg.k[0].shape
    got = {"n_layers": len(msg.k), "n_kv_heads": H_kv, "head_dim": D, "dtype": msg.k[0].dtype}
    want = {"n_layers": cfg.n_layers, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "dtype": dtype}
    bad = [f"{k}: message {got[k]} vs model {want[k]}" for k in got if got[k] != want[k]]
    if any(tuple(t.shape) != (B, H_kv, S, D) for t in msg.k + msg.v):
        bad.append("layers of different shapes")
    pos = msg.next_pos
    if pos.shape != (B,) or bool((pos < 1).any()) or bool((pos > S).any()):
        bad.append(f"positions {pos.tolist()} (each row's next position must be in [1, S={S}])")
    if S + max_new_tokens > cfg.max_seq_len:
        bad.append(f"S={S} + {max_new_tokens} new tokens exceeds max_seq_len={cfg.max_seq_len}")
    if bad:
        raise TransferMismatch("the KV message does not fit this model: " + "; ".join(bad) + ". Nothing was stored.")


def install(msg: KVMessage, cfg: ModelConfig, dtype: torch.dtype, cache: DynamicCache,
            max_new_tokens: int = 1) -> None:
    """Fill the empty ``cache`` from ``msg`` (after check_fits: on any mismatch the cache stays empty)."""
    if not isinstance(cache, DynamicCache) or cache.length:
        raise ValueError("install needs an empty DynamicCache (reset() it first)")
    check_fits(msg, cfg, dtype, max_new_tokens)
    B, _, S, _ = msg.k[0].shape
    cache.k, cache.v = [t.clone() for t in msg.k], [t.clone() for t in msg.v]
    slot = torch.arange(S)[None, :]  # (1, S)
    real = slot >= (S - msg.next_pos)[:, None]  # (B, S): left padding first, then the real tokens
    cache.real, cache.next_pos, cache.padded = real, msg.next_pos.clone(), not bool(real.all())
    cache.length = cache.seen = S
    cache.spec = (cfg.n_layers, B, cfg.n_kv_heads, cfg.head_dim, dtype, msg.k[0].device.type)


# -- connectors ------------------------------------------------------------------------------------
class Connector:
    """Moves one KVMessage from the prefill process to the decode process."""

    def send(self, msg: KVMessage) -> int:
        """Ship ``msg``; return the bytes sent (header + rows + payload)."""
        raise NotImplementedError

    def recv(self) -> KVMessage:
        raise NotImplementedError


class GlooConnector(Connector):
    """torch.distributed send/recv between two ranks of one group (gloo here, NCCL on GPUs): the header
    first (the receiver learns the sizes), then the rows, then the payload. Waits at most the group's
    timeout."""

    def __init__(self, peer: int) -> None:
        self.peer = peer

    def send(self, msg: KVMessage) -> int:
        parts = to_wire(msg)
        for t in parts:
            dist.send(t, dst=self.peer)
        return sum(t.numel() * t.element_size() for t in parts)

    def recv(self) -> KVMessage:
        header = torch.zeros(N_HEADER, dtype=torch.long)
        dist.recv(header, src=self.peer)
        L, B, H_kv, S, D, code, n = check_header(header)
        rows, payload = torch.zeros(2 * B, dtype=torch.long), torch.empty(n, dtype=torch.uint8)
        dist.recv(rows, src=self.peer)
        dist.recv(payload, src=self.peer)
        return from_wire(header, rows, payload)


class FileConnector(Connector):
    """A safetensors file (written under a temporary name, then renamed, so a reader never sees half a
    message); ``recv`` polls for it for at most ``timeout_s``."""

    def __init__(self, path: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.path, self.timeout_s = Path(path), timeout_s

    def send(self, msg: KVMessage) -> int:
        from safetensors.torch import save_file

        header, rows, payload = to_wire(msg)
        tmp = self.path.with_suffix(".tmp")
        save_file({"header": header, "rows": rows, "payload": payload}, str(tmp))
        os.replace(tmp, self.path)
        return sum(t.numel() * t.element_size() for t in (header, rows, payload))

    def recv(self) -> KVMessage:
        from safetensors.torch import load_file

        deadline = time.monotonic() + self.timeout_s
        while not self.path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no KV message at {self.path} after {self.timeout_s} s")
            time.sleep(0.01)
        t = load_file(str(self.path))
        return from_wire(t["header"], t["rows"], t["payload"])


def _connector(kind: str, rank: int, path: str | None, timeout_s: float) -> Connector:
    return GlooConnector(peer=1 - rank) if kind == "gloo" else FileConnector(path, timeout_s)


# -- the two processes -----------------------------------------------------------------------------
@dataclass
class DisaggResult:
    tokens: list[list[int]]  # (B, T + N): the prompt, the prefill's first token, the decode's tokens
    bytes_sent: int  # what the connector moved: kv_bytes + header_bytes
    kv_bytes: int  # the prompt's K/V (== kvref.kv_cache_bytes(cfg, B, T, dtype))
    header_bytes: int
    prefill_s: float  # the prompt's forward pass in the prefill process
    transfer_s: float  # from both sides ready to the message unpacked in the decode process


def disagg_worker(rank: int, world_size: int, model_dirs: tuple[str, str], ids: list[list[int]],
                  max_new_tokens: int, connector: str, path: str | None, timeout_s: float) -> dict:
    """Rank 0 prefills and sends; rank 1 receives, installs and decodes."""
    from ..generate import decode_one_token, prefill
    from ..hf import load_hf

    torch.set_num_threads(1)
    model = load_hf(model_dirs[rank], layout="out_in")
    conn = _connector(connector, rank, path, timeout_s)
    input_ids = torch.tensor(ids, dtype=torch.long)
    with torch.inference_mode():
        if rank == 0:
            cache = DynamicCache()
            t0 = time.perf_counter()
            first = prefill(model, input_ids, cache).argmax(dim=-1)  # (B,)
            prefill_s = time.perf_counter() - t0
            msg = pack(cache, first)
            dist.barrier()  # both sides ready: the transfer time starts here
            sent = conn.send(msg)
            return {"bytes_sent": sent, "kv_bytes": msg.kv_bytes, "prefill_s": prefill_s}
        dist.barrier()
        t0 = time.perf_counter()
        msg = conn.recv()
        cache = DynamicCache()
        install(msg, model.cfg, model.dtype, cache, max_new_tokens)
        transfer_s = time.perf_counter() - t0
        nxt, out = msg.first_token, [input_ids, msg.first_token[:, None]]
        for _ in range(max_new_tokens - 1):
            nxt = decode_one_token(model, nxt, cache).argmax(dim=-1)
            out.append(nxt[:, None])
        return {"tokens": torch.cat(out, dim=1).tolist(), "transfer_s": transfer_s}


def run_disaggregated(model_dir: str, input_ids: torch.Tensor, max_new_tokens: int, connector: str = "gloo",
                      decode_model_dir: str | None = None, path: str | None = None, port: int | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> DisaggResult:
    """Prefill in one process, decode in another, the cache shipped between them by ``connector``
    ("gloo" or "file"; the file goes to ``path``, default a temporary folder). ``decode_model_dir``
    (default ``model_dir``) lets the decode side run another model: a mismatch raises PeerFailed carrying
    the decode side's TransferMismatch."""
    import tempfile

    if connector not in ("gloo", "file"):
        raise ValueError(f"connector must be 'gloo' or 'file'; got {connector!r}")
    from .tp import check_request, read_config

    check_request(read_config(model_dir), input_ids, max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        file = str(path or Path(tmp) / "kv_message.safetensors") if connector == "file" else None
        dirs = (str(model_dir), str(decode_model_dir or model_dir))
        p, d = launch(disagg_worker, 2, (dirs, input_ids.tolist(), max_new_tokens, connector, file, timeout_s),
                      port=port, timeout_s=timeout_s)
    B = input_ids.shape[0]
    return DisaggResult(tokens=d["tokens"], bytes_sent=p["bytes_sent"], kv_bytes=p["kv_bytes"],
                        header_bytes=header_bytes(B), prefill_s=p["prefill_s"], transfer_s=d["transfer_s"])
