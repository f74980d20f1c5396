"""``TraceReport``: what one or more profiler traces say the GPU (and the host) did."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag._report import card, esc, html_grid, html_table, jsonable
from gpudiag.analysis.trace.attention import AttentionUse
from gpudiag.analysis.trace.breakdown import StreamIdle, TimeBreakdown
from gpudiag.analysis.trace.collectives import (
    CollectiveCall,
    CollectiveReport,
    match_collectives,
)
from gpudiag.analysis.trace.cpu_ops import CpuOpStats
from gpudiag.analysis.trace.kernels import KernelStats, TensorCoreUse
from gpudiag.analysis.trace.launches import LaunchStats
from gpudiag.analysis.trace.ledger import Ledger
from gpudiag.analysis.trace.model import DeviceProperties
from gpudiag.analysis.trace.ranks import CommOverlap, RankSummary, comm_overlap, pooled_overlap
from gpudiag.analysis.trace.shapes import GemmShape, ShapedOp, gemm_shapes
from gpudiag.analysis.trace.steps import StepReport
from gpudiag.analysis.trace.syncs import SyncEvent, SyncSite
from gpudiag.analysis.trace.transfers import TransferStats
from gpudiag.errors import TraceError

if TYPE_CHECKING:
    from gpudiag.analysis.roofline import GpuSource, Roofline

BREAKDOWN_KEYS: tuple[str, ...] = (
    "span_us",
    "compute_us",
    "communication_us",
    "memory_us",
    "sync_us",
    "idle_us",
    "idle_host_wait_us",
    "idle_kernel_wait_us",
    "idle_other_us",
)


def _pct(value: float | None) -> str:
    return "N/A" if value is None or not math.isfinite(value) else f"{value:.1%}"


def _ms(us: float | None) -> str:
    return "N/A" if us is None else f"{us / 1000:.2f} ms"


@dataclass(frozen=True, eq=False)
class RankReport:
    """Everything gpudiag reads from one trace file (one rank).

    Aggregates (breakdown, kernels, tensor cores, idle, memcpy, launches, CPU operators,
    syncs) cover ``window``; ``steps`` lists every step.
    """

    rank: int
    path: str
    world_size: int | None
    devices: tuple[DeviceProperties, ...]
    events: int
    file_bytes: int
    window: str
    has_gpu_events: bool
    breakdown: TimeBreakdown | None
    busy_by_category_set: Mapping[str, float]
    comm_compute_overlap: float | None
    stream_idle: tuple[StreamIdle, ...]
    kernels: tuple[KernelStats, ...]
    tensor_cores: TensorCoreUse | None
    cpu_ops: tuple[CpuOpStats, ...]
    launches: LaunchStats | None
    transfers: tuple[TransferStats, ...]
    syncs: tuple[SyncEvent, ...]
    sync_sites: tuple[SyncSite, ...]
    steps: tuple[StepReport, ...]
    dataloader_share: float | None
    notes: tuple[str, ...]
    metadata: Mapping[str, Any]
    shaped_ops: tuple[ShapedOp, ...] = ()  # outermost matmul/conv/attention calls in the window
    attention: AttentionUse = field(default_factory=AttentionUse)  # eager and fused attention
    # collective calls over the whole trace (not only the window), and what was left out
    collectives: tuple[CollectiveCall, ...] = ()
    collective_notes: tuple[str, ...] = ()
    # GPU idle time in the window that passed while the host sat in a wait for the GPU (a
    # sync call, a blocking copy), and the part of it whose next GPU work was already
    # queued (the GPU waited on something else, not on the host). None: no GPU events.
    idle_in_host_waits_us: tuple[float, float] | None = None
    # Every microsecond of the window on one row, busy or idle (None: built without one).
    ledger: Ledger | None = None
    # Why the GPU's kernel records are missing when the host launched kernels and the trace
    # holds none (a GPU run that lost its device activity, not a CPU-only run); None otherwise.
    kernels_missing: str | None = None

    @property
    def device(self) -> DeviceProperties | None:
        return self.devices[0] if self.devices else None

    def __repr__(self) -> str:
        gpu = f" on {self.device.name}" if self.device else ""
        b = self.breakdown
        busy = (
            f", compute {_pct(b.share('compute_us'))}, idle {_pct(b.share('idle_us'))}"
            if b is not None
            else ", no GPU events"
        )
        return (
            f"RankReport(rank {self.rank}{gpu}: {os.path.basename(self.path)}, "
            f"{len(self.steps)} steps, {len(self.kernels)} kernels{busy})"
        )

    def _repr_html_(self) -> str:
        return TraceReport((self,), (), (), (), self.notes)._repr_html_()

    @property
    def step_numbers(self) -> tuple[int, ...]:
        return tuple(s.number for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "path": self.path,
            "world_size": self.world_size,
            "devices": [d.to_dict() for d in self.devices],
            "events": self.events,
            "file_bytes": self.file_bytes,
            "window": self.window,
            "has_gpu_events": self.has_gpu_events,
            "time_breakdown": self.breakdown.to_dict() if self.breakdown else None,
            "busy_by_category_set_us": jsonable(dict(self.busy_by_category_set)),
            "comm_compute_overlap": jsonable(self.comm_compute_overlap),
            "stream_idle": [s.to_dict() for s in self.stream_idle],
            "kernels": [k.to_dict() for k in self.kernels],
            "tensor_cores": self.tensor_cores.to_dict() if self.tensor_cores else None,
            "cpu_ops": [o.to_dict() for o in self.cpu_ops],
            "launches": self.launches.to_dict() if self.launches else None,
            "transfers": [t.to_dict() for t in self.transfers],
            "syncs": [s.to_dict() for s in self.syncs],
            "sync_sites": [s.to_dict() for s in self.sync_sites],
            "steps": [s.to_dict() for s in self.steps],
            "dataloader_share": jsonable(self.dataloader_share),
            "idle_in_host_waits_us": jsonable(self.idle_in_host_waits_us),
            "attention": self.attention.to_dict(),
            "ledger": self.ledger.to_dict() if self.ledger is not None else None,
            "notes": list(self.notes),
            "metadata": jsonable(
                {k: v for k, v in self.metadata.items() if not isinstance(v, (list, dict))}
            ),
        }


def _pooled(stats: list[KernelStats]) -> KernelStats:
    """One row from the same kernel's rows on several ranks."""
    first = max(stats, key=lambda k: k.total_us)
    n = sum(k.count for k in stats)
    total = sum(k.total_us for k in stats)
    mean = total / n
    ss = sum(k.std_us**2 * (k.count - 1) + k.count * k.mean_us**2 for k in stats)
    var = (ss - n * mean * mean) / (n - 1) if n > 1 else 0.0

    def weighted(attr: str) -> float | None:
        pairs = [(getattr(k, attr), k.total_us) for k in stats if getattr(k, attr) is not None]
        w = sum(t for _, t in pairs)
        return sum(v * t for v, t in pairs) / w if pairs and w > 0 else None

    return KernelStats(
        name=first.name,
        category=first.category,
        count=n,
        total_us=total,
        mean_us=mean,
        min_us=min(k.min_us for k in stats),
        max_us=max(k.max_us for k in stats),
        std_us=math.sqrt(max(var, 0.0)),
        share=0.0,
        tensor_cores=any(k.tensor_cores for k in stats),
        grid=first.grid,
        block=first.block,
        registers_per_thread=first.registers_per_thread,
        shared_memory_bytes=first.shared_memory_bytes,
        blocks_per_sm=weighted("blocks_per_sm"),
        theoretical_occupancy=weighted("theoretical_occupancy"),
        achieved_occupancy=weighted("achieved_occupancy"),
        sm_efficiency=weighted("sm_efficiency"),
        occupancy_limited_by=first.occupancy_limited_by,
        launched_by=first.launched_by,
        short_calls=sum(k.short_calls for k in stats),
        family=first.family,
        provider=first.provider,
        vendor=first.vendor,
        tensor_cores_known=first.tensor_cores_known,
        dtype=first.dtype,
        dtype_source=first.dtype_source,
    )


