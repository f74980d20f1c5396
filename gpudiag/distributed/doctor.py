"""The distributed doctor: every rank gathers its own evidence, rank 0 merges it into one report.

Run as ``torchrun --nproc-per-node=N -m gpudiag doctor [--json]``. Each rank reads its host and
GPU (clocks, clock-event reasons, PCIe), times a few training steps of a workload *on its own*
(no collectives inside, so a slow rank shows as slow instead of being hidden by the others
waiting for it), profiles one step, and reads its NCCL / gloo environment. Rank 0 gathers the
evidence with ``torch.distributed.gather_object``; then all ranks measure an all-reduce together
(gpudiag.bench.collectives, nccl-tests' bus bandwidth). gloo on a CPU, NCCL on GPUs, the same
code; tested with gloo processes on a CPU, the NCCL path is untested on a real GPU.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag._report import FieldsDict, card, esc, html_grid, html_table, jsonable
from gpudiag.analysis.nccl import CollectiveResult
from gpudiag.analysis.stragglers import RankTiming, Straggler, find_stragglers
from gpudiag.distributed.group import RankEnv
from gpudiag.probe import cuda
from gpudiag.probe.host import load_average, usable_cpus
from gpudiag.units import format_bytes

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport
    from gpudiag.step import Workload

FORMAT = "gpudiag-distributed-doctor"
# Variables that change how NCCL / gloo / torch.distributed communicate.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT")
# Per-rank variables that naturally differ between ranks: not a mismatch.
_PER_RANK: frozenset[str] = frozenset()
DOCTOR_CPU_SIZES = (64 << 10, 1 << 20, 4 << 20)


def comm_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of this process that change collective communication."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


@dataclass(frozen=True)
class RankEvidence:
    """What one rank found about itself. ``error`` is set when its own measurement failed."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    device: str
    backend: str
    usable_cpus: int
    load_average: float | None
    torch_threads: int
    gpu: str = ""
    gpu_uuid: str = ""
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    clock_reasons: tuple[str, ...] = ()
    temperature_c: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlink_spec_gbps: float | None = None  # published bidirectional NVLink bandwidth per GPU
    nvlinks_active: int | None = None  # active NVLink links read from NVML; None: not read
    no_gpu_reason: str = ""
    workload: str = ""
    samples_per_step: int = 0
    step_s: tuple[float, ...] = ()
    top_ops: tuple[tuple[str, float], ...] = ()  # (op, self time in ms) over one profiled step
    environment: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    def timing(self) -> RankTiming:
        return RankTiming(
            rank=self.rank,
            step_s=self.step_s,
            host=self.host,
            gpu=self.gpu,
            clock_reasons=self.clock_reasons,
            sm_clock_mhz=self.sm_clock_mhz,
            max_sm_clock_mhz=self.max_sm_clock_mhz,
            load_average=self.load_average,
            usable_cpus=self.usable_cpus,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankEvidence:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["step_s"] = tuple(values.get("step_s") or ())
        values["clock_reasons"] = tuple(values.get("clock_reasons") or ())
        values["top_ops"] = tuple(
            (str(op["op"]), float(op["self_ms"])) for op in values.get("top_ops") or ()
        )
        values["environment"] = dict(values.get("environment") or {})
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["median_step_s"] = self.median_step_s
        out["top_ops"] = [{"op": n, "self_ms": ms} for n, ms in self.top_ops]
        return dict(out)


# --- inside every rank -------------------------------------------------------------------------


def gpu_facts(local_rank: int, system: SystemReport | None = None) -> dict[str, Any]:
    """The RankEvidence fields of this rank's GPU (its local index) from ``system`` (this
    machine's ``gd.inspect()`` when None; a recorded machine in tests)."""
    from gpudiag.probe.system import inspect
    from gpudiag.specs import lookup_gpu

    report = inspect() if system is None else system
    gpus = report.cuda_gpus or report.gpus
    if not gpus:
        return {"no_gpu_reason": report.no_gpu_reason}
    gpu = gpus[min(local_rank, len(gpus) - 1)]
    spec = lookup_gpu(gpu.name)
    return {
        "gpu": gpu.name,
        "gpu_uuid": str(gpu.info.uuid.get("")),
        "sm_clock_mhz": gpu.state.sm_clock_mhz.get(),
        "max_sm_clock_mhz": gpu.info.max_sm_clock_mhz.get(),
        "clock_reasons": tuple(gpu.state.clock_event_reasons.get(()) or ()),
        "temperature_c": gpu.state.temperature_c.get(),
        "pcie_gen": gpu.info.pcie.gen_max.get(),
        "pcie_width": gpu.info.pcie.width_max.get(),
        "nvlink_spec_gbps": None if spec is None else spec.nvlink_bandwidth_gbps,
        "nvlinks_active": (
            sum(1 for link in gpu.info.nvlinks if link.active.get(False))
            if gpu.info.nvlinks
            else None
        ),
    }


def time_local_steps(workload: Workload, steps: int, *, warmup: int = 1) -> list[float]:
    """Seconds per training step of ``workload`` run by this process alone (no collectives)."""
    from gpudiag.step import Step

    training = Step.of(workload)
    training.new_optimizer()
    on_gpu = str(workload.device).startswith("cuda")
    times: list[float] = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        training.run()
        if on_gpu:
            cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def profile_one_step(workload: Workload, top: int = 5) -> list[tuple[str, float]]:
    """The ops with the most self time in one training step (torch.profiler), in ms."""
    from torch.profiler import ProfilerActivity, profile

    from gpudiag._native_stderr import quiet_profiler_stderr

    on_gpu = str(workload.device).startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with quiet_profiler_stderr(), profile(activities=activities) as prof:
        time_local_steps(workload, 1, warmup=0)
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: -float(getattr(e, key, 0.0)))
    return [(str(e.key), float(getattr(e, key, 0.0)) / 1e3) for e in rows[:top]]


