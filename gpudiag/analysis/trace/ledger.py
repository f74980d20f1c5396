"""The time ledger: every microsecond of a rank's analysis window on exactly one row.

The window runs from the first GPU event of the analysed steps to the end of the last one
(``window.Window``; the whole capture without steps). Each instant of it is either busy (some
kernel, memcpy or memset of the window runs) or idle, and lands on one row:

- busy, by what ran, from the one kernel classifier (``kernel_classes``): communication that
  compute overlaps, communication alone (exposed), then the compute kernels by kind (eager
  attention, fused attention, GEMMs on tensor cores by dtype, GEMMs off them, GEMMs whose
  tensor-core use the name cannot tell, memory-bound work, other), then memcpy / memset;
  where kernels of several kinds overlap, the first of that order takes the instant.
- idle, by what the host was doing meanwhile (``host_activity``): compilation, graph capture
  or warm-up (lazy module loading on a kernel's first launch too); waiting on the DataLoader;
  blocked in a sync (a sync call, ``.item()``, a copy that blocks on pageable memory); queued
  work waiting on a dependency (the next GPU work was launched before the GPU went idle, and
  the gap is over 30 us); waiting for another rank; launch overhead (gaps under 100 us between
  launches); CPU operator and Python overhead (the host in an operator, a Python frame or its
  step, doing none of the above); and unexplained, where no host event covers the instant.

Busy time is the union of the window's GPU events, as Holistic Trace Analysis and TraceLens
count it; the idle rows are the window minus it, so the rows sum to the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpudiag._report import card, esc, html_grid
from gpudiag.analysis.trace.breakdown import KERNEL_WAIT_US
from gpudiag.analysis.trace.host_activity import (
    DATALOADER,
    PEER_WAIT,
    host_rows,
    row_chunks,
    spans,
    spans_where,
    warmup_rows,
)
from gpudiag.analysis.trace.intervals import (
    intersect,
    length,
    merge,
    overlap_with,
    subtract,
)
from gpudiag.analysis.trace.kernel_classes import (
    ATTENTION,
    COMMUNICATION,
    GEMM,
    MEMORY_BOUND,
    classify_kernel,
    kernel_dtype,
)
from gpudiag.analysis.trace.kernel_names import readable_kernel_name
from gpudiag.analysis.trace.launches import LAUNCH_GAP_US
from gpudiag.analysis.trace.model import F64, I64, Bool, Events, Kind

if TYPE_CHECKING:
    from gpudiag.analysis.trace.nesting import Nesting
    from gpudiag.analysis.trace.syncs import SyncEvent

Intervals = tuple[F64, F64]

BUSY, IDLE = "busy", "idle"
# Busy rows.
COMM_OVERLAPPED = "communication.overlapped"
COMM_EXPOSED = "communication.exposed"
ATTENTION_EAGER = "attention.eager"
ATTENTION_FUSED = "attention.fused"
GEMM_TENSOR_CORES = "gemm.tensor_cores"  # + "." + dtype
GEMM_CUDA_CORES = "gemm.cuda_cores"
GEMM_UNKNOWN_UNITS = "gemm.units_unknown"
MEMORY_BOUND_WORK = "memory_bound"
OTHER_KERNELS = "other_kernels"
MEMCPY = "memcpy"
# Idle rows.
WARMUP_IDLE = "idle.warmup"
DATALOADER_IDLE = "idle.dataloader"
SYNC_IDLE = "idle.sync"
QUEUED_IDLE = "idle.queued"
PEER_IDLE = "idle.other_rank"
LAUNCH_IDLE = "idle.launch_overhead"
CPU_IDLE = "idle.cpu_overhead"
UNEXPLAINED = "idle.unexplained"

LABELS: dict[str, str] = {
    COMM_OVERLAPPED: "communication overlapped by compute",
    COMM_EXPOSED: "communication exposed (no compute alongside)",
    ATTENTION_EAGER: "eager attention (softmax between matmuls)",
    ATTENTION_FUSED: "fused attention",
    GEMM_TENSOR_CORES: "GEMM on tensor cores",
    GEMM_CUDA_CORES: "GEMM off tensor cores",
    GEMM_UNKNOWN_UNITS: "GEMM, tensor-core use unknown",
    MEMORY_BOUND_WORK: "memory-bound (element-wise, norms, reductions, copies)",
    OTHER_KERNELS: "other kernels",
    MEMCPY: "memcpy / memset",
    WARMUP_IDLE: "idle: compilation, graph capture, warm-up",
    DATALOADER_IDLE: "idle: waiting on the DataLoader",
    SYNC_IDLE: "idle: host blocked in a sync",
    QUEUED_IDLE: "idle: queued work waiting on a dependency",
    PEER_IDLE: "idle: waiting for another rank",
    LAUNCH_IDLE: "idle: launch overhead",
    CPU_IDLE: "idle: CPU operator and Python overhead",
    UNEXPLAINED: "idle: unexplained (no host event covers it)",
}
# The order in which idle instants are claimed: the first matching activity takes one.
IDLE_ORDER: tuple[str, ...] = (
    WARMUP_IDLE,
    DATALOADER_IDLE,
    SYNC_IDLE,
    QUEUED_IDLE,
    PEER_IDLE,
    LAUNCH_IDLE,
    CPU_IDLE,
)
_TOP = 5  # kernels / host events listed behind a row


def label_of(bucket: str) -> str:
    """A row's name in words ("GEMM on tensor cores (bf16)" for gemm.tensor_cores.bf16)."""
    if bucket.startswith(GEMM_TENSOR_CORES + "."):
        return f"GEMM on tensor cores ({bucket.rsplit('.', 1)[1]})"
    return LABELS.get(bucket, bucket)


