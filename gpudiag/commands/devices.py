"""Device lists as the monitor's ``--devices`` takes them: NVML indices or UUIDs."""

from __future__ import annotations

import re

from gpudiag._values import digits
from gpudiag.errors import ArgumentError

_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/\-]{1,80}")


def parse_devices(text: str | None) -> list[int | str] | None:
    """``"0,GPU-8a1c..."`` -> ``[0, "GPU-8a1c..."]``; None or empty text means every device.
    An entry is an NVML index in ASCII digits or a GPU / MIG UUID; anything else is an
    ArgumentError naming it."""
    if not text:
        return None
    out: list[int | str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if digits(entry) and len(entry) <= 4:
            out.append(int(entry))
        elif _UUID.fullmatch(entry):
            out.append(entry)
        else:
            raise ArgumentError(
                f"--devices entry {entry[:40]!r} is neither an NVML index (ASCII digits, as "
                "`nvidia-smi -L` numbers the GPUs) nor a GPU or MIG UUID (GPU-..., MIG-...)"
            )
    return out
