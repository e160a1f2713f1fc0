"""Start N processes that talk through torch.distributed (gloo), and never hang.

    results = launch(fn, world_size=2, args=(x,))   # fn(rank, world_size, x) in every process
    results[r]                                        # what rank r returned

Every process joins one gloo process group on a free local port. Three things can go wrong, and each gives
one clear error instead of a hang:

- the port asked for is taken              -> ValueError before anything starts;
- a peer raises or dies (killed, os._exit) -> PeerFailed naming the rank, its exit code and its error; the
                                              other ranks are stopped at once;
- a collective waits too long              -> the group's ``timeout`` makes gloo raise in the waiting rank
                                              (every collective and send/recv honours it), which then
                                              counts as a failed peer.

The same worker code runs under ``torchrun`` (``init_from_env``), where torchrun does the spawning.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_TIMEOUT_S = 30.0  # one collective may wait this long; a tiny model's step takes milliseconds


class PeerFailed(RuntimeError):
    """A rank raised, died or timed out; the message says which and why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port: int) -> None:
    """Raise ValueError if ``port`` cannot be bound on 127.0.0.1 (another process holds it)."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer in [1, 65535]; got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            raise ValueError(f"port {port} on 127.0.0.1 is in use ({e.strerror}); pass port=None to pick a free "
                             f"one") from None


def init_group(rank: int, world_size: int, port: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the gloo group on 127.0.0.1:``port``; every collective afterwards waits at most ``timeout_s``."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def init_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Under torchrun: join the group from RANK, WORLD_SIZE, MASTER_ADDR/PORT; return (rank, world_size)."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def _worker(rank: int, world_size: int, port: int, timeout_s: float, fn: Callable, args: tuple, queue) -> None:
    try:
        init_group(rank, world_size, port, timeout_s)
        out = fn(rank, world_size, *args)
        queue.put((rank, True, out))
        dist.barrier()  # nobody tears the group down while a peer still sends to it
    except BaseException as e:  # noqa: BLE001  (reported to the parent, which raises)
        queue.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"))
        queue.close()
        queue.join_thread()  # the message must leave before os._exit ends the process
        os._exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _blame_the_dead(procs: list, rank: int, error: str, queue) -> None:
    """Raise PeerFailed for ``rank``'s error, or, when a peer died without a word (killed, os._exit) and
    the error is only the broken connection it left, name that peer as the cause."""
    reported = {rank}
    for _ in range(10):  # half a second for a silent death to show
        while not queue.empty():
            r, ok, _out = queue.get()
            reported |= {r} if not ok else set()
        silent = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reported]
        if silent:
            r, code = silent[0]
            raise PeerFailed(f"rank {r} of {len(procs)} died with exit code {code}; rank {rank} then failed with "
                             f"{error.splitlines()[0]}")
        time.sleep(0.05)
    raise PeerFailed(f"rank {rank} of {len(procs)} failed: {error}")


def launch(fn: Callable, world_size: int, args: tuple = (), port: int | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S, start_method: str = "forkserver") -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined by gloo; return the
    list of their results, rank order. ``fn`` must be importable (a module-level function).

    ``start_method`` "forkserver" (the default) forks each rank from a server process that has imported
    torch once and run no threads yet: fast like fork, safe like spawn. ``timeout_s`` bounds each collective; the whole run is stopped after ``timeout_s`` + a start-up
    allowance (60 s: a fresh process imports torch) even if no collective is waiting.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1; got {world_size!r}")
    if port is None:
        port = free_port()
    else:
        check_port(port)
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":  # one server imports torch and kvref once; each rank is a cheap fork of it
        ctx.set_forkserver_preload(["torch", "kvref.dist.tp", "kvref.dist.transfer"])
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, timeout_s, fn, args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s + 60.0
    try:
        while len(results) < world_size:
            try:
                rank, ok, out = queue.get(timeout=0.05)
            except Exception:  # queue.Empty: look at the processes instead
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead and queue.empty():
                    time.sleep(0.2)  # a dying rank's error message may still be on its way
                    if queue.empty():
                        r, code = dead[0]
                        raise PeerFailed(f"rank {r} of {world_size} died with exit code {code} before it "
                                         f"answered; the other ranks were stopped") from None
                    continue
                if time.monotonic() > deadline:
                    raise PeerFailed(f"no answer from ranks {sorted(set(range(world_size)) - set(results))} "
                                     f"within {timeout_s + 60:.0f} s; every rank was stopped") from None
                continue
            if not ok and rank in results:  # it had answered, then lost a peer in the final barrier:
                continue  # not the cause; the peer's own error (or death) is reported instead
            if not ok:
                _blame_the_dead(procs, rank, out, queue)
            results[rank] = out
        for p in procs:
            p.join(timeout=timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    return [results[r] for r in range(world_size)]
