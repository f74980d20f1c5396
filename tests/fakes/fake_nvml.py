"""A stand-in for nvidia-ml-py's ``pynvml`` module, fed from real ``nvidia-smi -q -x`` dumps.

It follows the real bindings' contract: the same function names and argument order, the real
ctypes structs and constants, and the real ``NVMLError_*`` classes (taken from the installed
nvidia-ml-py, which imports fine without a driver). Values come straight from the XML with a
reader of its own, independent of gpudiag's parser, so tests can check one against the other.

Knobs reproduce failure modes seen on real machines: an init error (no library, driver not
loaded, version mismatch), a GPU lost at handle time, functions the driver lacks, per-function
errors, every query failing, and sentinel values.

Topology comes from recorded ``nvidia-smi topo -m`` (and ``topo -p2p r``) text: pair paths,
NVLinks (to the peer GPU, or to NVSwitches when every pair shows the same NV# on a board of
more than two GPUs), P2P status, CPU and NUMA affinity. Without such a recording the topology
calls raise NOT_SUPPORTED, as on a single-GPU board. ``gpu_count`` copies the last recorded GPU
(new UUID and PCI bus id) until the machine has that many, for multi-GPU topologies.
"""

from __future__ import annotations

import copy
import ctypes
import re
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pynvml as real

MIB = 1 << 20

# Compute capability is not in nvidia-smi -q output; real NVML knows it. Facts per board.
COMPUTE_CAPABILITY = {
    "A100": (8, 0),
    "A10G": (8, 6),
    "T4": (7, 5),
    "RTX 3060": (8, 6),
    "RTX 3080": (8, 6),
    "RTX 3090": (8, 6),
    "RTX 2070": (7, 5),
    "RTX 2080": (7, 5),
    "RTX A5000": (8, 6),
    "RTX 4000 SFF Ada": (8, 9),
    "PRO 6000 Blackwell": (12, 0),
    "GTX 1660 Ti": (7, 5),
    "Graphics Device": (7, 5),
    "GTX 1070 Ti": (6, 1),
    "GT 1030": (6, 1),
    "P2000": (6, 1),
    "P400": (6, 1),
    "P4": (6, 1),
}

ARCH = {
    "Pascal": real.NVML_DEVICE_ARCH_PASCAL,
    "Volta": real.NVML_DEVICE_ARCH_VOLTA,
    "Turing": real.NVML_DEVICE_ARCH_TURING,
    "Ampere": real.NVML_DEVICE_ARCH_AMPERE,
    "Ada Lovelace": real.NVML_DEVICE_ARCH_ADA,
    "Hopper": real.NVML_DEVICE_ARCH_HOPPER,
    "Blackwell": real.NVML_DEVICE_ARCH_BLACKWELL,
}

REASON_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


def _err(code: int) -> Exception:
    return real.NVMLError(code)


# topo -m link label -> nvmlGpuTopologyLevel_t, and topo -p2p code -> nvmlGpuP2PStatus_t.
TOPOLOGY_LEVELS = {
    "PIX": real.NVML_TOPOLOGY_SINGLE,
    "PXB": real.NVML_TOPOLOGY_MULTIPLE,
    "PHB": real.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": real.NVML_TOPOLOGY_NODE,
    "SYS": real.NVML_TOPOLOGY_SYSTEM,
}
P2P_STATUS = {
    "OK": real.NVML_P2P_STATUS_OK,
    "CNS": real.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
    "GNS": real.NVML_P2P_STATUS_GPU_NOT_SUPPORTED,
    "TNS": real.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
    "DR": real.NVML_P2P_STATUS_DISABLED_BY_REGKEY,
    "NS": real.NVML_P2P_STATUS_NOT_SUPPORTED,
    "U": real.NVML_P2P_STATUS_UNKNOWN,
}


