"""What changed between two CUDA memory snapshots, and what one rank holds more than another.

A snapshot's live memory is its ``active_allocated`` blocks. Each is grouped with the others
allocated from the same stack (``Holder``: a category, the innermost frame of the user's code,
the whole stack, bytes and blocks); two snapshots are compared group by group (``SnapshotDiff``)
and the ranks of one job by their heaviest and lightest rank (``SnapshotRanks``).

The category is read from the allocation stack, a heuristic said as such: ``optimizer`` (a
frame in ``torch/optim``), ``backward`` (autograd's engine or a ``backward`` frame),
``parameters`` (module ``_apply``/``to``, ``load_state_dict``, ``reset_parameters``, weight
initialisers), ``forward`` (a module's ``forward``), else ``other``; ``no stack recorded`` when
the snapshot kept none (``_record_memory_history`` was off). Pure analysis: no torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpudiag import _views
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.errors import ArgumentError
from gpudiag.units import format_bytes

NO_STACK = "no stack recorded"
CATEGORY_RULE = (
    "read from the allocation stack (a heuristic): optimizer = a frame in torch/optim; "
    "backward = autograd's engine or a backward frame; parameters = module _apply/to, "
    "load_state_dict, reset_parameters or a weight initialiser; forward = a module's forward; "
    "else other"
)
_OPTIMIZER = re.compile(r"[/\\]torch[/\\]optim[/\\]|[/\\]optimizers?[/\\]")
_BACKWARD = re.compile(r"[/\\]torch[/\\]autograd[/\\]|\s(backward|_engine_run_backward)$")
_PARAMETERS = re.compile(
    r"\s(_apply|convert|load_state_dict|_load_from_state_dict|reset_parameters|"
    r"init_weights?\w*|_init_weights?\w*)$|[/\\]torch[/\\]nn[/\\]parameter\.py:"
)
_FORWARD = re.compile(r"\s(forward|_call_impl|_wrapped_call_impl)$")
# "path/to/file.py:123 name" -> "file.py name": a frame as two versions of the code share it.
_FUNCTION = re.compile(r"^(?:.*[/\\])?([^/\\]*?):(?:\d+|\?) (.*)$")


def stack_category(stack: Sequence[str]) -> str:
    """The category of an allocation from its stack (frames "file:line name", innermost first).
    The outermost telling frame decides between forward and backward: a backward pass calls
    modules' hooks, an optimizer step may call a forward-looking helper."""
    if not stack:
        return NO_STACK
    if any(_OPTIMIZER.search(f) for f in stack):
        return "optimizer"
    if any(_BACKWARD.search(f) for f in stack):
        return "backward"
    if any(_PARAMETERS.search(f) for f in stack):
        return "parameters"
    if any(_FORWARD.search(f) for f in stack):
        return "forward"
    return "other"


@dataclass(frozen=True)
class Holder:
    """Live memory allocated from one stack: category, the user's frame, bytes and blocks."""

    category: str
    site: str
    stack: tuple[str, ...]
    nbytes: int
    count: int


class SnapshotLike(Protocol):
    """What a diff reads of a snapshot (``gpudiag.analysis.memory_snapshot.MemorySnapshot``)."""

    @property
    def source(self) -> str: ...
    @property
    def allocated_bytes(self) -> int: ...
    @property
    def reserved_bytes(self) -> int: ...
    @property
    def holders(self) -> tuple[Holder, ...]: ...


