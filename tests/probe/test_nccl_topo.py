"""NCCL topology XML (dumps and vendors' static NCCL_TOPO_FILE files) against their SOURCES.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.errors import ReplayError
from gpudiag.probe.nccl_topo import cpumask_to_cpulist, parse_nccl_topo_xml
from gpudiag.probe.topology import parse_cpulist
from tests.conftest import FIXTURES

NCCL = FIXTURES / "nccl-topo-xml"

# From nccl-topo-xml/SOURCES.md: kind, GPUs, NUMA nodes, NICs, PCIe device id of the GPUs.
FACTS = {
    "modal-gvisor-8x-b200-vm.xml": ("dump", 8, 2, 13, "0x2901"),
    "panlichen-8x-rtx3090-pcie-topo.xml": ("dump", 8, 2, 1, "0x2204"),
    "azure-ncv4-topo.xml": ("dump", 4, 4, 1, "0x20b5"),
    "aws-p4d-24xl-topo.xml": ("static", 8, 2, 4, "0x20b0"),
    "aws-p4de-24xl-topo.xml": ("static", 8, 2, 4, "0x20b2"),
    "azure-ndv2-topo.xml": ("static", 8, 2, 1, ""),
    "azure-ndv4-topo.xml": ("static", 8, 4, 8, ""),
    "azure-ndv5-topo.xml": ("static", 8, 2, 8, ""),
    "aws-g5.48xl-topo.xml": ("static", 0, 2, 0, ""),
    "aws-p5.48xl-topo.xml": ("static", 0, 2, 0, ""),
}


def test_every_topology_file_is_covered() -> None:
    topologies = {p.name for p in NCCL.glob("*.xml") if "graph" not in p.name}
    assert topologies == set(FACTS)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_topology_files_read_to_their_documented_facts(name: str) -> None:
    kind, gpus, numa, nics, device = FACTS[name]
    topology = parse_nccl_topo_xml(NCCL / name)
    assert topology.kind == kind
    assert len(topology.gpus) == gpus
    assert len(topology.cpus) == numa
    assert len(topology.nics) == nics
    if device:
        assert {g.device_id for g in topology.gpus} == {device}
    assert topology.summary().startswith(f"NCCL topology {'dump' if kind == 'dump' else 'file'}")


def test_b200_dump_nvlink_every_pair_and_nic_speeds() -> None:
    topology = parse_nccl_topo_xml(NCCL / "modal-gvisor-8x-b200-vm.xml")
    assert topology.pair_nvlinks() == {18: 28}
    assert {g.sm for g in topology.gpus} == {100}
    speeds = sorted(n.speed_gbps or 0 for n in topology.nics)
    assert speeds == [100] * 4 + [200] + [400] * 8
    assert all(n.gdr for n in topology.nics)
    assert "NVLink between every GPU pair (18 links)" in topology.summary()
    assert "13 NICs (4x 100 Gb/s, 1x 200 Gb/s, 8x 400 Gb/s)" in topology.summary()


def test_rtx3090_dump_is_pcie_only_split_over_two_sockets() -> None:
    topology = parse_nccl_topo_xml(NCCL / "panlichen-8x-rtx3090-pcie-topo.xml")
    assert topology.pair_nvlinks() == {0: 28}
    assert [g.numa_id for g in topology.gpus] == [0] * 4 + [1] * 4
    assert {g.gdr for g in topology.gpus} == {False}
    assert topology.pci_switches == 2
    assert topology.nics[0].speed_gbps == 56
    assert topology.nics[0].numa_id == 1
    assert "no NVLink" in topology.summary()


def test_p4d_static_layout_and_affinity_masks() -> None:
    topology = parse_nccl_topo_xml(NCCL / "aws-p4d-24xl-topo.xml")
    assert topology.pci_switches == 4
    assert [g.numa_id for g in topology.gpus] == [0] * 4 + [1] * 4
    assert [n.numa_id for n in topology.nics] == [0, 0, 1, 1]
    first, second = (parse_cpulist(c.cpus) for c in topology.cpus)
    assert len(first) == len(second) == 48
    assert not first & second


def test_ncv4_vm_quirks_are_noted() -> None:
    topology = parse_nccl_topo_xml(NCCL / "azure-ncv4-topo.xml")
    assert [g.numa_id for g in topology.gpus] == [0, 1, 2, 3]
    assert {g.link_width for g in topology.gpus} == {0}
    assert len(topology.notes) == 4
    assert all("NVLink to itself" in n for n in topology.notes)
    assert topology.pair_nvlinks() == {0: 6}


def test_p5_lists_no_gpus_and_says_so() -> None:
    topology = parse_nccl_topo_xml(NCCL / "aws-p5.48xl-topo.xml")
    assert topology.pci_switches == 8
    assert topology.pci_unclassified == 32
    assert "lists no GPUs" in topology.notes[0]


def test_cpumask() -> None:
    assert cpumask_to_cpulist("000000ff,ffff0000,00ffffff") == "0-23,48-71"
    assert cpumask_to_cpulist("0000ffff,0000ffff") == "0-15,32-47"
    assert cpumask_to_cpulist("00000000") == ""


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("azure-ncv4-graph.xml", "NCCL graph file"),
        ("panlichen-8x-rtx3090-pcie-graph.xml", "NCCL graph file"),
    ],
)
def test_graph_files_are_refused(name: str, words: str) -> None:
    with pytest.raises(ReplayError, match=words):
        parse_nccl_topo_xml(NCCL / name)


def test_broken_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<system><cpu>")
    with pytest.raises(ReplayError, match="not valid XML"):
        parse_nccl_topo_xml(bad)
    bad.write_text("<nvidia_smi_log/>")
    with pytest.raises(ReplayError, match="not an NCCL topology"):
        parse_nccl_topo_xml(bad)
    with pytest.raises(ReplayError, match="cannot read"):
        parse_nccl_topo_xml(tmp_path / "missing.xml")


def test_azure_static_files() -> None:
    ndv2 = parse_nccl_topo_xml(NCCL / "azure-ndv2-topo.xml")
    assert [n.numa_id for n in ndv2.nics] == [0]  # one IB HCA, on socket 0
    ndv5 = parse_nccl_topo_xml(NCCL / "azure-ndv5-topo.xml")
    assert {g.link_speed for g in ndv5.gpus} == {"32.0 GT/s PCIe"}  # PCIe gen5
    assert ndv5.pci_switches == 8