def read_matrix(path: str | Path) -> dict[str, dict[str, str]]:
    """Rows of a recorded nvidia-smi matrix: row name -> {column name: cell}, split on spaces."""
    lines = Path(path).read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if "GPU0" in line.split())
    header = lines[start]
    for words in ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID"):
        header = header.replace(words, words.replace(" ", "-"))
    columns = header.split()
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if not cells or cells[0] not in columns:
            break
        rows[cells[0]] = dict(zip(columns, cells[1:], strict=False))
    return rows


def _id_list(text: str) -> list[int]:
    ids: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    return ids


def _bitmask(ids: list[int], words: int) -> Any:
    mask = (ctypes.c_ulonglong * words)()
    for n in ids:
        if n // 64 < words:
            mask[n // 64] |= 1 << (n % 64)
    return mask


class _Handle:
    """Opaque device handle, like ctypes' c_nvmlDevice_t."""

    def __init__(self, el: ET.Element, index: int, mig: bool = False) -> None:
        self.el, self.index, self.mig = el, index, mig


def _text(el: ET.Element, path: str) -> str:
    node = el.find(path)
    if node is None or node.text is None:
        raise _err(real.NVML_ERROR_NOT_SUPPORTED)
    text = node.text.strip()
    if text in ("N/A", "[N/A]", "") or text.startswith("Requested functionality"):
        raise _err(real.NVML_ERROR_NOT_SUPPORTED)
    return text


def _num(el: ET.Element, *paths: str) -> float:
    last: Exception = _err(real.NVML_ERROR_NOT_SUPPORTED)
    for path in paths:
        try:
            return float(re.match(r"-?\d+(\.\d+)?", _text(el, path)).group(0))  # type: ignore[union-attr]
        except real.NVMLError as exc:
            last = exc
    raise last


class FakeNvml(types.ModuleType):
    """``FakeNvml(xml_path)`` behaves like ``import pynvml`` on the recorded machine."""

    def __init__(
        self,
        xml_path: str | Path,
        *,
        init_error: int | None = None,
        handle_errors: dict[int, int] | None = None,
        driver_lacks: frozenset[str] = frozenset(),
        function_errors: dict[str, int] | None = None,
        every_query_raises: int | None = None,
        overrides: dict[str, Any] | None = None,
        topology: str | Path | None = None,
        p2p: str | Path | None = None,
        gpu_count: int | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.__file__ = real.__file__
        for name in dir(real):  # constants, structs and error classes, exactly as the real ones
            if name.startswith(("NVML", "nvmlClocks", "c_nvml", "nvmlMemory_v2", "nvmlPciInfo_t")):
                setattr(self, name, getattr(real, name))
        self.root = ET.parse(xml_path).getroot()
        self.gpus = self.root.findall("gpu")
        self.topo = read_matrix(topology) if topology is not None else {}
        self.p2p = read_matrix(p2p) if p2p is not None else {}
        while len(self.gpus) < (gpu_count or len(self.topo) or len(self.p2p)):
            self.gpus.append(self._copy_gpu(self.gpus[-1], len(self.gpus)))
        self.nvlinks = self._nvlink_table()
        self.init_error = init_error
        self.handle_errors = handle_errors or {}
        self.driver_lacks = driver_lacks
        self.function_errors = function_errors or {}
        self.every_query_raises = every_query_raises
        self.overrides = overrides or {}
        self.initialised = False
        self.calls: list[str] = []
        for name in dir(type(self)):
            if name.startswith("_nvml"):
                setattr(self, name[1:], self._wrap(name[1:], getattr(self, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if name in self.driver_lacks:
                raise _err(real.NVML_ERROR_FUNCTION_NOT_FOUND)
            if name.startswith(("nvmlDevice", "nvmlSystem")) and not self.initialised:
                raise _err(real.NVML_ERROR_UNINITIALIZED)
            if name in self.function_errors:
                raise _err(self.function_errors[name])
            if (
                self.every_query_raises is not None
                and name.startswith("nvmlDeviceGet")
                and name
                not in (
                    "nvmlDeviceGetCount",
                    "nvmlDeviceGetHandleByIndex",
                )
            ):
                raise _err(self.every_query_raises)
            if name in self.overrides:
                return self.overrides[name](*args, **kwargs)
            return fn(*args, **kwargs)

        call.__name__ = name
        return call

    @staticmethod
    def _copy_gpu(gpu: ET.Element, n: int) -> ET.Element:
        clone = copy.deepcopy(gpu)
        bus = f"00000000:{0x10 * (n + 1):02X}:00.0"
        clone.set("id", bus)
        for path, text in (
            ("pci/pci_bus_id", bus),
            ("uuid", f"GPU-00000000-0000-0000-0000-{n:012x}"),
        ):
            node = clone.find(path)
            if node is not None:
                node.text = text
        return clone

    def _bus_id(self, index: int) -> str:
        try:
            return _text(self.gpus[index], "pci/pci_bus_id")
        except real.NVMLError:
            return self.gpus[index].get("id", "")

    def _nvlink_table(self) -> dict[int, list[tuple[str, int]]]:
        """Per GPU, each active NVLink's remote (PCI bus id, nvmlNvLinkDeviceType)."""
        counts = {
            (int(row[3:]), int(col[3:])): int(cell[2:])
            for row, cells in self.topo.items()
            if row.startswith("GPU")
            for col, cell in cells.items()
            if col.startswith("GPU") and re.fullmatch(r"NV\d+", cell)
        }
        n = len(self.gpus)
        table: dict[int, list[tuple[str, int]]] = {i: [] for i in range(n)}
        if n > 2 and len(counts) == n * (n - 1) and len(set(counts.values())) == 1:
            links = next(iter(counts.values()))  # NVSwitch board: every link goes to a switch
            for i in table:
                table[i] = [
                    (f"00000000:{0xC0 + k % 6:02X}:00.0", real.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                    for k in range(links)
                ]
            return table
        for (i, j), links in sorted(counts.items()):
            table[i] += [(self._bus_id(j), real.NVML_NVLINK_DEVICE_TYPE_GPU)] * links
        return table

    def _column(self, h: _Handle, column: str) -> str:
        value = self.topo.get(f"GPU{h.index}", {}).get(column, "N/A")
        if value == "N/A":
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        return value

    # -- lifecycle ------------------------------------------------------------------------
    def _nvmlInitWithFlags(self, flags: int) -> None:
        if self.init_error is not None:
            raise _err(self.init_error)
        self.initialised = True

    def _nvmlInit(self) -> None:
        self._nvmlInitWithFlags(0)

    def _nvmlShutdown(self) -> None:
        self.initialised = False

    # -- system -----------------------------------------------------------------------------
    def _nvmlSystemGetDriverVersion(self) -> str:
        return _text(self.root, "driver_version")

    def _nvmlSystemGetCudaDriverVersion(self) -> int:
        major, minor = _text(self.root, "cuda_version").split(".")
        return int(major) * 1000 + int(minor) * 10

    def _nvmlSystemGetNVMLVersion(self) -> str:
        return "12." + _text(self.root, "driver_version")

    def _nvmlSystemGetProcessName(self, pid: int) -> str:
        for gpu in self.gpus:
            for p in gpu.findall("processes/process_info"):
                if int(_text(p, "pid")) == pid:
                    return _text(p, "process_name")
        raise _err(real.NVML_ERROR_NOT_FOUND)

    # -- devices ----------------------------------------------------------------------------
    def _nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if index in self.handle_errors:
            raise _err(self.handle_errors[index])
        if not 0 <= index < len(self.gpus):
            raise _err(real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self.gpus[index], index)

    def _nvmlDeviceGetName(self, h: _Handle) -> str:
        return _text(h.el, "product_name")

    def _nvmlDeviceGetUUID(self, h: _Handle) -> str:
        if h.mig:
            return f"MIG-fake-{h.index}"
        return _text(h.el, "uuid")

    def _nvmlDeviceGetPciInfo(self, h: _Handle) -> Any:
        pci = real.nvmlPciInfo_t()
        try:
            bus = _text(h.el, "pci/pci_bus_id")
        except real.NVMLError:
            bus = h.el.get("id", "")
        pci.busId = bus.encode()
        return pci

    def _nvmlDeviceGetArchitecture(self, h: _Handle) -> int:
        return ARCH.get(_text(h.el, "product_architecture"), real.NVML_DEVICE_ARCH_UNKNOWN)

    def _nvmlDeviceGetCudaComputeCapability(self, h: _Handle) -> tuple[int, int]:
        name = _text(h.el, "product_name")
        for key, cc in COMPUTE_CAPABILITY.items():
            if key in name:
                return cc
        raise _err(real.NVML_ERROR_UNKNOWN)

    def _nvmlDeviceGetAttributes(self, h: _Handle) -> Any:
        if not h.mig:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        attrs = real.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = int(_num(h.el, "device_attributes/shared/multiprocessor_count"))
        attrs.memorySizeMB = int(_num(h.el, "fb_memory_usage/total"))
        return attrs

    def _nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> Any:
        total = int(_num(h.el, "fb_memory_usage/total")) * MIB
        used = int(_num(h.el, "fb_memory_usage/used")) * MIB
        free = int(_num(h.el, "fb_memory_usage/free")) * MIB
        if version:
            mem = real.c_nvmlMemory_v2_t()
            mem.version = version
            try:
                mem.reserved = int(_num(h.el, "fb_memory_usage/reserved")) * MIB
            except real.NVMLError:
                mem.reserved = total - used - free
            mem.total, mem.free, mem.used = total, free, used
            return mem
        mem = real.c_nvmlMemory_t()
        mem.total, mem.free, mem.used = total, free, total - free  # v1 counts reserved as used
        return mem

    def _nvmlDeviceGetMemoryBusWidth(self, h: _Handle) -> int:
        raise _err(real.NVML_ERROR_NOT_SUPPORTED)  # not in nvidia-smi -q: unknown to the fake

    def _nvmlDeviceGetMaxClockInfo(self, h: _Handle, clock: int) -> int:
        tag = {real.NVML_CLOCK_SM: "sm_clock", real.NVML_CLOCK_MEM: "mem_clock"}[clock]
        return int(_num(h.el, f"max_clocks/{tag}"))

    def _nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        tag = {real.NVML_CLOCK_SM: "sm_clock", real.NVML_CLOCK_MEM: "mem_clock"}[clock]
        return int(_num(h.el, f"clocks/{tag}"))

    def _nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        watts = _num(
            h.el,
            "gpu_power_readings/current_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/current_power_limit",
            "power_readings/power_limit",
        )
        return round(watts * 1000)

    def _nvmlDeviceGetPowerManagementLimit(self, h: _Handle) -> int:
        watts = _num(
            h.el, "gpu_power_readings/requested_power_limit", "power_readings/requested_power_limit"
        )
        return round(watts * 1000)

    def _nvmlDeviceGetPowerManagementDefaultLimit(self, h: _Handle) -> int:
        watts = _num(
            h.el, "gpu_power_readings/default_power_limit", "power_readings/default_power_limit"
        )
        return round(watts * 1000)

    def _nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        watts = _num(
            h.el,
            "gpu_power_readings/instant_power_draw",
            "gpu_power_readings/power_draw",
            "power_readings/instant_power_draw",
            "power_readings/power_draw",
        )
        return round(watts * 1000)

    def _nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return int(_num(h.el, "temperature/gpu_temp"))

    def _enabled(self, h: _Handle, path: str) -> int:
        return 1 if _text(h.el, path) == "Enabled" else 0

    def _nvmlDeviceGetPersistenceMode(self, h: _Handle) -> int:
        return self._enabled(h, "persistence_mode")

    def _nvmlDeviceGetEccMode(self, h: _Handle) -> list[int]:
        return [self._enabled(h, "ecc_mode/current_ecc"), self._enabled(h, "ecc_mode/pending_ecc")]

    def _nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        return [self._enabled(h, "mig_mode/current_mig"), self._enabled(h, "mig_mode/pending_mig")]

    def _nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        return 7

    def _nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:
        devices = h.el.findall("mig_devices/mig_device")
        if index >= len(devices):
            raise _err(real.NVML_ERROR_NOT_FOUND)
        return _Handle(devices[index], index, mig=True)

    def _nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        return int(_num(h.el, "gpu_instance_id"))

    def _nvmlDeviceGetComputeInstanceId(self, h: _Handle) -> int:
        return int(_num(h.el, "compute_instance_id"))

    def _link(self, h: _Handle, path: str) -> int:
        return int(_num(h.el, f"pci/pci_gpu_link_info/{path}"))

    def _nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        return self._link(h, "pcie_gen/current_link_gen")

    def _nvmlDeviceGetMaxPcieLinkGeneration(self, h: _Handle) -> int:
        return self._link(h, "pcie_gen/max_link_gen")

    def _nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        return self._link(h, "link_widths/current_link_width")

    def _nvmlDeviceGetMaxPcieLinkWidth(self, h: _Handle) -> int:
        return self._link(h, "link_widths/max_link_width")

    def _link_of(self, h: _Handle, link: int) -> tuple[str, int]:
        links = self.nvlinks.get(h.index, [])
        if not links:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)  # no NVLink on this board
        if not 0 <= link < len(links):
            raise _err(real.NVML_ERROR_INVALID_ARGUMENT)  # past the board's last link
        return links[link]

    def _nvmlDeviceGetNvLinkState(self, h: _Handle, link: int) -> int:
        self._link_of(h, link)
        return real.NVML_FEATURE_ENABLED

    def _nvmlDeviceGetNvLinkRemotePciInfo(self, h: _Handle, link: int) -> Any:
        pci = real.nvmlPciInfo_t()
        pci.busId = self._link_of(h, link)[0].encode()
        return pci

    def _nvmlDeviceGetNvLinkRemoteDeviceType(self, h: _Handle, link: int) -> int:
        return self._link_of(h, link)[1]

    def _nvmlDeviceGetNvLinkVersion(self, h: _Handle, link: int) -> int:
        self._link_of(h, link)
        raise _err(real.NVML_ERROR_NOT_SUPPORTED)  # not in the recordings

    # -- topology ---------------------------------------------------------------------------
    def _nvmlDeviceGetTopologyCommonAncestor(self, h1: _Handle, h2: _Handle) -> int:
        if not self.topo:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        if h1.index == h2.index:
            raise _err(real.NVML_ERROR_INVALID_ARGUMENT)
        cell = self.topo[f"GPU{h1.index}"][f"GPU{h2.index}"]
        if cell.startswith("NV"):
            # topo -m hides the PCIe path of an NVLink pair: same CPUs -> one NUMA node.
            same = self._column(h1, "CPU-Affinity") == self._column(h2, "CPU-Affinity")
            return real.NVML_TOPOLOGY_NODE if same else real.NVML_TOPOLOGY_SYSTEM
        return TOPOLOGY_LEVELS[cell]

    def _nvmlDeviceGetP2PStatus(self, h1: _Handle, h2: _Handle, index: int) -> int:
        if not isinstance(index, int):  # what ctypes says when handed e.g. a tuple
            raise ctypes.ArgumentError(
                "argument 3: TypeError: Don't know how to convert parameter 3"
            )
        if not self.p2p:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        return P2P_STATUS[self.p2p[f"GPU{h1.index}"][f"GPU{h2.index}"]]

    def _nvmlDeviceGetCpuAffinity(self, h: _Handle, cpu_set_size: int) -> Any:
        return _bitmask(_id_list(self._column(h, "CPU-Affinity")), cpu_set_size)

    def _nvmlDeviceGetMemoryAffinity(self, h: _Handle, node_set_size: int, scope: int) -> Any:
        return _bitmask(_id_list(self._column(h, "NUMA-Affinity")), node_set_size)

    def _nvmlDeviceGetNumaNodeId(self, h: _Handle) -> int:
        return int(self._column(h, "GPU-NUMA-ID"))

    def _nvmlDeviceGetVirtualizationMode(self, h: _Handle) -> int:
        mode = _text(h.el, "gpu_virtualization_mode/virtualization_mode")
        return {"None": 0, "Pass-Through": 1, "VGPU": 2}.get(mode, 0)

    def _nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        util = real.c_nvmlUtilization_t()
        util.gpu = int(_num(h.el, "utilization/gpu_util"))
        util.memory = int(_num(h.el, "utilization/memory_util"))
        return util

    def _nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._reasons(h)

    def _nvmlDeviceGetCurrentClocksThrottleReasons(self, h: _Handle) -> int:
        return self._reasons(h)

    def _reasons(self, h: _Handle) -> int:
        node = h.el.find("clocks_event_reasons")
        if node is None:
            node = h.el.find("clocks_throttle_reasons")
        if node is None or len(node) == 0:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        mask = 0
        for child in node:
            name = child.tag.replace("clocks_event_reason_", "").replace(
                "clocks_throttle_reason_", ""
            )
            if (child.text or "").strip() == "Active":
                mask |= REASON_BITS.get(name, 0)
        return mask

    def _nvmlDeviceGetPerformanceState(self, h: _Handle) -> int:
        return int(_text(h.el, "performance_state").lstrip("P"))

    def _nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        tag = "pci/tx_util" if counter == real.NVML_PCIE_UTIL_TX_BYTES else "pci/rx_util"
        return int(_num(h.el, tag))

    def _nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter: int) -> int:
        volatile = h.el.find("ecc_errors/volatile")
        if volatile is None:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        paths = [c.tag for c in volatile if "_uncorrectable" in c.tag] or ["double_bit/total"]
        return sum(int(_num(volatile, p)) for p in paths)

    def _nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        # pynvml returns (correctable rows, uncorrectable rows, is pending, failure occurred).
        def flag(tag: str) -> int:
            return int(_text(h.el, f"remapped_rows/{tag}").lower() == "yes")

        return (
            int(_num(h.el, "remapped_rows/remapped_row_corr")),
            int(_num(h.el, "remapped_rows/remapped_row_unc")),
            flag("remapped_row_pending"),
            flag("remapped_row_failure"),
        )

    def _nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> list[int]:
        tag = "multiple_single_bit_retirement" if cause == 0 else "double_bit_retirement"
        return [0x1000 * i for i in range(int(_num(h.el, f"retired_pages/{tag}/retired_count")))]

    def _procs(self, h: _Handle, kinds: tuple[str, ...]) -> list[Any]:
        node = h.el.find("processes")
        if node is None:
            raise _err(real.NVML_ERROR_NOT_SUPPORTED)
        out = []
        for p in node.findall("process_info"):
            if _text(p, "type") not in kinds:
                continue
            try:
                used: int | None = int(_num(p, "used_memory")) * MIB
            except real.NVMLError:
                used = None  # the bindings turn NVML_VALUE_NOT_AVAILABLE into None
            out.append(
                real.nvmlFriendlyObject(
                    {
                        "pid": int(_text(p, "pid")),
                        "usedGpuMemory": used,
                        "gpuInstanceId": 0xFFFFFFFF,
                        "computeInstanceId": 0xFFFFFFFF,
                    }
                )
            )
        return out

    def _nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[Any]:
        return self._procs(h, ("C", "C+G"))

    def _nvmlDeviceGetGraphicsRunningProcesses(self, h: _Handle) -> list[Any]:
        return self._procs(h, ("G", "C+G"))

    def _nvmlDeviceGetProcessUtilization(self, h: _Handle, last_seen: int) -> list[Any]:
        # `nvidia-smi -q -x` holds no per-process utilization; every recorded GPU is idle
        # (0 %), and an idle GPU has no samples since the last window: NVML_ERROR_NOT_FOUND.
        # Busy cases pass overrides={"nvmlDeviceGetProcessUtilization": ...}.
        raise _err(real.NVML_ERROR_NOT_FOUND)
