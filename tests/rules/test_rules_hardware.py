"""Hardware and environment rules on real nvidia-smi recordings (and edits of them)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from gpudiag.monitoring import Monitor
from gpudiag.probe.dcgm import PROFILING_PERMISSION_FIX
from gpudiag.probe.model import Gpu, NvLink
from gpudiag.probe.readings import Reading, Status, ok
from gpudiag.probe.system import SystemReport, inspect
from gpudiag.rules.engine import EvidenceBundle, run_rules
from gpudiag.rules.finding import Finding, Severity
from tests.conftest import FIXTURES
from tests.fakes.clock import FakeClock
from tests.fakes.monitor_feeds import ScriptedFeed


def _report(fixtures_dir: Path, name: str) -> SystemReport:
    return inspect(replay=fixtures_dir / "nvidia-smi-xml" / name)


def _diagnose(system: SystemReport, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    found = run_rules(EvidenceBundle(system=system, env=env or {})).findings
    return [(f.id, f.severity.value) for f in found]


def _edit_gpu(
    system: SystemReport, *, info: dict | None = None, state: dict | None = None
) -> SystemReport:
    gpu = system.gpus[0]
    new = Gpu(
        dataclasses.replace(gpu.info, **(info or {})),
        dataclasses.replace(gpu.state, **(state or {})),
    )
    return dataclasses.replace(system, gpus=(new, *system.gpus[1:]))


def test_idle_sw_power_cap_and_gen_downclock_are_info_only(fixtures_dir: Path) -> None:
    found = _diagnose(_report(fixtures_dir, "3090-v13.xml"))
    assert ("hw.power_capped_idle", "info") in found
    assert ("hw.pcie_gen_idle_downclock", "info") in found
    assert all(sev == "info" for _, sev in found)


def test_sw_power_cap_while_busy_is_medium(fixtures_dir: Path) -> None:
    system = _edit_gpu(_report(fixtures_dir, "3090-v13.xml"), state={"gpu_util_pct": ok(97.0)})
    found = _diagnose(system)
    assert ("hw.power_capped", "medium") in found
    assert ("hw.pcie_gen_degraded", "medium") in found  # gen 1 of 4 under load is real
    assert "hw.power_capped_idle" not in dict(found)


def test_t4_link_width_x8_of_x16_while_idle_is_info(fixtures_dir: Path) -> None:
    diagnosis = run_rules(EvidenceBundle(system=_report(fixtures_dir, "tesla-t4.xml"), env={}))
    width = [f for f in diagnosis.findings if f.id == "hw.pcie_width_degraded"]
    assert len(width) == 1
    assert width[0].severity is Severity.INFO
    assert "x8 of x16 while idle" in width[0].message
    values = {e.name: e.value for e in width[0].evidence}
    assert (values["pcie.link.width.current"], values["pcie.link.width.max"]) == (8, 16)
    assert values["utilization.gpu"] == 0.0
    assert "hw.pcie_gen_idle_downclock" not in diagnosis.ids()  # T4 runs at gen 3 of 3


def test_idle_a10g_link_downshift_is_info_only(fixtures_dir: Path) -> None:
    # The recorded AWS g5 A10G idles in P8 at gen 1 of 4 and x8 of x16.
    found = _diagnose(_report(fixtures_dir, "a10g.xml"))
    assert ("hw.pcie_width_degraded", "info") in found
    assert ("hw.pcie_gen_idle_downclock", "info") in found
    assert not [f for f in found if f[0].startswith("hw.pcie") and f[1] != "info"]


def test_busy_a10g_on_a_narrow_slow_link_is_medium(fixtures_dir: Path) -> None:
    system = _edit_gpu(_report(fixtures_dir, "a10g.xml"), state={"gpu_util_pct": ok(90.0)})
    found = _diagnose(system)
    assert ("hw.pcie_width_degraded", "medium") in found
    assert ("hw.pcie_gen_degraded", "medium") in found
    width = next(
        f
        for f in run_rules(EvidenceBundle(system=system, env={})).findings
        if f.id == "hw.pcie_width_degraded"
    )
    assert "50% of the link's bandwidth" in width.message


def test_width_with_utilization_na_is_not_blamed(fixtures_dir: Path) -> None:
    unknown: Reading[float] = Reading(None, Status.NOT_SUPPORTED, "MIG")
    system = _edit_gpu(_report(fixtures_dir, "tesla-t4.xml"), state={"gpu_util_pct": unknown})
    assert ("hw.pcie_width_degraded", "info") in _diagnose(system)


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (FIXTURES / "nvidia-smi-xml").glob("*.xml"))
)
def test_no_recorded_gpu_gets_more_than_info_for_its_link(fixtures_dir: Path, name: str) -> None:
    # Every recording is idle except the RTX 3080 (v13) under load, whose link is at its maximum.
    found = _diagnose(_report(fixtures_dir, name))
    assert [f for f in found if f[0].startswith("hw.pcie") and f[1] != "info"] == []


def test_a100_mig_is_info_and_persistence_off_is_low(fixtures_dir: Path) -> None:
    found = dict(_diagnose(_report(fixtures_dir, "a100-sxm4-v12.xml")))
    assert found["hw.mig_enabled"] == "info"
    assert found["hw.persistence_off"] == "low"


def test_busy_rtx3080_has_no_throttle_or_link_finding(fixtures_dir: Path) -> None:
    found = dict(_diagnose(_report(fixtures_dir, "rtx-3080-v13.xml")))
    assert not any(k.startswith(("hw.pcie", "hw.power", "hw.thermal")) for k in found)


def test_memory_over_90_percent_held_by_another_program_names_it(fixtures_dir: Path) -> None:
    diagnosis = run_rules(
        EvidenceBundle(system=_report(fixtures_dir, "dual_a5000-v13.xml"), env={})
    )
    full = [f for f in diagnosis.findings if f.id == "hw.memory_full"]
    assert len(full) == 1  # GPU 0 holds 22 of 24 GiB; GPU 1 holds 17 GiB (70 %)
    # The recording's only process on GPU 0 is llama.cpp's server, not PyTorch: checkpointing
    # in the user's training step frees none of its memory.
    assert "held by llama-server (pid " in full[0].message
    assert full[0].fix is None
    assert "another GPU" in (full[0].instruction or "")
    assert "env.allocator_expandable_segments" in diagnosis.ids()


def test_memory_over_90_percent_in_a_python_process_suggests_checkpointing(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    xml = (fixtures_dir / "nvidia-smi-xml" / "dual_a5000-v13.xml").read_text()
    python = tmp_path / "a5000-python.xml"
    python.write_text(xml.replace("/root/src/llama.cpp/build/bin/llama-server", "python3"))
    diagnosis = run_rules(EvidenceBundle(system=inspect(replay=python), env={}))
    (full,) = [f for f in diagnosis.findings if f.id == "hw.memory_full"]
    assert full.fix is not None
    assert full.fix.id == "activation.checkpointing"
    assert full.fix.to_fix().id == "activation.checkpointing"
    fixed_env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    again = run_rules(
        EvidenceBundle(system=_report(fixtures_dir, "dual_a5000-v13.xml"), env=fixed_env)
    )
    assert "env.allocator_expandable_segments" not in again.ids()


@pytest.mark.parametrize(
    "reasons",
    [("hw_slowdown",), ("sw_thermal_slowdown", "sw_power_cap"), ("hw_power_brake_slowdown",)],
)
def test_protective_clock_events_are_high(fixtures_dir: Path, reasons: tuple[str, ...]) -> None:
    system = _edit_gpu(
        _report(fixtures_dir, "rtx-3080-v13.xml"), state={"clock_event_reasons": ok(reasons)}
    )
    assert ("hw.thermal_or_power_slowdown", "high") in _diagnose(system)


def test_ecc_and_retired_pages(fixtures_dir: Path) -> None:
    system = _edit_gpu(
        _report(fixtures_dir, "tesla-t4.xml"),
        state={"ecc_uncorrected_volatile": ok(3), "retired_pages": ok(2)},
    )
    found = dict(_diagnose(system))
    assert found["hw.ecc_uncorrected"] == "high"
    assert found["hw.retired_pages"] == "medium"
    assert "hw.ecc_uncorrected" not in dict(_diagnose(_report(fixtures_dir, "tesla-t4.xml")))


def test_nvlink_partly_down_is_high(fixtures_dir: Path) -> None:
    links = (
        NvLink(0, ok(True)),
        NvLink(1, ok(False)),
        NvLink(2, Reading(None, Status.NOT_SUPPORTED)),
    )
    system = _edit_gpu(_report(fixtures_dir, "a100-sxm4-v12.xml"), info={"nvlinks": links})
    diagnosis = run_rules(EvidenceBundle(system=system, env={}))
    nvlink = [f for f in diagnosis.findings if f.id == "hw.nvlink_down"]
    assert [f.severity for f in nvlink] == [Severity.HIGH]
    assert "link(s) 1 down" in nvlink[0].message


def test_gpu_lost_reading_is_high(fixtures_dir: Path) -> None:
    lost: Reading[float] = Reading(None, Status.GPU_LOST, "GPU is lost")
    system = _edit_gpu(_report(fixtures_dir, "rtx-3080-v13.xml"), state={"temperature_c": lost})
    assert ("hw.gpu_lost", "high") in _diagnose(system)


def test_na_readings_make_no_findings(fixtures_dir: Path) -> None:
    # The vGPU guest reports PCIe, clock reasons and persistence as N/A.
    assert _diagnose(_report(fixtures_dir, "tesla_p4.xml")) == []


def test_gpu_rules_not_evaluated_without_gpu() -> None:
    diagnosis = run_rules(EvidenceBundle(system=None, env={}))
    skipped = {n.rule: n.missing for n in diagnosis.not_evaluated}
    assert "hw.pcie_link" in skipped
    assert "NVIDIA GPU" in skipped["hw.pcie_link"]
    assert "hw.gpu_lost" in skipped
    assert "env.cuda_limiting" in diagnosis.evaluated


def test_cuda_launch_blocking_is_high_and_ranked_first(fixtures_dir: Path) -> None:
    env = {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_INJECTION64_PATH": "/opt/tool/libinj.so"}
    diagnosis = run_rules(EvidenceBundle(system=_report(fixtures_dir, "tesla-t4.xml"), env=env))
    assert diagnosis.findings[0].id == "env.cuda_launch_blocking"
    assert diagnosis.findings[0].severity is Severity.HIGH
    assert ("env.cuda_injection64_path", Severity.MEDIUM) in [
        (f.id, f.severity) for f in diagnosis.findings
    ]


@pytest.mark.parametrize("value", ["0", "", "false"])
def test_variables_set_to_off_are_ignored(value: str) -> None:
    diagnosis = run_rules(EvidenceBundle(env={"CUDA_LAUNCH_BLOCKING": value}))
    assert diagnosis.findings == ()


# -- GPU performance counters reserved for admin users (ERR_NVGPUCTRPERM) -------------------


def _live(system: SystemReport) -> SystemReport:
    """The recording as if read live here, so this machine's driver setting applies to it."""
    return dataclasses.replace(system, source="live")


