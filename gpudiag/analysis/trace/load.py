"""Reads Kineto traces (.json / .json.gz) in bounded memory into columnar ``RankTrace``s.

The file is read (and gunzipped) in blocks. Each block's complete events are decoded by msgspec
straight into small typed structs holding only the fields the analyses use (``schema.py``
declares them; everything else in an event is skipped unparsed), and the structs' fields are
moved into flat arrays column by column with C-level iteration (``map``, ``attrgetter``,
``np.fromiter``), never a Python loop per event. A multi-GB trace therefore never exists as
Python dicts, nor as one string, nor as one struct per event: memory is the columns plus one
block.

A damaged stretch (a bad byte, a cut-off event) is read around: the block it is in is decoded
event by event, the events that cannot be decoded are skipped and counted in the report's
notes, and the rest of the file reads at full speed. Binary garbage, special files and data
past ``max_bytes`` end in a TraceError.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import compress, repeat
from operator import attrgetter, is_not
from pathlib import Path
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from gpudiag._progress import ProgressFn, finish, report
from gpudiag.analysis.costed_ops import is_costed
from gpudiag.analysis.files import GiB, open_regular, over_limit
from gpudiag.analysis.trace.model import (
    ASYNC_COPY_RUNTIME_NAMES,
    COMM_ANNOTATION,
    IGNORED_CATEGORIES,
    KIND_OF_CATEGORY,
    STEP_PREFIX,
    SYNC_CONTEXT_OPS,
    SYNC_RUNTIME_NAMES,
    CommArgs,
    DeviceProperties,
    Events,
    Kind,
    LaunchTable,
    OpInputs,
    RankTrace,
    member_of,
)
from gpudiag.analysis.trace.schema import (
    DIM_ARGS,
    LAUNCH_FIELDS,
    LAUNCH_KINDS,
    RAW_ARGS,
    ROW_FIELDS,
    ArgField,
)
from gpudiag.errors import TraceError

BLOCK_BYTES = 8 << 20
# The most JSON text one read takes by default: a 5 GB trace reads in under a minute; a
# gzip bomb or an endless stream stops here. ``max_bytes=`` raises it.
DEFAULT_MAX_BYTES = 64 * GiB
# No event is this large: a stretch this long without an event boundary (or without the
# traceEvents key at the start) is not a Kineto trace.
MAX_EVENT_BYTES = 64 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# Where one event object ends and the next begins. A match can also sit inside a nested
# object or a string; decoding the block then fails as truncated and an earlier match is tried.
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_STREAM_TID = re.compile(r"stream\s*(\d+)")
_BYTE_AT = re.compile(r"\(byte (\d+)\)")
_TAIL_WINDOW = 1 << 16
_MAX_CUT_TRIES = 8
# Pieces (text between two boundary matches) joined at most to rebuild one event whose text
# holds boundary-like matches (nested objects): more is a damaged stretch.
_MAX_JOIN = 32
_OTHER = int(Kind.OTHER)
_KERNEL = int(Kind.KERNEL)
_CPU_OP = int(Kind.CPU_OP)
_ANNOTATION = int(Kind.ANNOTATION)
_DROPPED = -1  # the kind of a category deliberately not analysed: the row is not kept
# Flows, instants, counters and metadata: known phases, not analysed and not "unknown".
_QUIET_PHASES = frozenset({"s", "f", "t", "i", "I", "C", "M"})
_NO_RAW = msgspec.Raw()
# Integer columns are int64: a value outside it (a corrupt or hostile file) fails the typed
# decode, and the slow path drops it as "not recorded" instead of overflowing an array.
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
Int64 = Annotated[int, msgspec.Meta(ge=I64_MIN, le=I64_MAX)]


# -- the decoded structs, built from the schema ----------------------------------------------


def _attr(key: str) -> str:
    return "a_" + re.sub(r"\W", "_", key)


def _arg_keys() -> dict[str, bool]:
    """Every number key of ``args`` the schema reads -> whether it is read as a float."""
    keys: dict[str, bool] = {}
    for f in ROW_FIELDS + LAUNCH_FIELDS:
        for key in f.keys:
            if keys.setdefault(key, f.is_float) != f.is_float:
                raise TypeError(f"schema: args key {key!r} is read both as an int and a float")
    return keys


_NUMBER_KEYS = _arg_keys()
_Args: Any = msgspec.defstruct(
    "_Args",
    [
        *(
            (_attr(k), float if is_float else Int64, msgspec.field(default=math.nan, name=k))
            if is_float
            else (_attr(k), Int64, msgspec.field(default=-1, name=k))
            for k, is_float in _NUMBER_KEYS.items()
        ),
        *(
            (attr, tuple[Int64, Int64, Int64] | None, msgspec.field(default=None, name=key))
            for attr, key in DIM_ARGS.items()
        ),
        *(
            (attr, msgspec.Raw, msgspec.field(default=_NO_RAW, name=key))
            for attr, key in RAW_ARGS.items()
        ),
    ],
    frozen=True,
    gc=False,
)
_NO_ARGS = _Args()  # the args of an event that records none (shared: frozen)
# A complete ("X") event: what the analyses read. Events of other phases (flows, instants,
# counters, metadata) decode to an empty struct of their phase, tagged by "ph": nothing in
# them is kept, so nothing in them is built.
_Event: Any = msgspec.defstruct(
    "_Event",
    [
        ("cat", str, ""),
        ("name", str, ""),
        ("pid", Int64 | str, 0),
        ("tid", Int64 | str, 0),
        ("ts", float | None, None),
        ("dur", float | None, None),
        ("args", _Args, _NO_ARGS),
        # Set by the slow path only; no trace writes this key.
        ("beyond_int64", int, msgspec.field(default=0, name="__gpudiag_beyond_int64__")),
    ],
    tag_field="ph",
    tag="X",
    gc=False,
)
# Every phase of the Trace Event Format but "X" (and a missing one, read as ""): one class each.
_OTHER_PHASES: tuple[str, ...] = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P")
_OTHER_PHASES += ("N", "O", "D", "M", "V", "v", "R", "c", "(", ")", "")
_PHASE_OF: dict[Any, str] = {
    msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False): ph
    for i, ph in enumerate(_OTHER_PHASES)
}
# An event of another phase read by the slow path (any "ph" string).
_Other: Any = msgspec.defstruct("_Other", [("ph", str, ""), ("beyond_int64", int, 0)], gc=False)
_EVENT_TYPES = (_Event, *_PHASE_OF)
_AnyEvent: Any = Union[_EVENT_TYPES]  # noqa: UP007 - a union built at run time
_Tail: Any = msgspec.defstruct(
    "_Tail",
    [
        ("traceEvents", list[_AnyEvent], msgspec.field(default_factory=list)),
        ("deviceProperties", Any, None),
        ("distributedInfo", Any, None),
        ("traceName", Any, None),
        ("baseTimeNanoseconds", Any, None),
        ("displayTimeUnit", Any, None),
    ],
    gc=False,
)
_TAIL_KEYS = (
    "deviceProperties",
    "distributedInfo",
    "traceName",
    "baseTimeNanoseconds",
    "displayTimeUnit",
)

_BAD_UTF8 = "invalid UTF-8"
_NO_DURATION = "no duration"
_BEYOND_INT64 = "integer beyond int64"
_NO_TIMESTAMP = "no timestamp"
_NEGATIVE_DURATION = "negative duration"
_NOT_A_DURATION = "non-numeric duration"
_HUGE_DURATION = "duration over 11 days"
# No profiled event lasts this long (11.6 days); a larger value is corruption, and squaring it
# for a standard deviation would overflow.
MAX_DURATION_US = 1e12
_EVENTS_DECODER = msgspec.json.Decoder(list[_AnyEvent])
_EVENT_DECODER = msgspec.json.Decoder(_AnyEvent)
_TAIL_DECODER = msgspec.json.Decoder(_Tail)
_ANY_DECODER = msgspec.json.Decoder()
_STR_DECODER = msgspec.json.Decoder(str)


def _is_int64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and I64_MIN <= value <= I64_MAX


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int64(x) for x in value)


def _as_float(value: Any) -> float | None:
    """A JSON number as a float; None for a non-number, nan for one too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.nan


