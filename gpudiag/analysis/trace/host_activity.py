"""What the host was doing, by the names of its recorded events: waiting on the DataLoader,
compiling or capturing (warm-up), or waiting for another rank.

The time ledger reads these to say why the GPU sat idle. Names are matched once per distinct
name, never per event, so a million-event trace costs one regex pass over its few thousand
distinct names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import numpy as np

from gpudiag.analysis.trace.intervals import merge
from gpudiag.analysis.trace.model import (
    DATALOADER_PREFIX,
    F64,
    I32,
    I64,
    LAUNCH_RUNTIME_NAMES,
    Bool,
    Events,
    Kind,
)

# torch.compile (Dynamo, AOTAutograd, Inductor, Triton's compiler and autotuner), CUDA/HIP
# graph capture, lazy module loading and allocator growth, and ranges the user named a
# warm-up. Runtime pieces of the same libraries (a compiled graph's call, Dynamo's guard
# check, a graph replay, Inductor's kernel launcher) are not warm-up and are left out.
WARMUP = re.compile(
    r"\(dynamo_timed\)|^TorchDynamo Compile|_compile\.compile_inner|compile_fx|"
    r"create_aot_dispatcher|call_user_compiler|async_compile|benchmark_all_configs|"
    r"autotune_to_one_config|torch/_dynamo/convert_frame\.py|"
    r"torch/_inductor/(?:compile_fx|codecache|graph|lowering|scheduler|codegen|async_compile|"
    r"select_algorithm|autotune_process|compile_worker)|torch/_functorch/aot_autograd\.py|"
    r"triton/compiler/compiler\.py\(\d+\): compile|torch/cuda/graphs\.py\(\d+\): (?!replay)|"
    r"cudagraph_trees\.py\(\d+\): (?:_record|record_function|warmup|run_eager|_run_eager)|"
    r"^(?:cuda|hip|cu)StreamBeginCapture|^(?:cuda|hip|cu)StreamEndCapture|"
    r"^(?:cuda|hip|cu)GraphInstantiate|^cuModuleLoad|^cuLibraryLoad|^hipModuleLoad|"
    r"^(?:cuda|hip)Malloc$|^(?:cuda|hip)Free$|^cuMemAlloc|\bwarm-?up\b",
    re.IGNORECASE,
)
# The DataLoader's __next__ as torch.profiler records it ("enumerate(DataLoader)#..."), and as
# a Python frame when the profile has stacks but no such range.
DATALOADER = re.compile(
    re.escape(DATALOADER_PREFIX) + r"|torch/utils/data/dataloader\.py\(\d+\): __next__"
)
# Host calls that block until other ranks arrive: gloo / UCC / MPI collectives run on the host
# (their record_function range is the collective's execution), barriers, and waits on a
# process group's work object.
PEER_WAIT = re.compile(
    r"^(?:gloo|ucc|mpi):\w+|^c10d::(?:barrier|monitored_barrier|wait)\b|Work\w*::wait\b"
)


def name_ids(events: Events, pattern: re.Pattern[str]) -> I32:
    """Ids (into ``events.names``) of the names the pattern finds."""
    found = [i for i, n in enumerate(events.names) if pattern.search(n)]
    return np.array(found, dtype=np.int32)


_HOST_KINDS = np.array(
    [Kind.CPU_OP, Kind.ANNOTATION, Kind.RUNTIME, Kind.PYTHON, Kind.STEP, Kind.OTHER], np.int8
)


def host_rows(events: Events, pattern: re.Pattern[str]) -> I64:
    """Host events (any thread) whose names the pattern finds."""
    ids = name_ids(events, pattern)
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(events.kind_in(_HOST_KINDS) & events.name_in(ids))


# Rows taken at a time where a union or an overlap runs over millions of host events: the
# temporaries stay a few MB (a multi-GB trace's host rows would take 200 MB at once).
CHUNK_ROWS = 1 << 18


def row_chunks(mask: Bool) -> Iterator[I64]:
    """The rows ``mask`` selects, in order, a bounded slice of the events at a time."""
    for lo in range(0, mask.size, CHUNK_ROWS):
        rows = np.flatnonzero(mask[lo : lo + CHUNK_ROWS])
        if rows.size:
            yield rows + lo


def spans(events: Events, rows: I64) -> tuple[F64, F64]:
    """The union of the rows' time ranges."""
    if rows.size <= CHUNK_ROWS:
        return merge(events.ts[rows], events.ts[rows] + events.dur[rows])
    return _merged(events, (rows[lo : lo + CHUNK_ROWS] for lo in range(0, rows.size, CHUNK_ROWS)))


def spans_where(events: Events, mask: Bool) -> tuple[F64, F64]:
    """The union of the time ranges of the rows ``mask`` selects."""
    return _merged(events, row_chunks(mask))


def _merged(events: Events, chunks: Iterable[I64]) -> tuple[F64, F64]:
    """The union of the rows' ranges, merged a chunk at a time, then the chunks' unions: the
    union does not depend on the grouping, and each merged interval starts at its earliest
    start and ends at its latest end, so the result is the same arrays as one merge."""
    parts = [merge(events.ts[r], events.ts[r] + events.dur[r]) for r in chunks]
    if not parts:
        return np.zeros(0), np.zeros(0)
    if len(parts) == 1:
        return parts[0]
    return merge(np.concatenate([s for s, _ in parts]), np.concatenate([e for _, e in parts]))


def inside(spans_: tuple[F64, F64], start: float, end: float) -> bool:
    """Whether ``[start, end)`` lies within one of the (merged) spans."""
    starts, ends = spans_
    i = int(np.searchsorted(starts, start, side="right")) - 1
    return i >= 0 and end <= float(ends[i])


# A launch call takes microseconds; the first launch of a kernel that takes a millisecond or
# more is loading the kernel's module (CUDA's lazy loading, HIP's code objects): warm-up. A
# later long launch is the launch queue being full (the host far ahead), not warm-up.
LAZY_LOAD_US = 1000.0
_KERNEL_LAUNCHES = LAUNCH_RUNTIME_NAMES - {"cudaGraphLaunch", "hipGraphLaunch"}


def _first_launches_loading(events: Events) -> I64:
    """Launch calls of at least LAZY_LOAD_US whose kernel runs for the first time."""
    ids = np.array([i for i, n in enumerate(events.names) if n in _KERNEL_LAUNCHES], dtype=np.int32)
    slow = np.flatnonzero(
        (events.kind == Kind.RUNTIME)
        & events.name_in(ids)
        & (events.dur >= LAZY_LOAD_US)
        & (events.correlation >= 0)
    )
    if slow.size == 0:
        return slow
    kernels = np.flatnonzero(events.kind == Kind.KERNEL)
    kernels = kernels[np.argsort(events.ts[kernels], kind="stable")]
    _, first = np.unique(events.name[kernels], return_index=True)
    firsts = events.correlation[kernels[first]]
    return slow[np.isin(events.correlation[slow], firsts[firsts >= 0])]


def warmup_rows(events: Events) -> I64:
    """Host events of compilation, graph capture and lazy initialisation: the ``WARMUP``
    names, and a kernel's first launch when it is long enough to be loading its module."""
    return np.union1d(host_rows(events, WARMUP), _first_launches_loading(events))
