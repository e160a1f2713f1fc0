"""``python -m kvref.bench gpu``: a clean "no CUDA device" exit here, the full check on a GPU.

The no-CUDA case patches ``torch.cuda.is_available`` so that it is tested on GPU machines too.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kvref.bench import gpu

from conftest import CUDA


def test_without_cuda_it_says_so_and_exits_3(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "report.md"
    with pytest.raises(SystemExit) as stop:
        gpu.main(["--out", str(out)])
    assert stop.value.code == gpu.NO_CUDA == 3  # not 0 (nothing measured), not 1 (nothing failed)
    err = capsys.readouterr().err
    assert err.startswith("no CUDA device") and "nothing was measured" in err
    assert not out.exists()  # no half-written report


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the command line on a machine without CUDA")
def test_command_line_exit_status_without_cuda(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kvref.bench", "gpu", "--out", str(tmp_path / "r.md")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "no CUDA device" in done.stderr and done.stdout == ""


@CUDA
def test_quick_gpu_report_has_every_section(tmp_path):
    out = tmp_path / "report.md"
    gpu.main(["--quick", "--skip-tests", "--out", str(out)])
    text = out.read_text()
    for title in ("### 1. torch.compile", "### 2. decode vs the memory-bandwidth roofline", "### 4. one decode step"):
        assert title in text
    assert "**failed**" not in text
    assert "identical: {'default': True, 'reduce-overhead': True}" in text
    assert "device-to-device copy" in text


def test_a_compile_mode_that_fails_is_reported_and_the_others_still_run():
    # The GPU check is one shot on a lent machine: a mode the compiler rejects there must cost its own
    # rows only, not the whole section. An unknown mode makes torch.compile raise, like a compiler error.
    from kvref.bench.decode import compile_and_roofline

    from conftest import tiny_config, tiny_model
    model = tiny_model(tiny_config())
    header, rows1, rows2, info = compile_and_roofline(model, torch.device("cpu"), 4, 3, 1, ["no-such-mode"],
                                                      lambda msg: None)
    assert "no-such-mode" in info["no-such-mode: failed"]
    assert [r[0] for r in rows1] == ["eager"]  # the eager row is still measured
    assert info["identical"] == {}
