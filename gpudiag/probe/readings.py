"""A reading is a value plus why it may be missing: "not available" is data, not an exception."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
D = TypeVar("D")


class Status(str, enum.Enum):
    """Why a reading has (or lacks) a value. The string values are stable (JSON snapshots)."""

    OK = "ok"
    NOT_SUPPORTED = "not_supported"  # the device or driver cannot report it
    NOT_AVAILABLE = "not_available"  # exists, but has no value now (sentinel, MIG, vGPU)
    NO_PERMISSION = "no_permission"  # needs root or a module parameter
    GPU_LOST = "gpu_lost"  # fell off the bus / needs a reset
    NOT_FOUND = "not_found"  # device, library or driver absent
    DRIVER_TOO_OLD = "driver_too_old"  # the bindings know a function the driver lacks
    UNKNOWN = "unknown"  # any other failure; the reason says what it was


@dataclass(frozen=True, slots=True)
class Reading(Generic[T]):
    """One value read from the hardware, with its status and, when missing, the reason.

    ``value`` is ``None`` unless ``status`` is OK. ``source`` names where it came from
    ("nvml", "nvidia-smi xml", "torch", "specs", "host", "replay") so evidence can cite it.
    """

    value: T | None
    status: Status = Status.OK
    reason: str = ""
    source: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @overload
    def get(self) -> T | None: ...
    @overload
    def get(self, default: D) -> T | D: ...
    def get(self, default: Any = None) -> Any:
        """The value, or ``default`` when the reading is N/A (typed: ``T | None`` without one)."""
        return self.value if self.status is Status.OK else default

    def display(self, unit: str = "", fmt: str = "{}") -> str:
        """Human text: the formatted value with its unit, or "N/A (reason)"."""
        if self.status is not Status.OK:
            return f"N/A ({self.reason or self.status.value})"
        text = fmt.format(self.value)
        return f"{text} {unit}".rstrip() if unit else text

    def to_dict(self) -> dict[str, Any]:
        from gpudiag._report import jsonable

        out: dict[str, Any] = {"value": jsonable(self.value), "status": self.status.value}
        if self.reason:
            out["reason"] = self.reason
        if self.source:
            out["source"] = self.source
        return out

    @staticmethod
    def from_dict(data: Any) -> Reading[Any]:
        """Inverse of ``to_dict`` (JSON snapshots). A bare value is read as OK."""
        if not isinstance(data, dict) or "status" not in data:
            return Reading(data, Status.OK, source="replay")
        value = data.get("value")
        if isinstance(value, list):
            value = tuple(value)
        status = Status(data["status"])
        return Reading(value, status, data.get("reason", ""), data.get("source", ""))

    def __repr__(self) -> str:
        if self.status is Status.OK:
            return f"Reading({self.value!r})"
        return f"Reading(N/A: {self.status.value}: {self.reason})"


def ok(value: T, source: str = "") -> Reading[T]:
    return Reading(value, Status.OK, "", source)


def na(status: Status, reason: str, source: str = "") -> Reading[Any]:
    return Reading(None, status, reason, source)