@dataclass(frozen=True)
class DiffRow:
    """One allocation stack's live memory in both snapshots (0 where it held none)."""

    category: str
    site: str
    stack: tuple[str, ...]
    bytes_before: int
    bytes_after: int
    count_before: int
    count_after: int

    @property
    def bytes_delta(self) -> int:
        return self.bytes_after - self.bytes_before

    @property
    def where(self) -> str:
        """The user's frame and the one that called it, without folders."""
        if self.site not in self.stack:
            return self.site
        at = self.stack.index(self.site)
        frames = [short_frame(f) for f in self.stack[at : at + 2]]
        return " <- ".join(frames)

    @property
    def count_delta(self) -> int:
        return self.count_after - self.count_before

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "category": self.category,
                "site": self.site,
                "where": self.where,
                "stack": list(self.stack),
                "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after,
                "bytes_delta": self.bytes_delta,
                "count_before": self.count_before,
                "count_after": self.count_after,
                "count_delta": self.count_delta,
            }
        )


Key = Literal["stack", "function"]


def _keyed(stack: tuple[str, ...], by: Key) -> tuple[str, ...]:
    return stack if by == "stack" else tuple(_FUNCTION.sub(r"\1 \2", f) for f in stack)


def short_frame(frame: str) -> str:
    """A frame without its folders: "file.py:123 name"."""
    return re.sub(r"^.*[/\\]", "", frame.split(" ", 1)[0]) + (
        " " + frame.split(" ", 1)[1] if " " in frame else ""
    )


@dataclass(frozen=True)
class SnapshotDiff(Carded):
    """``after`` minus ``before``: allocated and reserved bytes, and each allocation stack's
    live bytes and blocks (``rows``, the largest change either way first)."""

    before: str
    after: str
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    rows: tuple[DiffRow, ...]
    by: Key = "stack"
    labels: tuple[str, str] = ("before", "after")
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def allocated_delta_bytes(self) -> int:
        return self.allocated_after - self.allocated_before

    @property
    def reserved_delta_bytes(self) -> int:
        return self.reserved_after - self.reserved_before

    def top(self, n: int = 10) -> tuple[DiffRow, ...]:
        """The ``n`` stacks whose live bytes changed most (growth or shrinkage)."""
        return tuple(r for r in self.rows if r.bytes_delta)[: max(n, 0)]

    def by_category(self) -> dict[str, int]:
        """Change of live bytes per category, largest growth first."""
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.category] = out.get(r.category, 0) + r.bytes_delta
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def findings(self) -> list[str]:
        """What grew (or shrank), by how much and where, in words."""
        a, b = self.labels
        change = "grew" if self.allocated_delta_bytes > 0 else "shrank"
        out = [
            f"allocated {change} by {format_bytes(abs(self.allocated_delta_bytes))} "
            f"({format_bytes(self.allocated_before)} in {a} -> "
            f"{format_bytes(self.allocated_after)} in {b}); reserved "
            f"{format_bytes(self.reserved_before)} -> {format_bytes(self.reserved_after)}"
            if self.allocated_delta_bytes
            else f"allocated is the same in both ({format_bytes(self.allocated_after)})"
        ]
        cats = [
            f"{c} {'+' if d > 0 else ''}{format_bytes(d)}"
            for c, d in self.by_category().items()
            if d
        ]
        if cats:
            out.append("by category: " + ", ".join(cats))
        for r in self.top(3):
            blocks = f"{r.count_before} -> {r.count_after} blocks"
            out.append(
                f"{'+' if r.bytes_delta > 0 else ''}{format_bytes(r.bytes_delta)} "
                f"({r.category}, {blocks}) allocated at {r.where}"
            )
        return out + list(self.notes)

    def plot(self) -> Any:
        """Bar chart of the stacks that changed most (``gpudiag.plots``)."""
        return _views.build("figure", self)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "memory_snapshot_diff",
                "before": self.before,
                "after": self.after,
                "labels": list(self.labels),
                "allocated_before": self.allocated_before,
                "allocated_after": self.allocated_after,
                "allocated_delta_bytes": self.allocated_delta_bytes,
                "reserved_before": self.reserved_before,
                "reserved_after": self.reserved_after,
                "reserved_delta_bytes": self.reserved_delta_bytes,
                "by": self.by,
                "category_rule": CATEGORY_RULE,
                "by_category": self.by_category(),
                "rows": [r.to_dict() for r in self.rows],
                "findings": self.findings(),
            }
        )

    def __repr__(self) -> str:
        lines = [f"SnapshotDiff({self.before} -> {self.after})"]
        lines += [f"  {f}" for f in self.findings()]
        return "\n".join(lines)

    def as_card(self) -> Card:
        a, b = self.labels
        head = Facts(
            [
                (f"allocated ({a} -> {b})", _change(self.allocated_before, self.allocated_after)),
                (f"reserved ({a} -> {b})", _change(self.reserved_before, self.reserved_after)),
            ]
        )
        notes = Lines(self.findings()[1:])
        grid = Grid(
            ("change", "blocks", "category", "allocated at"),
            [
                (
                    _signed(r.bytes_delta),
                    f"{r.count_before} -> {r.count_after}",
                    r.category,
                    r.where,
                )
                for r in self.top(15)
            ],
        )
        return Card("CUDA memory: what changed", [head, notes, grid], subtitle=f"{a} -> {b}")


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + format_bytes(n)