def _repair_utf8(text: bytes | bytearray | memoryview) -> bytes:
    return bytes(text).decode("utf-8", errors="replace").encode("utf-8")


def _decode_utf8_safe(
    decoder: Any, text: bytes | bytearray | memoryview, problems: Counter[str]
) -> Any:
    """``decoder.decode(text)``; bytes that are not UTF-8 are replaced (and counted)."""
    try:
        return decoder.decode(text)
    except UnicodeDecodeError:
        problems[_BAD_UTF8] += 1
        return decoder.decode(_repair_utf8(text))


def _raw(value: Any) -> msgspec.Raw:
    return _NO_RAW if value is None else msgspec.Raw(msgspec.json.encode(value))


def _decode_list(raw: msgspec.Raw) -> list[Any] | None:
    if not len(raw):
        return None
    try:
        value = _ANY_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, list) else None


def _dims(value: Any) -> tuple[int, ...]:
    """One input's dims; () for a scalar, None, or a tensor list (a list of lists)."""
    if isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        return tuple(value)
    return ()


def _op_inputs(a: Any) -> OpInputs | None:
    """The recorded inputs of a costed operator; malformed lists are dropped, not raised."""
    dims, types, concrete = (
        _decode_list(a.input_dims),
        _decode_list(a.input_type),
        _decode_list(a.concrete_inputs),
    )
    if dims is None and types is None and concrete is None:
        return None
    return OpInputs(
        dims=None if dims is None else tuple(_dims(d) for d in dims),
        types=None if types is None else tuple(t if isinstance(t, str) else "" for t in types),
        concrete=None
        if concrete is None
        else tuple(c if isinstance(c, str) else "" for c in concrete),
    )


def _decoded(raw: msgspec.Raw) -> Any:
    if not raw:
        return None
    try:
        return _ANY_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None


_COLLECTIVE_NAME = re.compile(r"[A-Za-z_]{1,64}")
_MAX_NELEMS = 1 << 48  # elements of one message: far above any GPU's memory
_MAX_GROUP = 1 << 24  # ranks in one process group


def _count(raw: msgspec.Raw, most: int) -> int | None:
    """A whole number from 0 to ``most``; None for anything else (a float such as 1e300 would
    otherwise become a 300-digit int)."""
    value = _decoded(raw)
    if isinstance(value, float) and value.is_integer() and 0 <= value <= most:
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most
    return value if ok else None


def _comm_args(a: Any) -> CommArgs | None:
    """The collective recorded on a communication kernel; None when absent or malformed."""
    name = _decoded(a.collective_name)
    if not isinstance(name, str) or not _COLLECTIVE_NAME.fullmatch(name):
        return None
    dtype, group = _decoded(a.msg_dtype), _decoded(a.pg_name)
    return CommArgs(
        collective=name,
        in_nelems=_count(a.in_msg_nelems, _MAX_NELEMS),
        out_nelems=_count(a.out_msg_nelems, _MAX_NELEMS),
        dtype=dtype if isinstance(dtype, str) and len(dtype) <= 32 else "",
        group_size=_count(a.group_size, _MAX_GROUP),
        process_group=str(group)[:64] if isinstance(group, (str, int)) else "",
    )


def _call_stack(raw: msgspec.Raw) -> str | None:
    """A recorded "Call stack" string; None when empty or not a string."""
    if not raw:
        return None
    try:
        value = _STR_DECODER.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return value or None


def _is_comm(name: str) -> bool:
    return ":" in name[:6] and COMM_ANNOTATION.fullmatch(name) is not None


def _keeps_inputs(name: str) -> bool:
    """Operators whose recorded inputs are kept: costed ones and collective ranges."""
    return is_costed(name) or _is_comm(name)


# What the loader keeps about an event by its name (a bit set per name id).
_KEEP_STACK = 1
_KEEP_INPUTS = 2
_STACK_NAMES = SYNC_RUNTIME_NAMES | SYNC_CONTEXT_OPS | ASYNC_COPY_RUNTIME_NAMES


def _name_flags(name: str) -> int:
    return (_KEEP_STACK if name in _STACK_NAMES else 0) | (
        _KEEP_INPUTS if _keeps_inputs(name) else 0
    )


# -- the slow path: one event at a time from untyped JSON --------------------------------------