def _counters(system: SystemReport, runtime: dict, samples: object = None) -> object:
    diagnosis = run_rules(
        EvidenceBundle(system=system, runtime=runtime, samples=samples, env={}),
        only=["hw.profiling_counters"],
    )
    found = [f for f in diagnosis.findings if f.id == "hw.profiling_counters_restricted"]
    return found[0] if found else {n.rule: n.missing for n in diagnosis.not_evaluated}


def test_admin_only_counters_for_a_non_root_process_are_info(fixtures_dir: Path) -> None:
    system = _live(_report(fixtures_dir, "a10g.xml"))
    runtime = {"profiling_admin_only": True, "euid": 1000, "profiling_params_path": "/proc/x"}
    finding = _counters(system, runtime)
    assert isinstance(finding, Finding)
    assert finding.severity is Severity.INFO
    assert "NVreg_RestrictProfilingToAdminUsers=0" in finding.instruction
    assert "ERR_NVGPUCTRPERM" in finding.instruction
    assert {(e.name, e.value) for e in finding.evidence} == {
        ("RmProfilingAdminOnly", 1),
        ("effective uid", 1000),
    }


@pytest.mark.parametrize(
    "runtime",
    [{"profiling_admin_only": True, "euid": 0}, {"profiling_admin_only": False, "euid": 1000}],
)
def test_root_or_open_counters_are_fine(fixtures_dir: Path, runtime: dict) -> None:
    assert _counters(_live(_report(fixtures_dir, "a10g.xml")), runtime) == {}