@dataclass(frozen=True)
class LedgerRow:
    """One row of the ledger: what the GPU's time went to, busy or idle.

    ``kernels`` (busy rows) and ``host_events`` (idle rows) are the largest items behind it,
    (name, microseconds); ``detail`` says more where a row has more to say (gap counts).
    """

    bucket: str
    kind: str  # "busy" | "idle"
    us: float
    kernels: tuple[tuple[str, float], ...] = ()
    host_events: tuple[tuple[str, float], ...] = ()
    detail: str = ""

    @property
    def label(self) -> str:
        return label_of(self.bucket)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "label": self.label,
            "kind": self.kind,
            "us": self.us,
            "kernels": [[n, us] for n, us in self.kernels],
            "host_events": [[n, us] for n, us in self.host_events],
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Ledger:
    """Where a window's time went, every microsecond on one row (``rows`` sum to
    ``window_us``), largest first. ``rank`` None: several ranks pooled (``ranks`` holds
    theirs; windows and rows are summed)."""

    window_us: float
    rows: tuple[LedgerRow, ...]
    window: str
    rank: int | None = None
    ranks: tuple[Ledger, ...] = field(default=(), repr=False)
    notes: tuple[str, ...] = ()
    # The idle rows whose host activity the trace recorded at all, whether or not it left the
    # GPU idle (a DataLoader that never made the GPU wait): a rule can tell "no wait" from
    # "cannot tell".
    recorded: frozenset[str] = frozenset()

    def row(self, bucket: str) -> LedgerRow | None:
        return next((r for r in self.rows if r.bucket == bucket), None)

    def us(self, *buckets: str) -> float:
        """Time on the named rows; a bucket ending in "." takes every row it prefixes
        (``us("gemm.tensor_cores.")``)."""
        return float(
            sum(
                r.us
                for r in self.rows
                if any(
                    r.bucket == b or (b.endswith(".") and r.bucket.startswith(b)) for b in buckets
                )
            )
        )

    def share(self, *buckets: str) -> float:
        return self.us(*buckets) / self.window_us if self.window_us > 0 else 0.0

    @property
    def busy_us(self) -> float:
        return float(sum(r.us for r in self.rows if r.kind == BUSY))

    @property
    def idle_us(self) -> float:
        return float(sum(r.us for r in self.rows if r.kind == IDLE))

    @property
    def unexplained_us(self) -> float:
        return self.us(UNEXPLAINED)

    @classmethod
    def pooled(cls, ledgers: Sequence[Ledger]) -> Ledger:
        """Several ranks as one: windows and each row summed."""
        if len(ledgers) == 1:
            return ledgers[0]
        by: dict[str, list[LedgerRow]] = {}
        for led in ledgers:
            for r in led.rows:
                by.setdefault(r.bucket, []).append(r)
        rows = [
            LedgerRow(
                bucket,
                parts[0].kind,
                float(sum(p.us for p in parts)),
                _top_pairs(pair for p in parts for pair in p.kernels),
                _top_pairs(pair for p in parts for pair in p.host_events),
                f"{len(parts)} ranks",
            )
            for bucket, parts in by.items()
        ]
        return cls(
            window_us=float(sum(led.window_us for led in ledgers)),
            rows=_ordered(rows),
            window=f"{len(ledgers)} ranks, each {ledgers[0].window}",
            rank=None,
            ranks=tuple(ledgers),
            notes=tuple(f"rank {led.rank}: {n}" for led in ledgers for n in led.notes),
            recorded=frozenset().union(*(led.recorded for led in ledgers)),
        )

    def plot(self) -> Any:
        """Where the time goes, busy and idle, largest first (a plotly figure)."""
        from gpudiag import _views

        return _views.build("figure", self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "window": self.window,
            "window_us": self.window_us,
            "busy_us": self.busy_us,
            "idle_us": self.idle_us,
            "unexplained_us": self.unexplained_us,
            "rows": [r.to_dict() for r in self.rows],
            "recorded": sorted(self.recorded),
            "ranks": [r.to_dict() for r in self.ranks],
            "notes": list(self.notes),
        }

    def lines(self, width: int = 40) -> list[str]:
        """The ledger as text bars: one line per row, largest first."""
        if self.window_us <= 0:
            return ["no GPU time to account for" + (f": {self.notes[0]}" if self.notes else "")]
        out = [f"where the time goes ({self.window_us / 1e3:.2f} ms: {self.window})"]
        for r in self.rows:
            share = r.us / self.window_us
            bar = "#" * max(1, round(share * width)) if r.us > 0 else ""
            out.append(f"  {share:>6.1%} {r.us / 1e3:>10.2f} ms  {bar:<{width}} {r.label}")
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        body = html_grid(
            ("row", "kind", "ms", "share", "behind it"),
            (
                (
                    r.label,
                    r.kind,
                    f"{r.us / 1e3:.2f}",
                    f"{r.us / self.window_us:.1%}" if self.window_us > 0 else "N/A",
                    ", ".join(n for n, _ in (r.kernels or r.host_events)[:3]) or r.detail,
                )
                for r in self.rows
            ),
        )
        if self.notes:
            body += "<ul>" + "".join(f"<li>{esc(n)}</li>" for n in self.notes) + "</ul>"
        return card("Time ledger", body, subtitle=self.window)