def _loose_event(raw: Any) -> Any:
    """An event from an untyped dict, dropping fields of unexpected types (slow path);
    integers dropped for being beyond int64 are counted in its ``beyond_int64``."""
    dropped = 0
    if not isinstance(raw, dict):
        return None

    def pick(src: Mapping[str, Any], key: str, types: tuple[type, ...]) -> Any:
        value = src.get(key)
        if isinstance(value, bool) or not isinstance(value, types):
            return None
        if isinstance(value, int) and not I64_MIN <= value <= I64_MAX:
            nonlocal dropped
            dropped += 1
            return None
        return value

    args = raw.get("args")
    parsed_args = _NO_ARGS
    if isinstance(args, dict):
        values: dict[str, Any] = {}
        for key, is_float in _NUMBER_KEYS.items():
            value = pick(args, key, (int, float) if is_float else (int,))
            if value is not None:
                values[_attr(key)] = value
        for attr, key in DIM_ARGS.items():
            dims: Any = args.get(key)
            if isinstance(dims, list) and any(
                isinstance(x, int) and not isinstance(x, bool) and not _is_int64(x) for x in dims
            ):
                dropped += 1
            if _int_list(dims) and len(dims) >= 3:
                values[attr] = tuple(dims[:3])
        stack = args.get(RAW_ARGS["call_stack"])
        if isinstance(stack, str):
            values["call_stack"] = _raw(stack)
        if "Collective name" in args:
            for attr in ("collective_name", "in_msg_nelems", "out_msg_nelems"):
                values[attr] = _raw(args.get(RAW_ARGS[attr]))
            for attr in ("msg_dtype", "group_size", "pg_name"):
                values[attr] = _raw(args.get(RAW_ARGS[attr]))
        if _keeps_inputs(str(raw.get("name", ""))):
            for attr in ("input_dims", "input_type", "concrete_inputs"):
                values[attr] = _raw(args.get(RAW_ARGS[attr]))
        parsed_args = _Args(**values)
    ts = _as_float(raw.get("ts"))
    dur = _as_float(raw.get("dur"))
    if dur is None and "dur" in raw:
        dur = math.nan  # present but not a number: counted as a bad duration, not "missing"
    pid, tid = pick(raw, "pid", (int, str)), pick(raw, "tid", (int, str))
    ph = str(raw.get("ph", ""))
    if ph != "X":
        return _Other(ph=ph, beyond_int64=dropped)
    return _Event(
        cat=str(raw.get("cat", "")),
        name=str(raw.get("name", "")),
        pid=0 if pid is None else pid,
        tid=0 if tid is None else tid,
        ts=None if ts is None or not math.isfinite(ts) else ts,
        dur=dur,
        args=parsed_args,
        beyond_int64=dropped,
    )


def _loose_events(raws: Any, problems: Counter[str]) -> list[Any]:
    """Events from a decoded JSON list by the slow path (non-events are skipped)."""
    if not isinstance(raws, list):
        return []
    events = [e for raw in raws if (e := _loose_event(raw)) is not None]
    dropped = sum(e.beyond_int64 for e in events)
    if dropped:
        problems[_BEYOND_INT64] += dropped
    return events


def _decode_events(text: bytes | bytearray | memoryview, problems: Counter[str]) -> list[Any]:
    """Decode a JSON array of events; ``msgspec.DecodeError`` if it is not valid JSON."""
    try:
        events: list[Any] = _decode_utf8_safe(_EVENTS_DECODER, text, problems)
        return events
    except msgspec.ValidationError:
        # Valid JSON, unexpected types somewhere (a string stream id, a float id, an
        # integer beyond int64, ...).
        return _loose_events(_decode_utf8_safe(_ANY_DECODER, text, problems), problems)


# -- decoded structs -> columns ------------------------------------------------------------


