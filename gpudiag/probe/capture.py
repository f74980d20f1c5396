"""Raw output of the machine's own tools, kept as it was printed: ``nvidia-smi`` and torch's
CUDA memory snapshot. ``gpudiag record`` writes these into a recording; N/A keeps the reason."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag.probe import cuda
from gpudiag.probe.readings import Reading, Status, na, ok

SOURCE_SMI = "nvidia-smi"
SOURCE_SNAPSHOT = "torch.cuda.memory"


def nvidia_smi(*args: str, timeout_s: float = 120.0) -> Reading[str]:
    """``nvidia-smi ARGS`` stdout; N/A when the tool is missing, fails or hangs."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return na(
            Status.NOT_FOUND,
            "nvidia-smi is not on PATH: no NVIDIA driver on this machine",
            SOURCE_SMI,
        )
    command = " ".join(["nvidia-smi", *args])
    try:
        done = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return na(Status.UNKNOWN, f"`{command}` did not answer within {timeout_s:g} s", SOURCE_SMI)
    except OSError as exc:
        return na(Status.UNKNOWN, f"`{command}` could not start: {exc}", SOURCE_SMI)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        why = said[0] if said else f"exit code {done.returncode}"
        return na(Status.UNKNOWN, f"`{command}` failed: {why}", SOURCE_SMI)
    return ok(done.stdout, SOURCE_SMI)


def cuda_memory_snapshot(
    path: str | Path, fn: Callable[[], Any], *, max_entries: int = 100_000
) -> Reading[int]:
    """Run ``fn`` with torch's allocator history on and dump the snapshot pickle to ``path``
    (``torch.cuda.memory._dump_snapshot``, what https://pytorch.org/memory_viz reads).
    The size in bytes, or N/A without CUDA."""
    if not cuda.available():
        return na(
            Status.NOT_FOUND, "needs a CUDA GPU (torch.cuda is not available)", SOURCE_SNAPSHOT
        )
    import torch

    memory: Any = torch.cuda.memory
    try:
        memory._record_memory_history(max_entries=max_entries)
    except (AttributeError, RuntimeError) as exc:
        return na(
            Status.NOT_SUPPORTED, f"this torch cannot record memory history: {exc}", SOURCE_SNAPSHOT
        )
    try:
        fn()
        memory._dump_snapshot(str(path))
    finally:
        memory._record_memory_history(enabled=None)
    return ok(Path(path).stat().st_size, SOURCE_SNAPSHOT)


def cuda_memory_history(fn: Callable[[], Any], *, max_entries: int = 1_000_000) -> Reading[Any]:
    """Run ``fn`` with the allocator's history on and return ``torch.cuda.memory._snapshot()``
    (segments, blocks and the history's alloc/free entries with their stacks: what torch's
    notice deprecating ``export_memory_timeline`` points to). N/A without CUDA or when this
    torch cannot record history; ``fn``'s own errors propagate (the history is switched off)."""
    if not cuda.available():
        return na(
            Status.NOT_FOUND, "needs a CUDA GPU (torch.cuda is not available)", SOURCE_SNAPSHOT
        )
    import torch

    memory: Any = torch.cuda.memory
    if not hasattr(memory, "_snapshot"):
        return na(Status.NOT_SUPPORTED, "this torch has no memory._snapshot", SOURCE_SNAPSHOT)
    try:
        memory._record_memory_history(max_entries=max_entries)
    except (AttributeError, RuntimeError) as exc:
        return na(
            Status.NOT_SUPPORTED, f"this torch cannot record memory history: {exc}", SOURCE_SNAPSHOT
        )
    try:
        fn()
        snapshot = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    return ok(snapshot, SOURCE_SNAPSHOT)