def _ordered(rows: Iterable[LedgerRow]) -> tuple[LedgerRow, ...]:
    return tuple(sorted((r for r in rows if r.us > 0), key=lambda r: (-r.us, r.bucket)))


def _top_pairs(pairs: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    total: dict[str, float] = {}
    for name, us in pairs:
        total[name] = total.get(name, 0.0) + us
    return tuple(sorted(total.items(), key=lambda kv: -kv[1])[:_TOP])


@dataclass(frozen=True, eq=False)
class LedgerInput:
    """What one rank's ledger is built from (all aligned with ``rows``)."""

    events: Events
    rows: I64  # the window's GPU rows (kernels, memcpy, memset; GPU sync events are ignored)
    launch_rows: I64  # the runtime row that launched each (-1: not recorded)
    op_dtypes: np.ndarray  # the launching operator's dtype (None where not recorded)
    eager_rows: frozenset[int]  # GPU rows of hand-written attention
    syncs: Sequence[SyncEvent]
    nesting: Nesting
    window: str
    rank: int | None = None


def build_ledger(inp: LedgerInput) -> Ledger:
    ev = inp.events
    work = np.isin(ev.kind[inp.rows], np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], np.int8))
    rows, launch_rows = inp.rows[work], inp.launch_rows[work]
    op_dtypes = inp.op_dtypes[work]
    if rows.size == 0:
        return Ledger(0.0, (), inp.window, inp.rank, notes=("no GPU work in the window",))
    starts, ends = ev.ts[rows], ev.ts[rows] + ev.dur[rows]
    lo, hi = float(starts.min()), float(ends.max())
    classes = _classes(ev, rows, op_dtypes, inp.eager_rows)
    busy_rows, busy_union = _busy(starts, ends, classes, ev, rows)
    idle = subtract((np.array([lo]), np.array([hi])), busy_union)
    launch_ts = np.where(launch_rows >= 0, ev.ts[np.clip(launch_rows, 0, None)], np.nan)
    idle_rows, recorded = _idle(inp, idle, starts, launch_ts, launch_rows)
    window_us = hi - lo
    return Ledger(
        window_us, _ordered(busy_rows + idle_rows), inp.window, inp.rank, recorded=recorded
    )


