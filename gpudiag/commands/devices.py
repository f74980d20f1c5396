"""Device lists as the monitor's ``--devices`` takes them: NVML indices or UUIDs."""

from __future__ import annotations


def parse_devices(text: str | None) -> list[int | str] | None:
    """``"0,GPU-8a1c..."`` -> ``[0, "GPU-8a1c..."]``; None or empty text means every device."""
    if not text:
        return None
    return [int(d) if d.strip().isdigit() else d.strip() for d in text.split(",") if d.strip()]
