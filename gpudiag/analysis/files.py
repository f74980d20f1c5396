"""Opening a user's data file for a bounded read: regular files only, errors that say what to do."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from gpudiag.errors import GpuDiagError

GiB = 1 << 30


def open_regular(path: str | os.PathLike[str], error: type[GpuDiagError], what: str) -> BinaryIO:
    """``path`` opened for reading in binary, when it is a regular file (or a link to one).

    A folder, a FIFO, a socket or a device (``/dev/zero`` never ends, a FIFO may never
    answer) raises ``error`` before anything is read, as do a missing or unreadable file.
    """
    name = os.fspath(path)
    try:
        # Opening a FIFO for reading blocks until a writer appears: look before opening.
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        raise error(f"{what} not found: {name}. Check the path.") from None
    except OSError as exc:
        raise error(f"cannot read {what} {name}: {exc.strerror or exc}.") from None
    if stat.S_ISDIR(mode):
        raise error(f"{name} is a folder, not a {what}: pass the file inside it.")
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        raise error(
            f"{name} is {kind}, not a {what} file: gpudiag reads files whose end it can see. "
            "Save the data to a file first."
        )
    try:
        return open(name, "rb")  # the caller closes it
    except OSError as exc:
        raise error(f"cannot read {what} {name}: {exc.strerror or exc}.") from None


def over_limit(
    error: type[GpuDiagError], name: str, what: str, limit: int, option: str
) -> GpuDiagError:
    """The error for data above a size limit the caller can raise."""
    return error(
        f"{name}: the {what} is more than {limit / GiB:.3g} GiB, gpudiag's limit for one read "
        "(so that a runaway or hostile file cannot keep it reading for hours). If the file is "
        f"what you meant, raise the limit: {option}."
    )
