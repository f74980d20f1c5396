"""Hardware health and configuration rules: lost GPUs, PCIe links, throttling, ECC, MIG, memory.

Every rule reads the system report (``gd.inspect()``, live or recorded) and is gated on what
that report can tell: a reading that is N/A makes no finding, and an idle GPU is not blamed for
the power saving it is supposed to do. The profiling-counter rule also reads the driver setting
that ``gpudiag.probe.runtime`` recorded, and the N/A reasons of monitor samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gpudiag.probe.dcgm import PROFILING_PERMISSION_FIX
from gpudiag.probe.model import Gpu
from gpudiag.probe.readings import Reading, Status
from gpudiag.rules._facts import gib, gpu_label, is_busy, memory_used_fraction, source_of
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, NotEvaluated, Severity

if TYPE_CHECKING:
    from gpudiag.rules.evidence import Samples
    from gpudiag.step import Workload

CATEGORY = "hardware"

# Clock-event reasons (NVML ``nvmlClocksEventReasons``) that mean the GPU is protecting itself
# from heat or a power excursion: clocks drop whatever the workload does.
_PROTECTIVE = {
    "hw_slowdown": "hardware slowdown (thermal or power brake asserted)",
    "sw_thermal_slowdown": "software thermal slowdown (GPU or memory over its target temperature)",
    "hw_thermal_slowdown": "hardware thermal slowdown (GPU over its shutdown-protect temperature)",
    "hw_power_brake_slowdown": "external power brake (the board or PSU asked to cut power)",
}

_LOST_NEXT = "check `dmesg` for Xid 79 / 48; reset the GPU (`nvidia-smi -r`) or reboot"

MEMORY_FULL = 0.90  # torch-tb-profiler's "memory > 90 %" recommendation


def _gpus(evidence: EvidenceBundle) -> tuple[Gpu, ...]:
    return tuple(evidence.system_report.gpus) if evidence.system is not None else ()


def _lost_fields(obj: Any) -> list[str]:
    names = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Reading) and value.status is Status.GPU_LOST:
            names.append(f.name)
    return names


@rule("hw.gpu_lost", category=CATEGORY, needs=("system",))
def gpu_lost(evidence: EvidenceBundle) -> Iterator[Finding]:
    """A GPU fell off the bus or needs a reset (NVML reports it lost)."""
    system = evidence.system_report
    if system.gpu_count.status is Status.GPU_LOST:
        yield Finding(
            "hw.gpu_lost",
            Severity.HIGH,
            CATEGORY,
            "a GPU is lost: the driver cannot count the devices",
            (Evidence("gpu_count", system.gpu_count.reason, source=source_of(system.gpu_count)),),
            threshold="any NVML reading with status GPU_LOST",
            instruction=_LOST_NEXT,
        )
        return
    for gpu in _gpus(evidence):
        lost = _lost_fields(gpu.info) + _lost_fields(gpu.state)
        if lost:
            yield Finding(
                "hw.gpu_lost",
                Severity.HIGH,
                CATEGORY,
                f"{gpu_label(gpu)} is lost: NVML cannot read it",
                tuple(Evidence(name, "GPU_LOST", source="nvml") for name in lost[:5]),
                threshold="any NVML reading with status GPU_LOST",
                instruction=_LOST_NEXT,
            )


def _pcie_width_finding(gpu: Gpu, width: int, width_max: int, src: str) -> Finding:
    """A link narrower than its maximum: MEDIUM while the GPU is busy, INFO while it is idle.

    nvidia-smi documents both the current generation and the current width as values that
    "may be reduced when the GPU is not in use", and the maximum as the most "possible with
    this GPU and system configuration" (a narrower slot shows up there). So an idle snapshot
    cannot tell a power-saving downshift from a link that trained narrow; a busy one can.
    """
    items = (
        Evidence("pcie.link.width.current", width, "lanes", src),
        Evidence("pcie.link.width.max", width_max, "lanes", src),
        Evidence(
            "utilization.gpu", gpu.state.gpu_util_pct.get(), "%", source_of(gpu.state.gpu_util_pct)
        ),
    )
    if is_busy(gpu):
        return Finding(
            "hw.pcie_width_degraded",
            Severity.MEDIUM,
            CATEGORY,
            f"{gpu_label(gpu)} PCIe link runs at x{width} of x{width_max} while the GPU is busy: "
            f"host<->GPU copies get {width / width_max:.0%} of the link's bandwidth",
            items,
            threshold="current PCIe link width < maximum width while utilization >= 10 %",
            instruction="seat the card in a full-width slot, or check the BIOS lane "
            "bifurcation / riser; this matters when the job copies data every step",
        )
    return Finding(
        "hw.pcie_width_degraded",
        Severity.INFO,
        CATEGORY,
        f"{gpu_label(gpu)} PCIe link at x{width} of x{width_max} while idle: the driver may "
        "narrow an idle link; re-check under load",
        items,
        threshold="current PCIe link width < maximum width while utilization < 10 % (or N/A)",
        instruction=f"run `gpudiag inspect` while the job runs: the link should be x{width_max}; "
        "if it stays narrower, check the slot, riser and BIOS lane bifurcation",
    )


@rule("hw.pcie_link", category=CATEGORY, needs=("gpu",))
def pcie_link(evidence: EvidenceBundle) -> Iterator[Finding]:
    """PCIe link narrower or slower than its maximum while busy (idle downshifts are INFO)."""
    for gpu in _gpus(evidence):
        link = gpu.info.pcie
        width, width_max = link.width_current.get(), link.width_max.get()
        src = source_of(link.width_current)
        if width is not None and width_max is not None and width < width_max:
            yield _pcie_width_finding(gpu, width, width_max, src)
        gen, gen_max = link.gen_current.get(), link.gen_max.get()
        if gen is None or gen_max is None or gen >= gen_max:
            continue
        evidence_gen = (
            Evidence("pcie.link.gen.current", gen, source=source_of(link.gen_current)),
            Evidence("pcie.link.gen.max", gen_max, source=source_of(link.gen_max)),
            Evidence(
                "utilization.gpu",
                gpu.state.gpu_util_pct.get(),
                "%",
                source_of(gpu.state.gpu_util_pct),
            ),
        )
        busy = is_busy(gpu)
        if busy:
            yield Finding(
                "hw.pcie_gen_degraded",
                Severity.MEDIUM,
                CATEGORY,
                f"{gpu_label(gpu)} PCIe link runs at gen {gen} of {gen_max} while the GPU is busy",
                evidence_gen,
                threshold="current PCIe generation < maximum while utilization >= 10 %",
                instruction="check the slot, riser and BIOS PCIe speed setting",
            )
        else:
            yield Finding(
                "hw.pcie_gen_idle_downclock",
                Severity.INFO,
                CATEGORY,
                f"{gpu_label(gpu)} PCIe link at gen {gen} of {gen_max} while idle: normal power "
                "saving; re-check under load",
                evidence_gen,
                threshold="current PCIe generation < maximum while utilization < 10 % (or N/A)",
                instruction="run `gpudiag inspect` while the job runs: the link should be at "
                f"gen {gen_max}",
            )


@rule("hw.clock_events", category=CATEGORY, needs=("gpu",))
def clock_events(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Clocks held down by thermal, hardware or power-cap events."""
    for gpu in _gpus(evidence):
        reasons = gpu.state.clock_event_reasons
        active = tuple(reasons.get(()) or ())
        src = source_of(reasons)
        protective = [r for r in active if r in _PROTECTIVE]
        if protective:
            yield Finding(
                "hw.thermal_or_power_slowdown",
                Severity.HIGH,
                CATEGORY,
                f"{gpu_label(gpu)} clocks are held down: "
                + "; ".join(_PROTECTIVE[r] for r in protective),
                (
                    Evidence("clocks_event_reasons", ", ".join(active), source=src),
                    Evidence(
                        "temperature.gpu",
                        gpu.state.temperature_c.get(),
                        "C",
                        source_of(gpu.state.temperature_c),
                    ),
                    Evidence(
                        "power.draw", gpu.state.power_w.get(), "W", source_of(gpu.state.power_w)
                    ),
                ),
                threshold="clock-event reason hw_slowdown, sw/hw_thermal_slowdown or power brake",
                instruction="check cooling (fans, airflow, dust) and the power supply; "
                "`nvidia-smi -q -d PERFORMANCE` shows the reasons live",
            )
        if "sw_power_cap" not in active:
            continue
        power = Evidence("power.draw", gpu.state.power_w.get(), "W", source_of(gpu.state.power_w))
        limit = Evidence(
            "power.limit", gpu.info.power_limit_w.get(), "W", source_of(gpu.info.power_limit_w)
        )
        util = Evidence(
            "utilization.gpu", gpu.state.gpu_util_pct.get(), "%", source_of(gpu.state.gpu_util_pct)
        )
        if is_busy(gpu):
            yield Finding(
                "hw.power_capped",
                Severity.MEDIUM,
                CATEGORY,
                f"{gpu_label(gpu)} is at its power limit: clocks drop to stay under it",
                (Evidence("clocks_event_reasons", "sw_power_cap", source=src), power, limit, util),
                threshold="sw_power_cap active while utilization >= 10 %",
                instruction="expected for heavy kernels on a power-limited board; if the limit "
                "was lowered, restore it (`nvidia-smi -q -d POWER`, `nvidia-smi -pl`)",
            )
        else:
            yield Finding(
                "hw.power_capped_idle",
                Severity.INFO,
                CATEGORY,
                f"{gpu_label(gpu)} reports sw_power_cap while idle: harmless, re-check under load",
                (Evidence("clocks_event_reasons", "sw_power_cap", source=src), power, limit, util),
                threshold="sw_power_cap active while utilization < 10 % (or N/A)",
            )


