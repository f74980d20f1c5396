"""``gd.analyze_memory_snapshot``: a CUDA allocator snapshot read safely and explained.

A snapshot is what ``torch.cuda.memory._dump_snapshot(path)`` writes: a pickled dict with
``segments`` (each cudaMalloc'd segment and its blocks: active, awaiting free, inactive) and
``device_traces`` (the allocator's recent actions when ``_record_memory_history`` was on:
alloc, free, segment alloc/free, ``oom`` with the bytes asked for and the device's free bytes,
``snapshot``). Older (torch 2.0-era) files keep a block's stack in ``history[].frames``; newer
ones in ``frames``, with ``time_us`` on trace entries.

A pickle can run code when loaded, so the file is read with an unpickler that admits only
builtin containers and scalars: any class or function reference in it (what an exploit
needs) stops the load with SnapshotError. Saving writes pickle protocol 4, which PyTorch's
memory viewer (pytorch.org/memory_viz) reads. Pure analysis: no torch, no GPU.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudiag import _progress
from gpudiag._progress import ProgressFn, finish, report
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.analysis.files import GiB, open_regular
from gpudiag.analysis.snapshot_diff import (
    Holder,
    Key,
    SnapshotDiff,
    SnapshotRanks,
    category_bytes,
    diff_snapshots,
    rank_imbalance,
    stack_category,
)
from gpudiag.errors import SnapshotError
from gpudiag.units import format_bytes

SAVE_PROTOCOL = 4  # what PyTorch's memory viewer accepts
# A snapshot pickle becomes 6-13x its size in Python objects (measured on the real snapshots in
# tests/fixtures/memory-snapshots: 6.0x with shared frames, 12.2x in the torch 2.0 format).
LOW_EXPANSION = 6
_CHECK_EVERY_BYTES = 4 << 20


def default_max_memory() -> int:
    """Half of this machine's memory (16 GiB when it cannot be told)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (AttributeError, OSError, ValueError):
        return 16 * GiB


def _rss_bytes() -> int | None:
    """This process's resident memory, from /proc (None where there is no /proc)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers, bools and None; refuses everything else.

    Containers and scalars have their own opcodes; only references to classes or functions
    (GLOBAL / STACK_GLOBAL, then REDUCE / BUILD / INST / OBJ) need ``find_class``, and it
    refuses them all. Persistent ids are refused too.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"the snapshot refers to {module}.{name}: a memory snapshot holds only plain data, "
            "so this file was not written by torch.cuda.memory._dump_snapshot (refused, not run)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("the snapshot uses persistent ids: not a plain-data pickle (refused)")


def _too_big(name: str, limit: int, what: str) -> SnapshotError:
    return SnapshotError(
        f"{name}: {what}, above the {format_bytes(limit)} memory limit for reading a snapshot "
        f"(a snapshot pickle becomes about {LOW_EXPANSION}-13x its size in memory). If this "
        "machine has the memory, raise the limit: analyze_memory_snapshot(path, max_memory=...) "
        "or gpudiag memory --snapshot FILE --max-memory-gb N; or take a smaller snapshot "
        "(torch.cuda.memory._record_memory_history(max_entries=...) keeps fewer trace entries)."
    )


class _Guarded(io.RawIOBase):
    """The pickle's bytes (gunzipped when gzip) as a stream that stops the read with a
    SnapshotError once the text passes ``max_bytes`` or this process has grown by more than
    ``max_memory`` since the read began; it reports the file's bytes read to ``on_progress``."""

    def __init__(
        self,
        source: Any,
        file: Any,
        name: str,
        max_bytes: int | None,
        max_memory: int,
        on_progress: ProgressFn | None,
    ) -> None:
        super().__init__()
        self.source, self.file, self.name = source, file, name
        self.max_bytes, self.max_memory = max_bytes, max_memory
        self.on_progress = on_progress
        try:
            self.total = os.fstat(file.fileno()).st_size
        except (OSError, AttributeError, io.UnsupportedOperation):
            self.total = 0  # bytes in memory: nothing to report
        self.read_bytes = 0
        self.checked_at = 0
        self.rss_at_start = _rss_bytes()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.read_bytes += n
        if self.max_bytes is not None and self.read_bytes > self.max_bytes:
            raise SnapshotError(
                f"{self.name} unpacks to more than {format_bytes(self.max_bytes)}, the max_bytes "
                "limit given; pass a larger one to read it"
            )
        if self.read_bytes - self.checked_at >= _CHECK_EVERY_BYTES:
            self.checked_at = self.read_bytes
            self._check_memory()
            if self.total:
                done = self.file.tell()
                report(self.on_progress, "reading snapshot", done, self.total, unit="B")
        return n

    def _check_memory(self) -> None:
        now = _rss_bytes()
        if now is None or self.rss_at_start is None:
            return
        if now - self.rss_at_start > self.max_memory:
            raise _too_big(
                self.name,
                self.max_memory,
                f"reading it took more than {format_bytes(now - self.rss_at_start)} of memory "
                f"after {format_bytes(self.read_bytes)} of the pickle",
            )


