"""Reading a file a user names: bounded, so ``/dev/zero`` or a 50 GB log cannot exhaust memory.

Every reader of a user's file (a recording, a topology, a config, a log, source code) reads it
through ``read_bytes`` / ``read_text``: a folder or a device is refused by what it is, a file
larger than the reader's cap is refused before it is read (its size from ``stat``), and a pipe
(``--replay <(ssh host nvidia-smi -q -x)``) is read up to the cap and no further. The cap is
per kind of file (a few MiB for a config, more for a recording); ``GPUDIAG_MAX_FILE_MB`` raises
every cap for a file that really is that large, and each reader takes ``max_bytes=``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from gpudiag._values import MAX_DEPTH, load_json
from gpudiag.errors import GpuDiagError

ErrorType = type[GpuDiagError]
OVERRIDE = "GPUDIAG_MAX_FILE_MB"
MiB = 1 << 20

# The cap of each kind of file: far above the largest real one, far below what exhausts memory.
CONFIG_BYTES = 16 * MiB  # a model config (config.json: a few KiB)
CODE_BYTES = 16 * MiB  # a Python file to scan (the largest in torch is ~1 MiB)
RECORDING_BYTES = 64 * MiB  # `nvidia-smi -q -x` / `-q` / table, a snapshot (8 GPUs: ~200 KiB)
TOPOLOGY_BYTES = 4 * MiB  # `nvidia-smi topo -m` / `-p2p r` (a few KiB)
TOPO_XML_BYTES = 16 * MiB  # NCCL_TOPO_DUMP_FILE (tens of KiB)
LOG_BYTES = 64 * MiB  # an nccl-tests log (a few hundred lines)
SESSION_BYTES = 512 * MiB  # a monitor session (JSON lines, ~1 KiB per GPU per tick)


def cap(default_bytes: int) -> int:
    """The cap for a kind of file: its default, or ``GPUDIAG_MAX_FILE_MB`` MiB when set."""
    text = os.environ.get(OVERRIDE, "").strip()
    if text.isascii() and text.isdigit() and int(text) > 0:
        return int(text) * MiB
    return default_bytes


def _size_text(n: int) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n:,} bytes"


def read_bytes(
    path: str | os.PathLike[str],
    what: str,
    *,
    max_bytes: int,
    error: ErrorType = GpuDiagError,
) -> bytes:
    """The bytes of ``path`` (``what`` names it in messages: "nvidia-smi recording"), at most
    ``cap(max_bytes)`` of them; ``error`` for a folder, a device, a missing or unreadable file,
    or one that is larger."""
    p = Path(path)
    limit = cap(max_bytes)
    try:
        info = p.stat()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {p} is a folder: name the file inside it")
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        raise error(f"{what} {p} is a device, not a file")
    too_big = (
        f"{what} {p} is larger than {_size_text(limit)}, more than such a file holds; if it "
        f"really is one, raise the limit with {OVERRIDE}=<MiB>"
    )
    if stat.S_ISREG(info.st_mode) and info.st_size > limit:
        raise error(too_big)
    try:
        with p.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise error(too_big)
    return data


def read_text(
    path: str | os.PathLike[str],
    what: str,
    *,
    max_bytes: int,
    error: ErrorType = GpuDiagError,
    replace: bool = False,
) -> str:
    """``read_bytes`` decoded as UTF-8: undecodable bytes are ``error`` (or replaced with
    ``replace``, for tools' logs that may hold a stray byte), and so is a NUL byte, which no
    text file of these kinds holds (a binary file given by mistake)."""
    data = read_bytes(path, what, max_bytes=max_bytes, error=error)
    if b"\0" in data[:65536]:
        raise error(f"{what} {path} is a binary file (it holds NUL bytes), not text")
    try:
        return data.decode("utf-8", errors="replace" if replace else "strict")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_json(
    path: str | os.PathLike[str],
    what: str,
    *,
    max_bytes: int,
    error: ErrorType = GpuDiagError,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """A JSON file: bounded (``read_text``), then decoded with ``NaN`` / ``Infinity`` refused
    and nesting deeper than ``max_depth`` refused (gpudiag._values.load_json)."""
    text = read_text(path, what, max_bytes=max_bytes, error=error)
    return load_json(text, f"{what} {path}", limit=max_depth, error=error)


__all__ = ["OVERRIDE", "MiB", "cap", "read_bytes", "read_json", "read_text"]