# -- busy ---------------------------------------------------------------------------------


def _classes(ev: Events, rows: I64, op_dtypes: np.ndarray, eager: frozenset[int]) -> np.ndarray:
    """The busy bucket of each GPU row (object array of bucket ids): one classification per
    distinct kernel name; GEMMs on tensor cores again where their operator recorded a dtype."""
    out = np.full(rows.size, MEMCPY, dtype=object)
    kernel = np.flatnonzero(ev.kind[rows] == Kind.KERNEL)
    if kernel.size:
        ids, inv = np.unique(ev.name[rows[kernel]], return_inverse=True)
        named = np.array([_bucket_of(ev.names[int(i)], None) for i in ids.tolist()], dtype=object)
        out[kernel] = named[inv]
        on_tensor_cores = np.array([str(b).startswith(GEMM_TENSOR_CORES) for b in named])
        has_dtype = np.array([d is not None for d in op_dtypes[kernel].tolist()], dtype=bool)
        typed = kernel[on_tensor_cores[inv] & has_dtype]
        for i in typed.tolist():
            out[i] = _bucket_of(ev.names[int(ev.name[rows[i]])], op_dtypes[i])
    if eager:
        is_eager = np.isin(rows, np.fromiter(eager, dtype=np.int64, count=len(eager)))
        out[is_eager & (out != COMM_EXPOSED)] = ATTENTION_EAGER
    return out


def _bucket_of(name: str, op_dtype: str | None) -> str:
    said = classify_kernel(name)
    if said.work == COMMUNICATION:
        return COMM_EXPOSED  # split into overlapped / exposed by time below
    if said.work == ATTENTION:
        return ATTENTION_FUSED
    if said.work == MEMORY_BOUND:
        return MEMORY_BOUND_WORK
    if said.work != GEMM:
        return OTHER_KERNELS
    if said.tensor_cores is None:
        return GEMM_UNKNOWN_UNITS
    if not said.tensor_cores:
        return GEMM_CUDA_CORES
    dtype, _ = kernel_dtype(name, op_dtype)
    # fp32 inputs on tensor cores run as TF32 (or 3xTF32); the row says what the cores did.
    dtype = "tf32" if dtype == "fp32" else dtype or "dtype unknown"
    return f"{GEMM_TENSOR_CORES}.{dtype}"


def _compute_order(buckets: Iterable[str]) -> list[str]:
    order = [ATTENTION_EAGER, ATTENTION_FUSED]
    order += sorted(b for b in set(buckets) if b.startswith(GEMM_TENSOR_CORES + "."))
    return [*order, GEMM_CUDA_CORES, GEMM_UNKNOWN_UNITS, MEMORY_BOUND_WORK, OTHER_KERNELS]


def _busy(
    starts: F64, ends: F64, classes: np.ndarray, ev: Events, rows: I64
) -> tuple[list[LedgerRow], Intervals]:
    def union(mask: np.ndarray) -> Intervals:
        return merge(starts[mask], ends[mask])

    is_comm = classes == COMM_EXPOSED
    is_copy = classes == MEMCPY
    compute = union(~is_comm & ~is_copy)
    comm = union(is_comm)
    taken: dict[str, Intervals] = {
        COMM_OVERLAPPED: intersect(comm, compute),
        COMM_EXPOSED: subtract(comm, compute),
    }
    claimed = comm
    for bucket in _compute_order(classes[~is_comm & ~is_copy].tolist()):
        mine = union(classes == bucket)
        if mine[0].size == 0:
            continue
        taken[bucket] = subtract(mine, claimed)
        claimed = merge(*(np.concatenate(x) for x in zip(claimed, taken[bucket], strict=True)))
    taken[MEMCPY] = subtract(union(is_copy), claimed)
    busy_union = merge(starts, ends)
    dur = ev.dur[rows]
    out = []
    for bucket, part in taken.items():
        us = length(part)
        if us <= 0:
            continue
        members = is_comm if bucket in (COMM_OVERLAPPED, COMM_EXPOSED) else classes == bucket
        out.append(
            LedgerRow(bucket, BUSY, us, kernels=_names_by_time(ev, rows[members], dur[members]))
        )
    return out, busy_union