def load_snapshot(
    path: str | os.PathLike[str] | bytes,
    *,
    max_memory: int | None = None,
    max_bytes: int | None = None,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """The snapshot dict from a file (``.pickle``, gzipped or not) or raw bytes, read safely.

    The file is streamed into the unpickler (its bytes are never held beside its objects). A
    pickle is one object graph, so the whole graph is built: reading stops with a
    SnapshotError, saying how to raise the limit, once it would take more than ``max_memory``
    bytes (default: half of this machine's memory). ``max_bytes`` caps the pickle's bytes
    (after gunzip). Folders, FIFOs and devices are refused before anything is read.
    """
    limit = default_max_memory() if max_memory is None else max_memory
    if limit <= 0 or (max_bytes is not None and max_bytes <= 0):
        raise SnapshotError("max_memory and max_bytes are sizes in bytes: give them above 0")
    if isinstance(path, (bytes, bytearray)):
        return _load(io.BytesIO(bytes(path)), None, "<bytes>", limit, max_bytes, on_progress)
    name = os.fspath(path)
    with open_regular(name, SnapshotError, "memory snapshot") as fh:
        size = os.fstat(fh.fileno()).st_size
        if max_bytes is not None and size > max_bytes and fh.read(2) != b"\x1f\x8b":
            raise SnapshotError(
                f"{name} is {format_bytes(size)}, above the max_bytes limit of "
                f"{format_bytes(max_bytes)}; pass a larger one to read it"
            )
        fh.seek(0)
        if size * LOW_EXPANSION > limit:
            raise _too_big(
                name,
                limit,
                f"a {format_bytes(size)} pickle needs at least "
                f"{format_bytes(size * LOW_EXPANSION)}",
            )
        return _load(fh, fh, name, limit, max_bytes, on_progress)


def _load(
    fh: Any,
    file: Any,
    name: str,
    limit: int,
    max_bytes: int | None,
    on_progress: ProgressFn | None,
) -> dict[str, Any]:
    head = fh.read(2)
    fh.seek(0)
    try:
        source: Any = gzip.GzipFile(fileobj=fh, mode="rb") if head == b"\x1f\x8b" else fh
        guarded = _Guarded(source, file or fh, name, max_bytes, limit, on_progress)
        obj = _DataOnlyUnpickler(io.BufferedReader(guarded, 1 << 20)).load()
    except SnapshotError:
        raise
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise SnapshotError(f"{name}: broken gzip ({exc})") from None
    except EOFError as exc:
        raise SnapshotError(
            f"{name} is not a readable pickle: it ends too early ({exc or 'truncated'})"
        ) from None
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError) as exc:
        raise SnapshotError(f"{name} is not a readable pickle: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"{name} nests too deeply to be a memory snapshot") from None
    except MemoryError:
        raise _too_big(name, limit, "this process ran out of memory reading it") from None
    finally:
        finish(on_progress, "reading snapshot")
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise SnapshotError(
            f"{name} is a pickle but not a memory snapshot (no 'segments' list); write one with "
            "torch.cuda.memory._dump_snapshot(path)"
        )
    return obj


def save_snapshot(snapshot: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Write a snapshot dict with pickle protocol 4 (PyTorch's memory viewer reads it)."""
    name = os.fspath(path)
    with open(name, "wb") as fh:
        pickle.dump(dict(snapshot), fh, protocol=SAVE_PROTOCOL)
    return name


@dataclass(frozen=True)
class StackGroup:
    """Live bytes allocated from one call site (the innermost frame outside torch)."""

    site: str
    nbytes: int
    count: int
    stack: tuple[str, ...]


@dataclass(frozen=True)
class OomEvent:
    """The allocator's ``oom`` trace entry: what was asked for, what the device had free."""

    requested_bytes: int
    device_free_bytes: int | None
    device: int
    stack: tuple[str, ...] = ()


def _int(value: Any) -> int:
    """A byte count or address as the file has it; 0 for anything that is not a whole number
    (a damaged or hostile field must not stop the analysis, nor become a 300-digit int)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 63) else 0
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return 0


def frame_strings(frames: Any) -> tuple[str, ...]:
    """A recorded stack (a list of {filename, line, name}) as "file:line name" strings."""
    if not isinstance(frames, (list, tuple)):
        return ()
    out = []
    for f in frames:
        if isinstance(f, Mapping):
            out.append(f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}")
    return tuple(out)


_FRAMEWORK = (
    "/torch/",
    "\\torch\\",
    "/site-packages/",
    "\\site-packages\\",
    "runpy.py",
    "<frozen",
    "/lib/python",
)


def _site(stack: Sequence[str]) -> str:
    """The innermost frame of the user's code; the innermost frame when all are framework."""
    for frame in stack:
        if not any(marker in frame for marker in _FRAMEWORK):
            return frame
    return stack[0] if stack else "no stack recorded"


def _group(items: Iterable[tuple[int, tuple[str, ...]]], top: int) -> list[StackGroup]:
    sizes: dict[str, int] = defaultdict(int)
    counts: Counter[str] = Counter()
    stacks: dict[str, tuple[str, ...]] = {}
    for nbytes, stack in items:
        site = _site(stack)
        sizes[site] += nbytes
        counts[site] += 1
        stacks.setdefault(site, stack)
    ranked = sorted(sizes, key=lambda s: -sizes[s])[:top]
    return [StackGroup(s, sizes[s], counts[s], stacks[s]) for s in ranked]


@dataclass(frozen=True)
class MemorySnapshot(Carded):
    """What a CUDA allocator snapshot says: held vs used memory, where it went, any OOM."""

    source: str
    segments: int
    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    requested_bytes: int
    inactive_bytes: int  # cached but free: reserved - active
    largest_inactive_block: int
    inactive_split_bytes: int  # free blocks inside segments that also hold live blocks
    blocks_by_state: dict[str, int]
    segments_by_type: dict[str, int]
    expandable_segments: bool | None
    trace_entries: int
    trace_actions: dict[str, int]
    oom: OomEvent | None
    peak_allocated_bytes: int | None  # from the trace, when it has alloc/free entries
    live_at_peak: tuple[StackGroup, ...]
    live_now: tuple[StackGroup, ...]
    format: str  # "torch 2.0 (block history)" or "current (block frames)"
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    # Live memory by allocation stack (every stack, largest first): what a diff compares.
    holders: tuple[Holder, ...] = field(repr=False, compare=False, default_factory=tuple)

    @property
    def fragmentation(self) -> float:
        """Share of reserved memory that is cached but not in use (0 when nothing reserved)."""
        return self.inactive_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    def findings(self) -> list[str]:
        """Plain-language conclusions, each from a number read in the snapshot."""
        out = []
        if self.oom is not None:
            free = self.oom.device_free_bytes
            out.append(
                f"out of memory: asked for {format_bytes(self.oom.requested_bytes)} with "
                f"{format_bytes(free) if free is not None else 'unknown'} free on device "
                f"{self.oom.device}; {format_bytes(self.reserved_bytes)} reserved by this "
                f"process, {format_bytes(self.allocated_bytes)} in live tensors"
            )
            if self.largest_inactive_block < self.oom.requested_bytes <= self.inactive_bytes:
                out.append(
                    f"fragmentation: {format_bytes(self.inactive_bytes)} cached but free, yet no "
                    f"free block is as large as the request (largest "
                    f"{format_bytes(self.largest_inactive_block)}): set "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fix allocator.config)"
                )
        elif self.trace_entries:
            actions = ", ".join(sorted(self.trace_actions))
            out.append(
                f"no oom entry in the allocator trace (its entries: {actions}): the bytes asked "
                "for and the device's free bytes were not recorded"
            )
        if self.reserved_bytes and self.fragmentation >= 0.2:
            out.append(
                f"{self.fragmentation:.0%} of reserved memory "
                f"({format_bytes(self.inactive_bytes)}) is cached but unused"
                + (
                    f", {format_bytes(self.inactive_split_bytes)} of it split inside live "
                    "segments: expandable_segments:True (fix allocator.config) lets the "
                    "allocator grow segments instead"
                    if self.inactive_split_bytes >= 0.1 * self.reserved_bytes
                    and not self.expandable_segments
                    else ""
                )
            )
        elif self.reserved_bytes:
            out.append(
                f"little fragmentation: {format_bytes(self.allocated_bytes)} of "
                f"{format_bytes(self.reserved_bytes)} reserved is in live tensors"
            )
        if self.live_now:
            top = self.live_now[0]
            share = top.nbytes / self.allocated_bytes if self.allocated_bytes else 0.0
            out.append(
                f"largest holder of live memory: {top.site} "
                f"({format_bytes(top.nbytes)}, {share:.0%} of allocated, {top.count} blocks)"
            )
        return out

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the snapshot (pickle protocol 4) for pytorch.org/memory_viz."""
        if not self.raw:
            raise SnapshotError(
                f"{self.source} was analysed without keeping the snapshot itself (a folder of "
                "ranks keeps only what the analysis needs): copy the file instead"
            )
        return save_snapshot(self.raw, path)

    def diff(self, other: MemorySnapshot, *, by: Key = "stack") -> SnapshotDiff:
        """What changed from this snapshot to ``other``: ``allocated_delta_bytes`` (exactly
        ``other.allocated_bytes - self.allocated_bytes``) and, per allocation stack, the live
        bytes and blocks (``.top(n)``, ``.plot()``). ``by="function"`` matches stacks without
        their line numbers (snapshots of two versions of the code)."""
        return diff_snapshots(self, other, by=by)

    def to_dict(self) -> dict[str, Any]:
        data = {
            k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("raw", "holders")
        }
        data["by_category"] = category_bytes(self.holders)
        data["fragmentation"] = self.fragmentation
        data["findings"] = self.findings()
        return jsonable({"kind": "memory_snapshot", **data})

    def __repr__(self) -> str:
        lines = [
            f"MemorySnapshot({self.source}: {self.segments} segments, reserved "
            f"{format_bytes(self.reserved_bytes)}, allocated {format_bytes(self.allocated_bytes)}, "
            f"{self.format})"
        ]
        lines += [f"  {f}" for f in self.findings()]
        for g in self.live_at_peak[:5]:
            lines.append(f"  at peak: {format_bytes(g.nbytes):>11}  {g.site}")
        return "\n".join(lines)

    def as_card(self) -> Card:
        head = Facts(
            [
                ("reserved", format_bytes(self.reserved_bytes)),
                ("allocated", format_bytes(self.allocated_bytes)),
                (
                    "cached, unused",
                    f"{format_bytes(self.inactive_bytes)} ({self.fragmentation:.0%})",
                ),
                ("largest free block", format_bytes(self.largest_inactive_block)),
                (
                    "out of memory",
                    "no oom entry in the trace"
                    if self.oom is None
                    else f"asked {format_bytes(self.oom.requested_bytes)}, free "
                    f"{format_bytes(self.oom.device_free_bytes)}",
                ),
            ]
        )
        groups = self.live_at_peak or self.live_now
        grid = Grid(
            ("live bytes", "blocks", "allocated at"),
            [(format_bytes(g.nbytes), g.count, g.site) for g in groups[:10]],
        )
        notes = Lines(self.findings())
        return Card("CUDA memory snapshot", [head, notes, grid], subtitle=self.source)


# More blocks and trace entries than a snapshot of any GPU holds (a 80 GB GPU's allocator has
# hundreds of thousands of blocks; history keeps max_entries, 100,000 by default): a pickle that
# reuses one list millions of times (cheap in its bytes) would otherwise keep the loops busy.
MAX_ITEMS = 50_000_000


def _check_size(snapshot: Mapping[str, Any], source: str) -> None:
    segments = snapshot.get("segments")
    traces = snapshot.get("device_traces")
    count = len(segments) if isinstance(segments, list) else 0
    for s in segments if isinstance(segments, list) else ():
        blocks = s.get("blocks") if isinstance(s, Mapping) else None
        count += len(blocks) if isinstance(blocks, list) else 0
        if count > MAX_ITEMS:
            break
    for t in traces if isinstance(traces, list) else ():
        count += len(t) if isinstance(t, list) else 0
    if count > MAX_ITEMS:
        raise SnapshotError(
            f"{source or 'the snapshot'} holds more than {MAX_ITEMS:,} segments, blocks and trace "
            "entries: more than a real allocator snapshot has (it repeats one list many times, "
            "or is not a snapshot). Refused rather than looped over."
        )


def block_stack(block: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a block was allocated: its frames (current format) or its last history entry's."""
    if block.get("frames"):
        return frame_strings(block["frames"])
    history = block.get("history")
    if isinstance(history, list) and history and isinstance(history[-1], Mapping):
        return frame_strings(history[-1].get("frames"))
    return ()


def _trace_peak(
    trace: Sequence[Mapping[str, Any]], allocated_now: int, top: int
) -> tuple[int | None, tuple[StackGroup, ...]]:
    """Replay alloc / free_completed entries: the peak of live bytes and who held it."""
    deltas = [
        _int(e.get("size", 0)) * (1 if e.get("action") == "alloc" else -1)
        for e in trace
        if e.get("action") in ("alloc", "free_completed")
    ]
    if not deltas:
        return None, ()
    before = allocated_now - sum(deltas)  # bytes allocated before the trace's first entry
    level = best = 0
    best_index = -1
    live: dict[int, tuple[int, tuple[str, ...]]] = {}
    at_best: dict[int, tuple[int, tuple[str, ...]]] = {}
    for i, e in enumerate(trace):
        action = e.get("action")
        if action == "alloc":
            level += _int(e.get("size", 0))
            live[_int(e.get("addr", -i))] = (_int(e.get("size", 0)), frame_strings(e.get("frames")))
        elif action == "free_completed":
            level -= _int(e.get("size", 0))
            live.pop(_int(e.get("addr", -i)), None)
        else:
            continue
        if level > best:
            best, best_index = level, i
            at_best = dict(live)
    groups = _group(at_best.values(), top) if best_index >= 0 else []
    if before > 0:
        groups.append(StackGroup("allocated before the trace began", before, 0, ()))
    return max(before, 0) + best, tuple(groups)


def _holders(live: Iterable[tuple[int, tuple[str, ...]]]) -> tuple[Holder, ...]:
    """Live bytes and blocks per allocation stack, largest first."""
    by_stack: dict[tuple[str, ...], list[int]] = {}
    for nbytes, stack in live:
        g = by_stack.setdefault(stack, [0, 0])
        g[0] += nbytes
        g[1] += 1
    holders = [
        Holder(stack_category(stack), _site(stack), stack, nbytes, count)
        for stack, (nbytes, count) in by_stack.items()
    ]
    holders.sort(key=lambda h: (-h.nbytes, h.site))
    return tuple(holders)


def analyze_snapshot_data(
    snapshot: Mapping[str, Any], *, source: str = "", top: int = 10, keep_raw: bool = True
) -> MemorySnapshot:
    """Analyse a snapshot dict (as loaded by ``load_snapshot``). ``keep_raw``: keep the dict
    in the result (for ``save``); a folder of ranks does not."""
    _check_size(snapshot, source)
    segments = [s for s in snapshot.get("segments", []) if isinstance(s, Mapping)]
    blocks = [b for s in segments for b in (s.get("blocks") or []) if isinstance(b, Mapping)]
    reserved = sum(_int(s.get("total_size", 0)) for s in segments)
    allocated = sum(_int(s.get("allocated_size", 0)) for s in segments)
    active = sum(_int(s.get("active_size", 0)) for s in segments)
    requested = sum(_int(s.get("requested_size", 0)) for s in segments)
    inactive = [_int(b.get("size", 0)) for b in blocks if b.get("state") == "inactive"]
    split = sum(
        _int(b.get("size", 0))
        for s in segments
        if _int(s.get("allocated_size", 0)) > 0
        for b in (s.get("blocks") or [])
        if isinstance(b, Mapping) and b.get("state") == "inactive"
    )
    traces = snapshot.get("device_traces") or []
    entries = [e for t in traces if isinstance(t, list) for e in t if isinstance(e, Mapping)]
    oom = None
    for device, t in enumerate(traces if isinstance(traces, list) else []):
        for e in t if isinstance(t, list) else []:
            if isinstance(e, Mapping) and e.get("action") == "oom":
                free = e.get("device_free")
                oom = OomEvent(
                    _int(e.get("size", 0)),
                    _int(free) if free is not None else None,
                    device,
                    frame_strings(e.get("frames")),
                )
    settings = snapshot.get("allocator_settings")
    expandable = (
        bool(settings.get("expandable_segments")) if isinstance(settings, Mapping) else None
    )
    if expandable is None and any("is_expandable" in s for s in segments):
        expandable = any(bool(s.get("is_expandable")) for s in segments)
    live = [
        (_int(b.get("size", 0)), block_stack(b))
        for b in blocks
        if b.get("state") == "active_allocated"
    ]
    live_now = _group(live, top)
    peak, at_peak = _trace_peak(entries, allocated, top)
    old_format = any("history" in b for b in blocks)
    return MemorySnapshot(
        source=source,
        segments=len(segments),
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        active_bytes=active,
        requested_bytes=requested,
        inactive_bytes=reserved - active,
        largest_inactive_block=max(inactive, default=0),
        inactive_split_bytes=split,
        blocks_by_state=dict(Counter(str(b.get("state")) for b in blocks)),
        segments_by_type=dict(Counter(str(s.get("segment_type")) for s in segments)),
        expandable_segments=expandable,
        trace_entries=len(entries),
        trace_actions=dict(Counter(str(e.get("action")) for e in entries)),
        oom=oom,
        peak_allocated_bytes=peak,
        live_at_peak=at_peak,
        live_now=tuple(live_now),
        format="torch 2.0 (block history)" if old_format else "current (block frames)",
        raw=dict(snapshot) if keep_raw else {},
        holders=_holders(live),
    )


_SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def analyze_memory_snapshot(
    path: str | os.PathLike[str] | Mapping[str, Any],
    *,
    top: int = 10,
    max_memory: int | None = None,
    max_bytes: int | None = None,
    progress: bool | ProgressFn | None = True,
) -> MemorySnapshot | SnapshotRanks:
    """Read a ``torch.cuda.memory._dump_snapshot()`` pickle safely and explain it: reserved vs
    allocated, fragmentation, the ``oom`` entry (asked vs free), the call sites holding memory
    now and at the trace's peak. ``path`` may also be an already loaded snapshot dict.

    A folder of per-rank snapshots (``*.pickle`` / ``*.pkl``, gzipped or not; the rank from a
    ``rank<N>`` in the name, else the file order) gives a ``SnapshotRanks``: each rank's
    snapshot and which rank holds more than the others, in what. The ranks are read one at a
    time and keep only what the analysis needs.

    The unpickler admits only plain data (no code runs). ``max_memory`` bounds the memory the
    read may take (default: half of this machine's), ``max_bytes`` the pickle's size; past
    either the read stops with a SnapshotError that says how to raise it. ``progress``: a bar
    for reads that take over two seconds.
    """
    if isinstance(path, Mapping):
        if not isinstance(path.get("segments"), list):
            raise SnapshotError("not a memory snapshot: no 'segments' list")
        return analyze_snapshot_data(path, source="snapshot dict", top=top)
    on_progress = _progress.resolve(progress, "memory", delay_s=2.0)
    name = os.fspath(path)
    with _progress.closed_on_error(on_progress):
        if os.path.isdir(name):
            return _ranks(name, top, max_memory, max_bytes, on_progress)
        data = load_snapshot(
            name, max_memory=max_memory, max_bytes=max_bytes, on_progress=on_progress
        )
        return analyze_snapshot_data(data, source=os.path.basename(name), top=top)


def _ranks(
    folder: str,
    top: int,
    max_memory: int | None,
    max_bytes: int | None,
    on_progress: ProgressFn | None,
) -> SnapshotRanks:
    files = sorted(
        f
        for f in os.listdir(folder)
        if f.endswith(_SNAPSHOT_SUFFIXES) and os.path.isfile(os.path.join(folder, f))
    )
    if not files:
        raise SnapshotError(
            f"no snapshot files in the folder {folder} (looked for "
            f"{', '.join('*' + s for s in _SNAPSHOT_SUFFIXES)})"
        )
    named = [_RANK_IN_NAME.search(f) for f in files]
    notes: list[str] = []
    if all(named) and len({int(m.group(1)) for m in named if m}) == len(files):
        ranks = [int(m.group(1)) for m in named if m]
    else:
        ranks = list(range(len(files)))
        notes.append(
            "ranks given by file order (not every file name says rank<N>): "
            + ", ".join(f"{f} -> {r}" for f, r in zip(files, ranks, strict=True))
        )
    snapshots = []
    for i, f in enumerate(files):
        data = load_snapshot(
            os.path.join(folder, f),
            max_memory=max_memory,
            max_bytes=max_bytes,
            on_progress=on_progress,
        )
        snapshots.append(analyze_snapshot_data(data, source=f, top=top, keep_raw=False))
        del data
        _progress.report(on_progress, "ranks", i + 1, len(files))
    _progress.finish(on_progress, "ranks")
    order = sorted(range(len(files)), key=lambda i: ranks[i])
    return rank_imbalance(
        os.path.basename(os.path.normpath(folder)),
        [ranks[i] for i in order],
        [snapshots[i] for i in order],
        notes,
    )
