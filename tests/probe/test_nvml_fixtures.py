"""Every recorded nvidia-smi dump, read through the NVML path (fake bindings) and replay."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.nvml_backend import NvmlBackend
from gpudiag.probe.readings import Status
from gpudiag.probe.replay import ReplayBackend
from gpudiag.probe.system import SystemReport, inspect
from tests.conftest import FIXTURES
from tests.fakes.fake_nvml import FakeNvml

XML_FILES = sorted((FIXTURES / "nvidia-smi-xml").glob("*.xml"))
MIB = 1 << 20


def _value(gpu: ET.Element, path: str) -> float | None:
    node = gpu.find(path)
    if node is None or node.text is None:
        return None
    match = re.match(r"\s*(-?\d+(\.\d+)?)", node.text)
    return float(match.group(1)) if match else None


def _reports(path: Path) -> list[SystemReport]:
    live = inspect(backend=NvmlBackend(NvmlSession(FakeNvml(path))), env={})
    replay = inspect(backend=ReplayBackend.from_file(path))
    return [live, replay]


def test_all_fixtures_are_present() -> None:
    assert len(XML_FILES) >= 19


@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.stem)
def test_report_matches_xml(path: Path) -> None:
    root = ET.parse(path).getroot()
    xml_gpus = root.findall("gpu")
    for report in _reports(path):
        assert len(report.gpus) == len(xml_gpus)
        for gpu, el in zip(report.gpus, xml_gpus, strict=False):
            info, state = gpu.info, gpu.state
            assert info.name.value == el.findtext("product_name").strip()
            assert info.uuid.value == el.findtext("uuid").strip()
            assert info.memory_total_bytes.value == _value(el, "fb_memory_usage/total") * MIB
            assert state.memory_used_bytes.value == _value(el, "fb_memory_usage/used") * MIB
            temp = _value(el, "temperature/gpu_temp")
            assert state.temperature_c.get() == temp
            sm = _value(el, "clocks/sm_clock")
            assert state.sm_clock_mhz.get() == sm
            gen = _value(el, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")
            assert info.pcie.gen_current.get() == gen
            util = _value(el, "utilization/gpu_util")
            if info.mig_enabled.get(False):
                assert not state.gpu_util_pct.ok
                assert "MIG" in state.gpu_util_pct.reason
            else:
                assert state.gpu_util_pct.get() == util
            procs = el.findall("processes/process_info")
            assert len(state.processes.get(())) == len(procs)


@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.stem)
def test_nvml_and_replay_paths_agree(path: Path) -> None:
    live, replay = _reports(path)
    for a, b in zip(live.gpus, replay.gpus, strict=False):
        for field in (
            "name",
            "uuid",
            "pci_bus_id",
            "memory_total_bytes",
            "power_limit_w",
            "default_power_limit_w",
        ):
            assert getattr(a.info, field).get() == getattr(b.info, field).get(), field
        for field in (
            "gpu_util_pct",
            "memory_used_bytes",
            "power_w",
            "clock_event_reasons",
            "remapped_rows_uncorrectable",
            "row_remap_pending",
            "row_remap_failed",
        ):
            assert getattr(a.state, field).get() == getattr(b.state, field).get(), field


@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.stem)
def test_missing_values_say_why(path: Path) -> None:
    for report in _reports(path):
        for gpu in report.gpus:
            for reading in (*vars_readings(gpu.info), *vars_readings(gpu.state)):
                if not reading.ok:
                    assert reading.reason, reading
                    assert reading.value is None


def vars_readings(record: object) -> list:
    from gpudiag.probe.readings import Reading

    return [getattr(record, n) for n in record.__slots__ if isinstance(getattr(record, n), Reading)]


def test_a100_mig_instances() -> None:
    live, replay = _reports(FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml")
    for report in (live, replay):
        info = report.gpus[0].info
        assert info.mig_enabled.value is True
        assert [m.sm_count.value for m in info.mig_instances] == [14, 14, 14, 14]
        assert [m.gpu_instance_id.value for m in info.mig_instances] == [3, 4, 5, 6]
        assert info.mig_instances[0].memory_total_bytes.value == 19968 * MIB
        util = report.gpus[0].state.gpu_util_pct
        assert util.status is Status.NOT_AVAILABLE
        assert util.value is None


def test_mig_utilization_is_never_zero_even_if_the_driver_says_zero() -> None:
    import pynvml

    def zero_util(handle: object) -> object:
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = 0, 0
        return util

    fake = FakeNvml(
        FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml",
        overrides={"nvmlDeviceGetUtilizationRates": zero_util},
    )
    state = NvmlBackend(NvmlSession(fake)).sample()[0]
    assert state.gpu_util_pct.value is None
    assert "MIG" in state.gpu_util_pct.reason


def test_throttle_reason_active_in_recording() -> None:
    # 3090-v13.xml: sw_power_cap active while idle (SOURCES.md).
    for report in _reports(FIXTURES / "nvidia-smi-xml" / "3090-v13.xml"):
        assert "sw_power_cap" in report.gpus[0].state.clock_event_reasons.value


def test_loaded_gpu_values() -> None:
    # rtx-3080-v13.xml: under load, P2, 65 % util, 142 W (SOURCES.md).
    for report in _reports(FIXTURES / "nvidia-smi-xml" / "rtx-3080-v13.xml"):
        state = report.gpus[0].state
        assert state.gpu_util_pct.value == 65
        assert state.performance_state.value == "P2"
        assert state.power_w.value == pytest.approx(142.33)


def test_v13_sram_parity_and_secded_count_as_uncorrected(tmp_path: Path) -> None:
    # DTD v13 (the Blackwell dump) splits SRAM uncorrectable errors in two tags; NVML's total
    # of uncorrected volatile errors counts them all. The dump prints N/A: fill in counts.
    text = (FIXTURES / "nvidia-smi-xml" / "pro-6000-maxq-blackwell-v13.xml").read_text()
    volatile = text.index("<volatile>")
    head, tail = text[:volatile], text[volatile:]
    for tag, count in (
        ("sram_correctable", 5),
        ("sram_uncorrectable_parity", 2),
        ("sram_uncorrectable_secded", 1),
        ("dram_correctable", 7),
        ("dram_uncorrectable", 1),
    ):
        tail = tail.replace(f"<{tag}>N/A</{tag}>", f"<{tag}>{count}</{tag}>", 1)
    path = tmp_path / "blackwell-sram-errors.xml"
    path.write_text(head + tail)
    for report in _reports(path):
        assert report.gpus[0].state.ecc_uncorrected_volatile.value == 4
