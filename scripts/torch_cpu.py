"""Install the CPU build of the pinned torch into a fresh environment, before `pip install -r requirements.txt`.

    python scripts/torch_cpu.py requirements.txt        (run by `make venv`, with the venv's Python)

The course runs on a CPU. On Linux, `pip install torch==X` from PyPI brings the CUDA build (several GB of
NVIDIA libraries); PyTorch's own index https://download.pytorch.org/whl/cpu has the same version as `X+cpu`
(about 200 MB), which satisfies the pin `torch==X` (PEP 440 ignores the local label), so the next
`pip install -r requirements.txt` keeps it. What it does, in one line of output at most:

- not Linux (macOS and Windows wheels on PyPI are CPU builds already), torch already installed at the pin, or
  KVREF_TORCH=default: nothing;
- an NVIDIA GPU (`nvidia-smi` on PATH or /proc/driver/nvidia/version): nothing, the CUDA build is wanted
  (KVREF_TORCH=cpu installs the CPU build anyway);
- otherwise it asks the CPU index whether it answers (KVREF_TORCH_TIMEOUT seconds, 5 by default, DNS included)
  and installs torch==X from it; when the index does not answer, or the install fails, it says so and leaves
  torch to the plain pins (exit status 0 either way: the set-up goes on).

KVREF_TORCH_INDEX replaces the index URL (a mirror of PyTorch's CPU wheels).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

INDEX = "https://download.pytorch.org/whl/cpu"


def pinned_torch(requirements: Path) -> str | None:
    """The version pinned by a `torch==X` line of a requirements file, or None."""
    for line in requirements.read_text().splitlines():
        m = re.fullmatch(r"\s*torch\s*==\s*([^\s;#]+)\s*(#.*)?", line)
        if m:
            return m.group(1)
    return None


def installed_torch(python: str) -> str | None:
    """The torch version installed for ``python`` (None if there is none), without importing torch."""
    code = "import importlib.metadata as m\ntry:\n print(m.version('torch'))\nexcept m.PackageNotFoundError:\n pass"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or None


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/version").exists()


def answers(url: str, timeout: float) -> bool:
    """Whether ``url`` answers within ``timeout`` seconds. The request runs in a daemon thread, so a name
    lookup that hangs (which a socket timeout does not cover) cannot hold the set-up up either."""
    ok = []

    def ask():
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout) as r:
                ok.append(r.status < 400)
        except Exception:  # no route, no name, refused, TLS, HTTP error: the index is not usable
            ok.append(False)

    t = threading.Thread(target=ask, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok and ok[0])


def main(argv: list[str], python: str = sys.executable) -> int:
    requirements = Path(argv[0]) if argv else Path("requirements.txt")
    version = pinned_torch(requirements)
    mode = os.environ.get("KVREF_TORCH", "auto")
    if version is None or mode == "default" or (mode != "cpu" and not sys.platform.startswith("linux")):
        return 0
    have = installed_torch(python)
    if have and have.split("+")[0] == version:
        return 0
    if mode != "cpu" and has_nvidia_gpu():
        print(f"torch: an NVIDIA GPU is present, so torch=={version} comes from the default index (the CUDA build; "
              f"KVREF_TORCH=cpu for the CPU build)", flush=True)
        return 0
    index = os.environ.get("KVREF_TORCH_INDEX", INDEX)
    timeout = float(os.environ.get("KVREF_TORCH_TIMEOUT", "5"))
    if not answers(index, timeout):
        print(f"torch: {index} did not answer (waited at most {timeout:g} s), so torch=={version} comes from the "
              f"default index (on Linux the CUDA build, several GB, unless a local CPU wheel is found)", flush=True)
        return 0
    print(f"torch: installing the CPU build of torch=={version} from {index}", flush=True)
    done = subprocess.run([python, "-m", "pip", "install", "--timeout", "30", "--index-url", index,
                           f"torch=={version}"])
    if done.returncode != 0:
        print(f"torch: the CPU build could not be installed (pip exited {done.returncode}), so torch=={version} "
              f"comes from the default index", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
