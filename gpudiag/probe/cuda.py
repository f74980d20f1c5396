"""The only door to ``torch.cuda``: safe on machines without CUDA, never called at import.

Layers above the probe (bench, profiling, experiments, monitor) use these helpers instead of
``torch.cuda`` so that a CPU-only torch build, a missing driver or a lost device gives a clear
answer instead of an AssertionError deep inside torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpudiag.errors import ProbeError


def _torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def available() -> bool:
    """True when torch is installed with CUDA and at least one device is usable."""
    torch = _torch()
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver makes is_available raise on some builds
        return False


def device_count() -> int:
    torch = _torch()
    if torch is None or not available():
        return 0
    return int(torch.cuda.device_count())


def built_with_cuda() -> str | None:
    """The CUDA version torch was built against (``torch.version.cuda``), None on CPU builds."""
    torch = _torch()
    return None if torch is None else getattr(torch.version, "cuda", None)


def _require(device: int | None) -> int:
    if not available():
        raise ProbeError(
            "No CUDA device is usable here (CPU-only torch build or no NVIDIA driver)."
        )
    torch = _torch()
    assert torch is not None
    return torch.cuda.current_device() if device is None else int(device)


@dataclass(frozen=True, slots=True)
class CudaDeviceProperties:
    """What ``torch.cuda.get_device_properties`` says about one visible device."""

    index: int
    name: str
    uuid: str  # "GPU-xxxxxxxx-..." form, to match NVML
    compute_capability: tuple[int, int]
    sm_count: int
    total_memory_bytes: int
    l2_cache_bytes: int | None


def normalize_uuid(uuid: object) -> str:
    """``GPU-``/``MIG-`` prefixed, lower-case UUID text, whatever form it came in."""
    text = str(uuid).strip().lower()
    if text.startswith(("gpu-", "mig-")):
        return text[:3].upper() + text[3:]
    return "GPU-" + text


def device_properties(index: int) -> CudaDeviceProperties:
    torch = _torch()
    _require(index)
    assert torch is not None
    props = torch.cuda.get_device_properties(index)
    return CudaDeviceProperties(
        index=index,
        name=str(props.name),
        uuid=normalize_uuid(getattr(props, "uuid", "")),
        compute_capability=(int(props.major), int(props.minor)),
        sm_count=int(props.multi_processor_count),
        total_memory_bytes=int(props.total_memory),
        l2_cache_bytes=getattr(props, "L2_cache_size", None),
    )


def synchronize(device: int | None = None) -> None:
    """Wait for the device; a no-op where there is no CUDA."""
    if available():
        torch = _torch()
        assert torch is not None
        torch.cuda.synchronize(device)


def memory_allocated(device: int | None = None) -> int:
    if not available():
        return 0
    torch = _torch()
    assert torch is not None
    return int(torch.cuda.memory_allocated(device))


def max_memory_allocated(device: int | None = None) -> int | None:
    """Peak bytes allocated by torch's caching allocator since the last reset; None without CUDA."""
    if not available():
        return None
    torch = _torch()
    assert torch is not None
    return int(torch.cuda.max_memory_allocated(device))


def reset_peak_memory_stats(device: int | None = None) -> None:
    if available():
        torch = _torch()
        assert torch is not None
        torch.cuda.reset_peak_memory_stats(device)


def mem_get_info(device: int | None = None) -> tuple[int, int] | None:
    """(free, total) bytes on the device, None without CUDA."""
    if not available():
        return None
    torch = _torch()
    assert torch is not None
    free, total = torch.cuda.mem_get_info(_require(device))
    return int(free), int(total)


def empty_cache() -> None:
    if available():
        torch = _torch()
        assert torch is not None
        torch.cuda.empty_cache()


def get_rng_states() -> list[Any] | None:
    """Every visible device's RNG state, None without CUDA (nothing to save)."""
    if not available():
        return None
    torch = _torch()
    assert torch is not None
    return list(torch.cuda.get_rng_state_all())


def set_rng_states(states: list[Any] | None) -> None:
    if states is not None and available():
        torch = _torch()
        assert torch is not None
        torch.cuda.set_rng_state_all(states)


def is_oom_error(exc: BaseException) -> bool:
    """True for torch's CUDA out-of-memory error (and its CPU cousin, a failed allocation)."""
    torch = _torch()
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in text or "can't allocate memory" in text or isinstance(exc, MemoryError)
    )


@contextmanager
def device_timer(device: int | None = None) -> Iterator[list[float]]:
    """Time a block in seconds, the result appended to the yielded list on exit.

    On CUDA it records events on the current stream and synchronises on the end event, so the
    time covers the kernels, not just their launch. Elsewhere it reads ``perf_counter``.
    """
    out: list[float] = []
    if available():
        torch = _torch()
        assert torch is not None
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        yield out
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    else:
        t0 = time.perf_counter()
        yield out
        out.append(time.perf_counter() - t0)


def initialized() -> bool:
    """True once torch has initialised CUDA in this process (we never do it behind your back)."""
    torch = _torch()
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def visible_uuids() -> list[str]:
    """UUIDs of the devices torch sees, in CUDA index order (initialises CUDA)."""
    return [device_properties(i).uuid for i in range(device_count())]


def make_graphed_callables(
    fn: Any,
    sample_args: tuple[Any, ...],
    *,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
) -> Any:
    """``torch.cuda.make_graphed_callables`` for one callable (an ``nn.Module`` or a function).

    Runs ``fn`` ``num_warmup_iters`` times on a side stream, then captures its forward and
    its backward as two CUDA graphs, and returns the graphed version: a drop-in replacement
    that takes positional tensors of the shapes, dtypes and ``requires_grad`` of
    ``sample_args`` and whose outputs live in static memory that the next call overwrites.
    For a module, torch gives back the module with an instance ``forward`` that replays the
    graphs while its training mode is the captured one. A module's parameters are graph
    inputs too; it must have no hooks, and no buffer may require grad. Under autocast the
    autocast cache must be off (``torch.autocast(..., cache_enabled=False)``).
    Raises ProbeError where CUDA is not usable.

    PyTorch docs: ``torch.cuda.make_graphed_callables``
    (https://pytorch.org/docs/stable/generated/torch.cuda.make_graphed_callables.html) and
    "CUDA semantics", "CUDA Graphs", "Partial-network capture"
    (https://pytorch.org/docs/stable/notes/cuda.html#partial-network-capture).
    """
    if not available():
        raise ProbeError(
            "CUDA graphs need a usable CUDA device (this is a CPU-only torch build or there "
            "is no NVIDIA driver)."
        )
    torch = _torch()
    assert torch is not None
    return torch.cuda.make_graphed_callables(
        fn,
        tuple(sample_args),
        num_warmup_iters=num_warmup_iters,
        allow_unused_input=allow_unused_input,
    )