def gather_evidence(
    env: RankEnv,
    backend: str,
    device: str,
    *,
    workload: str = "gpt",
    overrides: Mapping[str, Any] | None = None,
    steps: int = 5,
    profile: bool = True,
) -> RankEvidence:
    """This rank's evidence; a failure of its own measurement is reported, never raised (a rank
    that raised would leave the others waiting in the gather)."""
    import torch

    from gpudiag.distributed.workload import build

    facts: dict[str, Any] = {}
    error = ""
    try:
        facts.update(gpu_facts(env.local_rank))
    except Exception as exc:  # the report must still reach rank 0
        error = f"GPU probe failed: {type(exc).__name__}: {exc}"
    try:
        wl = build(workload, overrides, device=device)
        facts["workload"] = wl.describe()
        facts["samples_per_step"] = wl.samples_per_step()
        facts["step_s"] = tuple(time_local_steps(wl, steps))
        if profile:
            facts["top_ops"] = tuple(profile_one_step(wl))
    except Exception as exc:  # the report must still reach rank 0
        error = (error + "; " if error else "") + f"workload failed: {type(exc).__name__}: {exc}"
    return RankEvidence(
        rank=env.rank,
        local_rank=env.local_rank,
        world_size=env.world_size,
        host=socket.gethostname(),
        pid=os.getpid(),
        device=device,
        backend=backend,
        usable_cpus=usable_cpus(),
        load_average=load_average(),
        torch_threads=torch.get_num_threads(),
        environment=comm_environment(),
        error=error,
        **facts,
    )


# --- on rank 0 ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedBandwidth(FieldsDict):
    """What the links between the ranks should give as all-reduce bus bandwidth, or why unknown."""

    busbw_gbps: float | None
    basis: str


def expected_bandwidth(ranks: Sequence[RankEvidence]) -> ExpectedBandwidth:
    """The ceiling an all-reduce's bus bandwidth is compared with (untested on a real GPU).

    One node of GPUs with NVLink: half the published bidirectional NVLink figure per GPU (one
    direction, what nccl-tests' bus bandwidth approaches); without NVLink, the narrowest PCIe
    link, one direction. Between nodes, gloo, or a CPU: unknown here, with the reason.
    """
    from gpudiag.bench.memory import pcie_bandwidth_gbps

    if len(ranks) < 2:
        return ExpectedBandwidth(None, "one rank: no collective to compare")
    if any(not r.gpu for r in ranks):
        return ExpectedBandwidth(
            None,
            "CPU ranks (gloo over TCP): the ceiling is the host's memory and loopback, which "
            "gpudiag has no figure for",
        )
    if len({r.host for r in ranks}) > 1:
        return ExpectedBandwidth(
            None, "ranks on several nodes: the network between them sets the ceiling"
        )
    nvlink = [r.nvlink_spec_gbps for r in ranks]
    linked = all(r.nvlinks_active for r in ranks)
    if linked and all(v for v in nvlink):
        low = min(v for v in nvlink if v)
        return ExpectedBandwidth(
            low / 2,
            f"NVLink active on every GPU: {low:g} GB/s bidirectional per GPU (published), "
            "one direction",
        )
    pcie = [
        pcie_bandwidth_gbps(r.pcie_gen, r.pcie_width)
        for r in ranks
        if r.pcie_gen and r.pcie_width and r.pcie_gen in (1, 2, 3, 4, 5, 6)
    ]
    if len(pcie) < len(ranks):
        return ExpectedBandwidth(None, "the GPUs' links were not readable")
    basis = "PCIe: the narrowest GPU link, one direction"
    if any(r.nvlinks_active is None for r in ranks) and all(v for v in nvlink):
        # An nvidia-smi -q dump (or an NVML without NVLink queries) does not say whether the
        # links are up: PCIe is the floor, NVLink the ceiling.
        basis += f"; NVLink state not read (up to {min(v for v in nvlink if v) / 2:g} GB/s if up)"
    return ExpectedBandwidth(min(pcie), basis)


