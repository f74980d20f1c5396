"""Real Hopper `nvidia-smi -q` and `nvidia-smi` text (8x H100 SXM, 2x H100 NVL, H200, GH200)
replayed through gd.inspect(replay=...): every field the report shows is checked against the
text, read here with a separate line-by-line reader (not the parser's tree)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag.errors import GpuDiagError, ReplayError
from gpudiag.probe.readings import Status
from gpudiag.probe.replay import ReplayBackend
from gpudiag.probe.smi_text import looks_like_smi_text, parse_smi_text
from gpudiag.specs import bandwidth_from_clock, lookup_gpu
from tests.conftest import FIXTURES

TEXT = FIXTURES / "nvidia-smi-text"
QUERY_FILES = sorted(TEXT.glob("*.nvidia-smi-q.txt"))
TABLE_FILES = sorted(TEXT.glob("*.nvidia-smi.txt"))
MIB = 1 << 20
GIB = 1 << 30

# file stem -> the spec row NVIDIA's product name must find (SOURCES.md names the machines).
SPEC_KEYS = {
    "h100-sxm-x8": "h100-sxm5-80gb",
    "h100-nvl-x2": "h100-nvl",
    "h200": "h200-sxm-141gb",
    "gh200": "gh200-480gb",
    "h100-sxm-x8-dstack-after-loading": "h100-sxm5-80gb",
}


def _machine(path: Path) -> str:
    return path.name.split(".")[0]


# --- an independent reader of the -q text: flat lines, a section is found by its label --------


def _blocks(text: str) -> list[list[str]]:
    """The lines of each "GPU 0000...:xx:00.0" block."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if re.fullmatch(r"GPU [0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", line.strip()):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    return blocks


def _field(lines: list[str], label: str, section: str | None = None) -> str:
    """The value of the first "label : value" line (after the line ``section`` when given)."""
    start = 0
    if section is not None:
        start = next(i for i, line in enumerate(lines) if line.strip() == section)
    for line in lines[start:]:
        key, sep, value = line.partition(":")
        if sep and key.strip() == label:
            return value.strip()
    raise KeyError(label)


def _number(text: str) -> float:
    return float(re.match(r"-?\d+(\.\d+)?", text.strip()).group(0))


@pytest.mark.parametrize("path", QUERY_FILES, ids=_machine)
def test_query_report_matches_text(path: Path) -> None:
    text = path.read_text()
    report = gd.inspect(replay=path)
    assert report.is_recording
    assert path.name in report.label
    assert report.recorded_at == _field(text.splitlines(), "Timestamp")
    assert report.driver.driver_version.value == _field(text.splitlines(), "Driver Version")
    assert report.driver.cuda_driver_version.value == _field(text.splitlines(), "CUDA Version")
    blocks = _blocks(text)
    assert len(report.gpus) == len(blocks) == int(_field(text.splitlines(), "Attached GPUs"))
    for gpu, lines in zip(report.gpus, blocks, strict=True):
        info, state = gpu.info, gpu.state
        assert info.name.value == _field(lines, "Product Name")
        assert info.uuid.value == _field(lines, "GPU UUID")
        assert info.pci_bus_id.value == _field(lines, "Bus Id", "PCI").upper()
        assert info.pci_bus_id.value == lines[0].split()[1].upper()
        assert info.architecture.value == _field(lines, "Product Architecture") == "Hopper"
        total = _number(_field(lines, "Total", "FB Memory Usage")) * MIB
        assert info.memory_total_bytes.value == total
        assert (
            state.memory_used_bytes.value == _number(_field(lines, "Used", "FB Memory Usage")) * MIB
        )
        assert info.max_sm_clock_mhz.value == _number(_field(lines, "SM", "Max Clocks"))
        assert info.max_memory_clock_mhz.value == _number(_field(lines, "Memory", "Max Clocks"))
        assert state.sm_clock_mhz.value == _number(_field(lines, "SM", "Clocks"))
        assert state.memory_clock_mhz.value == _number(_field(lines, "Memory", "Clocks"))
        power = "GPU Power Readings"
        assert info.power_limit_w.value == _number(_field(lines, "Current Power Limit", power))
        default = _number(_field(lines, "Default Power Limit", power))
        assert info.default_power_limit_w.value == default
        assert state.power_w.value == _number(_field(lines, "Power Draw", power))
        assert state.temperature_c.value == _number(_field(lines, "GPU Current Temp"))
        assert state.gpu_util_pct.value == _number(_field(lines, "Gpu", "Utilization"))
        assert state.memory_util_pct.value == _number(_field(lines, "Memory", "Utilization"))
        assert state.performance_state.value == _field(lines, "Performance State")
        assert info.persistence_mode.value == (_field(lines, "Persistence Mode") == "Enabled")
        assert info.ecc_enabled.value == (_field(lines, "Current", "ECC Mode") == "Enabled")
        assert info.mig_enabled.value == (_field(lines, "Current", "MIG Mode") == "Enabled")
        mode = _field(lines, "Virtualization Mode", "GPU Virtualization Mode")
        assert info.virtualization.value == mode.lower()  # "none" / "pass-through"
        gen = "PCIe Generation"
        assert info.pcie.gen_current.value == _number(_field(lines, "Current", gen))
        assert info.pcie.gen_max.value == _number(_field(lines, "Max", gen))
        assert info.pcie.width_current.value == _number(_field(lines, "Current", "Link Width"))
        assert info.pcie.width_max.value == _number(_field(lines, "Max", "Link Width"))
        assert state.pcie_rx_bytes_per_s.value == _number(_field(lines, "Rx Throughput")) * 1024
        idle = _field(lines, "Idle", "Clocks Event Reasons") == "Active"
        assert ("gpu_idle" in state.clock_event_reasons.value) == idle
        uncorrectable = [
            _number(line.split(":")[1])
            for line in lines[lines.index("        Volatile") : lines.index("        Aggregate")]
            if "Uncorrectable" in line
        ]
        assert len(uncorrectable) == 3  # SRAM parity, SRAM SEC-DED, DRAM on Hopper
        assert state.ecc_uncorrected_volatile.value == sum(uncorrectable)
        assert _field(lines, "Processes") == "None"
        assert state.processes.value == ()
        # Hopper remaps rows; its retired-page counters print N/A, and the reason says why.
        assert _field(lines, "Single Bit ECC", "Retired Pages") == "N/A"
        assert state.retired_pages.status is Status.NOT_SUPPORTED
        remap = "Remapped Rows"
        assert state.remapped_rows_uncorrectable.value == _number(
            _field(lines, "Uncorrectable Error", remap)
        )
        assert state.row_remap_pending.value == (_field(lines, "Pending", remap) == "Yes")
        failure = _field(lines, "Remapping Failure Occurred", remap)
        assert state.row_remap_failed.value == (failure == "Yes")
        assert "remaps rows" in state.retired_pages.reason
        # Not in -q text at all: N/A with a reason, never a value.
        assert not info.nvlinks
        assert not state.nvlink_rx_bytes.ok
        assert state.nvlink_rx_bytes.reason


@pytest.mark.parametrize("path", QUERY_FILES, ids=_machine)
def test_report_text_shows_the_recorded_values(path: Path) -> None:
    lines = path.read_text().splitlines()
    shown = "\n".join(gd.inspect(replay=path).lines())
    first = _blocks(path.read_text())[0]
    assert _field(first, "Product Name") in shown
    assert (
        f"{_field(lines, 'Driver Version')}, CUDA (driver) {_field(lines, 'CUDA Version')}" in shown
    )
    sm, sm_max = _field(first, "SM", "Clocks"), _field(first, "SM", "Max Clocks")
    assert f"clocks SM {_number(sm):.0f}/{_number(sm_max):.0f} MHz" in shown
    limit = _number(_field(first, "Current Power Limit", "GPU Power Readings"))
    assert f"/ {limit:.0f} W" in shown
    assert "RECORDING" in shown
    assert "cc 9.0  132 SMs" in shown


def _table_rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(first line cells, second line cells) of each GPU in the table, split on '|' and spaces."""
    lines = text.splitlines()
    rows = []
    for n, line in enumerate(lines):
        if re.match(r"^\|\s+\d+\s+NVIDIA", line):
            rows.append((line.strip("|").split(), lines[n + 1].replace(" / ", " ").split()))
    return rows


@pytest.mark.parametrize("path", TABLE_FILES, ids=_machine)
def test_table_report_matches_text(path: Path) -> None:
    text = path.read_text()
    report = gd.inspect(replay=path)
    header = re.search(r"Driver Version: (\S+)\s+CUDA Version: (\S+)", text)
    assert report.driver.driver_version.value == header.group(1)
    assert report.driver.cuda_driver_version.value == header.group(2)
    assert "plain `nvidia-smi` table" in report.header()
    rows = _table_rows(text)
    assert len(report.gpus) == len(rows) >= 1
    for gpu, (first, second) in zip(report.gpus, rows, strict=True):
        info, state = gpu.info, gpu.state
        bar = first.index("|")
        assert info.index == int(first[0])
        assert info.name.value == " ".join(first[1 : bar - 1])
        assert info.persistence_mode.value == (first[bar - 1] == "On")
        assert info.pci_bus_id.value == first[bar + 1].upper()
        assert state.ecc_uncorrected_volatile.value == int(first[-1])
        # | N/A 28C P0 74W 700W | 1MiB 143771MiB | 0% Default |
        _, fan, temp, perf, power, cap, _, used, total, _, util, *_ = second
        assert fan == "N/A"
        assert state.temperature_c.value == _number(temp)
        assert state.performance_state.value == perf
        assert state.power_w.value == _number(power)
        assert info.power_limit_w.value == _number(cap)
        assert state.memory_used_bytes.value == _number(used) * MIB
        assert info.memory_total_bytes.value == _number(total) * MIB
        assert state.gpu_util_pct.value == _number(util)
        assert info.mig_enabled.value is False  # every recorded table says "Disabled"
        assert state.processes.value == ()  # "No running processes found" / an empty list
        # What the table does not show says so, and where to get it.
        for missing in (info.uuid, info.pcie.gen_current, state.sm_clock_mhz):
            assert not missing.ok
            assert "nvidia-smi -q" in missing.reason


def test_table_keeps_the_date_printed_before_it() -> None:
    path = TEXT / "h100-sxm-x8-dstack-after-loading.nvidia-smi.txt"
    report = gd.inspect(replay=path)
    assert report.recorded_at == path.read_text().splitlines()[0].strip()
    assert [g.state.gpu_util_pct.value for g in report.gpus] == [97, 96, 97, 97, 97, 96, 96, 96]


@pytest.mark.parametrize("machine", ["h100-sxm-x8", "h100-nvl-x2", "h200", "gh200"])
def test_table_and_query_of_one_machine_agree(machine: str) -> None:
    query = gd.inspect(replay=TEXT / f"{machine}.nvidia-smi-q.txt")
    table = gd.inspect(replay=TEXT / f"{machine}.nvidia-smi.txt")
    assert len(query.gpus) == len(table.gpus)
    for q, t in zip(query.gpus, table.gpus, strict=True):
        for name in ("name", "pci_bus_id", "memory_total_bytes", "power_limit_w"):
            assert getattr(q.info, name).value == getattr(t.info, name).value, name
        assert q.info.persistence_mode.value == t.info.persistence_mode.value
    assert query.driver.driver_version.value == table.driver.driver_version.value


# --- the spec table and the rules meet the real Hopper facts -------------------------------------


@pytest.mark.parametrize("path", QUERY_FILES + TABLE_FILES, ids=lambda p: p.name)
def test_product_names_find_their_spec_row(path: Path) -> None:
    for gpu in gd.inspect(replay=path).gpus:
        spec = lookup_gpu(gpu.info.name.value)
        assert spec is not None
        assert spec.key == SPEC_KEYS[_machine(path)]
        assert gpu.info.compute_capability.value == (9, 0)
        assert gpu.info.compute_capability.source == "specs"
        # nvidia-smi's total is what the driver leaves usable: a little under the datasheet's.
        total = gpu.info.memory_total_bytes.value
        assert spec.memory_bytes - 1 * GIB < total <= spec.memory_bytes
        # The power limit the board runs at never exceeds the spec's upper setting.
        assert gpu.info.power_limit_w.value <= spec.tdp_w


@pytest.mark.parametrize("path", QUERY_FILES, ids=_machine)
def test_spec_bandwidth_matches_the_recorded_memory_clock(path: Path) -> None:
    for gpu in gd.inspect(replay=path).gpus:
        spec = lookup_gpu(gpu.info.name.value)
        from_clock = bandwidth_from_clock(
            gpu.info.max_memory_clock_mhz.value, spec.memory_bus_width_bits, spec.memory_type
        )
        # H100 SXM 2619 MHz x 5120 bit = 3352 GB/s (3.35 TB/s); H200 3201 MHz x 6144 = 4917
        # (4.8 TB/s); GH200 4023 (4 TB/s); H100 NVL 4023 against the datasheet's 3.9 TB/s.
        assert from_clock == pytest.approx(spec.memory_bandwidth_gbps, rel=0.04)


@pytest.mark.parametrize("path", QUERY_FILES, ids=_machine)
def test_spec_fp32_peak_matches_the_recorded_max_sm_clock(path: Path) -> None:
    from gpudiag.specs import cc_limits

    for gpu in gd.inspect(replay=path).gpus:
        spec = lookup_gpu(gpu.info.name.value)
        lanes = cc_limits(spec.compute_capability).fp32_lanes_per_sm
        # SMs x FP32 lanes x 2 (FMA) x max SM clock: 132 x 128 x 2 x 1980 MHz = 66.9 TFLOP/s
        # (H100 SXM, H200, GH200: "67"); 1785 MHz on the H100 NVL = 60.3 ("60").
        from_clock = spec.sm_count * lanes * 2 * gpu.info.max_sm_clock_mhz.value / 1e6
        assert from_clock == pytest.approx(spec.peak_tflops["fp32"], rel=0.02)


def test_spec_nvlink_bandwidth_matches_the_recorded_nv18_mesh() -> None:
    # dstack's 8x H100 SXM5 `topo -m`: every pair NV18, i.e. 18 NVLink-4 links per GPU at
    # 50 GB/s each (25 GB/s per direction) = the spec table's 900 GB/s.
    system = gd.inspect(
        replay=TEXT / "h100-sxm-x8-dstack-after-loading.nvidia-smi.txt",
        topology=FIXTURES / "topo-matrix" / "dstack-8xh100-sxm5-topo-m.txt",
    )
    links = {system.topology.link(i, j).nvlinks for i, j in system.topology.pairs()}
    assert links == {18}
    spec = lookup_gpu(system.gpus[0].info.name.value)
    assert spec.nvlink_bandwidth_gbps == 18 * 50


@pytest.mark.parametrize("path", QUERY_FILES, ids=_machine)
def test_hopper_pcie_is_gen5_x16_except_the_c2c_attached_gh200(path: Path) -> None:
    for gpu in gd.inspect(replay=path).gpus:
        spec = lookup_gpu(gpu.info.name.value)
        link = gpu.info.pcie
        if _machine(path) == "gh200":
            # The Grace Hopper GPU talks to its CPU over NVLink-C2C; its own PCIe link is x1.
            assert (link.gen_max.value, link.width_max.value) == (4, 1)
            assert "NVLink-C2C" in spec.notes
        else:
            assert (link.gen_max.value, link.width_max.value) == (spec.pcie_gen, 16) == (5, 16)


@pytest.mark.parametrize("path", QUERY_FILES + TABLE_FILES, ids=lambda p: p.name)
def test_recorded_hopper_machines_get_only_the_real_hardware_finding(path: Path) -> None:
    # Idle (or, for dstack, loaded) healthy machines: ECC on, persistence on, links at their
    # maximum, no throttling. A GH200's x1 gen 4 PCIe link is its maximum, not a fault; its
    # power limit is a real finding: 700 W enforced of a 900 W default (requested 900 W: the
    # module's shared CPU+GPU budget), and it has one DRAM row remapped after an uncorrectable
    # error (aggregate DRAM Uncorrectable 1, Remapped Rows 1, not pending). The plain table has
    # neither the default limit nor the remapper.
    diagnosis = gd.diagnose(system=gd.inspect(replay=path))
    found = {(f.id, f.severity.value) for f in diagnosis.findings if f.category == "hardware"}
    if path.name == "gh200.nvidia-smi-q.txt":
        assert found == {("hw.power_limit_lowered", "low"), ("hw.rows_remapped", "low")}
        by_id = {f.id: f for f in diagnosis.findings}
        power = by_id["hw.power_limit_lowered"]
        assert "700 W, 22% below its default 900 W" in power.message
        assert [e.value for e in power.evidence[:3]] == [700.0, 900.0, 900.0]
        # 900 W is already requested: `nvidia-smi -pl 900` would change nothing.
        assert "though 900 W is requested" in power.message
        assert "-pl 900" not in (power.instruction or "")
        assert "module" in (power.instruction or "")
        assert "1 memory row remapped" in by_id["hw.rows_remapped"].message
    else:
        assert found == set()
    assert [f.id for f in diagnosis.findings if f.category == "memory"] == []


def test_recorded_topology_of_the_same_dstack_machine() -> None:
    system = gd.inspect(
        replay=TEXT / "h100-sxm-x8-dstack-after-loading.nvidia-smi.txt",
        topology=FIXTURES / "topo-matrix" / "dstack-8xh100-sxm5-topo-m.txt",
    )
    assert system.topology is not None
    assert system.topology.link_counts() == {"NV18": 28}
    diagnosis = gd.diagnose(system=system)
    # A full NV18 mesh: nothing between GPUs. Its one NIC (mlx5_0) is SYS from every GPU, which
    # only matters for jobs across nodes: a LOW fact, not a problem of this node.
    topology = [f for f in diagnosis.findings if f.category == "topology"]
    assert [(f.id, f.severity.name) for f in topology] == [("topo.nic_far", "LOW")]
    assert "topo.host_path" not in [n.rule for n in diagnosis.not_evaluated]


# --- detection and bad input ----------------------------------------------------------------------


def test_format_detection() -> None:
    assert looks_like_smi_text((TEXT / "h200.nvidia-smi-q.txt").read_bytes()) == "query"
    assert looks_like_smi_text((TEXT / "h200.nvidia-smi.txt").read_text()) == "table"
    assert looks_like_smi_text("hello") is None
    xml = FIXTURES / "nvidia-smi-xml" / "a10g.xml"
    assert looks_like_smi_text(xml.read_bytes()) is None


@pytest.mark.parametrize(
    "text",
    [
        "not nvidia-smi at all",
        "==============NVSMI LOG==============\nAttached GPUs : 2\nGPU 00000000:01:00.0\n"
        "    Product Name : NVIDIA H100 80GB HBM3\n",
        "| NVIDIA-SMI 550.90.12   Driver Version: 550.90.12   CUDA Version: 12.4 |\n"
        "| GPU  Name  Persistence-M | Bus-Id  Disp.A | Volatile Uncorr. ECC |\n",
    ],
    ids=["garbage", "truncated-query", "table-without-rows"],
)
def test_bad_text_is_a_clear_replay_error(text: str) -> None:
    with pytest.raises(ReplayError) as err:
        parse_smi_text(text)
    assert isinstance(err.value, GpuDiagError)
    assert "nvidia-smi" in str(err.value)


def test_unrecognised_file_names_the_formats(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("GPU 0: fine\n")
    with pytest.raises(ReplayError, match="nvidia-smi -q"):
        ReplayBackend.from_file(path)


def test_snapshot_of_a_text_replay_round_trips(tmp_path: Path) -> None:
    report = gd.inspect(replay=TEXT / "h100-nvl-x2.nvidia-smi-q.txt")
    again = type(report).from_dict(report.to_dict())
    assert [g.info.uuid.value for g in again.gpus] == [g.info.uuid.value for g in report.gpus]
    assert again.gpus[1].state.power_w.value == report.gpus[1].state.power_w.value


def test_cli_and_monitor_replay_the_text(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from gpudiag.cli import main

    path = TEXT / "h100-sxm-x8.nvidia-smi-q.txt"
    assert main(["inspect", "--replay", str(path), "--json"]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    assert [g["info"]["name"]["value"] for g in snapshot["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    monitor = gd.monitor(replay=path, display=False, interval=0.05)
    try:
        for _ in range(50):
            if monitor.summary().ticks >= 2:
                break
            time.sleep(0.05)
    finally:
        monitor.stop()
    summary = monitor.summary()
    assert summary.is_recording
    last_gpu = _blocks(path.read_text())[-1]
    power = _number(_field(last_gpu, "Power Draw", "GPU Power Readings"))
    assert summary.row("gpu7", "power_w").last == pytest.approx(power)
    assert summary.row("gpu0", "sm_clock_mhz").last == 345
