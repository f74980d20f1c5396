"""Collectives across ranks: each call matched over the ranks, with its duration, the rank
that arrived last, the skew of the start times, the wait, the algorithm and the bus bandwidth.

A call is found from the range torch.distributed records around it (``nccl:all_reduce``,
``gloo:all_gather``; its ``Input Dims`` / ``Input type`` give the message). On a GPU trace it is
timed by the communication kernels launched inside that range (a lone NCCL kernel is a call
of its own, its message unknown); on a CPU trace (gloo) the range itself is the execution, on
gloo's worker thread. The k-th call of one collective on a rank is matched with the k-th of the
same collective on every other rank, as the collectives of one process group are issued in
the same order on all its ranks.

Per matched call: the last rank to start is the one the others wait for; its start minus a
rank's own start is that rank's wait; the time from the last start to a rank's end (median
over ranks) is the transfer, from which the algorithm bandwidth (size / transfer) and bus
bandwidth (nccl-tests' factors, ``gpudiag.analysis.nccl.bus_factor``) follow. Start times are
compared on the ranks' clocks (aligned by ``baseTimeNanoseconds`` when recorded): ranks on
different hosts are only as comparable as those hosts' clocks.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag._report import card, esc, html_grid, html_table, jsonable
from gpudiag.analysis.nccl import COLLECTIVES, bus_factor
from gpudiag.analysis.trace.kernels import COMMUNICATION
from gpudiag.analysis.trace.model import (
    COMM_ANNOTATION,
    I64,
    CommArgs,
    Events,
    Kind,
    fields_json,
)

# Ranks that start a call within this share of its skew of the last start arrived late
# together: the others waited for all of them, not for the very last alone.
TOGETHER_SHARE = 0.10
# A rank the others wait for (a straggler): it is among the late ranks of calls that hold
# the others at least this share of all the holding.
STRAGGLER_HOLD_SHARE = 0.5
# Fewer matched calls than this say too little about who is late.
MIN_MATCHED_CALLS = 3
# Larger than any GPU memory: a size beyond it is a corrupt field, not a message.
MAX_MESSAGE_BYTES = 1 << 50
# Bytes per element of Kineto's "Input type" spellings (lower-cased) for collective messages.
_TYPE_BYTES = {
    "float": 4,
    "c10::bfloat16": 2,
    "c10::half": 2,
    "double": 8,
    "long": 8,
    "long int": 8,
    "int": 4,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "char": 1,
    "bool": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}
# ncclKernel_AllReduce_RING_LL_Sum_float (NCCL 2.1x) and ncclDevKernel_AllReduce_Sum_f32_RING_LL
# (2.19+): the collective, then the algorithm and the protocol somewhere after it.
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_ALGO_PROTO = re.compile(
    r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)"
    r"(?=_|\(|$)"
)
# Backends whose range only enqueues GPU kernels (the kernels are the execution); the others'
# ranges (gloo, and MPI/UCC on the host) are the execution itself.
_GPU_BACKENDS = frozenset({"nccl", "rccl", "xccl"})
_KERNEL_OPS = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "send_recv",
}


def normalize_collective(name: str) -> str:
    """``_all_gather_base`` -> all_gather, ``allreduce_coalesced`` -> all_reduce, ``send`` ->
    send_recv; a name outside nccl-tests' collectives comes back lower-cased."""
    key = name.lower().replace("_", "")
    for suffix in ("base", "coalesced", "intotensor", "tensor", "single"):
        key = key.removesuffix(suffix)
    if key in ("alltoall", "alltoallv"):
        return "all_to_all"
    if key in ("send", "recv", "sendrecv"):
        return "send_recv"
    return _KERNEL_OPS.get(key, name.lower().strip("_"))