def test_unknown_setting_is_not_evaluated_with_the_reason(fixtures_dir: Path) -> None:
    reason = "/proc/driver/nvidia/params does not exist (no NVIDIA driver loaded, or not Linux)"
    live = _counters(_live(_report(fixtures_dir, "a10g.xml")), {"profiling_unknown": reason})
    assert live == {"hw.profiling_counters": reason}
    # This machine's setting says nothing about a recorded GPU.
    recorded = _counters(_report(fixtures_dir, "a10g.xml"), {"profiling_admin_only": True})
    assert "recorded machine" in recorded["hw.profiling_counters"]  # type: ignore[index]


def _denied_monitor() -> Monitor:
    clock = FakeClock(1000.0)
    feed = ScriptedFeed(
        clock,
        values=lambda n: [float(n), math.nan],
        na=lambda n: {1: (Status.NO_PERMISSION, PROFILING_PERMISSION_FIX)},
    )
    monitor = Monitor(feed, interval=1.0, start=False, clock=clock)
    monitor.tick()
    return monitor


def test_monitor_series_denied_permission_are_low(fixtures_dir: Path) -> None:
    monitor = _denied_monitor()
    recorded = _report(fixtures_dir, "a10g.xml")
    for samples in (monitor, monitor.to_dict()):
        finding = _counters(recorded, {}, samples)
        assert isinstance(finding, Finding)
        assert finding.severity is Severity.LOW
        assert ("series without permission", "gpu0/throttled") in [
            (e.name, e.value) for e in finding.evidence
        ]
    # The DataFrame alone carries no N/A reasons: the rule says it could not tell.
    frame = _counters(recorded, {}, monitor.samples())
    assert set(frame) == {"hw.profiling_counters"}  # type: ignore[arg-type]


