"""Warm kernels: fork each grading kernel (and grading job) from a server that already imported
torch, kvref and ipykernel (or nbgrader), instead of starting Python and importing them again.

    server = warm.ensure()   # this process's servers (started once); None: cold kernels
    warm.kernel_argv(policy_file, kernel_argv)   # what kernel.json runs: the client, or the cold command

Why: a cold kernel spends seconds importing torch before its first cell, and every grading job as
long importing nbgrader; forking a process that has them costs milliseconds. Each notebook still
runs in a fresh process (forked, so nothing one student's code does reaches the next), started by
nbgrader through jupyter_client as before, with the same connection file, stderr capture,
interrupt, per-cell timeout and shutdown.

How: jupyter_client starts ``autograder/warm_client.py`` (standard library only) as the kernel.
The client passes its argv, environment, working directory and stdin/stdout/stderr over a Unix
socket; the server forks a *monitor* for it, single-threaded, which applies the sandbox policy
through ``sandbox.run`` (namespaces, read-only root, no network, rlimits: the same code a cold
kernel goes through) and, in the sandboxed child, sets the client's environment, cwd, argv and
sys.path and runs IPKernelApp instead of exec'ing Python. The monitor forwards the signals the
client receives, kills the kernel when the client dies, and reports the exit status, which the
client exits with.

The servers run with one OpenMP/BLAS thread so that they hold no thread when they fork
(``serve`` refuses to run otherwise); a kernel reads its own OMP_NUM_THREADS when torch first
needs threads. ``KVREF_WARM=0`` turns warm kernels off.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

CLIENT = Path(__file__).resolve().with_name("warm_client.py")
ROOT = CLIENT.parents[1]
ENV_SOCKET = "KVREF_WARM_SOCKETS"  # "kernel=PATH:job=PATH", inherited by grading jobs
# What a kernel imports before any cell: the course's code and the kernel itself.
PRELOAD = {
    "kernel": ["numpy", "torch", "torch.nn.functional", "kvref", "kvref.grading", "kvref.attention", "kvref.cache",
               "kvref.paged", "kvref.prefix", "kvref.evict", "kvref.memory", "ipykernel.kernelapp",
               "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.iostream", "IPython.core.interactiveshell",
               "ipywidgets"],
    "job": ["autograder.job", "nbgrader.apps", "nbgrader.converters", "nbgrader.preprocessors", "nbclient",
            "jupyter_client", "jupyter_client.provisioning.local_provisioner", "sqlalchemy.dialects.sqlite",
            "nbconvert.exporters.html"],  # the feedback page
}
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


def kernel_env() -> dict[str, str]:
    """A copy of this process's environment with ``kernel_env_changes`` applied: for a child
    started from a worker thread (two threads that swap ``os.environ`` in and out leak each
    other's values into it)."""
    env = dict(os.environ)
    for k, v in kernel_env_changes().items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@contextlib.contextmanager
def kernel_environment() -> Iterator[None]:
    """Environment for nbgrader and the kernels it starts (the same under the tests as under
    ``make grade``); restored afterwards. With warm servers running (``warm.ensure``), the
    plain ``python3`` kernel and the grading jobs start warm. One thread at a time: threads use
    ``kernel_env()``."""
    wanted = kernel_env_changes()
    saved = {k: os.environ.get(k) for k in wanted}
    for k, v in wanted.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- the server ------------------------------------------------------------------------------------


def serve(kind: str, path: str) -> int:
    """Import PRELOAD[kind], listen on ``path``, fork a monitor per connection. Prints ``ready``
    (or why not) on stdout once."""
    failed = []
    for name in PRELOAD[kind]:
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001  (a kernel would import it later, or fail the same way)
            failed.append(f"{name}: {e}")
    if threads() != 1:
        print(f"not ready: {threads()} threads after the imports (forking them is unsafe)", flush=True)
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the system
    parent = os.getppid()
    print("ready" + (f" (not preloaded: {'; '.join(failed)})" if failed else ""), flush=True)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    while os.getppid() == parent:  # the grader that started us is gone: stop
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                listener.close()
                status = _monitor(kind, conn)
            finally:
                os._exit(status)
        conn.close()
    return 0


def _read_request(conn: socket.socket) -> dict:
    conn.settimeout(30)
    head, fds, _, _ = socket.recv_fds(conn, 8, 3)
    if len(fds) != 3 or len(head) != 8:
        raise OSError("a request without its header and three file descriptors")
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        got = conn.recv(min(1 << 20, size - len(body)))
        if not got:
            raise OSError("the client went away")
        body += got
    conn.settimeout(None)
    for target, fd in enumerate(fds):  # the client's stdin, stdout, stderr become ours
        os.dup2(fd, target)
        os.close(fd)
    return json.loads(body)


def _watch(conn: socket.socket):
    """``wait(pid)`` for ``sandbox.run``: forward the client's signals to ``pid``; kill it when the
    client goes away; return its shell-style exit status."""

    def wait(pid: int) -> int:
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        while True:
            ready, _, _ = select.select([conn] + ([pidfd] if pidfd is not None else []), [], [], 0.2)
            if conn in ready:
                got = conn.recv(4096)
                if not got:  # the client died (or was killed): so does the kernel
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return 137
                for line in got.split():
                    sig = int(line)
                    try:
                        os.kill(pid, signal.SIGKILL if sig == signal.SIGTERM else sig)
                    except ProcessLookupError:
                        pass
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)

    return wait