def _names_by_time(ev: Events, rows: I64, dur: F64) -> tuple[tuple[str, float], ...]:
    if rows.size == 0:
        return ()
    ids, inv = np.unique(ev.name[rows], return_inverse=True)
    total = np.bincount(inv, weights=dur)
    top = np.argsort(-total)[:_TOP]
    return tuple(
        (readable_kernel_name(ev.names[int(ids[i])], 80), float(total[i])) for i in top.tolist()
    )


# -- idle ---------------------------------------------------------------------------------


def _idle(
    inp: LedgerInput, idle: Intervals, starts: F64, launch_ts: F64, launch_rows: I64
) -> tuple[list[LedgerRow], frozenset[str]]:
    """The idle rows, and the activities the trace recorded at all (``Ledger.recorded``)."""
    ev = inp.events
    total = length(idle)
    host_kinds = np.array(
        [Kind.CPU_OP, Kind.ANNOTATION, Kind.RUNTIME, Kind.PYTHON, Kind.STEP, Kind.OTHER], np.int8
    )
    is_host = ev.kind_in(host_kinds)
    # The threads that launched the window's GPU work (and those that ran its steps): a
    # background thread's events (a pin-memory thread, a watchdog) say nothing of the launcher.
    threads = np.unique(
        np.concatenate((ev.thread[launch_rows[launch_rows >= 0]], ev.thread[ev.kind == Kind.STEP]))
    )
    # A mask, not row numbers: the host rows of a multi-GB trace are millions, read a chunk
    # at a time below.
    on_threads = is_host & ev.thread_in(threads) if threads.size else is_host
    del is_host

    warm = warmup_rows(ev)
    loader = host_rows(ev, DATALOADER)
    peer = host_rows(ev, PEER_WAIT)
    sync_s = np.array([s.start_us for s in inp.syncs])
    sync_e = np.array([s.start_us + s.duration_us for s in inp.syncs])
    gaps_q, gaps_short, n_gaps = _gap_sets(idle, starts, launch_ts)
    sets: dict[str, Intervals] = {
        WARMUP_IDLE: spans(ev, warm),
        DATALOADER_IDLE: spans(ev, loader),
        SYNC_IDLE: merge(sync_s, sync_e) if sync_s.size else (np.zeros(0), np.zeros(0)),
        QUEUED_IDLE: gaps_q,
        PEER_IDLE: spans(ev, peer),
        LAUNCH_IDLE: gaps_short,
        CPU_IDLE: spans_where(ev, on_threads),
    }
    recorded = frozenset(b for b, (s, _) in sets.items() if s.size)
    if total <= 0:
        return [], recorded
    rest = idle
    out: list[LedgerRow] = []
    for bucket in IDLE_ORDER:
        got = intersect(rest, sets[bucket])
        us = length(got)
        if us <= 0:
            continue
        rest = subtract(rest, got)
        behind: tuple[tuple[str, float], ...] = ()
        detail = ""
        if bucket == WARMUP_IDLE:
            behind = _host_names(ev, warm, got)
        elif bucket == DATALOADER_IDLE:
            behind = _host_names(ev, loader, got)
        elif bucket == PEER_IDLE:
            behind = _host_names(ev, peer, got)
        elif bucket == SYNC_IDLE:
            behind = _sync_names(inp.syncs, got)
        elif bucket == CPU_IDLE:
            behind = _innermost_ops(ev, inp.nesting, on_threads, got)
            if not behind:
                detail = "the host was in its step or in Python frames, outside recorded operators"
        elif bucket in (QUEUED_IDLE, LAUNCH_IDLE):
            detail = f"{got[0].size:,} gaps, median {float(np.median(got[1] - got[0])):.1f} us"
        out.append(LedgerRow(bucket, IDLE, us, host_events=behind, detail=detail))
    claimed = sum(r.us for r in out)
    unexplained = max(total - claimed, 0.0)
    if unexplained > 0:
        largest = float(np.max(rest[1] - rest[0])) if rest[0].size else 0.0
        out.append(
            LedgerRow(
                UNEXPLAINED,
                IDLE,
                unexplained,
                detail=f"{rest[0].size:,} stretches of {n_gaps:,} idle gaps, the longest "
                f"{largest / 1e3:.2f} ms",
            )
        )
    return out, recorded