@dataclass(frozen=True)
class CollectiveCall:
    """One collective call on one rank. Times in microseconds on the rank's trace clock."""

    op: str
    backend: str
    start_us: float
    end_us: float
    size_bytes: int | None  # nccl-tests' "size" column; None when the trace does not tell
    dtype: str | None
    algorithm: str | None  # NCCL's RING / TREE / NVLS / ... from the kernel name
    protocol: str | None  # LL / LL128 / SIMPLE
    timed_on: str  # "gpu" (kernels) or "host" (gloo's range)
    group: str = ""  # the process group's name when the trace records it (PyTorch 2.1+)
    group_size: int | None = None

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["duration_us"] = self.duration_us
        return out


def _message(
    op: str, dims: tuple[tuple[int, ...], ...] | None, types: Sequence[str] | None, group: int
) -> tuple[int | None, str | None]:
    """(size column, dtype) of a collective from its recorded first input."""
    if not dims or not types:
        return None, None
    dtype = str(types[0])
    per = _TYPE_BYTES.get(dtype.lower())
    if per is None or not dims[0]:
        return None, dtype or None
    nbytes = math.prod(dims[0]) * per
    if nbytes > MAX_MESSAGE_BYTES:
        return None, dtype  # not a real message: no bandwidth from it
    # all_gather records the rank's own chunk; nccl-tests' size is the gathered total.
    return (nbytes * group if op == "all_gather" else nbytes), dtype