def _change(a: int, b: int) -> str:
    return f"{format_bytes(a)} -> {format_bytes(b)} ({_signed(b - a)})"


def diff_snapshots(
    before: SnapshotLike,
    after: SnapshotLike,
    *,
    by: Key = "stack",
    labels: tuple[str, str] | None = None,
) -> SnapshotDiff:
    """Compare two snapshots allocation stack by allocation stack.

    ``by="stack"`` matches stacks frame for frame, lines included (two snapshots of one run);
    ``by="function"`` matches them by file name and function, without folders and line numbers
    (snapshots of two versions or checkouts of the code).
    """
    if by not in ("stack", "function"):
        raise ArgumentError(f"by={by!r}: compare by 'stack' or 'function'.")
    groups: dict[tuple[str, tuple[str, ...]], list[Any]] = {}
    for side, snap in enumerate((before, after)):
        for h in snap.holders:
            g = groups.setdefault((h.category, _keyed(h.stack, by)), [h.site, h.stack, 0, 0, 0, 0])
            if side and not g[5]:
                g[0], g[1] = h.site, h.stack  # shown as in the later snapshot, where it holds
            g[2 + side] += h.nbytes
            g[4 + side] += h.count
    rows = [
        DiffRow(cat, site, stack, b0, b1, c0, c1)
        for (cat, _), (site, stack, b0, b1, c0, c1) in groups.items()
    ]
    rows.sort(key=lambda r: (-abs(r.bytes_delta), r.category, r.site))
    notes = []
    unexplained = (after.allocated_bytes - before.allocated_bytes) - sum(
        r.bytes_delta for r in rows
    )
    if unexplained:
        notes.append(
            f"{_signed(unexplained)} of the change in allocated bytes is not in any live block "
            "(the segments' allocated_size and their blocks disagree in the files)"
        )
    return SnapshotDiff(
        before=before.source,
        after=after.source,
        allocated_before=before.allocated_bytes,
        allocated_after=after.allocated_bytes,
        reserved_before=before.reserved_bytes,
        reserved_after=after.reserved_bytes,
        rows=tuple(rows),
        by=by,
        labels=labels or (before.source or "before", after.source or "after"),
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class SnapshotRanks(Carded):
    """The snapshots of one job's ranks: who holds more, and in what.

    ``imbalance`` compares the lightest rank (fewest allocated bytes) with the heaviest.
    """

    source: str
    ranks: tuple[int, ...]
    snapshots: tuple[Any, ...]  # MemorySnapshot of each rank, in ``ranks`` order
    imbalance: SnapshotDiff
    notes: tuple[str, ...] = ()

    @property
    def heaviest_rank(self) -> int:
        return self.ranks[self._order()[-1]]

    @property
    def lightest_rank(self) -> int:
        return self.ranks[self._order()[0]]

    @property
    def spread_bytes(self) -> int:
        """Allocated bytes of the heaviest rank less the lightest's."""
        return self.imbalance.allocated_delta_bytes

    def _order(self) -> list[int]:
        return sorted(range(len(self.ranks)), key=lambda i: self.snapshots[i].allocated_bytes)

    def rank(self, rank: int) -> Any:
        """The ``MemorySnapshot`` of one rank."""
        return self.snapshots[self.ranks.index(rank)]

    def findings(self) -> list[str]:
        heavy, light = self.rank(self.heaviest_rank), self.rank(self.lightest_rank)
        if self.spread_bytes <= 0:
            same = format_bytes(heavy.allocated_bytes)
            return [f"every rank holds the same allocated bytes ({same})", *self.notes]
        share = self.spread_bytes / light.allocated_bytes if light.allocated_bytes else 0.0
        out = [
            f"rank {self.heaviest_rank} holds {format_bytes(self.spread_bytes)} more than rank "
            f"{self.lightest_rank} ({format_bytes(heavy.allocated_bytes)} vs "
            f"{format_bytes(light.allocated_bytes)} allocated, +{share:.0%})"
        ]
        out += [f"  {f}" for f in self.imbalance.findings()[1:]]
        return out + list(self.notes)

    def plot(self) -> Any:
        """Allocated bytes per rank by category (``gpudiag.plots``)."""
        return _views.build("figure", self)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "memory_snapshot_ranks",
                "source": self.source,
                "ranks": [
                    {
                        "rank": r,
                        "source": s.source,
                        "allocated_bytes": s.allocated_bytes,
                        "reserved_bytes": s.reserved_bytes,
                        "by_category": category_bytes(s.holders),
                    }
                    for r, s in zip(self.ranks, self.snapshots, strict=True)
                ],
                "heaviest_rank": self.heaviest_rank,
                "lightest_rank": self.lightest_rank,
                "spread_bytes": self.spread_bytes,
                "imbalance": self.imbalance.to_dict(),
                "findings": self.findings(),
            }
        )

    def __repr__(self) -> str:
        lines = [f"SnapshotRanks({self.source}: {len(self.ranks)} ranks)"]
        for r, s in zip(self.ranks, self.snapshots, strict=True):
            lines.append(
                f"  rank {r}: allocated {format_bytes(s.allocated_bytes)}, reserved "
                f"{format_bytes(s.reserved_bytes)}"
            )
        lines += [f"  {f}" for f in self.findings()]
        return "\n".join(lines)

    def as_card(self) -> Card:
        grid = Grid(
            ("rank", "allocated", "reserved", "file"),
            [
                (r, format_bytes(s.allocated_bytes), format_bytes(s.reserved_bytes), s.source)
                for r, s in zip(self.ranks, self.snapshots, strict=True)
            ],
        )
        return Card(
            "CUDA memory across ranks", [Lines(self.findings()), grid], subtitle=self.source
        )


def category_bytes(holders: Iterable[Holder]) -> dict[str, int]:
    """Live bytes per category."""
    out: dict[str, int] = {}
    for h in holders:
        out[h.category] = out.get(h.category, 0) + h.nbytes
    return out


def rank_imbalance(
    source: str, ranks: Sequence[int], snapshots: Sequence[SnapshotLike], notes: Sequence[str] = ()
) -> SnapshotRanks:
    """The ranks' snapshots, with the lightest compared to the heaviest."""
    order = sorted(range(len(ranks)), key=lambda i: snapshots[i].allocated_bytes)
    light, heavy = order[0], order[-1]
    imbalance = diff_snapshots(
        snapshots[light],
        snapshots[heavy],
        labels=(f"rank {ranks[light]}", f"rank {ranks[heavy]}"),
    )
    return SnapshotRanks(source, tuple(ranks), tuple(snapshots), imbalance, tuple(notes))
