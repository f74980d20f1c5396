"""The CUDA caching allocator's counters and snapshot, read through torch.cuda (GPU only).

``allocator_stats`` reads ``torch.cuda.memory_stats()`` (the same counters as
``torch.cuda.memory_summary()``); ``allocator_snapshot`` returns ``torch.cuda.memory._snapshot()``
(what ``_dump_snapshot`` pickles). Both return None without CUDA. Written against torch's
documented key names and tested with a fake of ``torch.cuda``: untested on a real GPU here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudiag.probe import cuda


@dataclass(frozen=True)
class AllocatorStats:
    """Counters of torch's CUDA caching allocator for one device, in bytes and counts."""

    allocated_bytes: int  # live tensors now ("allocated_bytes.all.current")
    reserved_bytes: int  # held from the driver ("reserved_bytes.all.current")
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    active_bytes: int
    inactive_split_bytes: int  # free pieces of split blocks: fragmentation
    num_alloc_retries: int  # cudaMalloc failed, cache flushed, retried: a near-OOM
    num_ooms: int

    @property
    def reserved_unused_bytes(self) -> int:
        return max(0, self.reserved_bytes - self.allocated_bytes)


def allocator_stats(device: int | None = None) -> AllocatorStats | None:
    """The device's allocator counters (``torch.cuda.memory_stats``); None without CUDA."""
    if not cuda.available():
        return None
    import torch

    stats: dict[str, Any] = dict(torch.cuda.memory_stats(device))

    def get(key: str) -> int:
        return int(stats.get(key, 0) or 0)

    return AllocatorStats(
        allocated_bytes=get("allocated_bytes.all.current"),
        reserved_bytes=get("reserved_bytes.all.current"),
        peak_allocated_bytes=get("allocated_bytes.all.peak"),
        peak_reserved_bytes=get("reserved_bytes.all.peak"),
        active_bytes=get("active_bytes.all.current"),
        inactive_split_bytes=get("inactive_split_bytes.all.current"),
        num_alloc_retries=get("num_alloc_retries"),
        num_ooms=get("num_ooms"),
    )


def allocator_snapshot() -> dict[str, Any] | None:
    """``torch.cuda.memory._snapshot()`` (segments, blocks, trace); None without CUDA."""
    if not cuda.available():
        return None
    import torch

    return dict(torch.cuda.memory._snapshot())