@dataclass(frozen=True, eq=False)
class TraceReport:
    """The analysis of one trace file per rank (``gd.analyze_trace`` / ``gd.profile``).

    Accessors take ``rank=None`` to mean the only rank, or all ranks together (summed times,
    pooled kernels). ``notes`` say what the traces could not tell and why.
    """

    ranks: tuple[RankReport, ...]
    comparison: tuple[RankSummary, ...]
    stragglers: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    notes: tuple[str, ...]
    # What ``stragglers`` was read from: "collective arrivals" (the ranks the others wait for
    # in the matched collectives) or "gpu work" (more GPU work than the median rank, when too
    # few collectives match to read arrivals).
    straggler_basis: str = "gpu work"

    # -- selection -------------------------------------------------------------------
    def rank(self, rank: int | None = None) -> RankReport:
        """The report of one rank (``None``: the first)."""
        if rank is None:
            return self.ranks[0]
        for r in self.ranks:
            if r.rank == rank:
                return r
        known = ", ".join(str(r.rank) for r in self.ranks)
        raise TraceError(f"no trace for rank {rank} in this report (ranks: {known}).")

    def _selected(self, rank: int | None) -> tuple[RankReport, ...]:
        return self.ranks if rank is None else (self.rank(rank),)

    # -- the contract ------------------------------------------------------------------
    def time_breakdown(self, rank: int | None = None) -> dict[str, float | None]:
        """GPU time by category in microseconds (see ``TimeBreakdown``).

        Keys: span_us, compute_us, communication_us, memory_us (memcpy + memset), sync_us,
        idle_us and its split idle_host_wait_us / idle_kernel_wait_us / idle_other_us.
        ``compute_us`` and ``idle_us`` are what Holistic Trace Analysis' temporal breakdown
        reports as compute and idle time over the same window. A trace without GPU events
        gives None for every key.
        """
        parts = [r.breakdown for r in self._selected(rank) if r.breakdown is not None]
        if not parts:
            return dict.fromkeys(BREAKDOWN_KEYS)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return dict(total.as_mapping())

    def ledger(self, rank: int | None = None) -> Ledger:
        """Every microsecond of the analysis window on one row, busy or idle, largest first
        (see ``gpudiag.analysis.trace.ledger``): one rank's, or every rank's pooled
        (``rank=None`` with several ranks: windows and rows summed, ``.ranks`` each)."""
        own = [r.ledger for r in self._selected(rank) if r.ledger is not None]
        if not own:
            return Ledger(0.0, (), self.rank(rank).window, rank, notes=("no GPU timeline",))
        return Ledger.pooled(own)

    @property
    def dataloader_share(self) -> float | None:
        """Share of step time spent waiting on the DataLoader (mean over ranks that can
        tell); None when no trace has both ProfilerStep ranges and DataLoader events."""
        values = [r.dataloader_share for r in self.ranks if r.dataloader_share is not None]
        return sum(values) / len(values) if values else None

    @property
    def tensor_core_share(self) -> float | None:
        """Share of compute-kernel time in kernels that run on tensor cores (by name)."""
        uses = [r.tensor_cores for r in self.ranks if r.tensor_cores is not None]
        compute = sum(u.compute_us for u in uses)
        return sum(u.tensor_core_us for u in uses) / compute if compute > 0 else None

    def kernels(self, rank: int | None = None) -> tuple[KernelStats, ...]:
        """Every kernel name with its statistics and launch configuration, by total time."""
        selected = self._selected(rank)
        if len(selected) == 1:
            return selected[0].kernels
        by_name: dict[str, list[KernelStats]] = {}
        for r in selected:
            for k in r.kernels:
                by_name.setdefault(k.name, []).append(k)
        pooled = [_pooled(v) for v in by_name.values()]
        grand = sum(k.total_us for k in pooled) or 1.0
        out = [dataclasses.replace(k, share=k.total_us / grand) for k in pooled]
        out.sort(key=lambda k: -k.total_us)
        return tuple(out)

    def top_kernels(self, n: int = 10, rank: int | None = None) -> tuple[KernelStats, ...]:
        """The ``n`` kernels with the most total time."""
        return self.kernels(rank)[: max(int(n), 0)]

    # -- the rest ------------------------------------------------------------------------
    def top_cpu_ops(self, n: int = 10, rank: int | None = None) -> tuple[CpuOpStats, ...]:
        return self.rank(rank).cpu_ops[: max(int(n), 0)]

    def steps(self, rank: int | None = None) -> tuple[StepReport, ...]:
        return self.rank(rank).steps

    def syncs(self, rank: int | None = None) -> tuple[SyncEvent, ...]:
        """Sync calls and host-copy operators, with their Python call sites when recorded."""
        return tuple(s for r in self._selected(rank) for s in r.syncs)

    def sync_sites(self, rank: int | None = None) -> tuple[SyncSite, ...]:
        return self.rank(rank).sync_sites

    def idle_breakdown(self, rank: int | None = None) -> tuple[StreamIdle, ...]:
        """Per-stream idle gaps split host-wait / kernel-wait / other (as HTA splits them)."""
        return self.rank(rank).stream_idle

    def transfers(self, rank: int | None = None) -> tuple[TransferStats, ...]:
        return self.rank(rank).transfers

    def launch_stats(self, rank: int | None = None) -> LaunchStats | None:
        return self.rank(rank).launches

    def comm_compute_overlap(self, rank: int | None = None) -> float | None:
        """Share of communication time overlapped by compute on one rank (``None``: the
        first); ``communication()`` pools the ranks."""
        return self.rank(rank).comm_compute_overlap

    def collectives(self) -> CollectiveReport:
        """Every collective call matched across the ranks: duration, the rank that arrived
        last, start-time skew, wait per rank, NCCL algorithm and bus bandwidth (see
        ``gpudiag.analysis.trace.collectives``)."""
        notes = [
            (f"rank {r.rank}: " if len(self.ranks) > 1 else "") + n
            for r in self.ranks
            for n in r.collective_notes
        ]
        hosts = {r.rank: str(r.metadata.get("host_name") or "") for r in self.ranks}
        return match_collectives(
            {r.rank: r.collectives for r in self.ranks},
            world_size=self.ranks[0].world_size,
            bases={r.rank: r.metadata.get("baseTimeNanoseconds") for r in self.ranks},
            hosts={k: v for k, v in hosts.items() if v},
            notes=notes,
        )

    def communication_by_rank(self) -> tuple[CommOverlap, ...]:
        """Total, overlapped and exposed communication of each rank with GPU events."""
        return tuple(
            comm_overlap(r.rank, r.breakdown, r.busy_by_category_set)
            for r in self.ranks
            if r.breakdown is not None
        )

    def communication(self, rank: int | None = None) -> CommOverlap | None:
        """Communication of one rank, or of every rank pooled (``rank=None``, microseconds
        added over the ranks); None without GPU events."""
        rows = self.communication_by_rank()
        if rank is not None:
            self.rank(rank)  # a TraceError naming the known ranks
            rows = tuple(r for r in rows if r.rank == rank)
        return pooled_overlap(rows)

    def shaped_ops(self, rank: int | None = None) -> tuple[ShapedOp, ...]:
        """Matmul, convolution and attention calls with their recorded input shapes (the
        outermost of a nest: ``aten::linear``, not the ``aten::addmm`` inside it), in time order
        per rank. Shapes are empty when the trace was recorded without ``record_shapes``."""
        return tuple(op for r in self._selected(rank) for op in r.shaped_ops)

    def attention(self, rank: int | None = None) -> AttentionUse:
        """Eager (hand-written or SDPA math) and fused attention, read from the operator
        tree, with its time (all ranks together by default)."""
        return AttentionUse.merged(r.attention for r in self._selected(rank))

    def gemm_shapes(self, rank: int | None = None) -> tuple[GemmShape, ...]:
        """Matmul-like calls grouped by (operator, input shapes, dtype) with M, N, K and batch,
        most GPU time first (host time on a CPU-only trace)."""
        return gemm_shapes(self.shaped_ops(rank))

    def roofline(self, system: GpuSource = None, *, rank: int | None = None, **kw: Any) -> Roofline:
        """``gd.roofline(system, ops=...)`` over the costed calls, timed by their kernels.

        ``system`` defaults to the traced GPU's name (spec-table roofs). On a GPU trace a call's
        duration is the GPU time of the kernels it launched (its own host time is launch time,
        not work); calls whose kernels cannot be tied to them are left out, with a note.
        ``kw`` go to ``gpudiag.analysis.roofline.roofline`` (``measured=``, ``dtype=``, ...).
        """
        from gpudiag.analysis.roofline import roofline

        ops: list[ShapedOp] = []
        untimed = 0
        for r in self._selected(rank):
            for op in r.shaped_ops:
                if r.has_gpu_events and op.gpu_us is None:
                    untimed += 1
                else:
                    ops.append(op)
        if system is None and self.device_properties:
            system = self.device_properties[0].roofline_system()
        result = roofline(system, ops=ops, **kw)
        if untimed:
            note = (
                f"{untimed} operator calls left out: their kernels are not tied to them in the "
                "trace, and their host time is launch time"
            )
            result = dataclasses.replace(result, notes=(*result.notes, note))
        return result

    @property
    def device_properties(self) -> tuple[DeviceProperties, ...]:
        return self.ranks[0].devices

    @property
    def has_gpu_events(self) -> bool:
        return any(r.has_gpu_events for r in self.ranks)

    @property
    def kernels_missing(self) -> bool:
        """Whether some rank launched kernels the trace did not record (see RankReport)."""
        return any(r.kernels_missing for r in self.ranks)

    # -- output --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "ledger": self.ledger().to_dict(),
            "time_breakdown": jsonable(self.time_breakdown()),
            "dataloader_share": jsonable(self.dataloader_share),
            "tensor_core_share": jsonable(self.tensor_core_share),
            "gemm_shapes": [g.to_dict() for g in self.gemm_shapes()],
            "communication": {
                "pooled": c.to_dict() if (c := self.communication()) is not None else None,
                "by_rank": [r.to_dict() for r in self.communication_by_rank()],
            },
            "comparison": [c.to_dict() for c in self.comparison],
            "stragglers": list(self.stragglers),
            "straggler_basis": self.straggler_basis,
            "missing_ranks": list(self.missing_ranks),
            "notes": list(self.notes),
        }

    def _idle_in_host_waits(self) -> tuple[str, str] | None:
        """The idle time that passed while the host sat blocked waiting for the GPU, the
        wait that held most of it, and how much of it had the next work already queued."""
        idle = sum((r.breakdown.idle_us for r in self.ranks if r.breakdown is not None), 0.0)
        known = [r.idle_in_host_waits_us for r in self.ranks if r.idle_in_host_waits_us]
        inside = sum(k[0] for k in known)
        queued = sum(k[1] for k in known)
        if idle <= 0 or inside < 0.01 * idle:
            return None
        by: dict[str, float] = {}
        for r in self.ranks:
            for sy in r.syncs:
                if sy.kind != "runtime" or sy.gpu_busy_us is None:
                    continue
                what = sy.name + (f" ({sy.copy})" if sy.copy else "")
                if sy.inside_op:
                    what += f" in {sy.inside_op}"
                by[what] = by.get(what, 0.0) + max(sy.duration_us - sy.gpu_busy_us, 0.0)
        mostly = f", mostly {max(by, key=by.__getitem__)}" if by else ""
        return (
            "idle while the host sat blocked waiting for the GPU",
            f"{_ms(inside)} ({_pct(inside / idle)} of idle{mostly}); "
            f"{_pct(queued / inside)} of it with the next GPU work already queued (the GPU "
            "was not short of work from the host then)",
        )

    def _title(self) -> str:
        if len(self.ranks) == 1:
            r = self.ranks[0]
            gpu = f" on {r.device.name}" if r.device else ""
            return f"Trace {os.path.basename(r.path)} (rank {r.rank}){gpu}"
        return f"Traces of {len(self.ranks)} ranks"

    def _headline(self) -> list[tuple[str, str]]:
        b = self.time_breakdown()
        rows: list[tuple[str, str]] = []
        span = b["span_us"]
        n = len(self.ranks)
        if span:
            if n > 1:
                spans = sorted(r.breakdown.span_us for r in self.ranks if r.breakdown is not None)
                rows.append(
                    (
                        f"GPU span, {n} ranks summed (times below too)",
                        f"{_ms(span)} (per rank {_ms(spans[0])} - {_ms(spans[-1])})",
                    )
                )
            else:
                rows.append(("GPU span", _ms(span)))
            for key, label in (
                ("compute_us", "compute"),
                ("communication_us", "communication, no compute alongside (exposed)"),
                ("memory_us", "memcpy / memset"),
                ("sync_us", "sync events"),
                ("idle_us", "idle"),
            ):
                value = b[key] or 0.0
                rows.append((label, f"{_ms(value)} ({_pct(value / span)})"))
            comm = self.communication()
            if comm is not None and comm.total_us > 0:
                scope = f", {comm.label}" if comm.rank is None else ""
                rows.append(
                    (
                        f"communication kernels in all{scope}",
                        f"{_ms(comm.total_us)} ({_pct(comm.total_share)}), "
                        f"{_pct(comm.overlap)} of it overlapped by compute",
                    )
                )
            idle = b["idle_us"] or 0.0
            if idle > 0:
                rows.append(
                    (
                        "idle: host wait / kernel wait / other",
                        " / ".join(
                            _pct((b[k] or 0.0) / idle)
                            for k in ("idle_host_wait_us", "idle_kernel_wait_us", "idle_other_us")
                        ),
                    )
                )
                blocked = self._idle_in_host_waits()
                if blocked is not None:
                    rows.append(blocked)
        rows.append(("tensor-core share of compute time", _pct(self.tensor_core_share)))
        rows.append(("DataLoader share of step time", _pct(self.dataloader_share)))
        first = self.ranks[0]
        if first.launches and first.launches.launch_bound is not None:
            verdict = "yes" if first.launches.launch_bound else "no"
            label = "launch-bound" if n == 1 else f"launch-bound, rank {first.rank}"
            rows.append((label, f"{verdict}: {first.launches.reason}"))
        n_sync = sum(len(r.syncs) for r in self.ranks)
        if n_sync:
            rows.append(("sync points", str(n_sync)))
        return rows

    def _repr_html_(self) -> str:
        parts = [html_table(self._headline())]
        top = self.top_kernels(8)
        if top:
            parts.append(
                "<div style='margin-top:6px;font-weight:600'>Top kernels</div>"
                + html_grid(
                    ("kernel", "count", "total", "mean", "share", "tensor cores", "occupancy"),
                    (
                        (
                            k.short_name,
                            k.count,
                            _ms(k.total_us),
                            f"{k.mean_us:.1f} us",
                            _pct(k.share),
                            "yes" if k.tensor_cores else "no",
                            _pct(k.theoretical_occupancy),
                        )
                        for k in top
                    ),
                )
            )
        elif self.ranks[0].cpu_ops:
            parts.append(
                "<div style='margin-top:6px;font-weight:600'>Top CPU operators</div>"
                + html_grid(
                    ("operator", "count", "total", "self"),
                    (
                        (o.name, o.count, _ms(o.total_us), _ms(o.self_us))
                        for o in self.top_cpu_ops(8)
                    ),
                )
            )
        if len(self.comparison) > 1:
            parts.append(
                "<div style='margin-top:6px;font-weight:600'>Ranks</div>"
                + html_grid(
                    ("rank", "compute", "communication", "idle", "mean step", "straggler"),
                    (
                        (
                            c.rank,
                            _ms(c.compute_us),
                            _ms(c.communication_us),
                            _ms(c.idle_us),
                            _ms(c.mean_step_us),
                            "yes" if c.rank in self.stragglers else "",
                        )
                        for c in self.comparison
                    ),
                )
            )
        if self.notes:
            parts.append(
                "<ul style='margin:6px 0 0 1em;padding:0'>"
                + "".join(f"<li>{esc(n)}</li>" for n in self.notes)
                + "</ul>"
            )
        return card(self._title(), "".join(parts), subtitle=self.ranks[0].window)

    def __repr__(self) -> str:
        lines = [self._title(), f"  window: {self.ranks[0].window}"]
        lines += [f"  {k}: {v}" for k, v in self._headline()]
        top = self.top_kernels(5)
        if top:
            lines.append("  top kernels:")
            lines += [
                f"    {_pct(k.share):>6}  {_ms(k.total_us):>11}  x{k.count:<6} {k.short_name}"
                for k in top
            ]
        elif self.ranks[0].cpu_ops:
            lines.append("  top CPU operators:")
            lines += [
                f"    {_ms(o.total_us):>11}  x{o.count:<6} {o.name}" for o in self.top_cpu_ops(5)
            ]
        if self.stragglers:
            lines.append(
                f"  stragglers: ranks {', '.join(map(str, self.stragglers))} "
                f"(by {self.straggler_basis})"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
