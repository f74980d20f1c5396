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
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpudiag._report import card, esc, html_grid, html_table, jsonable
from gpudiag.analysis.memory_estimate import format_bytes
from gpudiag.errors import SnapshotError

DEFAULT_MAX_BYTES = 1 << 30  # a snapshot of a busy 80 GB GPU is tens of MB; refuse a runaway
SAVE_PROTOCOL = 4  # what PyTorch's memory viewer accepts


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


def load_snapshot(
    path: str | os.PathLike[str] | bytes, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """The snapshot dict from a file (``.pickle``, gzipped or not) or raw bytes, read safely."""
    if isinstance(path, (bytes, bytearray)):
        data = bytes(path)
        name = "<bytes>"
    else:
        name = os.fspath(path)
        try:
            size = os.path.getsize(name)
            if size > max_bytes:
                raise SnapshotError(
                    f"{name} is {format_bytes(size)}, above the {format_bytes(max_bytes)} limit; "
                    "pass max_bytes= to read it anyway"
                )
            with open(name, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise SnapshotError(f"no memory snapshot at {name}") from None
        except IsADirectoryError:
            raise SnapshotError(f"{name} is a directory, not a snapshot file") from None
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(max_bytes + 1)
        except OSError as exc:
            raise SnapshotError(f"{name}: broken gzip ({exc})") from None
        if len(data) > max_bytes:
            raise SnapshotError(f"{name} unpacks to more than {format_bytes(max_bytes)}")
    try:
        obj = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise SnapshotError(f"{name} is not a readable pickle: {exc}") from None
    except RecursionError:
        raise SnapshotError(f"{name} nests too deeply to be a memory snapshot") from None
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


def _frames(frames: Any) -> tuple[str, ...]:
    out = []
    for f in frames or ():
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
class MemorySnapshot:
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
        return save_snapshot(self.raw, path)

    def to_dict(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("raw",)}
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

    def _repr_html_(self) -> str:
        head = html_table(
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
        grid = html_grid(
            ("live bytes", "blocks", "allocated at"),
            [(format_bytes(g.nbytes), g.count, g.site) for g in groups[:10]],
        )
        notes = "".join(f"<div>{esc(f)}</div>" for f in self.findings())
        return card("CUDA memory snapshot", head + notes + grid, subtitle=self.source)


def _block_stack(block: Mapping[str, Any]) -> tuple[str, ...]:
    if block.get("frames"):
        return _frames(block["frames"])
    history = block.get("history") or ()
    if history and isinstance(history[-1], Mapping):
        return _frames(history[-1].get("frames"))
    return ()


def _trace_peak(
    trace: Sequence[Mapping[str, Any]], allocated_now: int, top: int
) -> tuple[int | None, tuple[StackGroup, ...]]:
    """Replay alloc / free_completed entries: the peak of live bytes and who held it."""
    deltas = [
        int(e.get("size", 0)) * (1 if e.get("action") == "alloc" else -1)
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
            level += int(e.get("size", 0))
            live[int(e.get("addr", -i))] = (int(e.get("size", 0)), _frames(e.get("frames")))
        elif action == "free_completed":
            level -= int(e.get("size", 0))
            live.pop(int(e.get("addr", -i)), None)
        else:
            continue
        if level > best:
            best, best_index = level, i
            at_best = dict(live)
    groups = _group(at_best.values(), top) if best_index >= 0 else []
    if before > 0:
        groups.append(StackGroup("allocated before the trace began", before, 0, ()))
    return max(before, 0) + best, tuple(groups)


def analyze_snapshot_data(
    snapshot: Mapping[str, Any], *, source: str = "", top: int = 10
) -> MemorySnapshot:
    """Analyse a snapshot dict (as loaded by ``load_snapshot``)."""
    segments = [s for s in snapshot.get("segments", []) if isinstance(s, Mapping)]
    blocks = [b for s in segments for b in (s.get("blocks") or []) if isinstance(b, Mapping)]
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    allocated = sum(int(s.get("allocated_size", 0)) for s in segments)
    active = sum(int(s.get("active_size", 0)) for s in segments)
    requested = sum(int(s.get("requested_size", 0)) for s in segments)
    inactive = [int(b.get("size", 0)) for b in blocks if b.get("state") == "inactive"]
    split = sum(
        int(b.get("size", 0))
        for s in segments
        if int(s.get("allocated_size", 0)) > 0
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
                    int(e.get("size", 0)),
                    int(free) if free is not None else None,
                    device,
                    _frames(e.get("frames")),
                )
    settings = snapshot.get("allocator_settings")
    expandable = (
        bool(settings.get("expandable_segments")) if isinstance(settings, Mapping) else None
    )
    if expandable is None and any("is_expandable" in s for s in segments):
        expandable = any(bool(s.get("is_expandable")) for s in segments)
    live_now = _group(
        (
            (int(b.get("size", 0)), _block_stack(b))
            for b in blocks
            if b.get("state") == "active_allocated"
        ),
        top,
    )
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
        raw=dict(snapshot),
    )


def analyze_memory_snapshot(
    path: str | os.PathLike[str] | Mapping[str, Any],
    *,
    top: int = 10,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> MemorySnapshot:
    """Read a ``torch.cuda.memory._dump_snapshot()`` pickle safely and explain it: reserved vs
    allocated, fragmentation, the ``oom`` entry (asked vs free), the call sites holding memory
    now and at the trace's peak. ``path`` may also be an already loaded snapshot dict."""
    if isinstance(path, Mapping):
        if not isinstance(path.get("segments"), list):
            raise SnapshotError("not a memory snapshot: no 'segments' list")
        return analyze_snapshot_data(path, source="snapshot dict", top=top)
    data = load_snapshot(path, max_bytes=max_bytes)
    return analyze_snapshot_data(data, source=os.path.basename(os.fspath(path)), top=top)
