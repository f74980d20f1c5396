"""Reads Kineto traces (.json / .json.gz) in bounded memory into columnar ``RankTrace``s.

The file is decompressed in blocks; each block's complete events are decoded by msgspec
straight into small typed structs that keep only the fields the analyses use, then appended
to flat arrays. A 1 M-event trace therefore never exists as a million Python dicts, nor as
one 300 MB string next to its decoded form.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from gpudiag.analysis.costed_ops import is_costed
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
)
from gpudiag.errors import TraceError

BLOCK_BYTES = 8 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# Where one event object ends and the next begins. A match can also sit inside a nested
# object or a string; decoding the block then fails and an earlier match is tried.
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_STREAM_TID = re.compile(r"stream\s*(\d+)")
_TAIL_WINDOW = 1 << 16
_MAX_CUT_TRIES = 8
_IGNORED = IGNORED_CATEGORIES
_KIND_OF_CATEGORY = {cat: int(kind) for cat, kind in KIND_OF_CATEGORY.items()}
_OTHER = int(Kind.OTHER)
_KERNEL = int(Kind.KERNEL)
_KNOWN_PHASES = frozenset({"s", "f", "t", "i", "I", "C"})  # flows, instants, counters
_CPU_OP = int(Kind.CPU_OP)
_ANNOTATION = int(Kind.ANNOTATION)
# Input lists stay undecoded JSON (a slice of the block) until the event proves to be one of
# the few costed operators: decoding them for every operator would cost time and memory, and
# a Raw field never fails validation, so an odd value cannot push a block onto the slow path.
_NO_RAW = msgspec.Raw()
# Integer columns are int64: a value outside it (a corrupt or hostile file) fails the typed
# decode, and the slow path drops it as "not recorded" instead of overflowing an array.
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
Int64 = Annotated[int, msgspec.Meta(ge=I64_MIN, le=I64_MAX)]


class _Args(msgspec.Struct, gc=False):
    external_id: Int64 | None = msgspec.field(default=None, name="External id")
    external_id_v1: Int64 | None = msgspec.field(default=None, name="external id")
    correlation: Int64 | None = None
    stream: Int64 | None = None
    device: Int64 | None = None
    grid: list[Int64] | None = None
    block: list[Int64] | None = None
    registers_per_thread: Int64 | None = msgspec.field(default=None, name="registers per thread")
    shared_memory: Int64 | None = msgspec.field(default=None, name="shared memory")
    achieved_occupancy_pct: float | None = msgspec.field(
        default=None, name="est. achieved occupancy %"
    )
    nbytes: Int64 | None = msgspec.field(default=None, name="bytes")
    call_stack: str | None = msgspec.field(default=None, name="Call stack")
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    # Collective fields of communication kernels, undecoded for the same reason as the inputs.
    collective_name: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Collective name")
    in_msg_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In msg nelems")
    out_msg_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out msg nelems")
    msg_dtype: msgspec.Raw = msgspec.field(default=_NO_RAW, name="dtype")
    group_size: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Group size")
    pg_name: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Name")


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None
    # Set by the slow path only; no trace writes this key.
    beyond_int64: int = msgspec.field(default=0, name="__gpudiag_beyond_int64__")


class _Tail(msgspec.Struct, gc=False):
    """The end of a trace object: the last events and whatever keys follow the list."""

    traceEvents: list[_Event] = []
    deviceProperties: Any = None
    distributedInfo: Any = None
    traceName: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None


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
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])
_TAIL_DECODER = msgspec.json.Decoder(_Tail)
_ANY_DECODER = msgspec.json.Decoder()


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


def _repair_utf8(text: bytes | bytearray) -> bytes:
    return bytes(text).decode("utf-8", errors="replace").encode("utf-8")


def _decode_utf8_safe(decoder: Any, text: bytes | bytearray, problems: Counter[str]) -> Any:
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


def _op_inputs(a: _Args) -> OpInputs | None:
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


def _comm_args(a: _Args) -> CommArgs | None:
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


def _is_comm(name: str) -> bool:
    return ":" in name[:6] and COMM_ANNOTATION.fullmatch(name) is not None


def _keeps_inputs(name: str) -> bool:
    """Operators whose recorded inputs are kept: costed ones and collective ranges."""
    return is_costed(name) or _is_comm(name)


def _loose_event(raw: Any) -> _Event | None:
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
    parsed_args = None
    if isinstance(args, dict):
        grid, block = args.get("grid"), args.get("block")
        for dims in (grid, block):
            if isinstance(dims, list) and any(
                isinstance(x, int) and not isinstance(x, bool) and not _is_int64(x) for x in dims
            ):
                dropped += 1
        parsed_args = _Args(
            external_id=pick(args, "External id", (int,)),
            external_id_v1=pick(args, "external id", (int,)),
            correlation=pick(args, "correlation", (int,)),
            stream=pick(args, "stream", (int,)),
            device=pick(args, "device", (int,)),
            grid=grid if _int_list(grid) else None,
            block=block if _int_list(block) else None,
            registers_per_thread=pick(args, "registers per thread", (int,)),
            shared_memory=pick(args, "shared memory", (int,)),
            achieved_occupancy_pct=pick(args, "est. achieved occupancy %", (int, float)),
            nbytes=pick(args, "bytes", (int,)),
            call_stack=pick(args, "Call stack", (str,)),
        )
        if "Collective name" in args:
            parsed_args.collective_name = _raw(args.get("Collective name"))
            parsed_args.in_msg_nelems = _raw(args.get("In msg nelems"))
            parsed_args.out_msg_nelems = _raw(args.get("Out msg nelems"))
            parsed_args.msg_dtype = _raw(args.get("dtype"))
            parsed_args.group_size = _raw(args.get("Group size"))
            parsed_args.pg_name = _raw(args.get("Process Group Name"))
        if _keeps_inputs(str(raw.get("name", ""))):
            parsed_args.input_dims = _raw(args.get("Input Dims"))
            parsed_args.input_type = _raw(args.get("Input type"))
            parsed_args.concrete_inputs = _raw(args.get("Concrete Inputs"))
    ts = _as_float(raw.get("ts"))
    dur = _as_float(raw.get("dur"))
    if dur is None and "dur" in raw:
        dur = math.nan  # present but not a number: counted as a bad duration, not "missing"
    pid, tid = pick(raw, "pid", (int, str)), pick(raw, "tid", (int, str))
    return _Event(
        ph=str(raw.get("ph", "")),
        cat=str(raw.get("cat", "")),
        name=str(raw.get("name", "")),
        pid=0 if pid is None else pid,
        tid=0 if tid is None else tid,
        ts=None if ts is None or not math.isfinite(ts) else ts,
        dur=dur,
        args=parsed_args,
        beyond_int64=dropped,
    )


def _loose_events(raws: Any, problems: Counter[str]) -> list[_Event]:
    """Events from a decoded JSON list by the slow path (non-events are skipped)."""
    if not isinstance(raws, list):
        return []
    events = [e for raw in raws if (e := _loose_event(raw)) is not None]
    dropped = sum(e.beyond_int64 for e in events)
    if dropped:
        problems[_BEYOND_INT64] += dropped
    return events


def _decode_events(text: bytes | bytearray, problems: Counter[str]) -> list[_Event]:
    """Decode a JSON array of events; ``msgspec.DecodeError`` if it is not valid JSON."""
    try:
        events: list[_Event] = _decode_utf8_safe(_EVENTS_DECODER, text, problems)
        return events
    except msgspec.ValidationError:
        # Valid JSON, unexpected types somewhere (a string stream id, a float id, an
        # integer beyond int64, ...).
        return _loose_events(_decode_utf8_safe(_ANY_DECODER, text, problems), problems)


class _Columns:
    """Growing arrays for one trace; ``add`` takes a decoded block of events."""

    def __init__(self) -> None:
        self.kind = array("b")
        self.name = array("i")
        self.thread = array("i")
        self.ts = array("d")
        self.dur = array("d")
        self.correlation = array("q")
        self.external_id = array("q")
        self.stream = array("q")
        self.device = array("q")
        self.extra = array("q")
        self.names: dict[str, int] = {}
        self.threads: dict[tuple[int | str, int | str], int] = {}
        self.stacks: dict[int, str] = {}
        self.inputs: dict[int, OpInputs] = {}
        self.comm_args: dict[int, CommArgs] = {}
        # The same layer records the same inputs every step: one shared record per spelling.
        self._seen_inputs: dict[tuple[bytes, bytes, bytes], OpInputs | None] = {}
        # Whether an operator's inputs are kept, once per distinct name.
        self._keeps: dict[str, bool] = {}
        self.unknown: Counter[str] = Counter()
        # What was wrong with the file but could be read around (the report's notes say it).
        self.problems: Counter[str] = Counter()
        self.bad_duration_example: str | None = None
        self.blocks = array("q")
        self.threads_per_block = array("q")
        self.registers = array("q")
        self.smem = array("q")
        self.nbytes = array("q")
        self.kineto_occupancy = array("d")
        self.grid: list[tuple[int, int, int] | None] = []
        self.block: list[tuple[int, int, int] | None] = []
        self.metadata_events = 0

    def add(self, events: list[_Event]) -> None:
        """Append a decoded block. Column by column: a list comprehension per field is
        several times faster than appending every field of every event in one loop."""
        phases = Counter([e.ph for e in events])
        for ph, count in phases.items():
            if ph == "M":
                self.metadata_events += count
            elif ph != "X" and ph not in _KNOWN_PHASES:
                self.unknown[f"ph={ph or '?'}"] += count
        complete = (
            events if phases.get("X", 0) == len(events) else [e for e in events if e.ph == "X"]
        )
        xs = [e for e in complete if e.ts is not None and e.cat not in _IGNORED]
        if len(xs) != len(complete):
            missing = sum(1 for e in complete if e.ts is None)
            if missing:
                self.problems[_NO_TIMESTAMP] += missing
        if not xs:
            return
        first_row = len(self.ts)
        kind_of = _KIND_OF_CATEGORY
        kinds = [kind_of.get(e.cat, _OTHER) for e in xs]
        if _OTHER in kinds:
            self.unknown.update(
                f"cat={e.cat or '?'}" for e, k in zip(xs, kinds, strict=True) if k == _OTHER
            )
        names, threads = self.names, self.threads
        self.kind.fromlist(kinds)
        self.name.fromlist([names.setdefault(e.name, len(names)) for e in xs])
        self.thread.fromlist([threads.setdefault((e.pid, e.tid), len(threads)) for e in xs])
        self.ts.fromlist([e.ts for e in xs])  # type: ignore[misc]
        durs = [e.dur for e in xs]
        top = MAX_DURATION_US
        self.dur.fromlist([d if d is not None and 0.0 < d <= top else 0.0 for d in durs])
        bad = [i for i, d in enumerate(durs) if d is None or not 0.0 <= d <= top]
        if bad:
            self._count_bad_durations(xs, durs, bad)
        args = [e.args for e in xs]
        self.correlation.fromlist(
            [-1 if a is None or a.correlation is None else a.correlation for a in args]
        )
        self.external_id.fromlist(
            [
                -1
                if a is None
                else (
                    a.external_id
                    if a.external_id is not None
                    else (-1 if a.external_id_v1 is None else a.external_id_v1)
                )
                for a in args
            ]
        )
        n = len(xs)
        stream = [-1] * n
        device = [-1] * n
        extra = [-1] * n
        for i, k in enumerate(kinds):
            if k >= _KERNEL:
                a = args[i]
                if a is not None:
                    stream[i], device[i], extra[i] = self._add_gpu(xs[i], a, k)
                    if k == _KERNEL and a.collective_name:
                        found = _comm_args(a)
                        if found is not None:
                            self.comm_args[first_row + i] = found
        self.stream.fromlist(stream)
        self.device.fromlist(device)
        self.extra.fromlist(extra)
        for i, a in enumerate(args):
            if a is not None and a.call_stack:
                name = xs[i].name
                if (
                    name in SYNC_RUNTIME_NAMES
                    or name in SYNC_CONTEXT_OPS
                    or name in ASYNC_COPY_RUNTIME_NAMES
                ):
                    self.stacks[first_row + i] = a.call_stack
        seen, keeps = self._seen_inputs, self._keeps
        for name in {e.name for e in xs}.difference(keeps):
            keeps[name] = _keeps_inputs(name)
        for i in [i for i, e in enumerate(xs) if keeps[e.name]]:
            a = args[i]
            if a is None or kinds[i] not in (_CPU_OP, _ANNOTATION):
                continue
            key = (bytes(a.input_dims), bytes(a.input_type), bytes(a.concrete_inputs))
            if key in seen:
                inputs = seen[key]
            else:
                inputs = seen[key] = _op_inputs(a)
            if inputs is not None:
                self.inputs[first_row + i] = inputs

    def _count_bad_durations(
        self, xs: list[_Event], durs: list[float | None], bad: list[int]
    ) -> None:
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

    def _add_gpu(self, e: _Event, a: _Args, kind: int) -> tuple[int, int, int]:
        """(stream, device, launch-table row) of a GPU event; records its launch arguments."""
        stream = a.stream
        if stream is None:
            m = _STREAM_TID.match(str(e.tid))
            stream = int(m.group(1)) if m else (e.tid if isinstance(e.tid, int) else -1)
            if not I64_MIN <= stream <= I64_MAX:
                stream = -1
        device = a.device if a.device is not None else (e.pid if isinstance(e.pid, int) else -1)
        if kind == Kind.GPU_SYNC or kind == Kind.GPU_ANNOTATION:
            return stream, device, -1
        row = len(self.blocks)
        grid = tuple(a.grid[:3]) if a.grid and len(a.grid) >= 3 else None
        block = tuple(a.block[:3]) if a.block and len(a.block) >= 3 else None
        self.grid.append(grid)  # type: ignore[arg-type]
        self.block.append(block)  # type: ignore[arg-type]
        self.blocks.append(_product(grid))
        self.threads_per_block.append(_product(block))
        self.registers.append(-1 if a.registers_per_thread is None else a.registers_per_thread)
        self.smem.append(-1 if a.shared_memory is None else a.shared_memory)
        self.nbytes.append(-1 if a.nbytes is None else a.nbytes)
        occ = a.achieved_occupancy_pct
        self.kineto_occupancy.append(float("nan") if occ is None else occ / 100.0)
        return stream, device, row

    def freeze(self) -> Events:
        def np_of(values: array[Any], dtype: Any) -> Any:
            return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype)

        launches = LaunchTable(
            blocks=np_of(self.blocks, np.int64),
            threads_per_block=np_of(self.threads_per_block, np.int64),
            registers_per_thread=np_of(self.registers, np.int64),
            shared_memory_bytes=np_of(self.smem, np.int64),
            nbytes=np_of(self.nbytes, np.int64),
            kineto_achieved_occupancy=np_of(self.kineto_occupancy, np.float64),
            grid=tuple(self.grid),
            block=tuple(self.block),
        )
        kind = np_of(self.kind, np.int8).copy()
        step_ids = [i for n, i in self.names.items() if n.startswith(STEP_PREFIX)]
        if step_ids:
            # ProfilerStep#N is a user_annotation in new traces, an "Operator" in old ones.
            name_col = np_of(self.name, np.int32)
            host = np.isin(kind, np.array([Kind.CPU_OP, Kind.ANNOTATION, Kind.OTHER], np.int8))
            kind[host & np.isin(name_col, np.array(step_ids, np.int32))] = Kind.STEP
        return Events(
            kind=kind,
            name=np_of(self.name, np.int32),
            thread=np_of(self.thread, np.int32),
            ts=np_of(self.ts, np.float64),
            dur=np_of(self.dur, np.float64),
            correlation=np_of(self.correlation, np.int64),
            external_id=np_of(self.external_id, np.int64),
            stream=np_of(self.stream, np.int64),
            device=np_of(self.device, np.int64),
            extra=np_of(self.extra, np.int64),
            names=tuple(self.names),
            threads=tuple((str(p), str(t)) for p, t in self.threads),
            launches=launches,
            stacks=dict(self.stacks),
            inputs=dict(self.inputs),
            comm_args=dict(self.comm_args),
        )


def _product(dims: tuple[int, ...] | None) -> int:
    """grid/block x*y*z, or -1 when not recorded, negative or beyond int64."""
    if not dims or min(dims) < 0:
        return -1
    n = dims[0] * dims[1] * dims[2]
    return n if n <= I64_MAX else -1


def _blocks(path: Path) -> Iterator[bytes]:
    """The file's bytes, gunzipped when it is gzip (by its magic number, not its name)."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}. Check the path.") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror or exc}.") from None
    with fh:
        first = fh.read(BLOCK_BYTES)
        if not first.startswith(_GZIP_MAGIC):
            while first:
                yield first
                first = fh.read(BLOCK_BYTES)
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