POWER_LIMIT_LOWERED = 0.95  # enforced limit below 95 % of the board's default


@rule("hw.power_limit", category=CATEGORY, needs=("gpu",))
def power_limit_lowered(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Power limit set below the board's default: heavy kernels reach the cap sooner.

    Seen on real recordings: an RTX 3090 at 200 W of its 350 W default (set with
    `nvidia-smi -pl`), and a GH200 whose GPU runs at 700 W of its 900 W default while 900 W is
    requested (the Grace Hopper module shares one budget between CPU and GPU): only the first
    is lifted by `nvidia-smi -pl`. MEDIUM while the GPU is busy and the power cap is the active
    clock-event reason, LOW otherwise: an idle GPU does not show whether it matters.
    """
    for gpu in _gpus(evidence):
        limit, default = gpu.info.power_limit_w.get(), gpu.info.default_power_limit_w.get()
        if limit is None or not default or limit >= default * POWER_LIMIT_LOWERED:
            continue
        reasons = tuple(gpu.state.clock_event_reasons.get(()) or ())
        capped = is_busy(gpu) and "sw_power_cap" in reasons
        requested = gpu.info.requested_power_limit_w.get()
        # Asked for (about) the default but held lower: another budget enforces the limit.
        elsewhere = requested is not None and requested >= default * POWER_LIMIT_LOWERED
        items = [
            Evidence("power.limit", limit, "W", source_of(gpu.info.power_limit_w)),
            Evidence(
                "power.default_limit", default, "W", source_of(gpu.info.default_power_limit_w)
            ),
        ]
        if requested is not None:
            items.append(
                Evidence(
                    "power.requested_limit",
                    requested,
                    "W",
                    source_of(gpu.info.requested_power_limit_w),
                )
            )
        items += [
            Evidence("power.draw", gpu.state.power_w.get(), "W", source_of(gpu.state.power_w)),
            Evidence(
                "clocks_event_reasons",
                ", ".join(reasons) or "none",
                source=source_of(gpu.state.clock_event_reasons),
            ),
        ]
        if elsewhere:
            why = (
                f", though {requested:.0f} W is requested: another power budget (the module's "
                "or the chassis') holds it there"
            )
            instruction = (
                "`nvidia-smi -pl` cannot raise it (the requested limit is already the default): "
                "`nvidia-smi -q -d POWER` shows the module's limits (on Grace Hopper the CPU "
                "and the GPU share one module budget), and the platform's power policy sets them"
            )
        else:
            why = ""
            instruction = (
                "`nvidia-smi -q -d POWER` shows the limits; unless the cap is deliberate (a "
                "rack power budget), restore it with "
                f"`sudo nvidia-smi -i {gpu.info.index} -pl {default:.0f}`"
            )
        yield Finding(
            "hw.power_limit_lowered",
            Severity.MEDIUM if capped else Severity.LOW,
            CATEGORY,
            f"{gpu_label(gpu)} power limit is {limit:.0f} W, {1 - limit / default:.0%} below its "
            f"default {default:.0f} W"
            + why
            + (": the GPU is at that cap now and its clocks drop" if capped else ""),
            tuple(items),
            threshold=f"enforced power limit < {POWER_LIMIT_LOWERED:.0%} of the default limit",
            instruction=instruction,
        )


@rule("hw.nvlink", category=CATEGORY, needs=("gpu",))
def nvlink_down(evidence: EvidenceBundle) -> Iterator[Finding]:
    """NVLink links that exist but are down (traffic falls back to PCIe)."""
    for gpu in _gpus(evidence):
        links = gpu.info.nvlinks
        down = [link.link for link in links if link.active.ok and link.active.get() is False]
        up = [link.link for link in links if link.active.get() is True]
        if down and up:
            yield Finding(
                "hw.nvlink_down",
                Severity.HIGH,
                CATEGORY,
                f"{gpu_label(gpu)}: NVLink link(s) {', '.join(map(str, down))} down, "
                f"{len(up)} up: peer and collective bandwidth is reduced",
                (
                    Evidence("nvlink links down", len(down), source="nvml"),
                    Evidence("nvlink links up", len(up), source="nvml"),
                ),
                threshold="an NVLink link is inactive while others on the GPU are active",
                instruction="`nvidia-smi nvlink --status`; reseat the bridge or service the node",
            )
        elif down:
            yield Finding(
                "hw.nvlink_down",
                Severity.MEDIUM,
                CATEGORY,
                f"{gpu_label(gpu)}: all {len(down)} NVLink links are down (no bridge, or a fault)",
                (Evidence("nvlink links down", len(down), source="nvml"),),
                threshold="every NVLink link of the GPU is inactive",
                instruction="`nvidia-smi nvlink --status`; if the system should have NVLink, "
                "check the bridge / fabric manager (`nvidia-fabricmanager`)",
            )


@rule("hw.ecc", category=CATEGORY, needs=("gpu",))
def ecc_errors(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Uncorrected ECC errors since boot, or retired memory pages."""
    for gpu in _gpus(evidence):
        uncorrected = gpu.state.ecc_uncorrected_volatile.get()
        retired = gpu.state.retired_pages.get()
        if uncorrected:
            yield Finding(
                "hw.ecc_uncorrected",
                Severity.HIGH,
                CATEGORY,
                f"{gpu_label(gpu)} had {uncorrected} uncorrected ECC errors since driver load",
                (
                    Evidence(
                        "ecc.errors.uncorrected.volatile.total",
                        uncorrected,
                        source=source_of(gpu.state.ecc_uncorrected_volatile),
                    ),
                ),
                threshold="uncorrected volatile ECC errors > 0",
                instruction="results computed on this GPU may be wrong: drain it, reset it, and "
                "run `dcgmi diag -r 3`; replace it if errors recur",
            )
        if retired:
            yield Finding(
                "hw.retired_pages",
                Severity.MEDIUM,
                CATEGORY,
                f"{gpu_label(gpu)} has {retired} retired memory pages",
                (Evidence("retired_pages", retired, source=source_of(gpu.state.retired_pages)),),
                threshold="retired pages > 0",
                instruction="`nvidia-smi -q -d PAGE_RETIREMENT`; a pending retirement needs a "
                "reset; a growing count means the board should be replaced",
            )


_ROW_REMAP_DOC = "NVIDIA's GPU memory error management guide (row remapping, A100 and newer)"


@rule("hw.row_remapping", category=CATEGORY, needs=("gpu",))
def row_remapping(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Memory rows remapped after uncorrectable errors, a remap waiting for a reset, or a
    remap that failed. A100, Hopper and newer repair rows instead of retiring pages, so on
    them this is the memory-health signal (their retired-page counters read N/A)."""
    for gpu in _gpus(evidence):
        state = gpu.state
        items = (
            Evidence(
                "remapped_rows.uncorrectable",
                state.remapped_rows_uncorrectable.get(),
                source=source_of(state.remapped_rows_uncorrectable),
            ),
            Evidence(
                "remapped_rows.pending",
                state.row_remap_pending.get(),
                source=source_of(state.row_remap_pending),
            ),
            Evidence(
                "remapped_rows.failure",
                state.row_remap_failed.get(),
                source=source_of(state.row_remap_failed),
            ),
        )
        if state.row_remap_failed.get() is True:
            yield Finding(
                "hw.row_remap_failed",
                Severity.HIGH,
                CATEGORY,
                f"{gpu_label(gpu)} could not remap a failing memory row: it has memory it "
                "cannot repair",
                items,
                threshold="remapping failure occurred",
                instruction=f"drain the GPU and have the board serviced ({_ROW_REMAP_DOC}); "
                "`nvidia-smi -q -d ROW_REMAPPER` shows the state",
            )
        elif state.row_remap_pending.get() is True:
            yield Finding(
                "hw.row_remap_pending",
                Severity.MEDIUM,
                CATEGORY,
                f"{gpu_label(gpu)} has a memory row remap waiting for a GPU reset: the repair "
                "is not in effect yet",
                items,
                threshold="a row remap is pending",
                instruction="when the GPU is idle, reset it (`sudo nvidia-smi -r -i "
                f"{gpu.info.index}`) or reboot; then `nvidia-smi -q -d ROW_REMAPPER` shows "
                "Pending: No",
            )
        elif rows := state.remapped_rows_uncorrectable.get(0):
            yield Finding(
                "hw.rows_remapped",
                Severity.LOW,
                CATEGORY,
                f"{gpu_label(gpu)} has {rows} memory row{'s' if rows != 1 else ''} remapped "
                "after uncorrectable errors (repaired)",
                items,
                threshold="rows remapped for uncorrectable errors > 0",
                instruction="repaired rows are normal in small numbers; a count that keeps "
                "growing means the board should be serviced (`nvidia-smi -q -d ROW_REMAPPER`)",
            )


@rule("hw.mig", category=CATEGORY, needs=("gpu",))
def mig_enabled(evidence: EvidenceBundle) -> Iterator[Finding]:
    """MIG mode on: each process sees a slice of the GPU, and NVML has no utilization."""
    for gpu in _gpus(evidence):
        if gpu.info.mig_enabled.get() is not True:
            continue
        yield Finding(
            "hw.mig_enabled",
            Severity.INFO,
            CATEGORY,
            f"{gpu_label(gpu)} is in MIG mode with {len(gpu.info.mig_instances)} instances: "
            "a job gets one slice's SMs and memory, and GPU utilization is N/A",
            (
                Evidence("mig.mode.current", "Enabled", source=source_of(gpu.info.mig_enabled)),
                Evidence(
                    "mig instances",
                    len(gpu.info.mig_instances),
                    source=source_of(gpu.info.mig_enabled),
                ),
            ),
            threshold="MIG mode enabled",
            instruction="compare against the slice's size, not the whole GPU; monitor with "
            "DCGM profiling fields per instance",
        )


@rule("hw.persistence", category=CATEGORY, needs=("gpu",))
def persistence_off(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Persistence mode off: the driver tears the GPU down between processes."""
    for gpu in _gpus(evidence):
        if gpu.info.persistence_mode.get() is not False:
            continue
        yield Finding(
            "hw.persistence_off",
            Severity.LOW,
            CATEGORY,
            f"{gpu_label(gpu)} has persistence mode off: each new process pays the driver's "
            "start-up (seconds on large GPUs)",
            (
                Evidence(
                    "persistence_mode", "Disabled", source=source_of(gpu.info.persistence_mode)
                ),
            ),
            threshold="persistence mode disabled (Linux)",
            instruction="run the `nvidia-persistenced` daemon (or `sudo nvidia-smi -pm 1`)",
        )


def _no_permission_series(samples: Samples | None) -> list[tuple[str, str]] | None:
    """(series, reason) of monitor series that are N/A for lack of permission; None when the
    samples carry no N/A reasons. ``samples`` is a Monitor (``na_reasons()``), its
    ``to_dict()``, or a DataFrame whose ``attrs`` hold the same "na" map."""
    if samples is None:
        return None
    na_reasons = getattr(samples, "na_reasons", None)
    if callable(na_reasons):
        rows = [
            (f"{key.device}/{key.name}", getattr(status, "value", str(status)), reason)
            for key, (status, reason) in na_reasons().items()
        ]
    else:
        table = samples if isinstance(samples, Mapping) else getattr(samples, "attrs", None)
        na_map = table.get("na") if isinstance(table, Mapping) else None
        if not isinstance(na_map, Mapping):
            return None
        rows = [(str(k), str(v[0]), str(v[1])) for k, v in na_map.items() if len(v) >= 2]
    return [(name, reason) for name, status, reason in rows if status == Status.NO_PERMISSION.value]


@rule("hw.profiling_counters", category=CATEGORY, needs=("gpu",))
def profiling_counters(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """GPU performance counters limited to admin users (NVIDIA's ERR_NVGPUCTRPERM case)."""
    blocked = _no_permission_series(evidence.samples)
    runtime = evidence.runtime or {}
    # The driver setting describes this machine: a recorded GPU is another machine's.
    admin_only = (
        None if evidence.system_report.is_recording else runtime.get("profiling_admin_only")
    )
    euid = runtime.get("euid")
    setting = (
        Evidence(
            "RmProfilingAdminOnly",
            int(admin_only),
            source=str(runtime.get("profiling_params_path", "driver parameters")),
        )
        if admin_only is not None
        else None
    )
    user = Evidence("effective uid", euid, source="this process") if euid is not None else None
    context = tuple(e for e in (setting, user) if e is not None)
    if blocked:
        yield Finding(
            "hw.profiling_counters_restricted",
            Severity.LOW,
            CATEGORY,
            f"{len(blocked)} monitor series are N/A for lack of permission: what needs GPU "
            "performance counters (SM and tensor activity) goes unmeasured",
            (
                Evidence(
                    "series without permission",
                    ", ".join(n for n, _ in blocked[:5]),
                    source="monitor samples",
                ),
                Evidence("reason", blocked[0][1][:160], source="monitor samples"),
                *context,
            ),
            threshold="monitor samples N/A with status NO_PERMISSION",
            instruction=PROFILING_PERMISSION_FIX,
        )
        return
    if admin_only is None:
        if blocked is None:
            why = (
                "the recorded machine's RmProfilingAdminOnly driver setting"
                if evidence.system_report.is_recording
                else runtime.get("profiling_unknown")
                or "the driver's RmProfilingAdminOnly setting (gpudiag.probe.runtime)"
            )
            yield NotEvaluated("hw.profiling_counters", str(why))
        return
    if admin_only and euid != 0:
        yield Finding(
            "hw.profiling_counters_restricted",
            Severity.INFO,
            CATEGORY,
            "the driver lets only admin users read GPU performance counters and this process "
            "is not root: Nsight Compute, DCGM profiling fields and SM/tensor activity in "
            "gd.monitor will fail with ERR_NVGPUCTRPERM",
            context,
            threshold="RmProfilingAdminOnly = 1 and effective uid != 0",
            instruction=PROFILING_PERMISSION_FIX,
        )


@rule("hw.memory_full", category=CATEGORY, needs=("gpu",))
def memory_full(evidence: EvidenceBundle) -> Iterator[Finding]:
    """GPU memory more than 90 % used: close to out-of-memory, the allocator thrashes."""
    for gpu in _gpus(evidence):
        used = memory_used_fraction(gpu)
        if used is None or used <= MEMORY_FULL:
            continue
        procs = gpu.state.processes.get(()) or ()
        holders = sorted(procs, key=lambda p: -(p.used_memory_bytes.get(0) or 0))
        named = ", ".join(
            f"{_program(p.name)} (pid {p.pid}"
            + (f", {gib(p.used_memory_bytes.get(0)):.1f} GiB)" if p.used_memory_bytes.ok else ")")
            for p in holders[:3]
        )
        # Known holders, none of them a Python process: no PyTorch setting frees their memory.
        foreign = bool(holders) and not any(_is_python(p.name) for p in holders)
        message = (
            f"{gpu_label(gpu)} memory is {used:.0%} used: little headroom before out-of-memory"
        )
        if foreign:
            message += f"; it is held by {named}, not a Python process"
        yield Finding(
            "hw.memory_full",
            Severity.MEDIUM,
            "memory",
            message,
            (
                Evidence(
                    "memory.used",
                    round(gib(gpu.state.memory_used_bytes.get(0)), 2),
                    "GiB",
                    source_of(gpu.state.memory_used_bytes),
                ),
                Evidence(
                    "memory.total",
                    round(gib(gpu.info.memory_total_bytes.get(0)), 2),
                    "GiB",
                    source_of(gpu.info.memory_total_bytes),
                ),
                Evidence("processes on the GPU", len(procs), source=source_of(gpu.state.processes)),
                *(
                    (Evidence("largest holders", named, source=source_of(gpu.state.processes)),)
                    if named
                    else ()
                ),
            ),
            threshold="memory used > 90 % of total",
            fix=None if foreign else FixRef("activation.checkpointing"),
            instruction=(
                "stop that process or run the job on another GPU: a training setting of yours "
                "cannot free memory another program holds"
                if foreign
                else "or a smaller micro-batch with gradient accumulation (batch.size); if "
                "another process holds the memory, free it first"
            ),
        )


# Process names of Python programs (nvidia-smi prints the executable; torch may rename its
# main thread pt_main_thread).
_PYTHON_NAMES = ("python", "pt_main_thread", "torchrun", "jupyter", "ipykernel", "ray::")


def _is_python(name: str) -> bool:
    return any(word in name.lower() for word in _PYTHON_NAMES)


def _program(name: str) -> str:
    return name.replace("\\", "/").rsplit("/", 1)[-1] or name


MEMORY_HEADROOM = 0.50  # less than half the memory used ...
GPU_BUSY_LOW = 0.50  # ... while the GPU computes less than half the time


@rule("memory.headroom_unused", category="memory", needs=("gpu", "gpu_trace"))
def memory_headroom_unused(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Under half the GPU memory used while the GPU computes under half the time: a bigger
    micro-batch gives each launch more work and the idle gaps less weight."""
    b = evidence.trace_report.time_breakdown()
    span = float(b.get("span_us") or 0.0)
    if span <= 0:
        return
    busy = float(b.get("compute_us") or 0.0) / span
    if busy >= GPU_BUSY_LOW:
        return
    for gpu in _gpus(evidence):
        used = memory_used_fraction(gpu)
        if used is None or used >= MEMORY_HEADROOM:
            continue
        yield Finding(
            "memory.headroom_unused",
            Severity.LOW,
            "memory",
            f"{gpu_label(gpu)}: {used:.0%} of memory used and the GPU computes {busy:.0%} of "
            "the time: room for a bigger micro-batch",
            (
                Evidence(
                    "memory used", round(used * 100, 1), "%", source_of(gpu.state.memory_used_bytes)
                ),
                Evidence("GPU compute time share", round(busy * 100, 1), "%", "trace"),
            ),
            threshold=f"memory used < {MEMORY_HEADROOM:.0%} and compute < {GPU_BUSY_LOW:.0%} "
            "of the trace span",
            fix=_bigger_batch(evidence.workload),
            instruction="raise the micro-batch (batch.size) until memory is ~80 % used, scaling "
            "the learning rate or lowering gradient accumulation to keep the global batch",
        )


def _bigger_batch(workload: Workload | None) -> FixRef | None:
    """``batch.size`` at twice the workload's batch, when gpudiag steps it (a trial can try it)."""
    if workload is None or not workload.owns_step:
        return None
    batch = workload.samples_per_step()
    return FixRef("batch.size", {"micro_batch": 2 * batch}) if batch else None
