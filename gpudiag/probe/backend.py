"""Where GPU readings come from: live NVML, a recorded machine, or nothing at all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gpudiag.probe.model import DriverInfo, GpuInfo, GpuState
from gpudiag.probe.readings import Reading, Status, na, ok

if TYPE_CHECKING:
    from gpudiag.probe.nvml import NvmlSession


@runtime_checkable
class Backend(Protocol):
    """A source of GPU facts and states.

    ``label`` says where the data comes from ("NVML", "recording: a100.xml");
    ``is_recording`` is True for replayed data, so every report can say so.
    """

    label: str
    is_recording: bool

    def gpu_count(self) -> Reading[int]:
        """How many GPUs; N/A with the reason when none can be seen (no driver, no library)."""
        ...

    def driver(self) -> DriverInfo: ...

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        """Static facts, one per GPU, read once and cached by the backend."""
        ...

    def sample(self) -> tuple[GpuState, ...]:
        """One refresh of every GPU: one pass, one timestamp shared by all fields of a device."""
        ...

    def close(self) -> None: ...


class NullBackend:
    """No GPU can be seen; every answer carries the reason."""

    is_recording = False

    def __init__(self, reason: str, status: Status = Status.NOT_FOUND) -> None:
        self.label = "this machine"
        self._reason = reason
        self._status = status

    @property
    def reason(self) -> str:
        return self._reason

    def gpu_count(self) -> Reading[int]:
        return na(self._status, self._reason, "nvml")

    def driver(self) -> DriverInfo:
        missing = na(self._status, self._reason, "nvml")
        return DriverInfo(driver_version=missing, cuda_driver_version=missing, nvml_version=missing)

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return ()

    def sample(self) -> tuple[GpuState, ...]:
        return ()

    def close(self) -> None:
        return None


def default_backend(session: NvmlSession | None = None, *, light: bool = False) -> Backend:
    """The live NVML backend when NVML answers, else a NullBackend saying why not.

    ``light`` makes ``sample()`` skip the slow calls (PCIe throughput, processes, ECC) for
    high-rate sampling.
    """
    from gpudiag.probe.nvml import NvmlSession
    from gpudiag.probe.nvml_backend import NvmlBackend

    session = session or NvmlSession.shared()
    count = session.device_count()
    if not count.ok:
        return NullBackend(f"no NVIDIA GPU: {count.reason}", count.status)
    if count.value == 0:
        return NullBackend("no NVIDIA GPU: the driver sees 0 devices", Status.NOT_FOUND)
    return NvmlBackend(session, light=light)


__all__ = ["Backend", "NullBackend", "default_backend", "ok"]
