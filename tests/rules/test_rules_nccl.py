"""NCCL judged from the topology and the environment: link budgets, measured bus bandwidth
against them (real nccl-tests log, real traces), variables that switch transports off, the
nccl.env fix exported to a recipe, and GPUs far from their network cards."""

from __future__ import annotations

import pytest

from gpudiag.analysis.nccl import (
    NCCL_EFFICIENCY,
    link_budget,
    measured_busbw,
    nccl_xml_link_budget,
    parse_nccl_tests,
    pcie_gen_of,
)
from gpudiag.analysis.trace import analyze_trace
from gpudiag.fixes import Fix
from gpudiag.probe.nccl_topo import parse_nccl_topo_xml
from gpudiag.probe.topology import load_topology
from gpudiag.recipe import Recipe
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Severity
from tests.conftest import FIXTURES
from tests.rules.test_rules_topology import _edited, _live

TOPO = FIXTURES / "topo-matrix"
ALLREDUCE_8X_A100 = FIXTURES / "nccl-tests" / "superbench-nccl_allreduce.log"


@pytest.mark.parametrize(
    ("name", "cc", "link", "gbps"),
    [
        ("dgx-a100-8x", 8, "NVLink x12", 300.0),  # A100 datasheet: 600 GB/s both ways
        ("dgx-h100-8x", 9, "NVLink x18", 450.0),  # H100 SXM: 900 GB/s both ways
        ("dstack-8xh100-sxm5-topo-m", 9, "NVLink x18", 450.0),
        ("2gpu-nvlink", 7, "NVLink x2", 50.0),
        ("2gpu-pcie", None, "PCIe Gen4 x16 (PHB)", 31.5),
    ],
)
def test_link_budget_of_recorded_machines(
    name: str, cc: int | None, link: str, gbps: float
) -> None:
    budget = link_budget(load_topology(TOPO / f"{name}.txt").links, cc_major=cc)
    assert budget is not None
    assert (budget.link, budget.link_gbps) == (link, gbps)
    assert budget.expected_busbw_gbps == pytest.approx(gbps * NCCL_EFFICIENCY)


def test_link_budget_direct_nvlinks_and_unknown_pairs() -> None:
    # DGX-1-like direct links: the least-linked GPU bounds the ring (here 1 + 2 = 3 links).
    labels = [["X", "NV1", "NV2"], ["NV1", "X", "NV2"], ["NV2", "NV2", "X"]]
    budget = link_budget(labels, cc_major=7)
    assert budget is not None
    assert (budget.link, budget.link_gbps) == ("NVLink x3", 75.0)
    assert link_budget([["X", "?"], ["?", "X"]]) is None
    assert link_budget([["X"]]) is None
    sys_pair = link_budget([["X", "SYS"], ["SYS", "X"]], pcie_gen=5)
    assert sys_pair is not None
    assert sys_pair.link_gbps == 63.0
    assert any("host memory" in n for n in sys_pair.notes)


def test_nccl_xml_link_speed_gives_the_pcie_generation() -> None:
    b200 = parse_nccl_topo_xml(FIXTURES / "nccl-topo-xml" / "modal-gvisor-8x-b200-vm.xml")
    assert {pcie_gen_of(g.link_speed) for g in b200.gpus} == {5}
    assert pcie_gen_of("16.0 GT/s PCIe") == 4
    assert pcie_gen_of("") is None


@pytest.mark.parametrize(
    ("name", "link", "gbps"),
    [
        # NCCL's own dump on 8x B200 (sm 100): every pair 18 NVLinks, 50 GB/s each way.
        ("modal-gvisor-8x-b200-vm.xml", "NVLink x18", 900.0),
        # 8x RTX 3090 without NVLink, links at 16 GT/s (Gen4).
        ("panlichen-8x-rtx3090-pcie-topo.xml", "PCIe Gen4 x16", 31.5),
        # A static NCCL_TOPO_FILE lists GPUs by PCI class only: no NVLinks to judge.
        ("aws-p4d-24xl-topo.xml", None, None),
    ],
)
def test_link_budget_from_nccl_topology_xml(
    name: str, link: str | None, gbps: float | None
) -> None:
    budget = nccl_xml_link_budget(parse_nccl_topo_xml(FIXTURES / "nccl-topo-xml" / name))
    if link is None:
        assert budget is None
    else:
        assert budget is not None
        assert (budget.link, budget.link_gbps) == (link, gbps)