def read_events(path: str | os.PathLike[str]) -> tuple[Events, dict[str, Any], int]:
    """Decode one trace file: its events (columnar), its metadata, its size in bytes.

    Raises ``TraceError`` for a missing, corrupt, truncated, non-JSON or too deeply nested
    file, and for JSON files that are another format (a memory timeline, an execution trace,
    rocprofiler output). Bytes that are not UTF-8, integers beyond int64 and invalid
    durations are read around and listed in ``metadata["_load_notes"]``.
    """
    p = Path(path)
    try:
        return _read_events(p)
    except RecursionError:
        raise TraceError(
            f"{p} nests JSON arrays or objects deeper than the decoder allows: torch.profiler "
            "never writes that, so the file is corrupt or not a profiler trace."
        ) from None


def _read_events(p: Path) -> tuple[Events, dict[str, Any], int]:
    columns = _Columns()
    metadata: dict[str, Any] = {}
    buf = b""
    head: bytes | None = None
    top_level_list = False
    consumed = 0  # bytes of decompressed text already decoded, for error offsets
    first = True
    try:
        for block in _blocks(p):
            if first:
                block = _check_encoding(p, block)
                first = False
            buf = buf + block if buf else block
            if head is None:
                stripped = buf.lstrip()
                if stripped.startswith(b"["):
                    if stripped[1:].lstrip()[:1] in (b"[", b"-") or stripped[1:2].isdigit():
                        raise TraceError(f"{p} is {_MEMORY_TIMELINE}.")
                    top_level_list = True
                    head = b""
                    consumed += len(buf) - len(stripped) + 1
                    buf = stripped[1:]
                else:
                    m = _EVENTS_KEY.search(buf)
                    if m is None:
                        continue
                    head, buf = buf[: m.end()], buf[m.end() :]
                    consumed += len(head)
            buf, used = _decode_complete_events(buf, columns)
            consumed += used
    except TraceError:
        raise
    except MemoryError:
        raise TraceError(f"{p} is too large to decode in this process's memory.") from None

    if first:
        raise TraceError(f"{p} is empty: no JSON in it (the export did not happen or was cut).")
    if head is None:
        # No event list found while streaming: a metadata-only file, or an odd layout.
        metadata = _decode_metadata(p, buf, consumed, columns.problems)
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
        if top_level_list:
            try:
                columns.add(_decode_events(b"[" + buf, columns.problems))
            except msgspec.DecodeError as exc:
                raise _json_error(p, exc, consumed) from None
        else:
            metadata.update(_decode_metadata(p, head + b"]}", 0, columns.problems))
            metadata.pop("traceEvents", None)
            text = b'{"traceEvents":[' + buf
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
                for key in _Tail.__struct_fields__[1:]:
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


def _load_notes(columns: _Columns) -> list[str]:
    """What was wrong in the file and how it was read around, for the report's notes."""
    notes = []
    problems = columns.problems
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


def _decode_complete_events(buf: bytes, columns: _Columns) -> tuple[bytes, int]:
    """Decode every complete event at the start of ``buf``; return the rest and bytes used."""
    end = len(buf)
    tries = 0
    while tries < _MAX_CUT_TRIES and end > 0:
        start = max(0, end - _TAIL_WINDOW)
        last = None
        for m in _BOUNDARY.finditer(buf, start, end):
            last = m
        if last is None:
            if start == 0:
                return buf, 0
            end = start + 8  # search further back (overlap so a match is not split)
            continue
        cut = last.start() + 1
        try:
            events = _decode_events(b"[" + buf[:cut] + b"]", columns.problems)
        except msgspec.DecodeError:
            tries += 1
            end = last.start()
            continue
        columns.add(events)
        nxt = last.end() - 1  # the "{" that starts the next event
        return buf[nxt:], nxt
    return buf, 0


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


def load_trace(path: str | os.PathLike[str]) -> RankTrace:
    """Read one trace file into a ``RankTrace`` (see ``read_events`` for the errors)."""
    events, metadata, size = read_events(path)
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