def test_power_limit_lowered_on_real_recordings(fixtures_dir: Path) -> None:
    # rtx-3090-v12.xml (its "power-limit fields", SOURCES.md): enforced 200 W of a 350 W
    # default; idle, so LOW.
    diagnosis = run_rules(EvidenceBundle(system=_report(fixtures_dir, "rtx-3090-v12.xml"), env={}))
    [finding] = [f for f in diagnosis.findings if f.id == "hw.power_limit_lowered"]
    assert finding.severity is Severity.LOW
    assert "200 W, 43% below its default 350 W" in finding.message
    assert "nvidia-smi -i 0 -pl 350" in finding.instruction
    # rtx-3080-v12.xml runs 336 W of a 320 W default: raised, not lowered.
    assert "hw.power_limit_lowered" not in dict(
        _diagnose(_report(fixtures_dir, "rtx-3080-v12.xml"))
    )


def test_power_limit_lowered_is_medium_when_busy_at_the_cap(fixtures_dir: Path) -> None:
    system = _edit_gpu(
        _report(fixtures_dir, "rtx-3090-v12.xml"),
        state={"gpu_util_pct": ok(98.0), "clock_event_reasons": ok(("sw_power_cap",))},
    )
    assert ("hw.power_limit_lowered", "medium") in _diagnose(system)
    busy_uncapped = _edit_gpu(
        _report(fixtures_dir, "rtx-3090-v12.xml"), state={"gpu_util_pct": ok(98.0)}
    )
    assert ("hw.power_limit_lowered", "low") in _diagnose(busy_uncapped)


