"""Run untrusted student code (the notebook kernel) in a sandbox, on Linux, without root or Docker.

    python -m autograder.shared.sandbox POLICY.json -- python -m ipykernel_launcher -f kernel.json

nbgrader starts every kernel through this launcher (see ``kernel_command`` and ``course.py``).
With user namespaces available (``unshare -rn`` works) the kernel runs

- in its own user, mount, PID, IPC and network namespaces: no network at all (only its own
  loopback), no view of other processes (a fresh /proc);
- in a new root file system holding only what Python needs, read-only: the system's /usr and
  /lib, a few files of /etc, the Python installation and virtual environment, and ``kvref``.
  The instructor's sources, the gradebook, the other students' work, the course repository
  and the home directory are simply not there. Writable: the notebook's own folder, the
  kernel's socket folder and a private /tmp;
- under resource limits: address space (memory), CPU seconds, file size, processes;
- as an unprivileged user of a nested user namespace, with every mount locked (student code
  cannot unmount what hides the instructor's files) and ``no_new_privs`` set.

The kernel talks to nbgrader over Unix sockets (jupyter_client's ``ipc`` transport), which a
separate network namespace does not cut. Without user namespaces (``probe()`` says why) the
launcher only applies the resource limits: the grade sheet reports that isolation is off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC = 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SANDBOX_UID = 1000  # the student's uid inside the sandbox

# System files Python, torch and ipykernel read; all else of /etc stays out.
ETC = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts", "localtime",
       "mime.types", "os-release"]
SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
DEVICES = ["null", "zero", "full", "random", "urandom"]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


class SandboxError(OSError):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise SandboxError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {source} on {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _map_ids(inside: int, outside_uid: int, outside_gid: int) -> None:
    """After unshare(CLONE_NEWUSER): be ``inside`` in the new user namespace."""
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{inside} {outside_uid} 1")
    _write("/proc/self/gid_map", f"{inside} {outside_gid} 1")


def _lo_up() -> None:
    """Bring up the loopback interface of the (empty) network namespace: code that talks to
    localhost keeps working, nothing else is reachable."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _locked_flags(path: str) -> int:
    """Mount flags a read-only remount must keep (the kernel refuses to clear locked ones)."""
    st = os.statvfs(path)
    out = 0
    for bit, flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                      (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                      (os.ST_RELATIME, MS_RELATIME), (os.ST_RDONLY, MS_RDONLY)):
        if st.f_flag & bit:
            out |= flag
    return out