def _gap_sets(idle: Intervals, starts: F64, launch_ts: F64) -> tuple[Intervals, Intervals, int]:
    """The idle gaps whose next GPU work was already launched when the GPU went idle and that
    last 30 us or more (queued: waiting on a dependency), and those under 100 us that are
    launch overhead (the host launching the next kernel, or the GPU's own launch latency)."""
    g_s, g_e = idle
    if g_s.size == 0:
        empty = (g_s[:0], g_e[:0])
        return empty, empty, 0
    order = np.argsort(starts, kind="stable")
    nxt = np.searchsorted(starts[order], g_e, side="left")
    has_next = nxt < order.size
    launched = np.full(g_s.size, np.nan)
    launched[has_next] = launch_ts[order[nxt[has_next]]]
    gap = g_e - g_s
    queued = launched <= g_s  # NaN (launch not recorded) is not queued
    long_queued = queued & (gap >= KERNEL_WAIT_US)
    short = (gap < LAUNCH_GAP_US) & ~long_queued & has_next
    return (g_s[long_queued], g_e[long_queued]), (g_s[short], g_e[short]), int(g_s.size)


def _host_names(ev: Events, rows: I64, got: Intervals) -> tuple[tuple[str, float], ...]:
    if rows.size == 0:
        return ()
    part = overlap_with(got, ev.ts[rows], ev.ts[rows] + ev.dur[rows])
    keep = part > 0
    return _top_pairs(
        (ev.names[int(n)], float(us))
        for n, us in zip(ev.name[rows[keep]].tolist(), part[keep].tolist(), strict=True)
    )


def _sync_names(syncs: Sequence[SyncEvent], got: Intervals) -> tuple[tuple[str, float], ...]:
    if not syncs:
        return ()
    s = np.array([x.start_us for x in syncs])
    e = s + np.array([x.duration_us for x in syncs])
    part = overlap_with(got, s, e)
    return _top_pairs(
        (_sync_label(x), float(us)) for x, us in zip(syncs, part.tolist(), strict=True) if us > 0
    )


def _sync_label(sync: SyncEvent) -> str:
    what = sync.name + (f" ({sync.copy})" if sync.copy else "")
    if sync.inside_op and sync.inside_op != sync.name:
        what += f" in {sync.inside_op}"
    return what + (f" at {sync.call_site}" if sync.call_site else "")


def _innermost_ops(
    ev: Events, nesting: Nesting, host: Bool, got: Intervals
) -> tuple[tuple[str, float], ...]:
    """Operators and runtime calls (of the ``host`` rows) by the idle time spent in them and
    not in a recorded child operator (their self share of the row)."""
    op_kinds = np.array([Kind.CPU_OP, Kind.RUNTIME], np.int8)
    found_ops: list[I64] = []
    found_parts: list[F64] = []
    # A chunk of rows at a time: each row's overlap is its own, and few overlap the row's idle
    # time, so only those are kept.
    for rows in row_chunks(host):
        ops = rows[np.isin(ev.kind[rows], op_kinds)]
        part = overlap_with(got, ev.ts[ops], ev.ts[ops] + ev.dur[ops])
        keep = part > 0
        found_ops.append(ops[keep])
        found_parts.append(part[keep])
    if not found_ops:
        return ()
    ops, part = np.concatenate(found_ops), np.concatenate(found_parts)
    if ops.size == 0:
        return ()
    own = part.copy()
    # ``ops`` is sorted: each operator's recorded parent, found among them, gives up its
    # child's share.
    pos = np.searchsorted(ops, nesting.parent_op[ops])
    found = (pos < ops.size) & (ops[np.minimum(pos, ops.size - 1)] == nesting.parent_op[ops])
    np.subtract.at(own, pos[found], part[found])
    own = np.maximum(own, 0.0)
    return _top_pairs(
        (ev.names[int(n)], float(us))
        for n, us in zip(ev.name[ops].tolist(), own.tolist(), strict=True)
        if us > 0
    )


def rows_sum_to_window(ledger: Ledger, rel: float = 1e-9) -> bool:
    """Whether the rows add up to the window (up to float rounding)."""
    return math.isclose(sum(r.us for r in ledger.rows), ledger.window_us, rel_tol=rel, abs_tol=1e-6)
