"""GPU topology from recorded `nvidia-smi topo -m` / `topo -p2p r` text and from NVML (fake)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pynvml
import pytest

from gpudiag.cli import main
from gpudiag.errors import GpuDiagError, ReplayError
from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.nvml_backend import NvmlBackend
from gpudiag.probe.system import SystemReport, inspect
from gpudiag.probe.topology import (
    LINK_KINDS,
    LINK_LEGEND,
    P2P_LEGEND,
    Link,
    Topology,
    format_cpulist,
    load_topology,
    parse_cpulist,
    parse_p2p_matrix,
    parse_topo_matrix,
)
from gpudiag.probe.topology_nvml import from_nvml, process_cpu_affinity
from tests.conftest import FIXTURES
from tests.fakes.fake_nvml import FakeNvml, read_matrix

TOPO = FIXTURES / "topo-matrix"
XML = FIXTURES / "nvidia-smi-xml"
MATRICES = ("2gpu-nvlink", "2gpu-pcie", "dgx-a100-8x", "dgx-h100-8x", "h100-8x-ht-affinity")

# What topo-matrix/SOURCES.md says each recording shows: GPU count, the one link label of every
# pair, and the CPU / NUMA affinity of each half of the GPUs.
FACTS = {
    "2gpu-nvlink": (2, "NV2", [("0-23", "")] * 2),
    "2gpu-pcie": (2, "PHB", [("0-11", "")] * 2),
    "dgx-a100-8x": (8, "NV12", [("0-23", "0")] * 4 + [("24-47", "1")] * 4),
    "dgx-h100-8x": (8, "NV18", [("0-51", "0")] * 4 + [("52-103", "1")] * 4),
    "h100-8x-ht-affinity": (
        8,
        "NV18",
        [("0-51,104-155", "0")] * 4 + [("52-103,156-207", "1")] * 4,
    ),
}


def _text(name: str) -> str:
    return (TOPO / f"{name}.txt").read_text()


def _fake_machine(xml: str, topo: str | None, p2p: str | None = None, **knobs: object) -> FakeNvml:
    return FakeNvml(
        XML / xml,
        topology=TOPO / f"{topo}.txt" if topo else None,
        p2p=TOPO / f"{p2p}.txt" if p2p else None,
        **knobs,  # type: ignore[arg-type]
    )


def _live(fake: FakeNvml, process_cpus: str = "0-1") -> Topology:
    session = NvmlSession(fake)
    handles = [session.handle(i).value for i in range(session.device_count().get(0))]
    return from_nvml(session, handles, process_cpus=process_cpus)


# -- recorded topo -m -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", MATRICES)
def test_every_recorded_matrix_parses_to_its_documented_facts(name: str) -> None:
    count, label, affinity = FACTS[name]
    topology = parse_topo_matrix(_text(name))
    assert topology.gpu_count == count
    assert topology.link_counts() == {label: count * (count - 1) // 2}
    assert [(g.cpu_affinity, g.numa_affinity) for g in topology.gpus] == affinity
    assert [g.name for g in topology.gpus] == [f"GPU{n}" for n in range(count)]
    assert topology.source == "nvidia-smi topo -m"
    assert topology.nics == ()
    assert topology.notes == ()


def test_dgx_a100_all_pairs_nv12_and_numa_split() -> None:
    topology = parse_topo_matrix(_text("dgx-a100-8x"))
    assert all(topology.link(i, j) == Link("NV12") for i, j in topology.pairs())
    assert topology.link(3, 4).nvlinks == 12
    assert topology.numa_groups() == {"0": (0, 1, 2, 3), "1": (4, 5, 6, 7)}
    assert topology.gpus[0].cpus == frozenset(range(24))
    assert topology.gpus[7].cpus == frozenset(range(24, 48))
    assert topology.summary() == "8 GPUs, all pairs NVLink (NV12)"


def test_h100_affinity_keeps_the_hyperthread_siblings() -> None:
    topology = parse_topo_matrix(_text("h100-8x-ht-affinity"))
    first, last = topology.gpus[0].cpus, topology.gpus[7].cpus
    assert first is not None
    assert last is not None
    assert len(first) == len(last) == 104  # 52 cores + their 52 hyper-thread siblings
    assert {0, 51, 104, 155} <= first
    assert 52 not in first
    assert 156 not in first
    assert {52, 103, 156, 207} <= last
    assert not first & last
    assert "NUMA 0: GPU 0-3 (CPUs 0-51,104-155)" in topology.lines()


def test_two_gpu_summaries() -> None:
    assert parse_topo_matrix(_text("2gpu-pcie")).summary() == (
        "2 GPUs through the PCIe host bridge (PHB)"
    )
    assert parse_topo_matrix(_text("2gpu-nvlink")).summary() == "2 GPUs over NVLink (NV2)"
    merged = load_topology(TOPO / "2gpu-pcie.txt", TOPO / "p2p-l4-2x.txt")
    assert merged.summary() == "2 GPUs through the PCIe host bridge (PHB), P2P not supported (CNS)"


def test_legend_of_the_recordings_matches_the_link_vocabulary() -> None:
    recorded = {}
    for line in (TOPO / "legend-topo-m.txt").read_text().splitlines():
        key, _, meaning = line.partition("=")
        recorded[key.strip()] = meaning.strip()
    assert recorded == dict(LINK_LEGEND)
    kinds = {k for k in recorded if k != "X"}
    assert kinds == {*LINK_KINDS[:-1], "NV#"}


def test_link_ranks_go_from_farthest_to_nearest() -> None:
    ranked = [Link(label) for label in ("SYS", "NODE", "PHB", "PXB", "PIX", "NV4")]
    assert [link.rank for link in ranked] == sorted(link.rank or 0 for link in ranked)
    assert len({link.rank for link in ranked}) == 6
    assert Link("X").rank is None
    assert Link("?").rank is None
    assert (Link("NV18").kind, Link("NV18").nvlinks, Link("PHB").nvlinks) == ("NV", 18, 0)


def _as_real_output(name: str, *, nics: bool = False) -> str:
    """A recording rewritten the way nvidia-smi prints it: TABs, a leading TAB, an underlined
    (ANSI) header, ` X ` on the diagonal, a GPU NUMA ID column, optional NICs, the legend."""
    rows = read_matrix(TOPO / f"{name}.txt")
    gpus = [r for r in rows if r.startswith("GPU")]
    nic_names = ["NIC0", "NIC1"] if nics else []
    header = "\t".join([*gpus, *nic_names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = [f"\t\x1b[4m{header}\x1b[0m"]
    for n, gpu in enumerate(gpus):
        cells = [" X " if g == gpu else rows[gpu][g] for g in gpus]
        cells += ["PXB" if k == n % 2 else "SYS" for k in range(len(nic_names))]
        affinity = [rows[gpu]["CPU-Affinity"], rows[gpu]["NUMA-Affinity"], "", "N/A"]
        lines.append("\t".join([f"\x1b[1m{gpu}\x1b[0m", *cells, *affinity]))
    for k, nic in enumerate(nic_names):
        cells = ["PXB" if k == n % 2 else "SYS" for n in range(len(gpus))]
        cells += [" X " if other == nic else "SYS" for other in nic_names]
        lines.append("\t".join([nic, *cells]))
    lines += ["", "Legend:", ""]
    lines += [f"  {k:<4} = {v}" for k, v in LINK_LEGEND.items()]
    if nics:
        lines += ["", "NIC Legend:", "", "  NIC0: mlx5_0", "  NIC1: mlx5_1"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", MATRICES)
def test_tab_separated_ansi_coloured_output_reads_like_the_recording(name: str) -> None:
    spaced = parse_topo_matrix(_text(name))
    real = parse_topo_matrix(_as_real_output(name))
    assert real.links == spaced.links
    assert [(g.cpu_affinity, g.numa_affinity) for g in real.gpus] == [
        (g.cpu_affinity, g.numa_affinity) for g in spaced.gpus
    ]
    assert all(g.gpu_numa_id is None for g in real.gpus)


def test_nic_rows_and_columns_are_kept_as_nics() -> None:
    topology = parse_topo_matrix(_as_real_output("dgx-h100-8x", nics=True))
    assert topology.gpu_count == 8
    assert topology.nics == ("mlx5_0", "mlx5_1")
    assert topology.nic_links[0] == ("PXB", "SYS")
    assert topology.nic_links[1] == ("SYS", "PXB")
    assert topology.summary() == "8 GPUs, all pairs NVLink (NV18), 2 NICs"


def test_crlf_and_the_old_soc_label() -> None:
    old = _text("2gpu-pcie").replace("PHB", "SOC").replace("\n", "\r\n")
    topology = parse_topo_matrix(old)
    assert topology.link(0, 1).label == "SYS"
    assert topology.gpus[1].cpu_affinity == "0-11"


def test_gpu_numa_id_column() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    text += "GPU0\t X \tNV18\t0-71\t0\t\t4\nGPU1\tNV18\t X \t72-143\t1\t\t12\n"
    topology = parse_topo_matrix(text)
    assert [g.gpu_numa_id for g in topology.gpus] == [4, 12]
    assert [g.numa_affinity for g in topology.gpus] == ["0", "1"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no GPU matrix"),
        ("hello world\nthis is not nvidia-smi\n", "no GPU matrix"),
        ((TOPO / "legend-topo-m.txt").read_text(), "no GPU matrix"),
        ("\tGPU0\tGPU1\nGPU0\t X \tNV2\n", "lacks the rows of GPU1"),
        ("\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n", "truncated"),
        ("\tGPU0\tGPU1\nGPU0\t X \tfoo\nGPU1\tfoo\t X \n", "not a link kind"),
        ("\tGPU0\tGPU1\nGPU0\tPHB\tPHB\nGPU1\tPHB\t X \n", "with itself"),
        ((TOPO / "p2p-l4-2x.txt").read_text(), "parse_p2p_matrix"),
    ],
    ids=[
        "empty",
        "prose",
        "legend_only",
        "missing_row",
        "short_rows",
        "bad_cell",
        "bad_diagonal",
        "p2p_output",
    ],
)
def test_garbage_is_a_clear_gpudiag_error(text: str, words: str) -> None:
    with pytest.raises(ReplayError, match=words) as raised:
        parse_topo_matrix(text)
    assert isinstance(raised.value, GpuDiagError)


def test_unknown_but_well_formed_link_label_is_kept_with_a_note() -> None:
    topology = parse_topo_matrix(_text("2gpu-pcie").replace("PHB", "C2C"))
    assert topology.link(0, 1).label == "C2C"
    assert topology.link(0, 1).rank is None
    assert any("C2C" in n for n in topology.notes)


# -- recorded topo -p2p r ---------------------------------------------------------------------
def test_p2p_recordings() -> None:
    h100 = parse_p2p_matrix(_text("p2p-h100-8x"))
    assert len(h100.gpus) == 8
    assert {c for n, row in enumerate(h100.status) for m, c in enumerate(row) if n != m} == {"OK"}
    assert all(h100.status[n][n] == "X" for n in range(8))
    l4 = parse_p2p_matrix(_text("p2p-l4-2x"))
    assert l4.status == (("X", "CNS"), ("CNS", "X"))
    assert P2P_LEGEND["CNS"] == "Chipset not supported"


def test_p2p_legend_matches_the_recording() -> None:
    legend = _text("p2p-h100-8x").split("Legend:")[1]
    recorded = dict(re.findall(r"^\s*(\w+)\s*=\s*(.+?)\s*$", legend, re.MULTILINE))
    recorded.pop("X")
    assert recorded.items() <= P2P_LEGEND.items()


def test_p2p_parser_refuses_a_topo_matrix() -> None:
    with pytest.raises(ReplayError, match="parse_topo_matrix"):
        parse_p2p_matrix(_text("dgx-h100-8x"))


def test_load_topology_merges_in_any_order_and_checks_the_gpus() -> None:
    one = load_topology(TOPO / "dgx-h100-8x.txt", TOPO / "p2p-h100-8x.txt")
    other = load_topology(TOPO / "p2p-h100-8x.txt", TOPO / "dgx-h100-8x.txt")
    assert one == other
    assert one.summary() == "8 GPUs, all pairs NVLink (NV18), P2P OK"
    assert one.source == "nvidia-smi topo -m + nvidia-smi topo -p2p r"
    only_p2p = load_topology(TOPO / "p2p-l4-2x.txt")
    assert only_p2p.links == ()
    assert only_p2p.summary() == "2 GPUs, link kinds unknown, P2P not supported (CNS)"
    with pytest.raises(ReplayError, match="same machine"):
        load_topology(TOPO / "2gpu-pcie.txt", TOPO / "p2p-h100-8x.txt")
    with pytest.raises(ReplayError, match="cannot read"):
        load_topology(TOPO / "missing.txt")


def test_cpulists() -> None:
    assert parse_cpulist("0-51,104-155") == frozenset([*range(52), *range(104, 156)])
    assert format_cpulist(parse_cpulist("0-51,104-155")) == "0-51,104-155"
    assert format_cpulist([5, 0, 1, 2, 7]) == "0-2,5,7"
    assert format_cpulist([]) == ""
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpulist("0-3;7")


def test_process_affinity_is_this_process() -> None:
    text = process_cpu_affinity()
    if hasattr(os, "sched_getaffinity"):
        assert parse_cpulist(text) == frozenset(os.sched_getaffinity(0))
    else:
        assert text == ""


# -- live NVML (fake bindings fed from the recordings) ------------------------------------------
# Each recorded matrix on a machine whose nvidia-smi XML fits it (the XML's GPU copied as needed).
MACHINES = {
    "2gpu-nvlink": "dual_2080-v13.xml",
    "2gpu-pcie": "dual_2070-v13.xml",
    "dgx-a100-8x": "a100-sxm4-v12.xml",
    "dgx-h100-8x": "a100-sxm4-v12.xml",
    "h100-8x-ht-affinity": "a100-sxm4-v12.xml",
}


@pytest.mark.parametrize("name", MATRICES)
def test_nvml_path_reads_what_topo_m_recorded(name: str) -> None:
    fake = _fake_machine(MACHINES[name], name)
    live = _live(fake)
    recorded = parse_topo_matrix(_text(name))
    assert live.links == recorded.links
    assert [(g.cpu_affinity, g.numa_affinity) for g in live.gpus] == [
        (g.cpu_affinity, g.numa_affinity) for g in recorded.gpus
    ]
    assert len({g.pci_bus_id for g in live.gpus}) == live.gpu_count
    assert live.source == "nvml"
    assert live.process_cpus == "0-1"
    # no P2P recording: every pair N/A with the reason, never an exception
    assert live.p2p == ()
    assert any(n.startswith("P2P status: N/A (not supported") for n in live.notes)


def test_nvswitch_board_counts_switch_links_for_every_pair() -> None:
    fake = _fake_machine("a100-sxm4-v12.xml", "dgx-a100-8x")
    assert "nvmlDeviceGetNvLinkRemoteDeviceType" not in fake.calls
    live = _live(fake)
    assert fake.calls.count("nvmlDeviceGetNvLinkRemoteDeviceType") == 8 * 12
    assert live.link_counts() == {"NV12": 28}


@pytest.mark.parametrize("name", ["2gpu-nvlink", "dgx-a100-8x"])
def test_nvlink_peers_without_remote_device_type(name: str) -> None:
    # drivers older than nvmlDeviceGetNvLinkRemoteDeviceType: peers are told apart by bus id
    fake = _fake_machine(
        MACHINES[name], name, driver_lacks=frozenset({"nvmlDeviceGetNvLinkRemoteDeviceType"})
    )
    assert _live(fake).links == parse_topo_matrix(_text(name)).links


def test_an_unreadable_link_does_not_hide_the_links_after_it() -> None:
    def state(handle: object, link: int) -> int:
        if getattr(handle, "index", None) == 0 and link == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return fake._nvmlDeviceGetNvLinkState(handle, link)

    fake = _fake_machine(
        "a100-sxm4-v12.xml", "dgx-a100-8x", overrides={"nvmlDeviceGetNvLinkState": state}
    )
    live = _live(fake)
    assert {live.link(0, j).label for j in range(1, 8)} == {"NV11"}
    assert live.link(1, 2).label == "NV12"


def test_p2p_status_through_nvml() -> None:
    l4 = _live(_fake_machine("dual_2070-v13.xml", "2gpu-pcie", "p2p-l4-2x"))
    assert l4.p2p == (("X", "CNS"), ("CNS", "X"))
    assert l4.summary() == "2 GPUs through the PCIe host bridge (PHB), P2P not supported (CNS)"
    h100 = _live(_fake_machine("a100-sxm4-v12.xml", "h100-8x-ht-affinity", "p2p-h100-8x"))
    # the fake refuses a non-int capability index as ctypes does, so OK means it got an int
    assert {h100.p2p_status(i, j) for i, j in h100.pairs()} == {"OK"}
    assert h100.gpus[0].cpu_affinity == "0-51,104-155"  # CPU ids past os.cpu_count() too


def test_single_gpu_pair_calls_not_supported_become_reasons() -> None:
    # A recording without topology behaves like boards where NVML answers NOT_SUPPORTED.
    live = _live(_fake_machine("dual_a5000-v13.xml", None))
    assert live.links == (("X", "?"), ("?", "X"))
    assert live.summary() == "2 GPUs, link kinds unknown"
    joined = " | ".join(live.notes)
    for what in ("CPU affinity", "NUMA affinity", "PCIe path between GPUs", "P2P status"):
        assert f"{what}: N/A (not supported by this GPU or driver)" in joined


def test_no_permission_everywhere_is_data_not_an_exception() -> None:
    fake = _fake_machine(
        "dual_2070-v13.xml", "2gpu-pcie", every_query_raises=pynvml.NVML_ERROR_NO_PERMISSION
    )
    live = _live(fake)
    assert live.links == (("X", "?"), ("?", "X"))
    assert all(g.cpu_affinity == "" and g.pci_bus_id == "" for g in live.gpus)
    assert any("permission denied" in n for n in live.notes)


def test_lost_gpu_leaves_its_pairs_unknown() -> None:
    fake = _fake_machine(
        "a100-sxm4-v12.xml", "dgx-h100-8x", handle_errors={5: pynvml.NVML_ERROR_GPU_IS_LOST}
    )
    topology = NvmlBackend(NvmlSession(fake)).topology()
    assert topology is not None
    assert topology.link(5, 0).label == "?"
    assert topology.link(0, 4).label == "NV18"
    assert topology.notes[0] == "no NVML handle for GPU5: their links are unknown"


def test_backend_has_no_topology_for_one_gpu_and_reads_it_once() -> None:
    assert NvmlBackend(NvmlSession(FakeNvml(XML / "tesla-t4.xml"))).topology() is None
    fake = _fake_machine("dual_2070-v13.xml", "2gpu-pcie", "p2p-l4-2x")
    backend = NvmlBackend(NvmlSession(fake))
    first = backend.topology()
    calls = len(fake.calls)
    assert backend.topology() is first
    assert len(fake.calls) == calls


# -- SystemReport and snapshots ---------------------------------------------------------------
def _live_report(topo: str = "dgx-a100-8x", p2p: str | None = None) -> SystemReport:
    fake = _fake_machine(MACHINES.get(topo, "a100-sxm4-v12.xml"), topo, p2p)
    return inspect(backend=NvmlBackend(NvmlSession(fake)), env={})


def test_live_report_shows_the_topology() -> None:
    report = _live_report("dgx-h100-8x", "p2p-h100-8x")
    assert report.topology is not None
    summary = "8 GPUs, all pairs NVLink (NV18), P2P OK"
    assert report.topology.summary() == summary
    assert f"Topology {summary} [nvml]" in repr(report)
    assert "NUMA 1: GPU 4-7 (CPUs 52-103)" in repr(report)
    html = report._repr_html_()
    assert summary in html
    assert "link matrix" in html
    assert report.to_dict()["topology"]["summary"] == summary


def test_snapshot_round_trip_keeps_the_topology(tmp_path: Path) -> None:
    report = _live_report("h100-8x-ht-affinity", "p2p-h100-8x")
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(report.to_dict()))
    again = inspect(replay=path)
    assert again.topology is not None
    assert report.topology is not None
    assert again.topology.links == report.topology.links
    assert again.topology.p2p == report.topology.p2p
    assert again.topology.gpus == report.topology.gpus
    assert again.topology.process_cpus == report.topology.process_cpus
    assert again.topology.source == "recording (nvml)"
    twice = SystemReport.from_dict(json.loads(json.dumps(again.to_dict())))
    assert twice.topology is not None
    assert twice.topology.source == "recording (nvml)"


def test_old_snapshot_without_topology_still_reads(tmp_path: Path) -> None:
    data = _live_report().to_dict()
    del data["topology"]
    again = SystemReport.from_dict(json.loads(json.dumps(data)))
    assert again.topology is None
    assert len(again.gpus) == 8
    assert "Topology unknown" in repr(again)


def test_malformed_topology_in_a_snapshot_is_a_replay_error() -> None:
    data = json.loads(json.dumps(_live_report().to_dict()))
    data["topology"]["links"] = [["X"]]
    with pytest.raises(ReplayError, match="not 8x8"):
        SystemReport.from_dict(data)
    data["topology"] = {"links": []}
    with pytest.raises(ReplayError, match="topology is malformed"):
        SystemReport.from_dict(data)
    data["topology"] = {"gpus": [{"name": "GPU0", "cpu_affinity": "all of them"}]}
    with pytest.raises(ReplayError, match="not a CPU list"):
        SystemReport.from_dict(data)


def test_xml_recording_takes_recorded_topology_files() -> None:
    files = [TOPO / "2gpu-pcie.txt", TOPO / "p2p-l4-2x.txt"]
    report = inspect(replay=XML / "dual_2070-v13.xml", topology=files)
    assert report.topology is not None
    assert report.topology.summary().endswith("P2P not supported (CNS)")
    assert inspect(replay=XML / "dual_2070-v13.xml").topology is None
    same = inspect(replay=XML / "dual_2070-v13.xml", topology=report.topology)
    assert same.topology == report.topology
    with pytest.raises(ReplayError, match="describes 8 GPUs but the report has 2"):
        inspect(replay=XML / "dual_2070-v13.xml", topology=TOPO / "dgx-a100-8x.txt")
    with pytest.raises(ReplayError, match="describes 2 GPUs but the report has 1"):
        inspect(replay=XML / "tesla-t4.xml", topology=TOPO / "2gpu-pcie.txt")


def test_topology_html_is_escaped() -> None:
    report = inspect(replay=XML / "dual_2070-v13.xml", topology=TOPO / "2gpu-pcie.txt")
    assert report.topology is not None
    evil = report.topology.__class__(
        gpus=report.topology.gpus,
        links=report.topology.links,
        source="<script>x</script>",
        notes=("<img src=x>",),
    )
    html = inspect(replay=XML / "dual_2070-v13.xml", topology=evil)._repr_html_()
    assert "<script>" not in html
    assert "<img" not in html
    assert "&lt;script&gt;" in html


def test_cli_inspect_topology(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["inspect", "--replay", str(XML / "dual_2070-v13.xml")]
    argv += ["--topology", str(TOPO / "2gpu-pcie.txt"), "--topology", str(TOPO / "p2p-l4-2x.txt")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Topology 2 GPUs through the PCIe host bridge (PHB), P2P not supported (CNS)" in out
    assert main([*argv[:3], "--topology", str(TOPO / "legend-topo-m.txt")]) == 1
    assert "no GPU matrix" in capsys.readouterr().err
