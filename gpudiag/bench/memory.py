"""Memory bandwidth ceiling: device copy (host memory on a CPU), host<->device pinned/pageable."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._progress import ProgressFn, iterate, resolve
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Grid, Lines
from gpudiag.analysis.measurement import noise_warning
from gpudiag.bench import _env
from gpudiag.bench.timing import Measurement, Rotation, copies_to_exceed_cache, measure
from gpudiag.errors import ArgumentError, GpuDiagError
from gpudiag.probe.readings import Reading, Status, na, ok
from gpudiag.units import format_bytes

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

KINDS: tuple[str, ...] = ("copy", "h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")
_MIB = 1 << 20
_CPU_SIZES = (1 * _MIB, 4 * _MIB, 16 * _MIB, 64 * _MIB, 256 * _MIB)
_GPU_SIZES = (1 * _MIB, 8 * _MIB, 64 * _MIB, 256 * _MIB, 1024 * _MIB)

# PCIe per-lane signalling rate (GT/s) and line-code efficiency per generation: PCI-SIG base
# specifications 1.0-6.0 (8b/10b up to gen 2, 128b/130b for gen 3-5; gen 6 FLIT mode 242/256).
_PCIE_LANE = {
    1: (2.5, 8 / 10),
    2: (5.0, 8 / 10),
    3: (8.0, 128 / 130),
    4: (16.0, 128 / 130),
    5: (32.0, 128 / 130),
    6: (64.0, 242 / 256),
}


def pcie_bandwidth_gbps(gen: int, width: int) -> float:
    """Theoretical one-direction PCIe bandwidth in GB/s (1e9 bytes/s) of a link, before
    packet overheads (real copies reach about 80-90 % of it)."""
    if gen not in _PCIE_LANE or width < 1:
        raise ArgumentError(f"unknown PCIe link gen {gen} x{width}")
    rate, efficiency = _PCIE_LANE[gen]
    return rate * efficiency * width / 8


@dataclass(frozen=True, slots=True)
class BandwidthRow:
    """One (kind, size) case. ``bytes_per_call`` counts read + written bytes for 'copy' and the
    bytes crossing the link for host<->device kinds."""

    kind: str
    size_bytes: int
    bytes_per_call: int
    measurement: Measurement | None
    gbps: float | None
    gbps_iqr: tuple[float, float] | None = None
    correct: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": self.kind,
                "size_bytes": self.size_bytes,
                "bytes_per_call": self.bytes_per_call,
                "gbps": self.gbps,
                "gbps_iqr": self.gbps_iqr,
                "correct": self.correct,
                "reason": self.reason,
                "measurement": self.measurement,
            }
        )


@dataclass(frozen=True, slots=True)
class BandwidthResult(Carded):
    """``gd.bench.bandwidth()``: GB/s (1e9 bytes/s) per kind and transfer size.

    ``gbps(kind)`` is the best median over the sizes that are at least as large as the
    last-level cache (over all sizes when none is). It returns None for a kind that cannot run
    here (on a CPU-only machine every host<->device kind): ``reason(kind)`` says why. A kind
    that is not one of KINDS, or was not part of the run, is a GpuDiagError.
    """

    device: str
    rows: tuple[BandwidthRow, ...]
    theoretical: Mapping[str, Reading[float]] = field(default_factory=dict)
    unavailable: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    cache_bytes: int = 0  # last-level cache the sizes are judged against

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([r.kind for r in self.rows] + list(self.unavailable)))

    def _check(self, kind: str) -> str:
        if kind not in KINDS:
            raise GpuDiagError(f"Unknown bandwidth kind {kind!r}: use one of {', '.join(KINDS)}.")
        if kind not in self.kinds:
            raise GpuDiagError(
                f"{kind} was not measured in this run; run gd.bench.bandwidth(kinds=[{kind!r}])."
            )
        return kind

    def best(self, kind: str) -> BandwidthRow | None:
        """The fastest size among those at least as large as the last-level cache (a smaller
        transfer can be served from the cache, rotation or not); all sizes if none is."""
        rows = [r for r in self.rows if r.kind == self._check(kind) and r.gbps is not None]
        large = [r for r in rows if r.size_bytes >= self.cache_bytes]
        return max(large or rows, key=lambda r: r.gbps or 0.0) if rows else None

    def gbps(self, kind: str) -> float | None:
        """Best achieved GB/s for ``kind``; None when it cannot run here (see ``reason``)."""
        row = self.best(kind)
        return None if row is None else row.gbps

    def reason(self, kind: str) -> str:
        kind = self._check(kind)
        if kind in self.unavailable:
            return self.unavailable[kind]
        if self.best(kind) is not None:
            return ""
        return "; ".join(sorted({r.reason for r in self.rows if r.kind == kind and r.reason}))

    def fraction_of_theoretical(self, kind: str) -> float | None:
        achieved, peak = self.gbps(kind), self.theoretical.get(kind)
        if achieved is None or peak is None or not peak.ok or not peak.value:
            return None
        return achieved / float(peak.value)

    def summary_rows(self) -> list[tuple[str, str, str, str]]:
        out = []
        for kind in self.kinds:
            best = self.gbps(kind)
            peak = self.theoretical.get(kind)
            frac = self.fraction_of_theoretical(kind)
            out.append(
                (
                    kind,
                    f"{best:.1f}" if best is not None else f"N/A ({self.reason(kind)})",
                    peak.display("GB/s", "{:.1f}") if peak is not None else "N/A",
                    f"{frac:.0%}" if frac is not None else "",
                )
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "bandwidth",
                "device": self.device,
                "best_gbps": {k: self.gbps(k) for k in self.kinds},
                "cache_bytes": self.cache_bytes,
                "theoretical": self.theoretical,
                "unavailable": self.unavailable,
                "rows": self.rows,
                "notes": self.notes,
            }
        )

    def plot(self) -> Any:
        return _views.build("figure", self)

    def __repr__(self) -> str:
        lines = [f"BandwidthResult on {self.device}: best GB/s per kind"]
        for kind, best, peak, frac in self.summary_rows():
            lines.append(
                f"  {kind:<13} {best:>8}  theoretical {peak}{'  (' + frac + ')' if frac else ''}"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        summary = Grid(("kind", "best GB/s", "theoretical", "of theoretical"), self.summary_rows())
        detail = Grid(
            ("kind", "size", "GB/s (median)", "IQR", "check"),
            [
                (
                    r.kind,
                    format_bytes(r.size_bytes, "g"),
                    f"{r.gbps:.1f}" if r.gbps is not None else "N/A",
                    f"{r.gbps_iqr[0]:.1f} - {r.gbps_iqr[1]:.1f}" if r.gbps_iqr else "",
                    "ok" if r.correct else r.reason,
                )
                for r in self.rows
            ],
        )
        notes = Lines(self.notes, "note")
        return Card("Memory bandwidth", [summary, detail, notes], subtitle=self.device)


def _theoretical(target: _env.Target, kind: str, system: SystemReport | None) -> Reading[float]:
    if kind == "copy":
        if not target.is_cuda:
            return na(Status.NOT_AVAILABLE, "host memory has no spec-table peak", "specs")
        return _env.peak_memory_gbps(target)
    if not target.is_cuda:
        return na(Status.NOT_AVAILABLE, "no CUDA device: no host<->device link", "nvml")
    spec, _ = _env.gpu_spec(target)
    c2c = spec.c2c_bandwidth_gbps if spec is not None else None
    if c2c:  # GH200: host traffic takes NVLink-C2C; its PCIe link (gen 4 x1) is not the path
        return ok(float(c2c), "NVLink-C2C (spec table), one direction")
    for gpu in system.gpus if system is not None else ():
        if gpu.info.cuda_index == target.index:
            gen, width = gpu.info.pcie.gen_max, gpu.info.pcie.width_max
            if gen.ok and width.ok:
                return ok(
                    pcie_bandwidth_gbps(int(gen.get(0)), int(width.get(0))),
                    f"PCIe gen {gen.value} x{width.value} (GPU's maximum link), one direction",
                )
            return na(Status.NOT_AVAILABLE, "PCIe link not read", "nvml")
    return na(Status.NOT_AVAILABLE, "PCIe link unknown (pass system=gd.inspect())", "nvml")


def _filled(numel: int, device: str, *, pin: bool = False) -> Any:
    """A float32 buffer of values in [0.5, 1.5): never zeros, which some memory paths compress."""
    import torch

    data = torch.rand(numel, device=device if device != "pinned" else "cpu").add_(0.5)
    if pin:
        pinned = torch.empty(numel, dtype=torch.float32, pin_memory=True)
        pinned.copy_(data)
        return pinned
    return data


def bandwidth(
    kinds: Iterable[str] | None = None,
    sizes: Iterable[int] | None = None,
    *,
    device: str | int | None = None,
    repeats: int | None = None,
    warmup: int = 2,
    max_time_s: float | None = None,
    system: SystemReport | None = None,
    progress: bool | ProgressFn = True,
) -> BandwidthResult:
    """Measure memory bandwidth per kind and transfer size (bytes per buffer).

    'copy' is ``dst.copy_(src)`` on the device (host memory on a CPU) and counts bytes read plus
    bytes written (2 x size), the convention of STREAM's Copy. The host<->device kinds count
    the bytes that cross the link once. Buffers rotate so the working set is at least twice the
    last-level cache. Host<->device kinds need a CUDA device; on a CPU-only machine they are N/A
    with the reason and ``gbps()`` returns None for them. GPU paths are untested on a real GPU.
    """

    target = _env.resolve_device(device)
    chosen = tuple(kinds) if kinds is not None else KINDS
    for kind in chosen:
        if kind not in KINDS:
            raise GpuDiagError(f"Unknown bandwidth kind {kind!r}: use one of {', '.join(KINDS)}.")
    size_list = _env.whole_numbers(
        sizes if sizes is not None else (_GPU_SIZES if target.is_cuda else _CPU_SIZES),
        "bandwidth sizes",
        low=0,
    )
    if not size_list or min(size_list) < 4:
        raise GpuDiagError("Bandwidth sizes are bytes per buffer, at least 4.")
    repeats = repeats if repeats is not None else (30 if target.is_cuda else 10)
    max_time_s = max_time_s if max_time_s is not None else (2.0 if target.is_cuda else 4.0)
    cache_bytes, cache_source = _env.last_level_cache_bytes(target, system)
    timer = _env.timer_for(target)
    unavailable: dict[str, str] = {}
    notes = [f"rotating buffers outgrow a {cache_bytes >> 20} MiB cache ({cache_source})"]
    if target.is_cuda:
        notes.append("GPU path: untested on a real GPU in this version of gpudiag")
        if system is None:
            system = _system_or_none()
    else:
        for kind in chosen:
            if kind != "copy":
                unavailable[kind] = "needs a CUDA device; this machine has none"
    rows: list[BandwidthRow] = []
    cases = [(k, s) for k in chosen if k not in unavailable for s in size_list]
    for kind, size in iterate(cases, "bandwidth", resolve(progress, "bench")):
        rows.append(
            _one_case(
                target,
                kind,
                size,
                cache_bytes,
                timer,
                repeats=repeats,
                warmup=warmup,
                max_time_s=max_time_s,
            )
        )
    theoretical = {k: _theoretical(target, k, system) for k in chosen}
    swung = noise_warning([(f"{r.kind} {r.size_bytes} B", r.measurement) for r in rows])
    notes += [swung] if swung else []
    return BandwidthResult(
        target.label, tuple(rows), theoretical, unavailable, tuple(notes), cache_bytes
    )


def _system_or_none() -> Any:
    try:
        from gpudiag.probe.system import inspect

        return inspect()
    except Exception:  # only the theoretical PCIe number depends on it
        return None


def _one_case(
    target: _env.Target,
    kind: str,
    size: int,
    cache_bytes: int,
    timer: Any,
    *,
    repeats: int,
    warmup: int,
    max_time_s: float,
) -> BandwidthRow:
    import torch

    numel = max(1, size // 4)
    nbytes = numel * 4
    dev = target.torch_device
    if kind == "copy":
        src_dev, dst_dev, pin_src, pin_dst = dev, dev, False, False
    elif kind.startswith("h2d"):
        src_dev, dst_dev = "cpu", dev
        pin_src, pin_dst = kind.endswith("pinned"), False
    else:
        src_dev, dst_dev = dev, "cpu"
        pin_src, pin_dst = False, kind.endswith("pinned")
    moved = 2 * nbytes if kind == "copy" else nbytes
    # Host-side buffers of host<->device copies do not need rotating: the link is the bottleneck.
    copies = (
        copies_to_exceed_cache(2 * nbytes, cache_bytes, max_total_bytes=1 << 30)
        if kind == "copy"
        else 1
    )
    non_blocking = pin_src or pin_dst
    # the device's side: both buffers of a copy, one of a host<->device transfer
    refused = _env.too_big(target, (2 if kind == "copy" else 1) * nbytes * copies)
    if refused:
        return BandwidthRow(kind, nbytes, moved, None, None, reason=refused)
    try:
        pairs = [
            (
                _filled(numel, src_dev, pin=pin_src),
                torch.empty(numel, dtype=torch.float32, device=dst_dev, pin_memory=pin_dst),
            )
            for _ in range(copies)
        ]
        rotation = Rotation(pairs)

        def run() -> None:
            src, dst = rotation.next()
            dst.copy_(src, non_blocking=non_blocking)

        measurement = measure(
            run,
            repeats=repeats,
            warmup=warmup,
            max_time_s=max_time_s,
            timer=timer,
            label=f"{kind} {format_bytes(nbytes, 'g')}",
        )
        src, dst = pairs[0]
        dst.copy_(src)
        correct = bool(torch.equal(dst.cpu(), src.cpu()))
    except (RuntimeError, MemoryError) as exc:
        text = str(exc).strip().splitlines()
        return BandwidthRow(
            kind, nbytes, moved, None, None, reason="cannot run: " + (text[0] if text else "")
        )
    if not correct:
        return BandwidthRow(
            kind, nbytes, moved, measurement, None, reason="wrong result: copy differs"
        )
    low, high = measurement.rate_spread(moved)
    return BandwidthRow(
        kind,
        nbytes,
        moved,
        measurement,
        measurement.rate(moved) / 1e9,
        (low / 1e9, high / 1e9),
        True,
    )