class _Ids(dict[Any, int]):
    """Keys numbered in the order first seen; ``ids[key]`` numbers a new key."""

    def __init__(self, on_new: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self.on_new = on_new

    def __missing__(self, key: Any) -> int:
        value = self[key] = len(self)
        if self.on_new is not None:
            self.on_new(key)
        return value


class _Products(dict[Any, int]):
    """grid/block tuple -> x*y*z (-1 when not recorded, negative or beyond int64)."""

    def __missing__(self, dims: tuple[int, ...] | None) -> int:
        value = self[dims] = _product(dims)
        return value


_CAT = attrgetter("cat")
_NAME = attrgetter("name")
_PID = attrgetter("pid")
_TID = attrgetter("tid")
_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_ARGS = attrgetter("args")


# Integer widths a column may take, narrowest first, with the range each holds.
_WIDTHS: tuple[tuple[str, Any, int, int], ...] = (
    ("h", np.int16, -(1 << 15), (1 << 15) - 1),
    ("i", np.int32, I32_MIN, I32_MAX),
    ("q", np.int64, I64_MIN, I64_MAX),
)
_DTYPE_OF = {"d": np.float64, "h": np.int16, "i": np.int32, "q": np.int64}


class _Column:
    """A growing column of numbers. Integers are kept as narrow as every value allows (int16
    for stream and device ids, int32 for correlation ids and row numbers of real traces: on
    a multi-GB trace each byte is millions) and widen at the first value that does not fit;
    floats are float64."""

    def __init__(self, is_float: bool = False) -> None:
        self.values = array("d" if is_float else "h")

    def extend(self, values: np.ndarray) -> None:
        code = self.values.typecode
        if code != "d" and code != "q" and values.size:
            lo, hi = int(values.min()), int(values.max())
            wide = next(w for w in _WIDTHS if w[2] <= lo and hi <= w[3])
            if _WIDTHS.index(wide) > [w[0] for w in _WIDTHS].index(code):
                widened = array(wide[0])
                _append(widened, np.frombuffer(self.values, _DTYPE_OF[code]).astype(wide[1]))
                self.values = widened
        dtype = _DTYPE_OF[self.values.typecode]
        _append(self.values, values.astype(dtype, copy=False))

    def freeze(self) -> np.ndarray:
        dtype = _DTYPE_OF[self.values.typecode]
        return np.frombuffer(self.values, dtype) if len(self.values) else np.zeros(0, dtype)


class _Columns:
    """Growing arrays for one trace; ``add`` takes a decoded block of events."""

    def __init__(self) -> None:
        self.kind = array("b")
        # Name and thread ids: int16 while the trace has under 32768 of each (real ones have
        # hundreds of names and a few threads): 4 bytes a row saved on the two.
        self.name = _Column()
        self.thread = _Column()
        self.ts = array("d")
        self.dur = array("d")
        self.row = {f.name: _Column(f.is_float) for f in ROW_FIELDS}
        self.launch = {f.name: array("d" if f.is_float else "q") for f in LAUNCH_FIELDS}
        flags = self.flags = bytearray()  # name id -> _KEEP_* bits
        # Not a method of self: a cycle would keep every column of the load alive after
        # ``freeze`` until the garbage collector happened to run.
        self.names = _Ids(lambda name: flags.append(_name_flags(name)))
        self.threads = _Ids()
        self.kind_of: dict[str, int] = {c: int(k) for c, k in KIND_OF_CATEGORY.items()}
        self.kind_of.update(dict.fromkeys(IGNORED_CATEGORIES, _DROPPED))
        self.stacks: dict[int, str] = {}
        self.inputs: dict[int, OpInputs] = {}
        self.comm_args: dict[int, CommArgs] = {}
        # The same layer records the same inputs every step: one shared record per spelling.
        self._seen_inputs: dict[tuple[bytes, bytes, bytes], OpInputs | None] = {}
        self.unknown: Counter[str] = Counter()
        # What was wrong with the file but could be read around (the report's notes say it).
        self.problems: Counter[str] = Counter()
        self.bad_duration_example: str | None = None
        self.extra = _Column()  # the launch-table row of each event row (-1: none)
        self.blocks = array("q")
        self.threads_per_block = array("q")
        self.grid: list[tuple[int, int, int] | None] = []
        self.block: list[tuple[int, int, int] | None] = []
        self._dims: dict[Any, Any] = {}  # one shared tuple per grid/block spelling
        self._products = _Products()
        self.damaged_events = 0  # stretches skipped as not valid JSON
        self.damaged_bytes = 0
        self.first_damage_at: int | None = None

    def add(self, events: list[Any]) -> None:
        """Append a decoded block, a field at a time over all its events."""
        complete = events
        types = set(map(type, events))
        if types != {_Event}:
            complete = [e for e in events if type(e) is _Event]
            if any(_PHASE_OF.get(t) not in _QUIET_PHASES for t in types if t is not _Event):
                self._count_phases([e for e in events if type(e) is not _Event])
            if not complete:
                return
        kinds = map(self.kind_of.get, map(_CAT, complete), repeat(_OTHER))
        kind_col = np.fromiter(kinds, np.int8, len(complete))
        ts = _floats(_TS, complete)
        no_ts = np.isnan(ts)  # NaN only where a timestamp was missing or unusable
        keep = ~no_ts & (kind_col != _DROPPED)
        if not keep.all():
            self.problems[_NO_TIMESTAMP] += int(no_ts.sum())
            complete = list(compress(complete, keep.tolist()))
            kind_col, ts = kind_col[keep], ts[keep]
        n = len(complete)
        if not n:
            return
        if (kind_col == _OTHER).any():
            self.unknown.update(
                f"cat={complete[i].cat or '?'}" for i in np.flatnonzero(kind_col == _OTHER).tolist()
            )
        first_row = len(self.ts)
        _append(self.kind, kind_col)
        names = np.fromiter(map(self.names.__getitem__, map(_NAME, complete)), np.int32, n)
        self.name.extend(names)
        pid_tid = zip(map(_PID, complete), map(_TID, complete), strict=True)
        threads = map(self.threads.__getitem__, pid_tid)
        self.thread.extend(np.fromiter(threads, np.int32, n))
        _append(self.ts, ts)
        self._add_durations(complete)
        args = list(map(_ARGS, complete))
        row = {f.name: self._field(f, args, kind_col) for f in ROW_FIELDS}
        extra = np.full(n, -1, np.int64)
        on_stream = np.flatnonzero(kind_col >= _KERNEL)
        if on_stream.size:
            stream_args = map(args.__getitem__, on_stream.tolist())
            has_args = np.fromiter(map(is_not, stream_args, repeat(_NO_ARGS)), bool, on_stream.size)
            on_stream = on_stream[has_args]  # no args: no stream, no launch
            self._stream_fallbacks(complete, row, on_stream)
            launched = on_stream[_isin(kind_col[on_stream], LAUNCH_KINDS)]
            if launched.size:
                extra[launched] = np.arange(len(self.blocks), len(self.blocks) + launched.size)
                self._add_launches([args[i] for i in launched.tolist()], kind_col[launched])
                self._add_comm_args(args, launched[kind_col[launched] == _KERNEL], first_row)
        for name, values in row.items():
            self.row[name].extend(values)
        self.extra.extend(extra)
        flags = np.frombuffer(self.flags, np.uint8)[names]
        for i in np.flatnonzero(flags & _KEEP_STACK).tolist():
            stack = _call_stack(args[i].call_stack)
            if stack is not None:
                self.stacks[first_row + i] = stack
        host_op = (kind_col == _CPU_OP) | (kind_col == _ANNOTATION)
        seen = self._seen_inputs
        for i in np.flatnonzero((flags & _KEEP_INPUTS).astype(bool) & host_op).tolist():
            a = args[i]
            key = (bytes(a.input_dims), bytes(a.input_type), bytes(a.concrete_inputs))
            if key in seen:
                inputs = seen[key]
            else:
                inputs = seen[key] = _op_inputs(a)
            if inputs is not None:
                self.inputs[first_row + i] = inputs

    def _count_phases(self, others: list[Any]) -> None:
        """Count the events of phases gpudiag does not analyse, for the report's notes."""
        for cls, count in Counter(map(type, others)).items():
            phases = Counter(e.ph for e in others if type(e) is cls) if cls is _Other else None
            for ph, n in (phases or {_PHASE_OF[cls]: count}).items():
                if ph not in _QUIET_PHASES:
                    self.unknown[f"ph={ph or '?'}"] += n

    @staticmethod
    def _field(f: ArgField, args: list[Any], kind_col: np.ndarray) -> np.ndarray:
        """One schema field over a block's rows (read only from the rows of its kinds)."""
        dtype, missing = (np.float64, math.nan) if f.is_float else (np.int64, -1)
        n = len(args)
        rows = None if len(f.kinds) == len(Kind) else np.flatnonzero(_isin(kind_col, f.kinds))
        if rows is not None and rows.size < n:
            out = np.full(n, missing, dtype)
            if rows.size:
                out[rows] = _recorded(f, _take(args, rows), dtype)
            return out
        return _recorded(f, args, dtype)

    def _add_durations(self, complete: list[Any]) -> None:
        values = _floats(_DUR, complete)  # NaN: missing or not a number
        top = MAX_DURATION_US
        with np.errstate(invalid="ignore"):
            good = (values > 0.0) & (values <= top)
            bad = np.flatnonzero(~((values >= 0.0) & (values <= top)))
        _append(self.dur, np.where(good, values, 0.0))
        if bad.size:
            self._count_bad_durations(complete, list(map(_DUR, complete)), bad.tolist())

    def _count_bad_durations(self, xs: list[Any], durs: list[float | None], bad: list[int]) -> None:
        for i in bad:
            d = durs[i]
            reason = (
                _NO_DURATION
                if d is None
                else _NEGATIVE_DURATION
                if d < 0
                else _HUGE_DURATION
                if d > MAX_DURATION_US
                else _NOT_A_DURATION
            )
            self.problems[reason] += 1
        if self.bad_duration_example is None:
            e = xs[bad[0]]
            shown = "missing" if durs[bad[0]] is None else f"{durs[bad[0]]!r}"
            self.bad_duration_example = f"{e.cat or '?'} {e.name[:60]!r} dur={shown}"

    @staticmethod
    def _stream_fallbacks(complete: list[Any], row: dict[str, np.ndarray], rows: Any) -> None:
        """A stream event whose args lack the stream (device) takes it from its tid (pid)."""
        stream, device = row["stream"], row["device"]
        for i in rows[stream[rows] == -1].tolist():
            tid = complete[i].tid
            m = _STREAM_TID.match(str(tid))
            value = int(m.group(1)) if m else (tid if isinstance(tid, int) else -1)
            stream[i] = value if I64_MIN <= value <= I64_MAX else -1
        for i in rows[device[rows] == -1].tolist():
            pid = complete[i].pid
            device[i] = pid if isinstance(pid, int) else -1

    def _add_launches(self, args: list[Any], kinds: np.ndarray) -> None:
        n = len(args)
        shared = self._dims.setdefault
        for attr, out, sizes in (
            ("grid", self.grid, self.blocks),
            ("block", self.block, self.threads_per_block),
        ):
            decoded = list(map(attrgetter(attr), args))
            values = list(map(shared, decoded, decoded))
            out.extend(values)
            _append(sizes, np.fromiter(map(self._products.__getitem__, values), np.int64, n))
        for f in LAUNCH_FIELDS:
            _append(self.launch[f.name], self._field(f, args, kinds))

    def _add_comm_args(self, args: list[Any], kernel_rows: np.ndarray, first_row: int) -> None:
        for i in kernel_rows.tolist():
            a = args[i]
            if a.collective_name:
                found = _comm_args(a)
                if found is not None:
                    self.comm_args[first_row + i] = found

    def freeze(self) -> Events:
        def np_of(values: array[Any], dtype: Any) -> Any:
            return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype)

        launch_columns = {
            f.name: np_of(self.launch[f.name], np.float64 if f.is_float else np.int64)
            for f in LAUNCH_FIELDS
        }
        launches = LaunchTable(
            blocks=np_of(self.blocks, np.int64),
            threads_per_block=np_of(self.threads_per_block, np.int64),
            registers_per_thread=launch_columns["registers_per_thread"],
            shared_memory_bytes=launch_columns["shared_memory_bytes"],
            nbytes=launch_columns["nbytes"],
            kineto_achieved_occupancy=launch_columns["kineto_achieved_occupancy"],
            grid=tuple(self.grid),
            block=tuple(self.block),
            columns=launch_columns,
        )
        kind = np_of(self.kind, np.int8)  # writable: this object is dropped after freezing
        step_ids = [i for n, i in self.names.items() if n.startswith(STEP_PREFIX)]
        name_col = self.name.freeze()
        if step_ids:
            # ProfilerStep#N is a user_annotation in new traces, an "Operator" in old ones.
            host = member_of(kind.view(np.uint8), (Kind.CPU_OP, Kind.ANNOTATION, Kind.OTHER), 256)
            kind[host & member_of(name_col, step_ids, len(self.names))] = Kind.STEP
        columns = {f.name: self.row[f.name].freeze() for f in ROW_FIELDS}
        return Events(
            kind=kind,
            name=name_col,
            thread=self.thread.freeze(),
            ts=np_of(self.ts, np.float64),
            dur=np_of(self.dur, np.float64),
            correlation=columns["correlation"],
            stream=columns["stream"],
            device=columns["device"],
            extra=self.extra.freeze(),
            names=tuple(self.names),
            threads=tuple((str(p), str(t)) for p, t in self.threads),
            launches=launches,
            stacks=self.stacks,
            inputs=self.inputs,
            comm_args=self.comm_args,
            columns=columns,
        )


