"""Which NVML device is which CUDA index: by UUID and CUDA_VISIBLE_DEVICES, never by index."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpudiag._values import digits
from gpudiag.probe.cuda import normalize_uuid
from gpudiag.probe.model import GpuInfo


@dataclass(frozen=True, slots=True)
class CudaMapping:
    """NVML index -> CUDA index, and how sure we are of it."""

    cuda_index: Mapping[int, int]
    method: (
        str  # "uuid (torch.cuda)", "uuid (CUDA_VISIBLE_DEVICES)", "pci order", "assumed pci order"
    )
    note: str = ""


def parse_visible_devices(value: str | None) -> list[str] | None:
    """Entries of CUDA_VISIBLE_DEVICES; None when unset (all devices visible).

    Like the CUDA runtime, parsing stops at the first invalid entry and "-1" hides everything.
    """
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            break
        if digits(entry.lstrip("-")):
            if int(entry) < 0:
                break
            entries.append(str(int(entry)))
        elif entry.upper().startswith(("GPU-", "MIG-")):
            entries.append(entry)
        else:
            break
    return entries


def _uuid_key(uuid: str) -> str:
    return normalize_uuid(uuid).lower()


def _cuda_order(infos: Sequence[GpuInfo], device_order: str | None) -> tuple[list[int], str, str]:
    """NVML indices in the order CUDA enumerates them, with the method and a caveat."""
    by_pci = [i.index for i in infos]  # NVML enumerates in PCI bus order
    if (device_order or "").upper() == "PCI_BUS_ID":
        return by_pci, "pci order (CUDA_DEVICE_ORDER=PCI_BUS_ID)", ""
    names = {str(i.name.get("")) for i in infos}
    if len(names) <= 1:
        # FASTEST_FIRST ties between identical GPUs are broken by PCI bus id.
        return by_pci, "pci order (identical GPUs)", ""
    return (
        by_pci,
        "assumed pci order",
        "mixed GPU models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA puts the fastest first, "
        "so CUDA indices are exact only once torch.cuda is initialised "
        "(or set CUDA_DEVICE_ORDER=PCI_BUS_ID)",
    )


def match_cuda_indices(
    infos: Sequence[GpuInfo],
    *,
    env: Mapping[str, str],
    torch_uuids: Sequence[str] | None = None,
) -> CudaMapping:
    """Match NVML devices to CUDA indices.

    ``torch_uuids`` (from ``torch.cuda.get_device_properties(i).uuid`` in CUDA index order) is
    exact and wins; otherwise CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER are interpreted the way
    the CUDA runtime does.
    """
    by_uuid = {_uuid_key(str(i.uuid.value)): i.index for i in infos if i.uuid.ok}
    if torch_uuids is not None:
        mapping = {
            by_uuid[_uuid_key(u)]: cuda_idx
            for cuda_idx, u in enumerate(torch_uuids)
            if _uuid_key(u) in by_uuid
        }
        return CudaMapping(mapping, "uuid (torch.cuda)")

    order, method, note = _cuda_order(infos, env.get("CUDA_DEVICE_ORDER"))
    entries = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if entries is None:
        return CudaMapping({nvml: cuda for cuda, nvml in enumerate(order)}, method, note)
    visible: dict[int, int] = {}
    used_uuid = False
    for entry in entries:
        if digits(entry):
            position = int(entry)
            if position >= len(order):
                break  # CUDA stops at the first entry that names no device
            nvml = order[position]
        elif entry.upper().startswith("GPU-"):
            used_uuid = True
            # CUDA accepts any unique prefix of a UUID.
            hits = [idx for key, idx in by_uuid.items() if key.startswith(_uuid_key(entry))]
            if len(hits) != 1:
                break
            nvml = hits[0]
        else:  # MIG-... entries select a MIG instance, not a whole GPU
            continue
        if nvml in visible:
            continue  # named twice: one device
        visible[nvml] = len(visible)
    if used_uuid and all(not digits(e) for e in entries):
        method, note = "uuid (CUDA_VISIBLE_DEVICES)", ""
    return CudaMapping(visible, method, note)
