"""Keep torch.profiler's harmless C++ chatter off stderr while gpudiag captures a profile.

PyTorch's profiler writes to file descriptor 2 from C++ (so ``contextlib.redirect_stderr``
cannot catch it): ``USDT: ... profiler_start`` / ``profiler_stop`` on every capture, and
``CPUAllocator.cpp ... Memory block of unknown size was allocated before the profiling
started`` whenever a tensor made before the capture is freed inside it. In JupyterLab each
becomes a red box above the result although nothing is wrong. :func:`quiet_profiler_stderr`
points fd 2 at a temporary file for the capture, then writes back every line that is *not*
one of those known messages, so a real error or warning printed meanwhile still shows.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

# Messages torch's profiler prints on every healthy capture (torch 2.4 to 2.13). Each is
# matched wherever it starts: a progress bar's line (written with \r, no newline) may precede it.
HARMLESS_PATTERNS: tuple[re.Pattern[str], ...] = (
    # Kineto's tracepoints: "USDT:2026-11-24 00:32:29 8648:8648 Sync...cpp:52] profiler_start"
    re.compile(r"USDT:\S* \S+ \d+:\d+ \S+\] profiler_(start|stop)[ \t]*"),
    # "[W1124 ...CPUAllocator.cpp:245] Memory block of unknown size was allocated before ..."
    re.compile(r"\[W\d+ [^\]\n]*CPUAllocator\.cpp:\d+\] Memory block of unknown size[^\n]*"),
    # Older Kineto: "STAGE:2024-01-01 ... ActivityProfilerController.cpp:314] Completed Stage: ..."
    re.compile(
        r"STAGE:\S* \S+ \d+:\d+ ActivityProfilerController\.cpp:\d+\] Completed Stage[^\n]*"
    ),
)

_lock = threading.Lock()
_depth = 0


def without_harmless(text: str) -> str:
    """``text`` with the profiler's known messages taken out; a line left empty by that goes."""
    kept = []
    for line in re.split(r"(?<=\n)", text):
        cleaned = line
        for pattern in HARMLESS_PATTERNS:
            cleaned = pattern.sub("", cleaned)
        if cleaned == line or cleaned.strip():
            kept.append(cleaned)
    return "".join(kept)


def is_harmless(line: str) -> bool:
    """True for a line that is nothing but the profiler's known, harmless messages."""
    return bool(line.strip()) and not without_harmless(line).strip()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


@contextlib.contextmanager
def quiet_profiler_stderr() -> Iterator[None]:
    """Hold back the profiler's harmless stderr lines for the block; pass every other line on.

    Nested uses share the outermost redirection. When fd 2 cannot be redirected (no such
    descriptor, a sandbox that forbids ``dup``), the block runs with stderr untouched.
    """
    global _depth
    with _lock:
        outer = _depth == 0
        _depth += 1
    try:
        if not outer:
            yield
            return
        with tempfile.TemporaryFile(mode="w+b") as capture:
            _flush()
            try:
                saved = os.dup(2)
            except OSError:
                yield
                return
            try:
                os.dup2(capture.fileno(), 2)
                yield
            finally:
                _flush()
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                _reemit(capture.read().decode("utf-8", errors="replace"))
    finally:
        with _lock:
            _depth -= 1


def _reemit(text: str) -> None:
    kept = without_harmless(text)
    if kept:
        sys.stderr.write(kept)
        with contextlib.suppress(Exception):
            sys.stderr.flush()