def _floats(get: Callable[[Any], float | None], events: list[Any]) -> np.ndarray:
    """A float field of every event; NaN where it is None."""
    try:
        return np.fromiter(map(get, events), np.float64, len(events))
    except TypeError:
        values = map(get, events)
        return np.array([math.nan if v is None else v for v in values], np.float64)


def _take(items: list[Any], rows: np.ndarray) -> list[Any]:
    return list(map(items.__getitem__, rows.tolist()))


def _recorded(f: ArgField, args: list[Any], dtype: Any) -> np.ndarray:
    """The field's value in each of ``args``: its first spelling recorded, over the divisor."""
    values = np.fromiter(map(attrgetter(_attr(f.keys[0])), args), dtype, len(args))
    for key in f.keys[1:]:
        unset = np.flatnonzero(np.isnan(values) if f.is_float else values == -1)
        if unset.size:
            later = map(attrgetter(_attr(key)), _take(args, unset))
            values[unset] = np.fromiter(later, dtype, unset.size)
    return values / f.divisor if f.divisor != 1.0 else values


def _append(column: array[Any], values: np.ndarray) -> None:
    """Append a numpy array of the column's type (one copy, no Python objects)."""
    column.frombytes(memoryview(np.ascontiguousarray(values)).cast("B"))  # type: ignore[arg-type]


def _isin(values: np.ndarray, kinds: Iterable[Kind]) -> np.ndarray:
    return member_of(values.view(np.uint8), kinds, 256)


def _product(dims: tuple[int, ...] | None) -> int:
    """grid/block x*y*z, or -1 when not recorded, negative or beyond int64."""
    if not dims or min(dims) < 0:
        return -1
    n = dims[0] * dims[1] * dims[2]
    return n if n <= I64_MAX else -1


# -- reading the file --------------------------------------------------------------------


