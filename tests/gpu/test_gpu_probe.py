"""The hardware layer on a real GPU: NVML against nvidia-smi read in the same run, the text
replay against the XML, MIG / GPM / DCGM where present, torch's UUID mapping, CUDA events,
memory statistics and a memory snapshot."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag.probe import cuda
from gpudiag.probe.backend import default_backend
from gpudiag.probe.cuda import normalize_uuid
from gpudiag.probe.smi_text import parse_smi_text
from gpudiag.probe.smi_xml import SmiRecording, parse_smi_xml

pytestmark = pytest.mark.gpu
MIB = 1 << 20


def _smi(*args: str) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("N/A: nvidia-smi is not on PATH")
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout


def _xml() -> SmiRecording:
    return parse_smi_xml(_smi("-q", "-x"))


def test_nvml_matches_nvidia_smi_xml(figure: Callable[[str], None]) -> None:
    """NVML backend vs `nvidia-smi -q -x` (same run)"""
    backend = default_backend()
    infos, states = backend.gpu_infos(), backend.sample()
    rec = _xml()
    assert len(infos) == len(rec.infos) >= 1
    fields = (
        "name",
        "uuid",
        "max_sm_clock_mhz",
        "max_memory_clock_mhz",
        "persistence_mode",
        "ecc_enabled",
        "mig_enabled",
    )
    checked = 0
    worst_used_mib = worst_temp = 0.0
    for live, smi, state, smi_state in zip(infos, rec.infos, states, rec.states, strict=True):
        for name in fields:
            a, b = getattr(live, name), getattr(smi, name)
            if a.ok and b.ok:
                assert a.value == b.value, name
                checked += 1
        assert str(live.pci_bus_id.value).upper() == str(smi.pci_bus_id.value).upper()
        # nvidia-smi prints whole MiB; NVML gives bytes.
        total = live.memory_total_bytes.value - smi.memory_total_bytes.value
        assert 0 <= total < MIB
        assert live.power_limit_w.value == pytest.approx(smi.power_limit_w.value, abs=0.5)
        if smi.default_power_limit_w.ok:
            default = smi.default_power_limit_w.value
            assert live.default_power_limit_w.value == pytest.approx(default, abs=0.5)
        for name in ("remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failed"):
            assert getattr(state, name).get() == getattr(smi_state, name).get(), name
        assert live.pcie.gen_max.value == smi.pcie.gen_max.value
        assert live.pcie.width_max.value == smi.pcie.width_max.value
        used = abs(state.memory_used_bytes.value - smi_state.memory_used_bytes.value) / MIB
        temp = abs(state.temperature_c.value - smi_state.temperature_c.value)
        worst_used_mib, worst_temp = max(worst_used_mib, used), max(worst_temp, temp)
    assert worst_used_mib <= 256
    assert worst_temp <= 5
    figure(
        f"{len(infos)} GPU(s), {checked} static fields equal; memory used within "
        f"{worst_used_mib:.0f} MiB, temperature within {worst_temp:.0f} C"
    )


def test_nvidia_smi_text_replay_matches_xml(figure: Callable[[str], None]) -> None:
    """`nvidia-smi -q` and table text replay vs `-q -x` (same run)"""
    xml = _xml()
    query = parse_smi_text(_smi("-q"))
    table = parse_smi_text(_smi())
    assert query.driver.driver_version.value == xml.driver.driver_version.value
    assert table.driver.driver_version.value == xml.driver.driver_version.value
    static = ("name", "uuid", "pci_bus_id", "memory_total_bytes", "max_sm_clock_mhz")
    for x, q, t in zip(xml.infos, query.infos, table.infos, strict=True):
        for name in static:
            assert getattr(q, name).value == getattr(x, name).value, name
        assert q.power_limit_w.value == pytest.approx(x.power_limit_w.value, abs=0.5)
        assert (q.pcie.gen_max.value, q.pcie.width_max.value) == (
            x.pcie.gen_max.value,
            x.pcie.width_max.value,
        )
        assert (q.ecc_enabled.value, q.mig_enabled.value) == (
            x.ecc_enabled.value,
            x.mig_enabled.value,
        )
        assert t.pci_bus_id.value == x.pci_bus_id.value
        assert t.memory_total_bytes.value == x.memory_total_bytes.value
    figure(f"{len(xml.infos)} GPU(s): -q text and the table agree with the XML")


def test_mig_instances_match_nvidia_smi(figure: Callable[[str], None]) -> None:
    """MIG instances (NVML vs nvidia-smi)"""
    infos = default_backend().gpu_infos()
    mig = [i for i in infos if i.mig_enabled.get(False)]
    if not mig:
        pytest.skip("N/A: MIG is off on every GPU (nvidia-smi -mig 1 turns it on)")
    rec = _xml()
    by_uuid = {i.uuid.value: i for i in rec.infos}
    for info in mig:
        smi = by_uuid[info.uuid.value]
        assert [m.sm_count.value for m in info.mig_instances] == [
            m.sm_count.value for m in smi.mig_instances
        ]
    figure(", ".join(f"GPU {i.index}: {len(i.mig_instances)} instances" for i in mig))


def _busy(seconds: float) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def test_gpm_activity_counters(figure: Callable[[str], None]) -> None:
    """NVML GPM activity counters (Hopper+)"""
    from gpudiag.probe.gpm import GpmReader
    from gpudiag.probe.nvml import NvmlSession

    opened = GpmReader.open(NvmlSession.shared(), 0)
    if not opened.ok or opened.value is None:
        pytest.skip(f"N/A: {opened.reason}")
    reader = opened.value
    try:
        reader.read()
        _busy(1.0)
        counters = reader.read()
    finally:
        reader.close()
    assert counters.sm_active_pct.ok, counters.sm_active_pct.reason
    assert 0 < counters.sm_active_pct.value <= 100
    figure(
        f"SM active {counters.sm_active_pct.value:.0f} %, tensor active "
        f"{counters.tensor_active_pct.display('%', '{:.0f}')} under a bf16 matmul loop"
    )


def test_dcgm_profiling_fields(figure: Callable[[str], None]) -> None:
    """DCGM profiling fields"""
    from gpudiag.probe.dcgm import DcgmReader

    connected = DcgmReader.connect()
    if not connected.ok or connected.value is None:
        pytest.skip(f"N/A: {connected.reason}")
    reader = connected.value
    try:
        _busy(1.0)
        values = reader.read()
    finally:
        reader.close()
    assert values
    first = next(iter(values.values()))
    assert first.sm_active_pct.ok, first.sm_active_pct.reason
    figure(f"{len(values)} GPU(s); SM active {first.sm_active_pct.value:.0f} %")


def test_torch_devices_map_to_nvml_by_uuid(figure: Callable[[str], None]) -> None:
    """torch.cuda -> NVML mapping by UUID"""
    import torch

    torch.cuda.init()
    report = gd.inspect()
    torch_uuids = cuda.visible_uuids()
    assert len(report.cuda_gpus) == len(torch_uuids) >= 1
    for index, uuid in enumerate(torch_uuids):
        gpu = report.cuda_gpus[index]
        assert gpu.info.cuda_index == index
        assert normalize_uuid(gpu.info.uuid.value) == normalize_uuid(uuid)
    figure(f"{len(torch_uuids)} device(s) matched by {report.cuda_mapping}")


def test_cuda_event_timing_agrees_with_the_host_clock(figure: Callable[[str], None]) -> None:
    """CUDA-event timing (gpudiag.probe.cuda.device_timer)"""
    import torch

    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    with cuda.device_timer() as out:
        for _ in range(20):
            a @ a
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    host = time.perf_counter() - t0
    assert out[0] == pytest.approx(host, rel=0.2)
    figure(f"20 fp32 8192^3 matmuls: events {out[0] * 1e3:.1f} ms, host {host * 1e3:.1f} ms")


def test_memory_stats_and_snapshot(tmp_path: Path, figure: Callable[[str], None]) -> None:
    """Memory statistics and a memory snapshot (gpudiag.probe.capture)"""
    import pickle

    import torch

    from gpudiag.probe.capture import cuda_memory_snapshot

    cuda.reset_peak_memory_stats()
    base = cuda.memory_allocated()
    held: list[object] = []

    def allocate() -> None:
        held.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))

    path = tmp_path / "snapshot.pickle"
    size = cuda_memory_snapshot(path, allocate)
    assert size.ok, size.reason
    peak = cuda.max_memory_allocated()
    held.clear()
    assert peak is not None
    assert peak - base >= 256 * MIB
    snapshot = pickle.loads(path.read_bytes())
    sizes = [s["total_size"] for s in snapshot["segments"]]
    assert sum(sizes) >= 256 * MIB
    traced = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    assert any(e["size"] >= 256 * MIB for e in traced)
    free_total = cuda.mem_get_info()
    assert free_total is not None
    figure(
        f"peak +{(peak - base) / MIB:.0f} MiB for a 256 MiB tensor; snapshot "
        f"{len(sizes)} segments, {len(traced)} allocations traced, {size.value / 1024:.0f} KiB"
    )