def _bind(src: str, dest: str, writable: bool, recursive: bool = False) -> None:
    """Bind ``/oldroot`` + src at ``dest`` (in the new root), read-only unless ``writable``.
    Symlinks are copied as symlinks."""
    old = "/oldroot" + src
    if os.path.islink(old):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.lexists(dest):
            os.symlink(os.readlink(old), dest)
        return
    if not os.path.exists(old):
        return
    if os.path.isdir(old):
        os.makedirs(dest, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.exists(dest):
            open(dest, "w").close()
    mount(old, dest, None, MS_BIND | (MS_REC if recursive else 0))
    if not writable:
        mount(None, dest, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _locked_flags(dest))


def _new_root(policy: dict) -> None:
    """Build the sandbox's root file system and pivot into it (we are root of a new user and
    mount namespace here, and PID 1 of a new PID namespace)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do propagates back to the host
    base = policy.get("base", "/tmp")  # any existing directory: a tmpfs goes on top of it
    mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.mkdir(f"{base}/oldroot")
    _check(_libc.syscall(155, _b(base), _b(f"{base}/oldroot")), "pivot_root")  # SYS_pivot_root (x86_64)
    os.chdir("/")
    os.mkdir("/newroot")
    mount("tmpfs", "/newroot", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    new = "/newroot"
    for path in SYSTEM:
        _bind(path, new + path, writable=False)
    for name in ETC:
        _bind(f"/etc/{name}", f"{new}/etc/{name}", writable=False)
    os.makedirs(f"{new}/sys", exist_ok=True)
    _bind("/sys", f"{new}/sys", writable=False, recursive=True)  # its submounts are locked: bind them all
    os.makedirs(f"{new}/proc")
    mount("proc", f"{new}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(f"{new}/dev")
    mount("tmpfs", f"{new}/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        _bind(f"/dev/{name}", f"{new}/dev/{name}", writable=True)
    os.makedirs(f"{new}/dev/shm")
    mount("tmpfs", f"{new}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={policy.get('tmp_mb', 512)}m")
    os.makedirs(f"{new}/tmp")
    mount("tmpfs", f"{new}/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={policy.get('tmp_mb', 512)}m")
    for path in policy.get("ro", []):  # after /tmp: some of them may live there
        _bind(path, new + path, writable=False)
    for path in policy.get("rw", []):
        _bind(path, new + path, writable=True)
    os.chdir(new)
    _check(_libc.syscall(155, b".", b"."), "pivot_root into the new root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _limits(policy: dict) -> None:
    def cap(which, value, slack=0):
        if value:
            soft, hard = resource.getrlimit(which)
            top = lambda x: int(x) if hard == resource.RLIM_INFINITY else min(int(x), hard)  # noqa: E731
            resource.setrlimit(which, (top(value), top(value + slack)))

    cap(resource.RLIMIT_AS, policy.get("memory_mb", 0) * 2 ** 20)
    # CPU: SIGXCPU at the limit (status 128 + 24 says why), SIGKILL 2 s later if that is ignored.
    cap(resource.RLIMIT_CPU, policy.get("cpu_s", 0), slack=2)
    cap(resource.RLIMIT_FSIZE, policy.get("fsize_mb", 0) * 2 ** 20)
    cap(resource.RLIMIT_NPROC, policy.get("nproc", 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core dumps in the student's folder


def _forward_signals(pid: int) -> None:
    def forward(signum, frame):
        try:
            os.kill(pid, signal.SIGKILL if signum == signal.SIGTERM else signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)


def _status(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _wait_watching_parent(pid: int) -> int:
    """Wait for ``pid``, and kill it when the grader that started us goes away. (No thread:
    after unshare(CLONE_NEWPID) a process cannot start one; and PR_SET_PDEATHSIG would fire when
    the *thread* that started us ends, while jupyter_client starts kernels from short-lived ones.)"""
    parent = os.getppid()
    while True:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return _status(status)
        if os.getppid() != parent:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 137
        time.sleep(0.2)


def _wait(pid: int, reap_all: bool = False) -> int:
    """Wait for ``pid``; as a PID 1, also reap every orphan. Returns a shell-style status."""
    while True:
        try:
            got, status = os.waitpid(-1 if reap_all else pid, 0)
        except ChildProcessError:
            return 1
        if got == pid:
            return _status(status)


def _die_with_parent() -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _exec(argv: list[str], env: dict) -> None:
    os.execvpe(argv[0], argv, env)


def run(policy: dict, argv: list[str], start=_exec, wait=None) -> int:
    """Run ``argv`` under ``policy``; returns its shell-style exit status. ``start(argv, env)``
    replaces the sandboxed process by the program (default: exec it; ``warm_server.py`` runs a kernel
    in the already warm, forked process instead); ``wait(pid)`` waits for the top child and kills
    it when the caller goes away (default: when the process that started us exits)."""
    wait = wait or _wait_watching_parent
    env = dict(os.environ)
    env.update(policy.get("env", {}))
    cwd = policy.get("cwd") or os.getcwd()
    if not policy.get("isolate", True):  # limits only
        pid = os.fork()
        if pid == 0:
            try:
                _die_with_parent()
                _limits(policy)
                os.chdir(cwd)
                start(argv, env)
            finally:
                os._exit(127)
        _forward_signals(pid)
        return wait(pid)

    # ipykernel exits when its parent's pid (JPY_PARENT_PID) is not its parent: in a PID
    # namespace it never is. The sandbox's PID 1 dies with the grader instead (PDEATHSIG).
    env.pop("JPY_PARENT_PID", None)
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC)
    _map_ids(0, uid, gid)
    read_end, write_end = os.pipe()  # PID 1 reports a failed set-up here, before exec
    pid = os.fork()  # the child is PID 1 of the new PID namespace
    if pid:
        os.close(write_end)
        _forward_signals(pid)
        status = wait(pid)
        err = os.read(read_end, 4096).decode(errors="replace")
        if err:
            print(f"autograder.shared.sandbox: {err}", file=sys.stderr, flush=True)
        return status
    try:  # PID 1
        os.close(read_end)
        _die_with_parent()
        _new_root(policy)
        _lo_up()
        # A nested user namespace: every mount above becomes locked (cannot be undone to reveal
        # what it hides) and the student is an ordinary user without capabilities.
        unshare(CLONE_NEWUSER | CLONE_NEWNS)
        _map_ids(SANDBOX_UID, 0, 0)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        kernel = os.fork()
        if kernel == 0:
            try:
                os.close(write_end)
                _limits(policy)
                os.chdir(cwd)
                start(argv, env)
            finally:
                os._exit(127)
        os.close(write_end)
        _forward_signals(kernel)
        os._exit(_wait(kernel, reap_all=True))
    except BaseException as e:  # noqa: BLE001  (reported through the pipe, then exit)
        try:
            os.write(write_end, f"{type(e).__name__}: {e}".encode())
        finally:
            os._exit(126)


# -- used by the grader ---------------------------------------------------------------------------


def readonly_paths(root: Path) -> list[str]:
    """What a kernel needs to see: the Python installation and virtual environment, and kvref."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parent.parent),
             str(Path(root) / "kvref")}
    # Package folders added to the path by a .pth file or a --user install (never a source tree:
    # PYTHONPATH may hold the course repository, which the kernel must not see).
    paths |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")}
    # A symlinked venv (a git worktree sharing another checkout's .venv) is bound as a symlink:
    # its target must be there too, or the kernel's python is not found (exit status 127).
    paths |= {str(Path(p).resolve()) for p in paths if p and os.path.exists(p)}
    return sorted(p for p in paths if p and os.path.exists(p) and p != "/")