class _Source:
    """The file's text in blocks (gunzipped when it is gzip, by its magic number), with the
    bytes of the file read so far for a progress bar and a cap on the text's size."""

    def __init__(self, path: Path, max_bytes: int, on_progress: ProgressFn | None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.on_progress = on_progress
        self.stage = f"reading {path.name}"
        self.text_bytes = 0

    def __iter__(self) -> Iterator[bytes | memoryview]:
        p = self.path
        with open_regular(p, TraceError, "trace file") as fh:
            total = os.fstat(fh.fileno()).st_size
            for block in self._blocks(fh):
                self.text_bytes += len(block)
                if self.text_bytes > self.max_bytes:
                    raise over_limit(
                        TraceError,
                        str(p),
                        "trace's JSON text",
                        self.max_bytes,
                        "analyze_trace(path, max_bytes=...) or gpudiag trace --max-gb",
                    )
                report(self.on_progress, self.stage, fh.tell(), total, unit="B")
                yield block
        finish(self.on_progress, self.stage)

    def _blocks(self, fh: Any) -> Iterator[bytes | memoryview]:
        path = self.path
        first = fh.read(BLOCK_BYTES)
        if not first.startswith(_GZIP_MAGIC):
            if first:
                yield first
            # One buffer read into again and again (a fresh 8 MB bytes per block maps fresh
            # pages each time); the reader copies out of it before the next read.
            block = bytearray(BLOCK_BYTES)
            view = memoryview(block)
            n = fh.readinto(block)
            while n:
                yield view[:n]
                n = fh.readinto(block)
            return
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        data = first
        try:
            while True:
                while data:
                    out = inflater.decompress(data, BLOCK_BYTES)
                    data = inflater.unconsumed_tail
                    if out:
                        yield out
                    if inflater.eof:
                        # A second gzip member (concatenated files) starts right after.
                        rest = inflater.unused_data + data
                        if not rest.strip(b"\0"):
                            data = b""
                            break
                        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
                        data = rest
                if inflater.eof:
                    data = fh.read(BLOCK_BYTES)
                    if not data:
                        return
                    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
                    continue
                data = fh.read(BLOCK_BYTES)
                if not data:
                    tail = inflater.flush()
                    if tail:
                        yield tail
                    raise TraceError(
                        f"{path} is a truncated gzip file (it ends before the compressed "
                        "stream does). Copy or export the trace again."
                    )
        except zlib.error as exc:
            raise TraceError(
                f"{path} is not a valid gzip file ({exc}). Re-export it, or gunzip it by hand "
                "to see whether the JSON inside survived."
            ) from None


def _json_error(path: Path, exc: Exception, offset: int) -> TraceError:
    text = str(exc)
    if "truncated" in text.lower() or "unexpected end" in text.lower():
        return TraceError(
            f"{path} ends in the middle of the JSON (truncated near byte {offset:,}): the "
            "profiler's export was probably interrupted. Export the trace again."
        )
    return TraceError(
        f"{path} is not valid Kineto/Chrome-trace JSON ({text}, near byte {offset:,}). "
        "gpudiag reads the files torch.profiler writes (export_chrome_trace or "
        "tensorboard_trace_handler)."
    )


def _decode_metadata(
    path: Path, text: bytes, offset: int, problems: Counter[str]
) -> dict[str, Any]:
    try:
        value = _decode_utf8_safe(_ANY_DECODER, text, problems)
    except msgspec.DecodeError as exc:
        raise _json_error(path, exc, offset) from None
    if not isinstance(value, dict):
        raise TraceError(f"{path}: the top level of the JSON is not an object or event list.")
    return value


_MEMORY_TIMELINE = (
    "a torch.profiler memory timeline (export_memory_timeline's output: bytes per category "
    "over time), not a Kineto trace; gpudiag's trace analysis does not read it. Pass the "
    "trace that export_chrome_trace or tensorboard_trace_handler wrote in the same run"
)
_EXECUTION_TRACE = (
    "a PyTorch execution trace (Chakra / ExecutionTraceObserver: the operator graph, without "
    "kernel timings), not a Kineto trace. Pass the Kineto trace recorded alongside it "
    "(torch.profiler's export_chrome_trace or tensorboard_trace_handler)"
)
_ROCPROFILER = (
    "a rocprofiler-sdk (rocprofv3) JSON file, not a Kineto trace. Profile with "
    "torch.profiler on ROCm (it records HIP kernels into a Kineto trace), or export "
    "rocprofv3's output with --output-format pftrace for Perfetto"
)


def _check_encoding(p: Path, first: bytes) -> bytes:
    """The first block without a UTF-8 byte-order mark; a TraceError for UTF-16/32."""
    if first.startswith(b"\xef\xbb\xbf"):
        return first[3:]
    if first.startswith((b"\xff\xfe", b"\xfe\xff")) or first[:2].count(b"\0") == 1:
        raise TraceError(
            f"{p} is UTF-16/32 text (it was re-saved by an editor or a tool); torch.profiler "
            "writes UTF-8. Re-export the trace, or convert it: iconv -f UTF-16 -t UTF-8."
        )
    return first


def _not_kineto(metadata: Mapping[str, Any]) -> str | None:
    """What a JSON object without trace events is, when it is a known other format."""
    if "rocprofiler-sdk-tool" in metadata:
        return _ROCPROFILER
    if isinstance(metadata.get("nodes"), list) and "schema" in metadata:
        return _EXECUTION_TRACE
    return None


def read_events(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    on_progress: ProgressFn | None = None,
) -> tuple[Events, dict[str, Any], int]:
    """Decode one trace file: its events (columnar), its metadata, its size in bytes.

    Raises ``TraceError`` for a missing, corrupt, truncated, non-JSON or too deeply nested
    file, for a folder or a special file (a FIFO, ``/dev/zero``), for JSON text beyond
    ``max_bytes`` (after gunzip), and for JSON files that are another format (a memory
    timeline, an execution trace, rocprofiler output). Bytes that are not UTF-8, integers
    beyond int64, invalid durations and damaged stretches of events are read around and
    listed in ``metadata["_load_notes"]``. ``on_progress`` hears the megabytes read.
    """
    p = Path(path)
    try:
        return _read_events(p, _Source(p, max_bytes, on_progress))
    except RecursionError:
        raise TraceError(
            f"{p} nests JSON arrays or objects deeper than the decoder allows: torch.profiler "
            "never writes that, so the file is corrupt or not a profiler trace."
        ) from None


def _no_events_key(p: Path) -> TraceError:
    return TraceError(
        f"{p} has no traceEvents list in its first {MAX_EVENT_BYTES >> 20} MB: it is not a "
        "Kineto/Chrome trace (binary data, or another JSON format). gpudiag reads the files "
        "torch.profiler writes (export_chrome_trace or tensorboard_trace_handler)."
    )


def _read_events(p: Path, source: _Source) -> tuple[Events, dict[str, Any], int]:
    columns = _Columns()
    metadata: dict[str, Any] = {}
    buf = b""
    head: bytes | None = None
    top_level_list = False
    splitter: _Splitter | None = None
    first = True
    try:
        for chunk in source:
            if splitter is not None:
                splitter.feed(chunk)
                continue
            block = bytes(chunk)  # until the event list is found: the first block or few
            if first:
                block = _check_encoding(p, block)
                first = False
            buf = buf + block if buf else block
            stripped = buf.lstrip()
            if stripped.startswith(b"["):
                if stripped[1:].lstrip()[:1] in (b"[", b"-") or stripped[1:2].isdigit():
                    raise TraceError(f"{p} is {_MEMORY_TIMELINE}.")
                top_level_list = True
                head = b""
                offset = len(buf) - len(stripped) + 1
                splitter = _Splitter(p, columns, offset)
                splitter.feed(stripped[1:])
            else:
                m = _EVENTS_KEY.search(buf)
                if m is None:
                    if len(buf) > MAX_EVENT_BYTES:
                        raise _no_events_key(p)
                    continue
                head = buf[: m.end()]
                splitter = _Splitter(p, columns, m.end())
                splitter.feed(buf[m.end() :])
            buf = b""
    except TraceError:
        raise
    except MemoryError:
        raise TraceError(f"{p} is too large to decode in this process's memory.") from None

    if first:
        raise TraceError(f"{p} is empty: no JSON in it (the export did not happen or was cut).")
    if head is None or splitter is None:
        # No event list found while streaming: a metadata-only file, or an odd layout.
        metadata = _decode_metadata(p, buf, 0, columns.problems)
        other = _not_kineto(metadata)
        if other is not None:
            raise TraceError(f"{p} is {other}.")
        events = metadata.pop("traceEvents", None)
        if events is not None and not isinstance(events, list):
            raise TraceError(
                f"{p}: traceEvents is a JSON {type(events).__name__}, not a list of events; "
                "the file is not a Kineto trace or was edited."
            )
        if isinstance(events, list):
            columns.add(_loose_events(events, columns.problems))
    else:
        rest, consumed = splitter.rest()
        if top_level_list:
            try:
                columns.add(_decode_events(b"[" + rest, columns.problems))
            except msgspec.DecodeError as exc:
                raise _json_error(p, exc, consumed) from None
        else:
            metadata.update(_decode_metadata(p, head + b"]}", 0, columns.problems))
            metadata.pop("traceEvents", None)
            text = b'{"traceEvents":[' + rest
            try:
                tail = _decode_utf8_safe(_TAIL_DECODER, text, columns.problems)
            except msgspec.ValidationError:
                loose = _decode_metadata(p, text, consumed, columns.problems)
                raw_events = loose.pop("traceEvents", [])
                metadata.update(loose)
                columns.add(_loose_events(raw_events, columns.problems))
            except msgspec.DecodeError as exc:
                raise _json_error(p, exc, consumed) from None
            else:
                columns.add(tail.traceEvents)
                for key in _TAIL_KEYS:
                    value = getattr(tail, key)
                    if value is not None:
                        metadata[key] = value
    if columns.unknown:
        metadata.setdefault("_unknown", dict(columns.unknown))
    notes = _load_notes(columns)
    if notes:
        metadata["_load_notes"] = notes
    size = p.stat().st_size
    return columns.freeze(), metadata, size


class _Splitter:
    """Cuts the text of an event list into blocks of whole events and decodes each.

    A block is cut after the last ``},{`` that decodes; what follows waits for the next block.
    A block that is not valid JSON (a damaged byte) is decoded one event at a time, skipping
    what cannot be read, so each byte is decoded a bounded number of times: a damaged file
    costs about what a clean one does.
    """

    def __init__(self, path: Path, columns: _Columns, offset: int) -> None:
        self.path = path
        self.columns = columns
        # "[" then the text not decoded yet, in buf[:end]. The buffer keeps its size from
        # block to block (a bytearray that shrank and grew again each block would map fresh
        # pages every time: 0.7 s of CPU over a 1.6 GB file).
        self.buf = bytearray(2 * BLOCK_BYTES)
        self.buf[0] = 0x5B
        self.end = 1
        self.offset = offset - 1  # position in the file's text of buf[0]

    def feed(self, block: bytes | memoryview) -> None:
        n = len(block)
        if self.end + n > len(self.buf):
            self.buf.extend(bytes(max(self.end + n - len(self.buf), len(self.buf))))
        self.buf[self.end : self.end + n] = block
        self.end += n
        used = self._decode_complete()
        if used:
            # Keep the "[" in front: the next block's events decode as a list.
            rest = self.end - used
            self.buf[1 : 1 + rest] = self.buf[used : self.end]
            self.end = 1 + rest
            self.offset += used - 1
        elif self.end > MAX_EVENT_BYTES:
            self._damaged(1, self.end - 1)
            raise TraceError(
                f"{self.path}: no event boundary in {MAX_EVENT_BYTES >> 20} MB of the event "
                f"list (from byte {self.offset + 1:,}): the file is damaged or not a Kineto "
                "trace."
            )
        self._check_damage()

    def rest(self) -> tuple[bytes, int]:
        """The text after the last decoded event, and its offset in the file's text."""
        return bytes(self.buf[1 : self.end]), self.offset + 1

    def _decode_complete(self) -> int:
        """Decode every complete event in ``buf[:end]``; the bytes used (0: none)."""
        buf = self.buf
        end = self.end
        for _ in range(_MAX_CUT_TRIES):
            last = _last_boundary(buf, end)
            if last is None:
                break
            cut = last.start() + 1
            closer = buf[cut]
            buf[cut] = 0x5D  # "]": the text up to here is a list of events
            try:
                events = _decode_events(memoryview(buf)[: cut + 1], self.columns.problems)
            except msgspec.DecodeError as exc:
                at = _BYTE_AT.search(str(exc))
                if at is None or int(at.group(1)) >= cut:
                    end = last.start()  # truncated: the cut is inside an event
                    continue
                if "trailing characters" in str(exc):
                    end = int(at.group(1))  # the event list ends before the cut
                    continue
                # A damaged byte before the cut: read this stretch one event at a time.
                self._piecewise(cut)
                return last.end() - 1
            finally:
                buf[cut] = closer
            self.columns.add(events)
            return last.end() - 1  # the "{" that starts the next event
        if self.end > 2 * BLOCK_BYTES:
            # No cut decodes in two blocks' worth of text: a damaged quote made the rest one
            # string, or the like. Read it one event at a time rather than wait for more.
            last = _last_boundary(buf, self.end)
            if last is not None:
                self._piecewise(last.start() + 1)
                return last.end() - 1
        return 0

    def _piecewise(self, cut: int) -> None:
        """Decode ``buf[1:cut]`` one event at a time; skip and count what is damaged."""
        buf = self.buf
        starts = [1] + [m.end() - 1 for m in _BOUNDARY.finditer(buf, 1, cut)]
        ends = [m.start() + 1 for m in _BOUNDARY.finditer(buf, 1, cut)] + [cut]
        events: list[Any] = []
        problems = self.columns.problems
        i = 0
        while i < len(starts):
            j = i
            while True:
                text = memoryview(buf)[starts[i] : ends[j]]
                try:
                    events.append(_decode_utf8_safe(_EVENT_DECODER, text, problems))
                except msgspec.ValidationError:
                    value = _decode_utf8_safe(_ANY_DECODER, text, problems)
                    events += _loose_events([value], problems)
                except msgspec.DecodeError as exc:
                    truncated = _BYTE_AT.search(str(exc)) is None
                    if truncated and j + 1 < len(starts) and j - i < _MAX_JOIN:
                        j += 1  # the piece ends inside this event (a nested object): join more
                        continue
                    self._damaged(starts[i], ends[i] - starts[i])
                    j = i  # skip this piece only
                i = j + 1
                break
        self.columns.add(events)

    def _damaged(self, at: int, nbytes: int) -> None:
        c = self.columns
        c.damaged_events += 1
        c.damaged_bytes += nbytes
        if c.first_damage_at is None:
            c.first_damage_at = self.offset + at

    def _check_damage(self) -> None:
        c = self.columns
        if c.damaged_bytes > MAX_EVENT_BYTES and c.damaged_bytes > len(c.ts) * 64:
            raise TraceError(
                f"{self.path}: most of the event list is not valid JSON ({c.damaged_bytes:,} "
                f"bytes could not be read, from byte {c.first_damage_at:,}): the file is "
                "damaged or not a Kineto trace. Export the trace again."
            )


def _last_boundary(buf: bytearray, end: int) -> re.Match[bytes] | None:
    """The last event boundary in ``buf[1:end]``, searched backwards a window at a time."""
    while end > 1:
        start = max(1, end - _TAIL_WINDOW)
        last = None
        for m in _BOUNDARY.finditer(buf, start, end):
            last = m
        if last is not None:
            return last
        end = start + 8  # search further back (overlap so a match is not split)
        if start == 1:
            return None
    return None


def _load_notes(columns: _Columns) -> list[str]:
    """What was wrong in the file and how it was read around, for the report's notes."""
    notes = []
    problems = columns.problems
    if columns.damaged_events:
        notes.append(
            f"{columns.damaged_events:,} stretches of the event list ({columns.damaged_bytes:,} "
            f"bytes, the first near byte {columns.first_damage_at:,} of the JSON) are not valid "
            "JSON: they were skipped, so the events in them are missing from every figure (the "
            "file was damaged after it was written)."
        )
    if problems[_BAD_UTF8]:
        notes.append(
            "the file holds bytes that are not valid UTF-8: they were replaced with U+FFFD, "
            "so some names may read oddly (the file was probably corrupted or edited)."
        )
    if problems[_NO_TIMESTAMP]:
        notes.append(
            f"{problems[_NO_TIMESTAMP]:,} complete events have no usable timestamp (missing, "
            "not a number, or beyond a float's range): they are left out, so the time they "
            "took is not counted anywhere."
        )
    if problems[_BEYOND_INT64]:
        notes.append(
            f"{problems[_BEYOND_INT64]:,} integer fields (ids, streams, grid sizes, ...) are "
            "beyond the 64-bit range Kineto writes: they were read as not recorded, so the "
            "events they belong to may not be tied to their launches."
        )
    bad = {
        k: problems[k] for k in (_NEGATIVE_DURATION, _NOT_A_DURATION, _HUGE_DURATION, _NO_DURATION)
    }
    if any(bad.values()):
        listed = ", ".join(f"{n:,} with {k}" for k, n in bad.items() if n)
        notes.append(
            f"events with an invalid duration ({listed}; first: "
            f"{columns.bad_duration_example}) were counted as taking 0 us: times that "
            "include them are too low. torch.profiler writes a non-negative number for every "
            "complete event, so the file was probably edited or corrupted."
        )
    return notes


# More ranks than any job has run with: a world size above it is a corrupt field, and
# nothing may be allocated by it.
MAX_WORLD_SIZE = 1 << 20


def _rank_of(metadata: Mapping[str, Any]) -> tuple[int | None, int | None, list[str]]:
    """distributedInfo's rank and world size, each None when absent or implausible (with a
    note saying why)."""
    info = metadata.get("distributedInfo")
    if not isinstance(info, dict):
        return None, None, []
    notes: list[str] = []
    rank, world = info.get("rank"), info.get("world_size")
    if world is not None and not (_is_int64(world) and 1 <= world <= MAX_WORLD_SIZE):
        notes.append(
            f"distributedInfo.world_size is {str(world)[:40]!s}, not a world size (an integer "
            f"from 1 to {MAX_WORLD_SIZE:,}): ignored, so missing ranks cannot be told."
        )
        world = None
    if rank is not None and not (
        _is_int64(rank) and 0 <= rank < (world if world is not None else MAX_WORLD_SIZE)
    ):
        notes.append(
            f"distributedInfo.rank is {str(rank)[:40]!s}, not a rank of this job: ignored "
            "(ranks are given by file order)."
        )
        rank = None
    return rank, world, notes


def load_trace(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    on_progress: ProgressFn | None = None,
) -> RankTrace:
    """Read one trace file into a ``RankTrace`` (see ``read_events`` for the errors)."""
    events, metadata, size = read_events(path, max_bytes=max_bytes, on_progress=on_progress)
    devices_raw = metadata.get("deviceProperties")
    devices = tuple(
        DeviceProperties.from_json(row)
        for row in (devices_raw if isinstance(devices_raw, list) else [])
        if isinstance(row, dict)
    )
    unknown = metadata.pop("_unknown", {})
    load_notes = tuple(metadata.pop("_load_notes", ()))
    rank, world, rank_notes = _rank_of(metadata)
    return RankTrace(
        path=str(path),
        rank=rank,
        world_size=world,
        events=events,
        devices=devices,
        metadata={k: v for k, v in metadata.items() if k != "deviceProperties"},
        unknown_event_types=unknown,
        file_bytes=size,
        load_notes=load_notes + tuple(rank_notes),
    )


def kernel_names(paths: Iterable[str | os.PathLike[str]]) -> set[str]:
    """Every distinct GPU kernel name the trace files recorded, as written in them."""
    names: set[str] = set()
    for path in paths:
        events, _, _ = read_events(path)
        rows = np.unique(events.name[events.kind == _KERNEL])
        names.update(events.names[int(i)] for i in rows if i >= 0)
    return names
