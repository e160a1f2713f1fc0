"""The kernel (or grading job) command when a warm server runs: a tiny process, standard library only.

    python autograder/shared/warm_client.py SOCKET KIND POLICY -- ARGV...

KIND is ``kernel`` (ARGV is ``python -m ipykernel_launcher ...``; POLICY a sandbox policy file or
``-``) or ``job`` (ARGV is ``python -m autograder.grade.job JOBDIR``). The client hands the warm server
(``autograder/shared/warm_server.py``) its argv, environment, working directory and its stdin/stdout/stderr;
the server forks a process that has already imported torch (or nbgrader) and runs ARGV's program
in it, sandboxed by POLICY exactly as ``python -m autograder.shared.sandbox POLICY -- ARGV`` would.
This process stands in for that one: signals sent to it (interrupt, terminate, kill) reach the
forked process, its exit status is ours, and when we die (or our parent does) it is killed.

When the server cannot be reached, the client becomes the cold command itself (exec), after one
line on stderr saying so.
"""

import json
import os
import select
import signal
import socket
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def cold_command(kind: str, policy: str, argv: list[str]) -> list[str]:
    if kind == "kernel" and policy != "-":
        return [sys.executable, "-m", "autograder.shared.sandbox", policy, "--", *argv]
    return argv


def connect(path: str, kind: str, policy: str, argv: list[str]) -> socket.socket:
    """A connection on which the server has accepted the request (else OSError)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    body = json.dumps({"kind": kind, "policy": None if policy == "-" else policy, "argv": argv,
                       "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(s, [len(body).to_bytes(8, "big")], [0, 1, 2])
    s.sendall(body)
    answer = b""
    while not answer.endswith(b"\n"):
        got = s.recv(4096)
        if not got:
            raise OSError("the warm server closed the connection")
        answer += got
    if answer != b"ok\n":
        raise OSError(answer.decode(errors="replace").strip())
    s.settimeout(None)
    return s


def main(args: list[str]) -> int:
    path, kind, policy, sep, *argv = args
    assert sep == "--", "usage: warm_client.py SOCKET KIND POLICY -- ARGV..."
    try:
        conn = connect(path, kind, policy, argv)
    except OSError as e:
        print(f"autograder.shared.warm: no warm {kind} ({e}); starting a cold one", file=sys.stderr, flush=True)
        cold = cold_command(kind, policy, argv)
        os.execvp(cold[0], cold)

    def forward(signum, frame):
        try:
            conn.sendall(f"{signum}\n".encode())
        except OSError:
            pass

    for sig in SIGNALS:
        signal.signal(sig, forward)
    parent = os.getppid()
    data = b""
    while True:
        ready, _, _ = select.select([conn], [], [], 0.2)
        if os.getppid() != parent:  # whoever started us is gone: so goes the kernel (the server sees EOF)
            return 137
        if not ready:
            continue
        got = conn.recv(4096)
        if not got:
            return 137  # the server's process died without a word
        data += got
        if data.startswith(b"exit ") and data.endswith(b"\n"):
            return int(data.split()[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
