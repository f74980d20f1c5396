"""gpudiag's own profiler captures keep torch's harmless C++ stderr lines off the screen.

torch.profiler prints ``USDT: ... profiler_start`` and ``CPUAllocator.cpp ... Memory block of
unknown size`` on fd 2 (seen with torch 2.13.0+cpu on this machine); a real error printed
during the capture must still come through.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gpudiag._native_stderr import is_harmless, quiet_profiler_stderr, without_harmless
from gpudiag.experiment.memory import measure_peak_memory
from gpudiag.profiling import profile

# Lines exactly as torch 2.13.0+cpu printed them here.
USDT_LINE = (
    "USDT:2026-11-24 00:32:42 10479:10479 SyncActivityProfilerHandler.cpp:52] profiler_start"
)
ALLOCATOR_LINE = (
    "[W1124 00:32:42.708693416 CPUAllocator.cpp:245] Memory block of unknown size was "
    "allocated before the profiling started, profiler results will not include the "
    "deallocation event"
)


def test_known_lines_are_harmless_and_others_are_not() -> None:
    assert is_harmless(USDT_LINE)
    assert is_harmless(USDT_LINE.replace("profiler_start", "profiler_stop"))
    assert is_harmless(ALLOCATOR_LINE)
    assert not is_harmless("RuntimeError: CUDA error: out of memory")
    assert not is_harmless("[W1124 CPUAllocator.cpp:99] something else went wrong")
    assert not is_harmless("USDT: something other than the profiler")


def test_the_raw_profiler_is_noisy_here() -> None:
    """The noise is real: a bare torch.profiler capture in a fresh process prints it."""
    script = (
        "import torch\n"
        "from torch.profiler import profile, ProfilerActivity\n"
        "a = [torch.randn(1000) for _ in range(4)]\n"
        "with profile(activities=[ProfilerActivity.CPU], profile_memory=True):\n"
        "    del a\n"
    )
    err = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    ).stderr
    assert "profiler_start" in err
    assert "Memory block of unknown size" in err


def test_quiet_block_drops_known_lines_and_passes_others(capfd: pytest.CaptureFixture[str]) -> None:
    with quiet_profiler_stderr():
        os.write(2, (USDT_LINE + "\n").encode())
        os.write(2, b"a real problem\n")
        os.write(2, (ALLOCATOR_LINE + "\n").encode())
        with quiet_profiler_stderr():  # nested: the outer redirection is shared
            os.write(2, b"nested problem\n")
    err = capfd.readouterr().err
    assert "a real problem\n" in err
    assert "nested problem\n" in err
    assert "USDT" not in err
    assert "CPUAllocator" not in err
    # fd 2 is restored after the block.
    os.write(2, (USDT_LINE + "\n").encode())
    assert "profiler_start" in capfd.readouterr().err


def test_quiet_block_restores_stderr_on_exception(capfd: pytest.CaptureFixture[str]) -> None:
    def fails() -> None:
        with quiet_profiler_stderr():
            os.write(2, b"before the error\n")
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "before the error\n" in err
    assert "after\n" in err


def test_gd_profile_is_quiet_but_keeps_other_lines(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = torch.nn.Linear(16, 16)
    made_before = [torch.randn(512) for _ in range(3)]

    def step() -> Any:
        if made_before:
            del made_before[0]  # freed inside the capture: the CPUAllocator warning
        os.write(2, b"user step says hello\n")
        model(torch.randn(4, 16)).sum().backward()

    profile(step, steps=2, warmup=1, trace_dir=tmp_path)
    err = capfd.readouterr().err
    assert "user step says hello" in err
    assert "profiler_start" not in err
    assert "Memory block of unknown size" not in err


def test_cpu_peak_memory_is_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    made_before = [torch.randn(512) for _ in range(3)]

    def step() -> None:
        made_before.clear()
        torch.ones(1024).sum()

    peak = measure_peak_memory(step, device_type="cpu")
    assert peak.method
    err = capfd.readouterr().err
    assert "USDT" not in err
    assert "Memory block of unknown size" not in err


def test_a_message_after_a_progress_bar_on_the_same_line_goes_and_the_bar_stays() -> None:
    # tqdm ends its line with \r, not \n: Kineto's message lands right after the bar's text.
    bar = "\rdemo profile:  67%|######6   | 2/3 [00:02<00:01,  1.06s/it]   "
    text = f"{bar}{USDT_LINE.replace('start', 'stop')}\n{ALLOCATOR_LINE}\nreal error\n"
    assert without_harmless(text) == f"{bar}\nreal error\n"
    assert is_harmless(USDT_LINE + "\n")
    assert not is_harmless(bar + USDT_LINE)
