"""Topology rules on machines built from recorded `nvidia-smi topo -m` / `topo -p2p r` output."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.nvml_backend import NvmlBackend
from gpudiag.probe.system import SystemReport, inspect
from gpudiag.probe.topology import Topology, parse_topo_matrix
from gpudiag.rules.engine import FAMILIES, EvidenceBundle, run_rules
from gpudiag.rules.finding import Finding, NotEvaluated
from tests.conftest import FIXTURES
from tests.fakes.fake_nvml import FakeNvml

TOPO = FIXTURES / "topo-matrix"
XML = FIXTURES / "nvidia-smi-xml"
RULES = ("topo.host_path", "topo.nvlink_asymmetric", "topo.cpu_affinity")


def _run(system: SystemReport) -> tuple[list[Finding], list[NotEvaluated]]:
    diagnosis = run_rules(EvidenceBundle(system=system, env={}), only=RULES)
    return list(diagnosis.findings), list(diagnosis.not_evaluated)


def _ids(findings: list[Finding]) -> dict[str, str]:
    return {f.id: f.severity.value for f in findings}


def _live(xml: str, topo: str, p2p: str | None = None) -> SystemReport:
    fake = FakeNvml(
        XML / xml, topology=TOPO / f"{topo}.txt", p2p=TOPO / f"{p2p}.txt" if p2p else None
    )
    return inspect(backend=NvmlBackend(NvmlSession(fake)), env={})


def _recording(system: SystemReport, tmp_path: Path) -> SystemReport:
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(system.to_dict()))
    return inspect(replay=path)


def _edited(system: SystemReport, text: str, **changes: object) -> SystemReport:
    """The system with the topology of ``text`` (an edit of a recording) and ``changes``."""
    assert system.topology is not None
    edited = dataclasses.replace(
        parse_topo_matrix(text),
        process_cpus=system.topology.process_cpus,
        **changes,  # type: ignore[arg-type]
    )
    return dataclasses.replace(system, topology=edited)


def _two_sockets_of_nvlink() -> str:
    """dgx-a100-8x with the NVLinks between the two NUMA halves gone (SYS instead)."""
    lines = (TOPO / "dgx-a100-8x.txt").read_text().splitlines()
    out = [lines[0]]
    for n, line in enumerate(lines[1:]):
        cells = line.split()
        for m in range(8):
            if (n < 4) != (m < 4):
                cells[1 + m] = "SYS"
        out.append("  ".join(cells))
    return "\n".join(out) + "\n"


def test_topology_family_is_registered() -> None:
    assert "topology" in FAMILIES


def test_pcie_pair_without_p2p_is_medium_with_the_pair_as_evidence() -> None:
    system = inspect(
        replay=XML / "dual_2070-v13.xml",
        topology=[TOPO / "2gpu-pcie.txt", TOPO / "p2p-l4-2x.txt"],
    )
    findings, skipped = _run(system)
    assert _ids(findings) == {"topo.p2p_unsupported": "medium"}
    finding = findings[0]
    values = {e.name: e.value for e in finding.evidence}
    assert values["GPU0-GPU1"] == "PHB, P2P CNS"
    assert values["pairs affected"] == 1
    assert "host memory" in finding.message
    assert "ACSCtl" in finding.instruction
    # the affinity rule cannot judge a recording
    assert [n.rule for n in skipped] == ["topo.cpu_affinity"]


def test_p2p_only_recording_still_judges_p2p() -> None:
    system = inspect(replay=XML / "dual_2070-v13.xml", topology=TOPO / "p2p-l4-2x.txt")
    assert "topo.p2p_unsupported" in _ids(_run(system)[0])


def test_pcie_pair_with_unknown_p2p_is_not_evaluated() -> None:
    system = inspect(replay=XML / "dual_2070-v13.xml", topology=TOPO / "2gpu-pcie.txt")
    findings, skipped = _run(system)
    assert findings == []
    reasons = {n.rule: n.missing for n in skipped}
    assert "topo -p2p r" in reasons["topo.host_path"]


def test_multi_gpu_recording_without_topology_is_not_evaluated() -> None:
    findings, skipped = _run(inspect(replay=XML / "dual_a5000-v13.xml"))
    assert findings == []
    assert sorted(n.rule for n in skipped) == sorted(RULES)
    assert all("nvidia-smi topo -m" in n.missing for n in skipped)


def test_single_gpu_has_nothing_to_say() -> None:
    assert _run(inspect(replay=XML / "tesla-t4.xml")) == ([], [])


@pytest.mark.parametrize(
    ("topo", "p2p"),
    [("dgx-h100-8x", "p2p-h100-8x"), ("dgx-a100-8x", None), ("h100-8x-ht-affinity", None)],
)
def test_uniform_nvlink_boards_are_clean(topo: str, p2p: str | None) -> None:
    findings, _ = _run(_live("a100-sxm4-v12.xml", topo, p2p))
    assert [f for f in findings if f.id.startswith("topo.") and f.severity.value != "info"] == []


def test_two_gpu_nvlink_bridge_is_clean() -> None:
    findings, _ = _run(_live("dual_2080-v13.xml", "2gpu-nvlink"))
    assert findings == []


def test_cross_socket_pairs_and_partial_nvlink() -> None:
    system = _edited(_live("a100-sxm4-v12.xml", "dgx-a100-8x"), _two_sockets_of_nvlink())
    findings, _ = _run(system)
    ids = _ids(findings)
    assert ids["topo.cross_socket"] == "medium"  # P2P unknown
    assert ids["topo.nvlink_partial"] == "low"
    assert "topo.nvlink_uneven" not in ids
    cross = next(f for f in findings if f.id == "topo.cross_socket")
    values = {e.name: e.value for e in cross.evidence}
    assert values["pairs affected"] == 16
    assert values["GPU0-GPU4"] == "SYS"
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3" in cross.instruction
    assert "NCCL_P2P_LEVEL" in cross.instruction
    partial = next(f for f in findings if f.id == "topo.nvlink_partial")
    assert "NVLink joins 12 of 28 GPU pairs" in partial.message


def test_cross_socket_with_p2p_ok_is_low() -> None:
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    text = _two_sockets_of_nvlink()
    ok = tuple(tuple("X" if i == j else "OK" for j in range(8)) for i in range(8))
    findings, _ = _run(_edited(system, text, p2p=ok))
    assert _ids(findings)["topo.cross_socket"] == "low"


def test_a_short_pair_on_an_all_nvlink_board_is_medium() -> None:
    # GPU3 lost one link into the switches: every pair with GPU3 shows NV11.
    lines = (TOPO / "dgx-a100-8x.txt").read_text().splitlines()
    rows = [line.split() for line in lines[1:]]
    for n, cells in enumerate(rows):
        for m in range(8):
            if 3 in (n, m) and n != m:
                cells[1 + m] = "NV11"
    text = "\n".join([lines[0], *("  ".join(c) for c in rows)]) + "\n"
    findings, _ = _run(_edited(_live("a100-sxm4-v12.xml", "dgx-a100-8x"), text))
    uneven = [f for f in findings if f.id == "topo.nvlink_uneven"]
    assert len(uneven) == 1
    assert uneven[0].severity.value == "medium"
    values = {e.name: e.value for e in uneven[0].evidence}
    assert values["pairs affected"] == 7
    assert values["GPU0-GPU3"] == "NV11"
    assert values["pairs by link"] == "7 NV11, 21 NV12"
    assert "nvidia-smi nvlink --status" in uneven[0].instruction


@pytest.mark.parametrize(
    ("process_cpus", "expected"),
    [
        ("24-47", {"topo.cpu_affinity_remote": "medium"}),
        ("20-30", {"topo.cpu_affinity_partly_remote": "low"}),
        ("0-47", {"topo.cpu_affinity_unpinned": "info"}),
        ("0-23", {}),
        ("2-5", {}),
    ],
)
def test_process_pinning_against_the_primary_gpu(
    process_cpus: str, expected: dict[str, str]
) -> None:
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    assert system.topology is not None
    topology = dataclasses.replace(system.topology, process_cpus=process_cpus)
    findings, skipped = _run(dataclasses.replace(system, topology=topology))
    assert _ids(findings) == expected
    assert skipped == [n for n in skipped if n.rule == "topo.host_path"]  # P2P N/A on the fake
    for f in findings:
        assert "numactl --cpunodebind=0 --membind=0" in f.instruction
        assert "torchrun --numa-binding=node" in f.instruction


def test_pinning_on_another_primary_gpu_uses_its_numa_node() -> None:
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    assert system.topology is not None
    gpus = tuple(
        dataclasses.replace(g, info=dataclasses.replace(g.info, cuda_index=(n + 4) % 8))
        for n, g in enumerate(system.gpus)
    )
    topology = dataclasses.replace(system.topology, process_cpus="0-23")
    findings, _ = _run(dataclasses.replace(system, gpus=gpus, topology=topology))
    remote = [f for f in findings if f.id == "topo.cpu_affinity_remote"]
    assert len(remote) == 1
    assert "GPU4 (cuda:0)" in remote[0].message
    assert "--cpunodebind=1" in remote[0].instruction


def test_no_affinity_without_numa_uses_taskset() -> None:
    system = _live("dual_2080-v13.xml", "2gpu-nvlink")
    assert system.topology is not None
    topology = dataclasses.replace(system.topology, process_cpus="30-40")
    findings, _ = _run(dataclasses.replace(system, topology=topology))
    assert _ids(findings) == {"topo.cpu_affinity_remote": "medium"}
    assert "taskset -c 0-23" in findings[0].instruction


def test_recorded_live_machine_does_not_judge_this_process(tmp_path: Path) -> None:
    live = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    assert live.topology is not None
    pinned_far = dataclasses.replace(
        live, topology=dataclasses.replace(live.topology, process_cpus="24-47")
    )
    recorded = _recording(pinned_far, tmp_path)
    assert recorded.is_recording
    assert recorded.topology is not None
    assert recorded.topology.process_cpus == "24-47"
    findings, skipped = _run(recorded)
    assert "topo.cpu_affinity_remote" not in _ids(findings)
    assert "topo.cpu_affinity" in {n.rule for n in skipped}


def test_topology_findings_reach_the_full_diagnosis() -> None:
    system = inspect(
        replay=XML / "dual_2070-v13.xml",
        topology=[TOPO / "2gpu-pcie.txt", TOPO / "p2p-l4-2x.txt"],
    )
    diagnosis = run_rules(EvidenceBundle(system=system, env={}))
    assert "topo.p2p_unsupported" in diagnosis.ids()
    assert isinstance(system.topology, Topology)