def test_real_8x_a100_allreduce_is_healthy_against_its_links() -> None:
    log = parse_nccl_tests(ALLREDUCE_8X_A100)
    busbw, size, _ = measured_busbw([log]) or (0.0, 0, "")
    assert busbw == pytest.approx(235.26)
    assert size == 8 << 30
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    diagnosis = run_rules(
        EvidenceBundle(system=system, env={}, collectives=[log]), only=["nccl.busbw"]
    )
    # 235 GB/s of the 300 GB/s NV12 carries (78 %): no finding, and it was judged.
    assert diagnosis.findings == ()
    assert "nccl.busbw" in diagnosis.evaluated
    assert diagnosis.not_evaluated == ()


def test_the_same_busbw_on_an_nv18_board_is_low() -> None:
    # The real A100 log judged against an 8x NV18 topology (450 GB/s per direction): 52 %.
    log = parse_nccl_tests(ALLREDUCE_8X_A100)
    system = _live("a100-sxm4-v12.xml", "dgx-h100-8x")
    diagnosis = run_rules(
        EvidenceBundle(system=system, env={}, collectives=[log]), only=["nccl.busbw"]
    )
    (finding,) = diagnosis.findings
    assert finding.id == "nccl.busbw_low"
    assert finding.severity is Severity.MEDIUM
    values = {e.name: e.value for e in finding.evidence}
    assert values["measured bus bandwidth"] == pytest.approx(235.3)
    assert values["link bandwidth per GPU and direction"] == 450.0
    assert values["expected bus bandwidth"] == pytest.approx(360.0)
    assert "52%" in finding.message


def test_small_trace_messages_are_not_judged() -> None:
    # The V100 DLRM job's all-reduces are 1.5 MB: latency-bound, so the rule says it cannot tell.
    trace = analyze_trace(FIXTURES / "traces" / "param-dlrm-8rank-v100")
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    diagnosis = run_rules(EvidenceBundle(system=system, trace=trace, env={}), only=["nccl.busbw"])
    assert diagnosis.findings == ()
    (skipped,) = diagnosis.not_evaluated
    assert "32 MiB or more" in skipped.missing


def _env_findings(env: dict[str, str], system: object = None) -> dict[str, object]:
    diagnosis = run_rules(EvidenceBundle(system=system, env=env), only=["env.nccl"])
    return {f.id: f for f in diagnosis.findings}


def test_p2p_disabled_on_an_nvlink_node_is_high_and_exports_the_fix() -> None:
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    found = _env_findings({"NCCL_P2P_DISABLE": "1"}, system)
    finding = found["env.nccl.p2p_disable"]
    assert finding.severity is Severity.HIGH  # type: ignore[attr-defined]
    assert "NVLink" in finding.message  # type: ignore[attr-defined]
    fix = finding.fix.to_fix()  # type: ignore[attr-defined]
    recipe = Recipe.of([fix])
    assert recipe.to_env() == "export NCCL_P2P_DISABLE=0\n"
    assert recipe.torchrun_command().startswith("NCCL_P2P_DISABLE=0 torchrun")
    assert "export NCCL_P2P_DISABLE=0" in recipe.slurm_script()