def command(policy_file: Path, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "autograder.shared.sandbox", str(policy_file), "--", *argv]


PROBE = """
import os, socket, sys
bad = []
for p in sys.argv[1:]:
    if os.path.exists(p):
        bad.append('can see ' + p)
try:
    socket.create_connection(('1.1.1.1', 53), timeout=2).close()
    bad.append('network reachable')
except OSError:
    pass
try:
    open('/probe-write', 'w')
    bad.append('/ is writable')
except OSError:
    pass
print('; '.join(bad) or 'ok')
"""


def probe(hidden: list[str], policy: dict | None = None, timeout: float = 60) -> tuple[bool, str]:
    """(True, 'ok') if a sandboxed Python starts and cannot see ``hidden`` nor reach the network;
    else (False, why)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvsb-") as tmp:
        pol = dict(policy or {})
        pol.setdefault("ro", readonly_paths(Path(__file__).resolve().parents[2]))
        pol.update(rw=[tmp], cwd=tmp, isolate=True)
        pf = Path(tmp) / "policy.json"
        pf.write_text(json.dumps(pol))
        try:
            here = str(Path(__file__).resolve().parents[2])  # so that `-m autograder.shared.sandbox` imports
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH")] if p))
            p = subprocess.run(command(pf, [sys.executable, "-c", PROBE, *hidden]), capture_output=True,
                               text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return False, "the sandbox probe timed out"
    out = p.stdout.strip()
    if p.returncode != 0 or out != "ok":
        why = (out + " " + p.stderr.strip()).strip()
        return False, why[-500:] or f"exit status {p.returncode}"
    return True, "ok"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    policy = json.loads(Path(argv[0]).read_text())
    return run(policy, argv[2:])


if __name__ == "__main__":
    sys.exit(main())