def _monitor(kind: str, conn: socket.socket) -> int:
    """In the forked monitor: take the request, start the kernel (or job) under its policy, wait."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        req = _read_request(conn)
        argv, env, cwd = req["argv"], req["env"], req["cwd"]
        if req.get("kind") != kind:
            raise ValueError(f"this server forks {kind}s, not {req.get('kind')}s")
        if kind == "kernel" and argv[1:3] != ["-m", "ipykernel_launcher"]:
            raise ValueError(f"not an ipykernel command: {argv[:3]}")
        if kind == "job" and argv[1:3] != ["-m", "autograder.job"]:
            raise ValueError(f"not a grading job: {argv[:3]}")
        policy = json.loads(Path(req["policy"]).read_text()) if req.get("policy") else {"isolate": False}
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
    except Exception as e:  # noqa: BLE001  (the client falls back to a cold start)
        conn.sendall(f"no: {type(e).__name__}: {e}\n".encode())
        return 1
    conn.sendall(b"ok\n")
    from . import sandbox

    def start(argv: list[str], env: dict) -> None:
        conn.close()
        _become(kind, argv, env)

    if kind == "job":
        policy = {"isolate": False}
    status = sandbox.run(policy, argv, start=start, wait=_watch(conn))
    try:
        conn.sendall(f"exit {status}\n".encode())
    except OSError:
        pass
    return 0


def _become(kind: str, argv: list[str], env: dict) -> None:
    """In the (sandboxed) child: take the cold process's environment, argv and sys.path, then run
    its program. Never returns."""
    import atexit as _atexit

    os.environ.clear()
    os.environ.update(env)
    # sys.path as `python -m ipykernel_launcher` has it with the client's PYTHONPATH: the
    # launcher drops the cwd entry; Python makes the entries absolute and drops duplicates.
    ours = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in _SERVER_PYTHONPATH]
    sys.path[:] = list(dict.fromkeys(ours + base))
    code = 0
    try:
        if kind == "kernel":
            from ipykernel import kernelapp

            sys.argv = [str(Path(kernelapp.__file__).with_name("ipykernel_launcher.py")), *argv[3:]]
            _threads_as_cold(env)
            # Its parent is this monitor, not jupyter_client (JPY_PARENT_PID): no parent poller
            # (handle 1), the monitor kills it when the client goes. (The trait's default was read
            # when the server imported ipykernel, so it is set here.)
            kernelapp.IPKernelApp.launch_instance(argv[3:], parent_handle=1, interrupt=0)
        else:  # `python -m MODULE ARGS...` (a grading job): run MODULE as __main__, as Python does
            sys.argv = [argv[2], *argv[3:]]  # runpy puts the module's file name in argv[0]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            _atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _threads_as_cold(env: dict) -> None:
    """The OpenMP runtime read the server's OMP_NUM_THREADS=1 when torch was imported: give the
    kernel the intra-op threads a cold start would have (OMP_NUM_THREADS, else every usable CPU)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        n = int(env.get("OMP_NUM_THREADS", ""))
    except ValueError:
        n = 0
    torch.set_num_threads(n if n > 0 else len(os.sched_getaffinity(0)))


_SERVER_PYTHONPATH = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}


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
                self.procs[kind] = subprocess.Popen([sys.executable, "-m", "autograder.warm", "serve", kind, path],
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
            from . import sandbox

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


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and len(sys.argv) == 4:
        sys.exit(serve(sys.argv[2], sys.argv[3]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