@pytest.mark.parametrize(
    ("env", "finding_id", "severity"),
    [
        ({"NCCL_P2P_LEVEL": "LOC"}, "env.nccl.p2p_level", Severity.HIGH),
        ({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, "env.nccl.shm_disable", Severity.HIGH),
        ({"NCCL_MAX_NCHANNELS": "1"}, "env.nccl.max_nchannels", Severity.MEDIUM),
        ({"NCCL_SOCKET_IFNAME": "lo"}, "env.nccl.socket_ifname", Severity.MEDIUM),
        ({"NCCL_PROTO": "Simple"}, "env.nccl.proto", Severity.LOW),
        ({"NCCL_DEBUG": "TRACE"}, "env.nccl.debug", Severity.LOW),
    ],
)
def test_nccl_variables_that_hurt(env: dict[str, str], finding_id: str, severity: Severity) -> None:
    found = _env_findings(env, _live("a100-sxm4-v12.xml", "dgx-a100-8x"))
    assert found[finding_id].severity is severity  # type: ignore[attr-defined]


def test_nccl_variables_on_a_machine_without_nvidia_gpus_are_not_judged(
    make_cpu_system: object,
) -> None:
    system = make_cpu_system()  # type: ignore[operator]
    assert _env_findings({"NCCL_P2P_DISABLE": "1"}, system) == {}


def test_harmless_nccl_settings_are_quiet() -> None:
    system = _live("a100-sxm4-v12.xml", "dgx-a100-8x")
    quiet = {
        "NCCL_P2P_DISABLE": "0",
        "NCCL_IB_DISABLE": "0",
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_MAX_NCHANNELS": "32",
    }
    assert _env_findings(quiet, system) == {}


def _dstack_with_nic() -> object:
    """The real dstack 8x H100 SXM5 `topo -m` (one NIC, mlx5_0, SYS from every GPU) on an
    8-GPU recording."""
    text = (TOPO / "dstack-8xh100-sxm5-topo-m.txt").read_text()
    return _edited(_live("a100-sxm4-v12.xml", "dgx-h100-8x"), text)


def test_ib_disabled_on_a_machine_with_an_infiniband_nic() -> None:
    found = _env_findings({"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"}, _dstack_with_nic())
    ib = found["env.nccl.ib_disable"]
    assert ib.severity is Severity.HIGH  # type: ignore[attr-defined]
    assert "mlx5_0" in ib.message  # type: ignore[attr-defined]
    assert found["env.nccl.net"].fix == Fix("nccl.env", variables={"NCCL_NET": "IB"})
    # Without a topology the NICs are unknown: the same variable is only a low finding.
    unknown = _env_findings({"NCCL_IB_DISABLE": "1"})
    assert unknown["env.nccl.ib_disable"].severity is Severity.LOW  # type: ignore[attr-defined]


def test_gpus_far_from_the_nic_on_the_real_h100_node() -> None:
    diagnosis = run_rules(
        EvidenceBundle(system=_dstack_with_nic(), env={}), only=["topo.nic_affinity"]
    )
    (finding,) = diagnosis.findings
    assert finding.id == "topo.nic_far"
    assert "8 of 8 GPUs" in finding.message
    assert "mlx5_0" in finding.message
    # The A100 board's matrix lists no NIC: nothing to say.
    quiet = run_rules(
        EvidenceBundle(system=_live("a100-sxm4-v12.xml", "dgx-a100-8x"), env={}),
        only=["topo.nic_affinity"],
    )
    assert quiet.findings == ()


def test_collectives_across_nodes_are_not_judged_by_the_gpu_links() -> None:
    # The same 8-rank log on a machine of 2 GPUs: the 8 ranks spanned several nodes.
    log = parse_nccl_tests(ALLREDUCE_8X_A100)
    system = _live("a100-sxm4-v12.xml", "2gpu-nvlink")
    diagnosis = run_rules(
        EvidenceBundle(system=system, env={}, collectives=[log]), only=["nccl.busbw"]
    )
    assert diagnosis.findings == ()
    (skipped,) = diagnosis.not_evaluated
    assert "across nodes" in skipped.missing
