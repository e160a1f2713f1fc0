"""The GPU check in one command: ``python -m kvref.bench gpu`` (or ``make gpu-check``).

On a machine with a CUDA device it runs, in about 5-8 minutes on one modern GPU,

1. the CUDA cases of the test suite (``pytest -k cuda tests/``; on a CPU machine they skip);
2. the decode benchmark (``kvref.bench.decode``) on CUDA: the decode step eager, compiled
   (inductor) and compiled with ``mode="reduce-overhead"`` (CUDA graphs), GPT-2-124M shape, B=1;
   the roofline against the GPU's bandwidth measured by a 1 GiB device-to-device copy; kvref vs
   HF ``generate`` at batch 1-64; one decode step over the paged cache, gathered and in place
   (FlexAttention), at S = 512, B = 16;

and writes everything into one markdown report (``--out``, default ``gpu_report.md``), also
printed. Without a CUDA device it measures nothing, says "no CUDA device" on stderr and exits
with status 3 (``NO_CUDA``), so a script can tell "no GPU here" from a failure (status 1).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import torch

NO_CUDA = 3  # exit status when there is no CUDA device
TESTS_TIMEOUT_S = 240


def no_cuda_message() -> str:
    return (f"no CUDA device: torch.cuda.is_available() is False here (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda or 'none'}). `python -m kvref.bench gpu` needs an NVIDIA GPU "
            f"and a CUDA build of torch; nothing was measured. The CPU benchmarks: python -m kvref.bench decode")


def run_cuda_tests(timeout_s: int = TESTS_TIMEOUT_S) -> list[str]:
    """Run the test suite's CUDA cases in a subprocess; markdown lines with the summary."""
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not tests.is_dir():
        return ["### CUDA tests\n", f"not run: no tests/ folder next to the kvref package ({tests})", ""]
    cmd = [sys.executable, "-m", "pytest", "-q", "-k", "cuda", "-p", "no:cacheprovider", str(tests)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=tests.parent)
    except subprocess.TimeoutExpired:
        return ["### CUDA tests\n", f"**timed out** after {timeout_s} s: `{' '.join(cmd[2:])}`", ""]
    lines = [ln for ln in done.stdout.strip().splitlines() if ln.strip()]
    summary = lines[-1] if lines else "(no output)"
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))][:20]
    status = "passed" if done.returncode == 0 else f"**exit status {done.returncode}**"
    return ["### CUDA tests\n", f"`pytest -q -k cuda tests/`: {status}, {summary} ({time.perf_counter() - t0:.0f} s)",
            *[f"- {ln}" for ln in failed], ""]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kvref.bench gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_report.md", help="where to write the markdown report")
    ap.add_argument("--quick", action="store_true", help="a 2-layer model and small sizes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5, 2 with --quick)")
    ap.add_argument("--skip-tests", action="store_true", help="do not run the CUDA tests")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(no_cuda_message(), file=sys.stderr)
        raise SystemExit(NO_CUDA)
    from . import decode  # imported only when there is something to measure

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    head = [f"## kvref GPU check ({datetime.date.today()}; {props.name}, {props.total_memory / 2**30:.0f} GiB; "
            f"torch {torch.__version__}, CUDA {torch.version.cuda})", ""]
    body = [] if args.skip_tests else run_cuda_tests()
    log("CUDA tests done" if body else "CUDA tests skipped (--skip-tests)")
    torch.set_num_threads(1)  # the CPU side of each step (Python, launches): as on the course machine
    repeats = args.repeats or (2 if args.quick else 5)
    body.append(decode.report(torch.device("cuda"), args.quick, repeats, log))
    text = "\n".join(head + body + [f"Total wall time {time.perf_counter() - t0:.0f} s.", ""])
    Path(args.out).write_text(text)
    print(text)
    log(f"report written to {args.out}")


if __name__ == "__main__":
    main()