def environment_mismatches(ranks: Sequence[RankEvidence]) -> list[str]:
    """Communication variables that differ between ranks (a classic cause of hangs)."""
    names = sorted({k for r in ranks for k in r.environment} - _PER_RANK - {"CUDA_VISIBLE_DEVICES"})
    out = []
    for name in names:
        values = {r.rank: r.environment.get(name) for r in ranks}
        if len(set(values.values())) > 1:
            shown = ", ".join(
                f"rank {k}: {v if v is not None else 'unset'}" for k, v in values.items()
            )
            out.append(f"{name} differs between ranks ({shown})")
    return out


@dataclass(frozen=True)
class DistributedReport:
    """The merged doctor report: one row per rank, stragglers, the collective, the environment."""

    ranks: tuple[RankEvidence, ...]
    backend: str
    stragglers: tuple[Straggler, ...] = ()
    collective: CollectiveResult | None = None
    expected: ExpectedBandwidth = field(default_factory=lambda: ExpectedBandwidth(None, ""))
    environment: dict[str, str] = field(default_factory=dict)
    mismatches: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def nnodes(self) -> int:
        return len({r.host for r in self.ranks})

    @property
    def measured_busbw_gbps(self) -> float | None:
        if self.collective is None or self.collective.error:
            return None
        return self.collective.peak_busbw_gbps()

    @property
    def busbw_share(self) -> float | None:
        """Measured peak bus bandwidth over the expected one, when both are known."""
        measured, expected = self.measured_busbw_gbps, self.expected.busbw_gbps
        if measured is None or not expected:
            return None
        return measured / expected

    def findings(self) -> list[str]:
        out = [s.describe() for s in self.stragglers]
        out += [f"rank {r.rank}: {r.error}" for r in self.ranks if r.error]
        out += list(self.mismatches)
        share = self.busbw_share
        if share is not None and share < 0.6:
            out.append(
                f"all-reduce reaches {self.measured_busbw_gbps:.1f} GB/s bus bandwidth, "
                f"{share:.0%} of the {self.expected.busbw_gbps:.0f} GB/s the links should give"
            )
        return out

    @classmethod
    def merge(
        cls,
        ranks: Sequence[RankEvidence],
        *,
        backend: str,
        collective: CollectiveResult | None = None,
        threshold: float = 0.10,
        notes: Sequence[str] = (),
    ) -> DistributedReport:
        ordered = tuple(sorted(ranks, key=lambda r: r.rank))
        stragglers = find_stragglers(
            [r.timing() for r in ordered if not r.error], threshold=threshold
        )
        return cls(
            ranks=ordered,
            backend=backend,
            stragglers=tuple(stragglers),
            collective=collective,
            expected=expected_bandwidth(ordered),
            environment=dict(ordered[0].environment) if ordered else {},
            mismatches=tuple(environment_mismatches(ordered)),
            notes=tuple(notes),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DistributedReport:
        """The report back from ``to_dict()`` (``torchrun -m gpudiag doctor --json`` output)."""
        if data.get("format") != FORMAT:
            from gpudiag.errors import GpuDiagError

            raise GpuDiagError(f"not a gpudiag doctor report (format {data.get('format')!r})")
        expected = data.get("expected_busbw") or {}
        collective = data.get("collective")
        return cls(
            ranks=tuple(RankEvidence.from_dict(r) for r in data.get("ranks", ())),
            backend=str(data.get("backend", "")),
            stragglers=tuple(
                Straggler(
                    rank=int(st["rank"]),
                    median_s=float(st["median_s"]),
                    reference_s=float(st["reference_s"]),
                    slower_by=float(st["slower_by"]),
                    reasons=tuple(st.get("reasons") or ()),
                )
                for st in data.get("stragglers", ())
            ),
            collective=None if collective is None else CollectiveResult.from_dict(collective),
            expected=ExpectedBandwidth(expected.get("busbw_gbps"), str(expected.get("basis", ""))),
            environment=dict(data.get("environment") or {}),
            mismatches=tuple(data.get("mismatches") or ()),
            notes=tuple(data.get("notes") or ()),
        )

    # -- presentation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "format": FORMAT,
                "world_size": self.world_size,
                "nnodes": self.nnodes,
                "backend": self.backend,
                "ranks": [r.to_dict() for r in self.ranks],
                "stragglers": [s.to_dict() for s in self.stragglers],
                "collective": None if self.collective is None else self.collective.to_dict(),
                "measured_busbw_gbps": self.measured_busbw_gbps,
                "expected_busbw": self.expected.to_dict(),
                "busbw_share": self.busbw_share,
                "environment": self.environment,
                "mismatches": list(self.mismatches),
                "findings": self.findings(),
                "notes": list(self.notes),
            }
        )

    _HEADER = ("rank", "host", "device", "step median", "spread", "top op", "CPUs", "load")

    def rows(self) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for r in self.ranks:
            med = r.median_step_s
            spread = (max(r.step_s) - min(r.step_s)) / med if med and r.step_s else None
            device = f"{r.device} {r.gpu}".strip()
            if r.clock_reasons:
                device += f" [{', '.join(r.clock_reasons)}]"
            out.append(
                (
                    str(r.rank),
                    r.host,
                    device,
                    "error" if med is None else f"{med * 1e3:.1f} ms",
                    "" if spread is None else f"{spread:.0%}",
                    r.top_ops[0][0] if r.top_ops else "",
                    str(r.usable_cpus),
                    "" if r.load_average is None else f"{r.load_average:.1f}",
                )
            )
        return out

    def _collective_line(self) -> str:
        c = self.collective
        if c is None:
            return "collective: not measured (one rank)"
        if c.error:
            return f"collective: failed: {c.error}"
        measured = self.measured_busbw_gbps
        text = f"all_reduce ({c.backend}, {c.world_size} ranks): peak bus bandwidth "
        text += "n/a" if measured is None else f"{measured:.2f} GB/s"
        if self.expected.busbw_gbps:
            text += f", expected ~{self.expected.busbw_gbps:.0f} GB/s ({self.expected.basis})"
        else:
            text += f"; expected: unknown ({self.expected.basis})"
        sizes = [
            f"{format_bytes(row.size_bytes, 'g')} {row.time_us / 1e3:.2f} ms "
            f"({row.busbw_gbps:.2f} GB/s)"
            for row in c.rows
        ]
        if sizes:
            text += "\n  per size (slowest rank): " + ", ".join(sizes)
        return text

    def __repr__(self) -> str:
        lines = [
            f"gpudiag doctor: {self.world_size} rank{'s' if self.world_size != 1 else ''} on "
            f"{self.nnodes} host{'s' if self.nnodes != 1 else ''}, backend {self.backend}"
        ]
        table = [self._HEADER, *self.rows()]
        widths = [max(len(row[i]) for row in table) for i in range(len(self._HEADER))]
        for row in table:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        lines.append(self._collective_line())
        found = self.findings()
        lines.append("findings:" if found else "findings: none (no straggler, no mismatch)")
        lines += [f"  - {f}" for f in found]
        env = ", ".join(
            f"{k}={v}" for k, v in self.environment.items() if k.startswith(ENV_PREFIXES)
        )
        lines.append(f"communication environment (rank 0): {env or 'no NCCL_/GLOO_ variables set'}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        inner = html_grid(self._HEADER, self.rows())
        inner += f"<p>{esc(self._collective_line())}</p>"
        found = self.findings()
        if found:
            inner += "<ul>" + "".join(f"<li>{esc(f)}</li>" for f in found) + "</ul>"
        if self.environment:
            inner += html_table(self.environment.items(), caption="environment (rank 0)")
        return card(
            "gpudiag doctor",
            inner,
            subtitle=f"{self.world_size} ranks on {self.nnodes} host(s), {self.backend}",
        )