# c10 ScalarType names as newer traces write them in a kernel's "dtype" (lower-cased).
_SCALAR_BYTES = {
    "float": 4,
    "bfloat16": 2,
    "half": 2,
    "double": 8,
    "long": 8,
    "int": 4,
    "short": 2,
    "char": 1,
    "byte": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def _recorded_message(op: str, args: CommArgs) -> int | None:
    """nccl-tests' size column from a kernel's recorded message (elements x element size)."""
    per = _SCALAR_BYTES.get(args.dtype.lower())
    count = args.out_nelems if op == "all_gather" else args.in_nelems
    if not per or count is None or count * per > MAX_MESSAGE_BYTES:
        return None
    return count * per


def _kernel_info(name: str) -> tuple[str | None, str | None, str | None]:
    m = _NCCL_KERNEL.search(name)
    op = _KERNEL_OPS.get(m.group(1).lower()) if m else None
    ap = _ALGO_PROTO.search(name)
    return op, (ap.group(1) if ap else None), (ap.group(2) if ap else None)


def rank_collectives(
    events: Events, gpu_rows: I64, launch_rows: I64, categories: np.ndarray, group: int
) -> tuple[tuple[CollectiveCall, ...], tuple[str, ...]]:
    """The collective calls of one rank, in start order, and notes on what was left out.

    ``gpu_rows``/``launch_rows``/``categories`` are the rank's GPU events, the runtime call
    that launched each (-1: unknown) and their kernel categories; ``group`` the number of ranks
    in the collective (the world size) for the all-gather size.
    """
    names = events.names
    comm_names = {
        i: m
        for i, n in enumerate(names)
        if ":" in n[:6] and (m := COMM_ANNOTATION.fullmatch(n)) is not None
    }
    ann = np.flatnonzero((events.kind == Kind.ANNOTATION) & events.name_in(comm_names))
    comm = np.flatnonzero(categories == COMMUNICATION)
    kern_rows, kern_launch = gpu_rows[comm], launch_rows[comm]
    # Tie each communication kernel to the range whose time holds its launch, on one thread.
    owner = np.full(kern_rows.size, -1, dtype=np.int64)
    if ann.size and kern_rows.size:
        for thread in np.unique(events.thread[ann]).tolist():
            mine = ann[events.thread[ann] == thread]
            mine = mine[np.argsort(events.ts[mine], kind="stable")]
            starts, ends = events.ts[mine], events.ts[mine] + events.dur[mine]
            has = kern_launch >= 0
            sel = np.flatnonzero(has)
            sel = sel[events.thread[kern_launch[sel]] == thread]
            if sel.size == 0:
                continue
            t = events.ts[kern_launch[sel]]
            pos = np.searchsorted(starts, t, side="right") - 1
            ok = (pos >= 0) & (t <= ends[np.clip(pos, 0, None)])
            owner[sel[ok]] = mine[pos[ok]]
    calls: list[CollectiveCall] = []
    by_owner: dict[int, list[int]] = {}
    for k, o in enumerate(owner.tolist()):
        by_owner.setdefault(o, []).append(k)
    has_gpu = gpu_rows.size > 0
    untimed = 0
    for row in ann.tolist():
        m = comm_names[int(events.name[row])]
        backend, op = m.group(1), normalize_collective(m.group(2))
        inputs = events.inputs.get(row)
        size, dtype = _message(
            op, inputs.dims if inputs else None, inputs.types if inputs else None, group
        )
        ks = by_owner.get(row, [])
        if ks:
            krows = kern_rows[ks]
            kname = names[int(events.name[krows[0]])]
            _, algo, proto = _kernel_info(kname)
            start = float(events.ts[krows].min())
            end = float((events.ts[krows] + events.dur[krows]).max())
            pg_name, pg_size = "", None
            recorded = next(
                (ca for k in krows.tolist() if (ca := events.comm_args.get(k)) is not None), None
            )
            if recorded is not None:  # the kernel's own record beats the range's inputs
                op = normalize_collective(recorded.collective)
                size = _recorded_message(op, recorded) or size
                dtype = recorded.dtype or dtype
                pg_name, pg_size = recorded.process_group, recorded.group_size
            calls.append(
                CollectiveCall(
                    op, backend, start, end, size, dtype, algo, proto, "gpu", pg_name, pg_size
                )
            )
        elif backend in _GPU_BACKENDS and has_gpu:
            untimed += 1  # enqueued, but its kernel is outside the capture
        elif backend not in _GPU_BACKENDS:
            start = float(events.ts[row])
            end = start + float(events.dur[row])
            calls.append(CollectiveCall(op, backend, start, end, size, dtype, None, None, "host"))
    lone = by_owner.get(-1, [])
    for k in lone:
        row = int(kern_rows[k])
        kop, algo, proto = _kernel_info(names[int(events.name[row])])
        start = float(events.ts[row])
        recorded = events.comm_args.get(row)
        lone_op = normalize_collective(recorded.collective) if recorded else kop or "unknown"
        calls.append(
            CollectiveCall(
                lone_op,
                "nccl",
                start,
                start + float(events.dur[row]),
                _recorded_message(lone_op, recorded) if recorded else None,
                recorded.dtype if recorded else None,
                algo,
                proto,
                "gpu",
                recorded.process_group if recorded else "",
                recorded.group_size if recorded else None,
            )
        )
    notes = []
    if untimed:
        notes.append(
            f"{untimed} NCCL calls were enqueued without a communication kernel in the trace "
            "(outside the capture): left out"
        )
    unsized = sum(1 for k in lone if int(kern_rows[k]) not in events.comm_args)
    if unsized:
        notes.append(
            f"{unsized} communication kernels are not inside a recorded collective range: "
            "each is counted as one call, its message size unknown"
        )
    calls.sort(key=lambda c: c.start_us)
    return tuple(calls), tuple(notes)


@dataclass(frozen=True)
class CollectiveStats:
    """One collective call matched over the ranks (``seq``: its index among the calls of
    ``op`` on each rank). Times in microseconds; ``starts_us``/``ends_us`` by rank, aligned."""

    op: str
    seq: int
    backend: str
    group_size: int
    size_bytes: int | None
    dtype: str | None
    algorithm: str | None
    protocol: str | None
    timed_on: str
    starts_us: Mapping[int, float]
    ends_us: Mapping[int, float]
    process_group: str = ""  # its name, when the trace records it

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.starts_us))

    @property
    def last_rank(self) -> int:
        """The rank that started last: the one the others waited for."""
        return max(self.starts_us, key=lambda r: (self.starts_us[r], r))

    @property
    def skew_us(self) -> float:
        return max(self.starts_us.values()) - min(self.starts_us.values())

    @property
    def late_ranks(self) -> tuple[int, ...]:
        """The ranks the others waited for: the last to start and every rank that started
        within ``TOGETHER_SHARE`` of the skew before it (late together); () without skew."""
        skew = self.skew_us
        if skew <= 0:
            return ()
        last = max(self.starts_us.values())
        return tuple(
            sorted(r for r, s in self.starts_us.items() if last - s <= TOGETHER_SHARE * skew)
        )

    @property
    def hold_us(self) -> float:
        """How long the late ranks held the others: the last start minus the median start of
        the ranks that were not late (0 without skew)."""
        late = set(self.late_ranks)
        others = [s for r, s in self.starts_us.items() if r not in late]
        if not late or not others:
            return 0.0
        return max(self.starts_us.values()) - statistics.median(others)

    def wait_us(self, rank: int) -> float:
        """Time ``rank`` spent in the call before the last rank arrived."""
        return max(self.starts_us.values()) - self.starts_us[rank]

    @property
    def duration_us(self) -> float:
        """The longest time any rank spent in the call (from its own start to its own end)."""
        return max(self.ends_us[r] - self.starts_us[r] for r in self.starts_us)

    @property
    def consistent(self) -> bool:
        """False when a rank ended before another began: they cannot have been in one call
        (the traces do not record process groups, so a sub-group's calls can be mismatched)."""
        last = max(self.starts_us.values())
        return all(end >= last for end in self.ends_us.values())

    @property
    def transfer_us(self) -> float | None:
        """Median over ranks of (own end - last start): the call once every rank is in.
        None when the clocks disagree (an end before the last start)."""
        last = max(self.starts_us.values())
        spans = [self.ends_us[r] - last for r in self.ends_us]
        value = statistics.median(spans)
        return value if value > 0 else None

    @property
    def algbw_gbps(self) -> float | None:
        t = self.transfer_us
        return self.size_bytes / (t * 1e-6) / 1e9 if self.size_bytes and t else None

    @property
    def busbw_gbps(self) -> float | None:
        alg = self.algbw_gbps
        if alg is None or self.op not in COLLECTIVES or self.group_size < 1:
            return None
        return alg * bus_factor(self.op, self.group_size)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "op": self.op,
                "seq": self.seq,
                "backend": self.backend,
                "group_size": self.group_size,
                "process_group": self.process_group,
                "size_bytes": self.size_bytes,
                "dtype": self.dtype,
                "algorithm": self.algorithm,
                "protocol": self.protocol,
                "timed_on": self.timed_on,
                "ranks": list(self.ranks),
                "starts_us": {str(r): v for r, v in self.starts_us.items()},
                "ends_us": {str(r): v for r, v in self.ends_us.items()},
                "last_rank": self.last_rank,
                "late_ranks": list(self.late_ranks),
                "hold_us": self.hold_us,
                "skew_us": self.skew_us,
                "duration_us": self.duration_us,
                "transfer_us": self.transfer_us,
                "algbw_gbps": self.algbw_gbps,
                "busbw_gbps": self.busbw_gbps,
            }
        )


