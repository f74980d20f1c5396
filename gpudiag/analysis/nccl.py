"""Collective bandwidth: nccl-tests' algorithm/bus bandwidth formulas, results, and a log parser.

Formulas follow nccl-tests' ``doc/PERFORMANCE.md`` (NVIDIA/nccl-tests): algbw = S / t, where S is
the "size" column (bytes per rank for all-reduce/broadcast/reduce, the total gathered or
scattered buffer for all-gather/reduce-scatter/all-to-all), and busbw = algbw x a factor that
makes every collective comparable with the hardware's link bandwidth:

========================  ============
all-reduce                2 (n - 1) / n
all-gather, reduce-scatter, all-to-all   (n - 1) / n
broadcast, reduce, send/recv             1
========================  ============

GB/s here are 1e9 bytes per second, as in nccl-tests.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._files import LOG_BYTES, read_text
from gpudiag._report import jsonable
from gpudiag._values import digits, is_ascii_number
from gpudiag._views import Block, Card, Carded, Grid, Lines
from gpudiag.errors import GpuDiagError
from gpudiag.units import format_bytes

if TYPE_CHECKING:
    from gpudiag.probe.nccl_topo import NcclTopology

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send_recv",
)
_ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send_recv",
}
# Bytes per element of the type names nccl-tests prints (``ncclDataType_t`` names).
TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "float": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
    "float64": 8,
}


def normalize_op(op: str) -> str:
    key = str(op).strip().lower().replace("-", "_").removesuffix("_perf")
    key = _ALIASES.get(key.replace("_", ""), key)
    if key not in COLLECTIVES:
        raise GpuDiagError(f"Unknown collective {op!r}: use one of {', '.join(COLLECTIVES)}.")
    return key


def bus_factor(op: str, nranks: int) -> float:
    """busbw / algbw for ``op`` on ``nranks`` ranks (nccl-tests' correction factor)."""
    op = normalize_op(op)
    if nranks < 1:
        raise GpuDiagError(f"A collective needs at least one rank, got {nranks}.")
    if op == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if op in {"all_gather", "reduce_scatter", "all_to_all"}:
        return (nranks - 1) / nranks
    return 1.0


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth: the size column over the time, in GB/s (1e9 B/s)."""
    return size_bytes / time_s / 1e9 if time_s > 0 else math.inf


def busbw_gbps(op: str, size_bytes: int, time_s: float, nranks: int) -> float:
    return algbw_gbps(size_bytes, time_s) * bus_factor(op, nranks)


def size_bytes_for(op: str, count_per_rank: int, type_bytes: int, nranks: int) -> int:
    """The size column for ``count_per_rank`` elements each rank sends or receives.

    all-gather: each rank contributes ``count_per_rank`` and the size is the gathered total;
    reduce-scatter: each rank keeps ``count_per_rank`` and the size is the full input.
    """
    op = normalize_op(op)
    per_rank = count_per_rank * type_bytes
    return per_rank * nranks if op in {"all_gather", "reduce_scatter", "all_to_all"} else per_rank


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """One message size. Times in microseconds; bandwidths in GB/s (1e9 B/s).

    ``time_q1_us``/``time_q3_us`` exist for measured rows (IQR over repetitions); a parsed
    nccl-tests row has only the reported time. ``wrong`` counts wrong elements (None: not
    checked, as nccl-tests' "N/A").
    """

    size_bytes: int
    count: int
    dtype: str
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    in_place: bool = False
    time_q1_us: float | None = None
    time_q3_us: float | None = None
    wrong: int | None = None

    @property
    def busbw_iqr_gbps(self) -> tuple[float, float] | None:
        """Bus bandwidth at the Q3 and Q1 times (low, high)."""
        if self.time_q1_us is None or self.time_q3_us is None or self.time_us <= 0:
            return None
        scale = self.busbw_gbps * self.time_us
        return (
            scale / self.time_q3_us if self.time_q3_us > 0 else math.inf,
            scale / self.time_q1_us if self.time_q1_us > 0 else math.inf,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "size_bytes": self.size_bytes,
            "count": self.count,
            "dtype": self.dtype,
            "time_us": self.time_us,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
            "in_place": self.in_place,
            "time_q1_us": self.time_q1_us,
            "time_q3_us": self.time_q3_us,
            "busbw_iqr_gbps": self.busbw_iqr_gbps,
            "wrong": self.wrong,
        }
        return jsonable(out)


@dataclass(frozen=True, slots=True)
class CollectiveResult(Carded):
    """Bandwidth of one collective over message sizes: measured by ``gd.bench.allreduce`` (and
    friends) or parsed from an nccl-tests log, so the two can be compared.

    ``source`` says which ("measured" or "nccl-tests log"); ``backend`` is "nccl", "gloo" or
    what the log implies. ``error`` is set, with no rows, when the benchmark could not run.
    """

    op: str
    world_size: int
    backend: str
    source: str
    rows: tuple[CollectiveRow, ...]
    label: str = ""
    reported_avg_busbw_gbps: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    error: str = ""

    @property
    def bus_factor(self) -> float:
        return bus_factor(self.op, self.world_size)

    def _rows(self, in_place: bool | None) -> list[CollectiveRow]:
        return [r for r in self.rows if in_place is None or r.in_place == in_place]

    def peak_busbw_gbps(self, *, in_place: bool | None = None) -> float | None:
        """Highest bus bandwidth over the sizes; None without rows."""
        rows = self._rows(in_place)
        return max(r.busbw_gbps for r in rows) if rows else None

    def avg_busbw_gbps(self) -> float | None:
        """Mean bus bandwidth of every row, both placements: nccl-tests' "Avg bus bandwidth"."""
        return statistics.fmean(r.busbw_gbps for r in self.rows) if self.rows else None

    def busbw_at(self, size_bytes: int, *, in_place: bool | None = None) -> float | None:
        """Bus bandwidth at the measured size closest to ``size_bytes`` (best placement)."""
        rows = [r for r in self._rows(in_place) if r.size_bytes > 0]
        if not rows:
            return None
        nearest = min(
            rows, key=lambda r: abs(math.log(r.size_bytes) - math.log(max(size_bytes, 1)))
        )
        return max(r.busbw_gbps for r in rows if r.size_bytes == nearest.size_bytes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted({r.size_bytes for r in self.rows}))

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "collective",
                "op": self.op,
                "world_size": self.world_size,
                "backend": self.backend,
                "source": self.source,
                "label": self.label,
                "bus_factor": self.bus_factor,
                "peak_busbw_gbps": self.peak_busbw_gbps(),
                "avg_busbw_gbps": self.avg_busbw_gbps(),
                "reported_avg_busbw_gbps": self.reported_avg_busbw_gbps,
                "error": self.error,
                "notes": self.notes,
                "rows": self.rows,
            }
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectiveResult:
        """Inverse of ``to_dict`` (results written by another process or saved to JSON)."""
        try:
            rows = tuple(
                CollectiveRow(
                    size_bytes=int(r["size_bytes"]),
                    count=int(r["count"]),
                    dtype=str(r["dtype"]),
                    time_us=float(r["time_us"]),
                    algbw_gbps=float(r["algbw_gbps"]) if r["algbw_gbps"] is not None else math.inf,
                    busbw_gbps=float(r["busbw_gbps"]) if r["busbw_gbps"] is not None else math.inf,
                    in_place=bool(r.get("in_place", False)),
                    time_q1_us=r.get("time_q1_us"),
                    time_q3_us=r.get("time_q3_us"),
                    wrong=r.get("wrong"),
                )
                for r in data.get("rows", ())
            )
            return cls(
                op=normalize_op(data["op"]),
                world_size=int(data["world_size"]),
                backend=str(data.get("backend", "")),
                source=str(data.get("source", "")),
                rows=rows,
                label=str(data.get("label", "")),
                reported_avg_busbw_gbps=data.get("reported_avg_busbw_gbps"),
                notes=tuple(data.get("notes", ())),
                error=str(data.get("error", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GpuDiagError(
                f"Not a gpudiag collective result ({exc!r}): expected the output of "
                "CollectiveResult.to_dict()."
            ) from None

    def plot(self, *others: CollectiveResult) -> Any:
        """Bus bandwidth vs message size, with other results (e.g. an nccl-tests log) overlaid."""
        return _views.build("figure", self, *others)

    def _table(self) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for r in self.rows:
            spread = r.busbw_iqr_gbps
            out.append(
                (
                    format_bytes(r.size_bytes, "g"),
                    "in-place" if r.in_place else "out-of-place",
                    f"{r.time_us:.1f}",
                    f"{r.algbw_gbps:.2f}",
                    f"{r.busbw_gbps:.2f}",
                    f"{spread[0]:.2f} - {spread[1]:.2f}" if spread else "",
                    "N/A" if r.wrong is None else str(r.wrong),
                )
            )
        return out

    def _title(self) -> str:
        return (
            f"{self.op} over {self.world_size} ranks ({self.backend}; {self.source}"
            f"{': ' + self.label if self.label else ''})"
        )

    def __repr__(self) -> str:
        lines = [f"CollectiveResult: {self._title()}"]
        if self.error:
            lines.append(f"  cannot run: {self.error}")
        else:
            peak, avg = self.peak_busbw_gbps(), self.avg_busbw_gbps()
            lines.append(
                f"  peak bus bandwidth {peak:.2f} GB/s, average {avg:.2f} GB/s "
                f"(bus factor {self.bus_factor:.3g})"
                if peak is not None and avg is not None
                else "  no rows"
            )
            lines.append(
                f"  {'size':>10} {'placement':>12} {'time us':>10} {'algbw':>8} {'busbw':>8} "
                f"{'busbw IQR':>15}"
            )
            for size, place, t, alg, bus, spread, _ in self._table():
                lines.append(f"  {size:>10} {place:>12} {t:>10} {alg:>8} {bus:>8} {spread:>15}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        body: Block
        if self.error:
            body = Lines([f"cannot run: {self.error}"])
        else:
            body = Grid(
                (
                    "size",
                    "placement",
                    "time (us)",
                    "algbw GB/s",
                    "busbw GB/s",
                    "busbw IQR",
                    "wrong",
                ),
                self._table(),
            )
        return Card(
            "Collective bandwidth", [body, Lines(self.notes, "note")], subtitle=self._title()
        )


# --- nccl-tests log parser ---------------------------------------------------------------------

_PARAMS = re.compile(r"#\s*nThread\s+([0-9]{1,6})\s+nGpus\s+([0-9]{1,6})")
_RANK = re.compile(r"#\s+Rank\s+[0-9]+\b")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OP_IN_NAME = re.compile(
    r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|reduce|send_?recv)"
)


# Sizes and counts of an nccl-tests row: ASCII digits, at most a pebibyte.
_MAX_ROW_NUMBER = 1 << 50


def _float(token: str) -> float | None:
    """A time or bandwidth cell: a finite, non-negative ASCII number, else None."""
    if not is_ascii_number(token):
        return None
    value = float(token)
    return value if math.isfinite(value) and value >= 0 else None


def _count(token: str) -> int | None:
    """A size or count cell: ASCII digits up to a pebibyte, else None."""
    if not digits(token) or len(token) > 16 or int(token) > _MAX_ROW_NUMBER:
        return None
    return int(token)


@dataclass
class _Block:
    columns: list[str] = field(default_factory=list)
    groups: int = 0
    ranks: int = 0
    threads_gpus: tuple[int, int] | None = None
    data: list[list[str]] = field(default_factory=list)
    avg: float | None = None


def _blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    current: _Block | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        params = _PARAMS.match(line)
        if params:
            current = _Block(threads_gpus=(int(params.group(1)), int(params.group(2))))
            blocks.append(current)
            continue
        if current is None:
            if line.startswith("#") and "size" in line and "count" in line:
                current = _Block()  # a log cut above its parameter line
                blocks.append(current)
            else:
                continue
        if line.startswith("#"):
            tokens = line.lstrip("#").split()
            if _RANK.match(line):
                current.ranks += 1
            elif tokens[:2] == ["size", "count"]:
                current.columns = tokens
                current.groups = tokens.count("time")
            elif (avg := _AVG.match(line)) is not None:
                current.avg = float(avg.group(1))
            continue
        tokens = line.split()
        if digits(tokens[0]) and current.groups:
            current.data.append(tokens)
    return [b for b in blocks if b.data]


def _infer_op(block: _Block, nranks: int, hint: str | None) -> str:
    if hint:
        match = _OP_IN_NAME.search(hint.lower().replace("-", "_"))
        if match:
            return normalize_op(match.group(1))
    prefix = block.columns[: block.columns.index("time")] if "time" in block.columns else []
    rows = [r for r in block.data if len(r) >= 3 + 4 * block.groups]
    extra = [r[3 : len(r) - 4 * block.groups] for r in rows]
    has_root = "root" in prefix
    has_redop = any(e and not digits(e[0].lstrip("-")) and e[0] != "none" for e in extra)
    if has_root:
        return "reduce" if has_redop else "broadcast"
    ratios = []
    per_rank_count = True
    for r in rows:
        size, count, type_bytes = _count(r[0]) or 0, _count(r[1]) or 0, TYPE_BYTES.get(r[2].lower())
        if size and type_bytes and count * type_bytes == size:
            per_rank_count = False
        alg, bus = _float(r[-4 * block.groups + 1]), _float(r[-4 * block.groups + 2])
        if alg and bus and alg >= 1.0:
            ratios.append(bus / alg)
    if ratios:
        ratio = statistics.median(ratios)
        if math.isclose(ratio, bus_factor("all_reduce", nranks), rel_tol=0.02) and nranks > 1:
            return "all_reduce"
    if has_redop:
        return "reduce_scatter" if per_rank_count else "all_reduce"
    raise GpuDiagError(
        "Cannot tell from the log whether this is all_gather or all_to_all (same columns and bus "
        "factor): pass op='all_gather' or op='all_to_all'."
    )


def _parse_block(block: _Block, op: str | None, hint: str | None, label: str) -> CollectiveResult:
    threads, gpus = block.threads_gpus or (1, 1)
    nranks = block.ranks or threads * gpus
    name = normalize_op(op) if op else _infer_op(block, nranks, hint)
    rows: list[CollectiveRow] = []
    skipped = 0
    for tokens in block.data:
        need = 3 + 4 * block.groups
        size, count = _count(tokens[0]), _count(tokens[1]) if len(tokens) > 1 else None
        if len(tokens) < need or size is None or count is None:
            skipped += 1
            continue
        dtype = tokens[2]
        for g in range(block.groups):
            t, alg, bus, wrong = tokens[len(tokens) - 4 * (block.groups - g) :][:4]
            time_us, alg_v, bus_v = _float(t), _float(alg), _float(bus)
            if time_us is None or alg_v is None or bus_v is None:
                skipped += 1
                continue
            rows.append(
                CollectiveRow(
                    size_bytes=size,
                    count=count,
                    dtype=dtype,
                    time_us=time_us,
                    algbw_gbps=alg_v,
                    busbw_gbps=bus_v,
                    in_place=g == 1,
                    wrong=int(wrong) if digits(wrong) else None,
                )
            )
    notes = [f"parsed from nccl-tests output ({nranks} ranks)"]
    if skipped:
        notes.append(f"{skipped} row(s) left out: a size, count or time that is not a number")
    return CollectiveResult(
        op=name,
        world_size=nranks,
        backend="nccl",
        source="nccl-tests log",
        rows=tuple(rows),
        label=label,
        reported_avg_busbw_gbps=block.avg,
        notes=tuple(notes),
    )


def _read_source(source: str | Path) -> tuple[str, str | None, str]:
    """(text, file name hint, label) from a path or the log text itself."""
    if isinstance(source, Path) or ("\n" not in str(source) and len(str(source)) < 4096):
        path = Path(source)
        if not path.exists():
            raise GpuDiagError(
                f"nccl-tests log {str(source)!r} not found: pass a path to the saved output of "
                "all_reduce_perf (or its text)."
            )
        text = read_text(path, "nccl-tests log", max_bytes=LOG_BYTES, replace=True)
        return text, path.name, path.name
    return str(source), None, ""


def parse_nccl_tests_all(source: str | Path, *, op: str | None = None) -> list[CollectiveResult]:
    """Every run in an nccl-tests output (a file can hold several, one per header)."""
    text, hint, label = _read_source(source)
    blocks = _blocks(text)
    if not blocks:
        raise GpuDiagError(
            "No nccl-tests result rows found: expected the table printed by all_reduce_perf "
            "(a '#  size  count  type ...' header followed by numeric rows)."
        )
    return [_parse_block(b, op, hint, label) for b in blocks]


def parse_nccl_tests(source: str | Path, *, op: str | None = None) -> CollectiveResult:
    """Parse nccl-tests output (a path or its text) into a CollectiveResult.

    The collective is taken from ``op``, else from the file name (``all_reduce_perf.log``,
    ``nccl_allgather.log``), else from the columns and the busbw/algbw ratio. Only all-gather
    and all-to-all cannot be told apart that way: pass ``op`` for those.
    """
    results = parse_nccl_tests_all(source, op=op)
    if len(results) > 1:
        raise GpuDiagError(
            f"The log holds {len(results)} runs: use parse_nccl_tests_all() to get each of them."
        )
    return results[0]


def check_formulas(result: CollectiveResult, *, rel_tol: float = 0.02) -> list[CollectiveRow]:
    """Rows whose algbw/busbw disagree with the formulas (size/time and the bus factor).

    Rows too small for the printed two decimals to carry the ratio are skipped.
    """
    bad = []
    for r in result.rows:
        if r.time_us <= 0 or r.algbw_gbps < 1.0:
            continue
        alg = algbw_gbps(r.size_bytes, r.time_us * 1e-6)
        bus = alg * result.bus_factor
        if not (
            math.isclose(alg, r.algbw_gbps, rel_tol=rel_tol)
            and math.isclose(bus, r.busbw_gbps, rel_tol=rel_tol)
        ):
            bad.append(r)
    return bad


def rows_from_times(
    op: str,
    nranks: int,
    dtype: str,
    type_bytes: int,
    measurements: Iterable[tuple[int, Sequence[float], int | None, bool]],
) -> tuple[CollectiveRow, ...]:
    """Rows from measured times: (count per rank, seconds per op, wrong elements, in place)."""
    from statistics import quantiles

    out = []
    for count, samples, wrong, in_place in measurements:
        ordered = sorted(samples)
        if len(ordered) >= 2:
            q1, median, q3 = quantiles(ordered, n=4, method="inclusive")
        else:
            q1 = median = q3 = ordered[0]
        size = size_bytes_for(op, count, type_bytes, nranks)
        out.append(
            CollectiveRow(
                size_bytes=size,
                count=count,
                dtype=dtype,
                time_us=median * 1e6,
                algbw_gbps=algbw_gbps(size, median),
                busbw_gbps=busbw_gbps(op, size, median, nranks),
                in_place=in_place,
                time_q1_us=q1 * 1e6,
                time_q3_us=q3 * 1e6,
                wrong=wrong,
            )
        )
    return tuple(out)


# --- what the links should give ------------------------------------------------------------------

# NVLink bandwidth per link and direction, by the GPU's compute capability major: NVLink 2
# (Volta), 3 (Ampere) and 4 (Hopper) carry 25 GB/s per link per direction (V100 6 links = 300 GB/s
# both ways, A100 12 = 600, H100 18 = 900, as their datasheets state); NVLink 5 (Blackwell) 50
# (B200 18 links = 1.8 TB/s).
NVLINK_GBPS_PER_LINK: dict[int, float] = {7: 25.0, 8: 25.0, 9: 25.0, 10: 50.0, 12: 50.0}
# PCIe x16 per direction after line encoding (Gen3 128b/130b 8 GT/s ... Gen6 64 GT/s).
PCIE_X16_GBPS: dict[int, float] = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
# Share of the link bandwidth a large all-reduce reaches as nccl-tests busbw on a healthy node:
# on 8x A100-SXM4 (NV12 through NVSwitch, 300 GB/s per direction) superbench's recorded
# all_reduce_perf peaks at 235 GB/s (78 %); NVIDIA's published DGX figures sit in the same
# 75-85 % band. Below LOW_SHARE of the link a finding is raised.
NCCL_EFFICIENCY = 0.8
LOW_SHARE = 0.6
# Messages below this are latency-bound: their bus bandwidth says nothing about the links.
MIN_JUDGED_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class LinkBudget:
    """What one node's GPU links should give a collective over ``gpus`` GPUs: ``link_gbps``
    per GPU and direction (theoretical), ``expected_busbw_gbps`` = link x NCCL_EFFICIENCY.
    ``basis`` says how it was derived; ``notes`` what was assumed."""

    link: str
    gpus: int
    link_gbps: float
    basis: str
    notes: tuple[str, ...] = ()

    @property
    def expected_busbw_gbps(self) -> float:
        return self.link_gbps * NCCL_EFFICIENCY

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "link": self.link,
                "gpus": self.gpus,
                "link_gbps": self.link_gbps,
                "expected_busbw_gbps": self.expected_busbw_gbps,
                "basis": self.basis,
                "notes": self.notes,
            }
        )


def pcie_gen_of(link_speed: str) -> int | None:
    """PCIe generation from NCCL XML's ``link_speed`` ("16.0 GT/s PCIe" -> 4)."""
    match = re.match(r"\s*([0-9.]+)\s*GT/s", link_speed or "")
    if not match:
        return None
    rate = float(match.group(1))
    return {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}.get(rate)


def _nvlink_rate(cc_major: int | None) -> tuple[float, list[str]]:
    if cc_major in NVLINK_GBPS_PER_LINK:
        return NVLINK_GBPS_PER_LINK[cc_major], []
    return 25.0, ["GPU generation unknown: 25 GB/s per NVLink per direction assumed (NVLink 2-4)"]


def link_budget(
    labels: Sequence[Sequence[str]], *, cc_major: int | None = None, pcie_gen: int | None = None
) -> LinkBudget | None:
    """The budget for a collective over every GPU of a square matrix of ``nvidia-smi topo -m``
    link labels ("NV12", "PIX", "SYS", "X" on the diagonal); None for one GPU or an unknown
    pair ("?").

    All pairs NVLink with one count on three or more GPUs is an NVSwitch board (each pair
    reports the GPU's full bond): a GPU's links are that count. Otherwise NVLinks are direct
    and a GPU's links are the sum over its peers (the slowest GPU bounds the ring). Any pair
    without NVLink bounds the collective by PCIe x16 of ``pcie_gen``.
    """
    n = len(labels)
    if n < 2:
        return None
    pairs = [labels[i][j] for i in range(n) for j in range(n) if i != j]
    if any(label in ("?", "") for label in pairs):
        return None
    counts = [int(label[2:]) if re.fullmatch(r"NV[0-9]{1,4}", label) else 0 for label in pairs]
    if all(counts):
        rate, notes = _nvlink_rate(cc_major)
        if len(set(counts)) == 1 and n > 2:
            links, basis = counts[0], f"NVSwitch: every pair NV{counts[0]}"
        else:
            per_gpu = [sum(int(labels[i][j][2:]) for j in range(n) if j != i) for i in range(n)]
            links, basis = min(per_gpu), f"direct NVLinks: {min(per_gpu)} on the least-linked GPU"
        return LinkBudget(
            link=f"NVLink x{links}",
            gpus=n,
            link_gbps=links * rate,
            basis=f"{basis}, {rate:g} GB/s per link per direction",
            notes=tuple(notes),
        )
    notes = []
    gen = pcie_gen
    if gen not in PCIE_X16_GBPS:
        notes.append("PCIe generation unknown: Gen4 x16 assumed")
        gen = 4
    worst = min(
        (label for label in pairs if not label.startswith("NV")),
        key=lambda label: (
            ("SYS", "NODE", "PHB", "PXB", "PIX").index(label)
            if label in ("SYS", "NODE", "PHB", "PXB", "PIX")
            else 5
        ),
    )
    if worst in ("SYS", "NODE", "PHB"):
        notes.append(
            f"the slowest pair is {worst} (through the CPU): without P2P at that distance "
            "NCCL stages through host memory and stays well below this bound"
        )
    return LinkBudget(
        link=f"PCIe Gen{gen} x16 ({worst})",
        gpus=n,
        link_gbps=PCIE_X16_GBPS[gen],
        basis=f"a GPU pair without NVLink ({worst}): PCIe Gen{gen} x16 bounds the ring",
        notes=tuple(notes),
    )


def measured_busbw(
    results: Iterable[CollectiveResult], *, max_ranks: int | None = None
) -> tuple[float, int, str] | None:
    """(bus bandwidth, at size, source) of the best large-message row of the all-reduce /
    all-gather / reduce-scatter results (sizes of MIN_JUDGED_BYTES and up) over at most
    ``max_ranks`` ranks (one node's GPUs: more ranks cross the network); None without."""
    best: tuple[float, int, str] | None = None
    for res in results:
        if res.op not in ("all_reduce", "all_gather", "reduce_scatter") or res.error:
            continue
        if max_ranks is not None and res.world_size > max_ranks:
            continue
        for row in res.rows:
            if row.size_bytes < MIN_JUDGED_BYTES or not math.isfinite(row.busbw_gbps):
                continue
            if best is None or row.busbw_gbps > best[0]:
                source = f"{res.source}{': ' + res.label if res.label else ''} ({res.op})"
                best = (row.busbw_gbps, row.size_bytes, source)
    return best


def nccl_xml_link_budget(topology: NcclTopology) -> LinkBudget | None:
    """``link_budget`` from an NCCL topology dump (NCCL_TOPO_DUMP_FILE): NVLink counts per GPU
    pair, the compute capability (``sm``) and the PCIe link speed. None for a static file
    (``NCCL_TOPO_FILE`` lists GPUs by PCI class only, without their NVLinks) or one GPU."""
    if topology.kind != "dump" or len(topology.gpus) < 2:
        return None
    gpus = topology.gpus
    labels = [
        [
            "X"
            if i == j
            else (
                f"NV{n}"
                if (n := max(topology.nvlinks_between(a, b), topology.nvlinks_between(b, a)))
                else "PIX"
            )
            for j, b in enumerate(gpus)
        ]
        for i, a in enumerate(gpus)
    ]
    sms = {g.sm for g in gpus if g.sm}
    gens = {pcie_gen_of(g.link_speed) for g in gpus} - {None}
    budget = link_budget(
        labels,
        cc_major=min(sms) // 10 if sms else None,
        pcie_gen=min(g for g in gens if g is not None) if gens else None,
    )
    if budget is None:
        return None
    return LinkBudget(
        link=budget.link.replace(" (PIX)", ""),
        gpus=budget.gpus,
        link_gbps=budget.link_gbps,
        basis=budget.basis.replace("(PIX)", "(no NVLink in the NCCL topology dump)"),
        notes=budget.notes,
    )
