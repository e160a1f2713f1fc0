"""The warm server (started by ``autograder/shared/warm.py``): imports what a kernel (or a grading job)
imports, then forks one sandboxed process per client.

    python -m autograder.shared.warm_server KIND SOCKET_PATH     # KIND: kernel or job

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

import json
import os
import runpy
import select
import signal
import socket
import sys
from pathlib import Path

from autograder.shared.warm import PRELOAD, WARM_UP, threads

def serve(kind: str, path: str) -> int:
    """Import PRELOAD[kind], listen on ``path``, fork a monitor per connection. Prints ``ready``
    (or why not) on stdout once."""
    failed = []
    for name in PRELOAD[kind]:
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001  (a kernel would import it later, or fail the same way)
            failed.append(f"{name}: {e}")
    if kind in WARM_UP:
        module, _, function = WARM_UP[kind].partition(":")
        try:
            getattr(__import__(module, fromlist=[function]), function)()
        except Exception as e:  # noqa: BLE001  (the jobs fill their caches themselves, as before)
            failed.append(f"{WARM_UP[kind]}: {e}")
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
        if kind == "job" and argv[1:3] != ["-m", "autograder.grade.job"]:
            raise ValueError(f"not a grading job: {argv[:3]}")
        policy = json.loads(Path(req["policy"]).read_text()) if req.get("policy") else {"isolate": False}
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
    except Exception as e:  # noqa: BLE001  (the client falls back to a cold start)
        conn.sendall(f"no: {type(e).__name__}: {e}\n".encode())
        return 1
    conn.sendall(b"ok\n")
    from autograder.shared import sandbox

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


if __name__ == "__main__":
    if len(sys.argv) == 3:
        sys.exit(serve(sys.argv[1], sys.argv[2]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