@dataclass(frozen=True)
class OpSummary:
    """Every matched call of one collective: counts, time, bandwidth and who arrived last."""

    op: str
    calls: int
    total_duration_us: float
    total_transfer_us: float
    median_busbw_gbps: float | None
    max_busbw_gbps: float | None
    mean_skew_us: float
    max_skew_us: float
    algorithms: Mapping[str, int]  # "RING/LL" -> calls

    def to_dict(self) -> dict[str, Any]:
        return jsonable(fields_json(self))


@dataclass(frozen=True)
class RankWait:
    """One rank across the matched calls: time waiting for the last rank, and how often it was
    the last (the others waited for it)."""

    rank: int
    calls: int
    time_in_calls_us: float
    wait_us: float
    last_arrivals: int
    lateness_us: float  # when last: its start minus the median start of the others, summed
    late_calls: int = 0  # calls where it is among the late ranks (``late_ranks``)
    held_us: float = 0.0  # the ``hold_us`` of those calls, summed (shared with its late peers)

    @property
    def wait_share(self) -> float | None:
        return self.wait_us / self.time_in_calls_us if self.time_in_calls_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["wait_share"] = self.wait_share
        return out


@dataclass(frozen=True, eq=False)
class CollectiveReport:
    """``TraceReport.collectives()``: the collectives of a job's ranks, matched call by call."""

    ranks: tuple[int, ...]
    world_size: int | None
    calls: tuple[CollectiveStats, ...]
    by_op: tuple[OpSummary, ...]
    by_rank: tuple[RankWait, ...]
    notes: tuple[str, ...]

    def op(self, name: str) -> OpSummary | None:
        return next((s for s in self.by_op if s.op == name), None)

    @property
    def waited_for(self) -> RankWait | None:
        """The rank whose late starts held the others longest (the most ``lateness_us``, then
        the most last arrivals), with two or more ranks; None when no rank was ever last."""
        if len(self.ranks) < 2 or not self.by_rank:
            return None
        top = max(self.by_rank, key=lambda r: (r.lateness_us, r.last_arrivals))
        return top if top.last_arrivals else None

    @property
    def total_hold_us(self) -> float:
        """The time late ranks held the others, over every matched call."""
        return sum(c.hold_us for c in self.calls)

    @property
    def stragglers(self) -> tuple[RankWait, ...]:
        """The ranks the others wait for: among the late ranks of calls that hold the others
        ``STRAGGLER_HOLD_SHARE`` or more of all the holding, over ``MIN_MATCHED_CALLS`` or more
        matched calls; most holding first. () when the arrivals name no such rank."""
        total = self.total_hold_us
        if len(self.ranks) < 2 or len(self.calls) < MIN_MATCHED_CALLS or total <= 0:
            return ()
        found = [w for w in self.by_rank if w.held_us >= STRAGGLER_HOLD_SHARE * total]
        return tuple(sorted(found, key=lambda w: (-w.held_us, w.rank)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": list(self.ranks),
            "stragglers": [w.rank for w in self.stragglers],
            "total_hold_us": self.total_hold_us,
            "world_size": self.world_size,
            "by_op": [s.to_dict() for s in self.by_op],
            "by_rank": [r.to_dict() for r in self.by_rank],
            "calls": [c.to_dict() for c in self.calls],
            "notes": list(self.notes),
        }

    def _op_rows(self) -> list[tuple[str, ...]]:
        def num(v: float | None, fmt: str) -> str:
            return "N/A" if v is None else format(v, fmt)

        return [
            (
                s.op,
                str(s.calls),
                f"{s.total_duration_us / 1000:.2f}",
                num(s.median_busbw_gbps, ".2f"),
                num(s.max_busbw_gbps, ".2f"),
                f"{s.mean_skew_us:.1f}",
                f"{s.max_skew_us:.1f}",
                ", ".join(f"{k} ({v})" for k, v in s.algorithms.items()) or "-",
            )
            for s in self.by_op
        ]

    def _rank_rows(self) -> list[tuple[str, ...]]:
        return [
            (
                str(r.rank),
                str(r.calls),
                f"{r.time_in_calls_us / 1000:.2f}",
                f"{r.wait_us / 1000:.2f}",
                "N/A" if r.wait_share is None else f"{r.wait_share:.0%}",
                str(r.last_arrivals),
                str(r.late_calls),
                f"{r.held_us / 1000:.2f}",
            )
            for r in self.by_rank
        ]

    _OP_HEAD = (
        "collective",
        "calls",
        "ms",
        "busbw med",
        "busbw max",
        "skew us",
        "max skew",
        "algo",
    )
    _RANK_HEAD = (
        "rank",
        "calls",
        "ms in calls",
        "ms waiting",
        "wait share",
        "last",
        "late",
        "ms holding others",
    )

    def __repr__(self) -> str:
        lines = [
            f"CollectiveReport({len(self.calls)} calls over ranks "
            f"{', '.join(map(str, self.ranks))}; world size {self.world_size or 'unknown'})"
        ]
        if self.by_op:
            lines.append("  " + " | ".join(self._OP_HEAD))
            lines += ["  " + " | ".join(row) for row in self._op_rows()]
        if len(self.ranks) > 1:
            lines.append("  " + " | ".join(self._RANK_HEAD))
            lines += ["  " + " | ".join(row) for row in self._rank_rows()]
        late = self.stragglers
        if late:
            named = ", ".join(str(r) for r in sorted(w.rank for w in late))
            lines.append(
                f"  the others wait for rank(s) {named}: late in calls that hold them "
                f"{max(w.held_us for w in late) / 1000:.2f} of "
                f"{self.total_hold_us / 1000:.2f} ms ('late': last to start, or within "
                f"{TOGETHER_SHARE:.0%} of the call's skew of the last)"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = [
            html_table(
                [
                    ("ranks", ", ".join(map(str, self.ranks))),
                    ("world size", self.world_size or "unknown"),
                    ("matched calls", len(self.calls)),
                ]
            )
        ]
        if self.by_op:
            parts.append(html_grid(self._OP_HEAD, self._op_rows()))
        if len(self.ranks) > 1:
            parts.append(html_grid(self._RANK_HEAD, self._rank_rows()))
        parts += [f"<div style='opacity:.7'>note: {esc(n)}</div>" for n in self.notes]
        return card("Collectives across ranks", "".join(parts))


def _offsets(bases: Mapping[int, Any]) -> tuple[dict[int, float], list[str]]:
    """Per-rank shift (us) onto the earliest rank's clock from ``baseTimeNanoseconds``."""
    known = {r: int(b) for r, b in bases.items() if isinstance(b, int) and not isinstance(b, bool)}
    if len(known) < len(bases) or not known:
        notes = (
            ["some traces lack baseTimeNanoseconds: their timestamps are compared as recorded"]
            if known
            else []
        )
        return dict.fromkeys(bases, 0.0), notes
    low = min(known.values())
    return {r: (b - low) / 1000.0 for r, b in known.items()}, []


def match_collectives(
    per_rank: Mapping[int, Sequence[CollectiveCall]],
    *,
    world_size: int | None,
    bases: Mapping[int, Any] | None = None,
    hosts: Mapping[int, str] | None = None,
    notes: Sequence[str] = (),
) -> CollectiveReport:
    """Match each rank's k-th call of a collective with the others' and summarise."""
    ranks = tuple(sorted(per_rank))
    out_notes = list(notes)
    offsets, more = _offsets(bases or dict.fromkeys(ranks))
    out_notes += more
    group = world_size or len(ranks)
    if world_size and len(ranks) < world_size:
        out_notes.append(
            f"{len(ranks)} of {world_size} ranks traced: the last arrival, skew and wait are "
            "among the traced ranks only"
        )
    if hosts and len(set(hosts.values())) > 1:
        out_notes.append(
            "the ranks ran on different hosts: start-time skew is only as exact as their clocks' "
            "synchronisation (NTP/PTP)"
        )
    # The k-th call of one collective in one process group (when recorded) on every rank.
    by_op: dict[tuple[str, str], dict[int, list[CollectiveCall]]] = {}
    for r in ranks:
        for c in per_rank[r]:
            by_op.setdefault((c.op, c.group), {}).setdefault(r, []).append(c)
    matched: list[CollectiveStats] = []
    for (op, pg), lists in by_op.items():
        counts = {r: len(lists.get(r, [])) for r in ranks}
        n = min(counts.values())
        if len(set(counts.values())) > 1:
            shown = ", ".join(f"rank {r}: {c}" for r, c in counts.items())
            where = f" in process group {pg}" if pg else ""
            out_notes.append(
                f"{op}{where}: the ranks recorded different numbers of calls ({shown}); the "
                f"first {n} of each are matched (the capture windows may differ, or some ranks "
                "are not in the group)"
            )
        for k in range(n):
            group_calls = {r: lists[r][k] for r in ranks}
            first = next(iter(group_calls.values()))
            sizes = [c.size_bytes for c in group_calls.values() if c.size_bytes]
            algos = Counter(
                (c.algorithm, c.protocol) for c in group_calls.values() if c.algorithm
            ).most_common(1)
            matched.append(
                CollectiveStats(
                    op=op,
                    seq=k,
                    backend=first.backend,
                    group_size=first.group_size or group,
                    size_bytes=max(sizes) if sizes else None,
                    dtype=first.dtype,
                    algorithm=algos[0][0][0] if algos else None,
                    protocol=algos[0][0][1] if algos else None,
                    timed_on=first.timed_on,
                    starts_us={r: c.start_us + offsets.get(r, 0.0) for r, c in group_calls.items()},
                    ends_us={r: c.end_us + offsets.get(r, 0.0) for r, c in group_calls.items()},
                    process_group=pg,
                )
            )
    matched.sort(key=lambda c: min(c.starts_us.values()))
    odd = [c for c in matched if not c.consistent]
    if odd:
        out_notes.append(
            f"{len(odd)} of {len(matched)} matched calls cannot be one collective across these "
            "ranks (a rank finished before another began): the traces do not say which process "
            "group each call used, so calls of different sub-groups were paired; those calls are "
            "left out of the skew, wait and bandwidth figures"
        )
        matched = [c for c in matched if c.consistent]
    return CollectiveReport(
        ranks=ranks,
        world_size=world_size,
        calls=tuple(matched),
        by_op=_summaries(matched),
        by_rank=_waits(matched, ranks),
        notes=tuple(out_notes),
    )


def _summaries(calls: Sequence[CollectiveStats]) -> tuple[OpSummary, ...]:
    ops: dict[str, list[CollectiveStats]] = {}
    for c in calls:
        ops.setdefault(c.op, []).append(c)
    out = []
    for op, cs in ops.items():
        bws = [b for c in cs if (b := c.busbw_gbps) is not None]
        algos = Counter(f"{c.algorithm}/{c.protocol}" for c in cs if c.algorithm)
        out.append(
            OpSummary(
                op=op,
                calls=len(cs),
                total_duration_us=sum(c.duration_us for c in cs),
                total_transfer_us=sum(c.transfer_us or 0.0 for c in cs),
                median_busbw_gbps=statistics.median(bws) if bws else None,
                max_busbw_gbps=max(bws) if bws else None,
                mean_skew_us=statistics.fmean(c.skew_us for c in cs),
                max_skew_us=max(c.skew_us for c in cs),
                algorithms=dict(algos.most_common()),
            )
        )
    out.sort(key=lambda s: -s.total_duration_us)
    return tuple(out)


def _waits(calls: Sequence[CollectiveStats], ranks: Sequence[int]) -> tuple[RankWait, ...]:
    out = []
    for r in ranks:
        mine = [c for c in calls if r in c.starts_us]
        last = [c for c in mine if len(c.starts_us) > 1 and c.last_rank == r and c.skew_us > 0]
        lateness = sum(
            c.starts_us[r] - statistics.median(v for q, v in c.starts_us.items() if q != r)
            for c in last
        )
        late = [c for c in mine if r in c.late_ranks]
        out.append(
            RankWait(
                rank=r,
                calls=len(mine),
                time_in_calls_us=sum(c.ends_us[r] - c.starts_us[r] for c in mine),
                wait_us=sum(c.wait_us(r) for c in mine),
                last_arrivals=len(last),
                lateness_us=lateness,
                late_calls=len(late),
                held_us=sum(c.hold_us for c in late),
            )
        )
    return tuple(out)