@pytest.mark.parametrize(
    "path", sorted((FIXTURES / "nvidia-smi-xml").glob("*.xml")), ids=lambda p: p.stem
)
def test_power_limit_rule_only_where_the_recording_shows_a_lowered_limit(path: Path) -> None:
    system = inspect(replay=path)
    found = "hw.power_limit_lowered" in dict(_diagnose(system))
    lowered = any(
        g.info.power_limit_w.ok
        and g.info.default_power_limit_w.ok
        and g.info.power_limit_w.value < 0.95 * g.info.default_power_limit_w.value
        for g in system.gpus
    )
    assert found is lowered
    assert found is (path.name == "rtx-3090-v12.xml")


@pytest.mark.parametrize(
    "path",
    [
        *[
            p
            for p in sorted((FIXTURES / "nvidia-smi-text").glob("*-q.txt"))
            if "gh200" not in p.name
        ],
        FIXTURES / "nvidia-smi-xml" / "pro-6000-maxq-blackwell-v13.xml",
    ],
    ids=lambda p: p.name,
)
def test_row_remapping_read_on_real_recordings_and_healthy(path: Path) -> None:
    # The H100 / H200 text dumps and the Blackwell XML print 0 rows, Pending: No, Failure: No.
    system = inspect(replay=path)
    for gpu in system.gpus:
        assert gpu.state.remapped_rows_uncorrectable.value == 0
        assert gpu.state.row_remap_pending.value is False
        assert gpu.state.row_remap_failed.value is False
    found = dict(_diagnose(system))
    assert not {"hw.row_remap_failed", "hw.row_remap_pending", "hw.rows_remapped"} & set(found)


def test_gh200_recording_has_one_repaired_row() -> None:
    # gh200.nvidia-smi-q.txt: Remapped Rows / Uncorrectable Error 1, Pending No, Failure No,
    # after one aggregate DRAM uncorrectable error: repaired, so LOW, not a reset or a service.
    system = inspect(replay=FIXTURES / "nvidia-smi-text" / "gh200.nvidia-smi-q.txt")
    found = dict(_diagnose(system))
    assert found["hw.rows_remapped"] == "low"
    assert "hw.row_remap_pending" not in found
    assert "hw.row_remap_failed" not in found


def test_row_remapping_na_on_the_a100_recording_says_why(fixtures_dir: Path) -> None:
    state = _report(fixtures_dir, "a100-sxm4-v12.xml").gpus[0].state
    assert state.row_remap_pending.status is Status.NOT_SUPPORTED
    assert "printed N/A" in state.row_remap_pending.reason


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (
            {"row_remap_failed": ok(True), "row_remap_pending": ok(True)},
            ("hw.row_remap_failed", "high"),
        ),
        ({"row_remap_pending": ok(True)}, ("hw.row_remap_pending", "medium")),
        ({"remapped_rows_uncorrectable": ok(2)}, ("hw.rows_remapped", "low")),
    ],
    ids=["failed", "pending", "repaired"],
)
def test_row_remapping_findings(state: dict, expected: tuple[str, str]) -> None:
    # The H100 SXM text (0 / No / No) with one remapper state changed.
    base = inspect(replay=FIXTURES / "nvidia-smi-text" / "h100-sxm-x8.nvidia-smi-q.txt")
    remap = ("hw.row_remap_failed", "hw.row_remap_pending", "hw.rows_remapped")
    found = [f for f in _diagnose(_edit_gpu(base, state=state)) if f[0] in remap]
    assert found == [expected]
