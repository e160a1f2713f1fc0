"""Warm kernels: fork each grading kernel (and grading job) from a server that already imported
torch, kvref and ipykernel (or nbgrader), instead of starting Python and importing them again.

    server = warm.ensure()   # this process's servers (started once); None: cold kernels
    warm.command("kernel", argv, policy_file)   # what kernel.json runs: the client, or the cold command

Why: a cold kernel spends seconds importing torch before its first cell, and every grading job as
long importing nbgrader; forking a process that has them costs milliseconds. Each notebook still
runs in a fresh process (forked, so nothing one student's code does reaches the next), started by
nbgrader through jupyter_client as before, with the same connection file, stderr capture,
interrupt, per-cell timeout and shutdown.

How: jupyter_client starts ``autograder/shared/warm_client.py`` (standard library only) as the kernel; the
client hands its argv, environment, working directory and stdin/stdout/stderr to the server
(``autograder/shared/warm_server.py``), which forks a sandboxed kernel for it. This module is the grader's
side: the servers' start and status, the command a kernel.json runs, and the kernels' environment.
``KVREF_WARM=0`` turns warm kernels off.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

CLIENT = Path(__file__).resolve().with_name("warm_client.py")
ROOT = CLIENT.parents[2]
ENV_SOCKET = "KVREF_WARM_SOCKETS"  # "kernel=PATH:job=PATH", inherited by grading jobs
# What a kernel imports before any cell: the course's code and the kernel itself.
PRELOAD = {
    "kernel": ["numpy", "torch", "torch.nn.functional", "kvref", "kvref.grading", "kvref.attention", "kvref.cache",
               "kvref.paged", "kvref.prefix", "kvref.evict", "kvref.memory", "ipykernel.kernelapp",
               "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.iostream", "IPython.core.interactiveshell",
               "ipywidgets"],
    "job": ["autograder.grade.job", "autograder.grade.quick", "nbgrader.apps", "nbgrader.converters", "nbgrader.preprocessors", "nbclient",
            "jupyter_client", "jupyter_client.provisioning.local_provisioner", "sqlalchemy.dialects.sqlite",
            "nbconvert.exporters.html"],  # the feedback page
}
# Run once by the server after PRELOAD, before it forks (module:function): per-process caches filled.
WARM_UP = {"job": "autograder.grade.job:warm_up"}
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def enabled() -> bool:
    return os.environ.get("KVREF_WARM", "").lower() not in ("0", "off", "no")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


# pytest's variables (and the Makefile's PYTEST_ARGS): ipykernel turns off its capture of C-level
# stderr when it sees PYTEST_CURRENT_TEST, so a kernel started from a test would not lose the points
# that the same cell loses under `make grade`. Kernels see none of the PYTEST* names.
PYTEST_PREFIX = "PYTEST"


def kernel_env_changes() -> dict[str, str | None]:
    """The changes to this process's environment that nbgrader and its kernels need (None: unset).
    Computed, not applied: grading threads take ``kernel_env()``, which touches nothing shared."""
    bindir = str(Path(sys.executable).parent)
    wanted: dict[str, str | None] = {
        "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p),
        "MPLBACKEND": "Agg",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # no debugger banner on the kernel's stderr
    }
    wanted.update({k: None for k in os.environ if k.startswith(PYTEST_PREFIX)})
    if _servers is not None and _servers.ready:
        wanted[ENV_SOCKET] = _servers.env_value()
    if not os.environ.get("JUPYTER_PATH"):  # a grading job sets its own (sandboxed) kernel spec
        spec = kernel_spec_dir()
        if spec:
            wanted["JUPYTER_PATH"] = spec
    return wanted


def _apply(env, changes: dict[str, str | None]) -> None:
    """Set each name of ``changes`` in ``env`` (a dict or os.environ); None unsets it."""
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v


def kernel_env() -> dict[str, str]:
    """A copy of this process's environment with ``kernel_env_changes`` applied: for a child
    started from a worker thread (two threads that swap ``os.environ`` in and out leak each
    other's values into it)."""
    env = dict(os.environ)
    _apply(env, kernel_env_changes())
    return env


@contextlib.contextmanager
def kernel_environment() -> Iterator[None]:
    """Environment for nbgrader and the kernels it starts (the same under the tests as under
    ``make grade``); restored afterwards. With warm servers running (``warm.ensure``), the
    plain ``python3`` kernel and the grading jobs start warm. One thread at a time: threads use
    ``kernel_env()``."""
    wanted = kernel_env_changes()
    saved = {k: os.environ.get(k) for k in wanted}
    _apply(os.environ, wanted)
    try:
        yield
    finally:
        _apply(os.environ, saved)


# -- the grader's side ----------------------------------------------------------------------------


class Servers:
    """A kernel server and a job server, children of this process, stopped at exit."""

    def __init__(self, kinds: tuple[str, ...] = ("kernel", "job"), timeout: float = 300):
        self.dir = Path(tempfile.mkdtemp(prefix="kvw-"))  # short: socket paths hold 108 bytes
        self.procs: dict[str, subprocess.Popen] = {}
        self.sockets: dict[str, str] = {}
        self.confirmed: set[str] = set()
        self.why = ""
        self.timeout = timeout
        self.add(kinds)
        atexit.register(self.stop)

    def add(self, kinds: tuple[str, ...]) -> None:
        """Start the servers of ``kinds`` not started yet (in the background)."""
        with kernel_environment():
            env = dict(os.environ, **SINGLE_THREAD)
        env.pop(ENV_SOCKET, None)
        env.pop("JPY_PARENT_PID", None)
        env.pop("JUPYTER_PATH", None)
        for kind in kinds:
            if kind in self.procs or self.why:
                continue
            path = str(self.dir / kind)
            with open(self.dir / f"{kind}.log", "wb") as log:
                self.procs[kind] = subprocess.Popen([sys.executable, "-m", "autograder.shared.warm_server", kind, path],
                                                    stdout=subprocess.PIPE, stderr=log, env=env, cwd=str(self.dir),
                                                    start_new_session=True)
            self.sockets[kind] = path

    @property
    def ready(self) -> bool:
        return not self.why and bool(self.procs) and self.confirmed == set(self.procs)

    def wait(self) -> bool:
        """Block until every server is ready; False, with ``why``, if one is not."""
        deadline = time.monotonic() + self.timeout
        for kind, proc in list(self.procs.items()):
            if kind in self.confirmed or self.why:
                continue
            line = b""
            while not line.endswith(b"\n") and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                got = os.read(proc.stdout.fileno(), 4096) if ready else b""
                if not got:
                    break
                line += got
            if not line.startswith(b"ready"):
                err = (self.dir / f"{kind}.log").read_text(errors="replace").strip().splitlines()[-1:]
                self.why = f"the warm {kind} server did not start: " + (line.decode(errors="replace").strip()
                                                                       or " ".join(err) or "timed out")
                self.stop()
                return False
            self.confirmed.add(kind)
        return self.ready

    @property
    def ok(self) -> bool:
        return self.wait()

    def env_value(self) -> str:
        return ":".join(f"{k}={v}" for k, v in self.sockets.items())

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its monitors and kernels go with it
                proc.wait()
        self.procs.clear()
        self.confirmed.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: Servers | None = None


def start(kinds: tuple[str, ...] = ("kernel", "job")) -> None:
    """Start this process's warm servers in the background (they import for a few seconds while
    the grader does other work); ``ensure`` waits for them. Nothing to start when warm kernels
    are off or a parent's servers are inherited (a grading job)."""
    global _servers
    if enabled() and not os.environ.get(ENV_SOCKET):
        if _servers is None:
            _servers = Servers(kinds)
        else:
            _servers.add(kinds)


def ensure(kinds: tuple[str, ...] = ("kernel", "job")) -> Servers | None:
    """This process's warm servers, started on first use and ready; None when warm kernels are
    off, come from a parent, or could not start (``status()`` says why)."""
    start(kinds)
    return _servers if _servers is not None and _servers.ok else None


def stop() -> None:
    """Stop this process's servers now (a worker process that ends without running atexit)."""
    global _servers
    if _servers is not None:
        _servers.stop()
        _servers = None


def status() -> str:
    """One line for the grade sheet: whether kernels start warm."""
    if not enabled():
        return "cold (KVREF_WARM=0)"
    if _servers is None or not _servers.ready and not _servers.why:
        return "cold"
    if not _servers.ok:
        return f"cold ({_servers.why})"
    return ("warm (kernels forked from a server that imported torch, kvref and ipykernel"
            + (", grading jobs from one that imported nbgrader)" if "job" in _servers.procs else ")"))


def socket_for(kind: str) -> str | None:
    """The socket of this process's (or the grader's, inherited) warm ``kind`` server, if any."""
    if not enabled():
        return None
    if _servers is not None and _servers.ready:
        return _servers.sockets.get(kind)
    for part in os.environ.get(ENV_SOCKET, "").split(":"):
        k, _, path = part.partition("=")
        if k == kind and os.path.exists(path):
            return path
    return None


def command(kind: str, argv: list[str], policy_file: Path | None = None) -> list[str]:
    """The command that starts ``argv`` warm when a server runs (the client, which falls back to
    the cold command on its own), else the cold command."""
    path = socket_for(kind)
    if path is None:
        if kind == "kernel" and policy_file is not None:
            from autograder.shared import sandbox

            return sandbox.command(policy_file, argv)
        return argv
    return [sys.executable, str(CLIENT), path, kind, str(policy_file) if policy_file else "-", "--", *argv]


def kernel_spec_dir() -> str | None:
    """A JUPYTER_PATH folder whose ``python3`` kernel starts warm (unsandboxed, for ``Course``
    used directly, as the tests do); None without a kernel server."""
    if socket_for("kernel") is None:
        return None
    spec = Path(_servers.dir if _servers else tempfile.gettempdir()) / f"spec-{os.getpid()}"
    kernel = spec / "kernels" / "python3"
    if not (kernel / "kernel.json").is_file():
        kernel.mkdir(parents=True, exist_ok=True)
        argv = command("kernel", [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
        (kernel / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3 (warm)",
                                                        "language": "python", "metadata": {"debugger": False}}))
    return str(spec)
