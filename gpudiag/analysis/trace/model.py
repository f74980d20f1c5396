"""The decoded trace of one rank: columnar event arrays, device properties and metadata."""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]
# Ids and row numbers as the loader keeps them: the narrowest of int16, int32 and int64 that
# every value of the column fits.
Ids = npt.NDArray[np.int16] | npt.NDArray[np.int32] | npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]


class Kind(enum.IntEnum):
    """What an event is, whatever spelling its Kineto version used for the category."""

    OTHER = 0  # a complete ("X") event of a category gpudiag does not analyse
    CPU_OP = 1  # an ATen operator ("cpu_op", old "Operator")
    ANNOTATION = 2  # record_function ranges ("user_annotation")
    RUNTIME = 3  # CUDA runtime / driver API calls ("cuda_runtime", old "Runtime")
    PYTHON = 4  # Python frames recorded with with_stack ("python_function")
    STEP = 5  # ProfilerStep#N, whatever its category
    KERNEL = 6  # GPU kernels ("kernel", old "Kernel")
    MEMCPY = 7  # ("gpu_memcpy", old "Memcpy")
    MEMSET = 8  # ("gpu_memset", old "Memset")
    GPU_SYNC = 9  # synchronisation seen from the GPU side ("cuda_sync")
    GPU_ANNOTATION = 10  # record_function ranges projected on a stream ("gpu_user_annotation")


# Category spellings across Kineto versions (2021 traces capitalise them).
KIND_OF_CATEGORY: dict[str, Kind] = {
    "cpu_op": Kind.CPU_OP,
    "Operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "cuda_runtime": Kind.RUNTIME,
    "Runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
    "python_function": Kind.PYTHON,
    "kernel": Kind.KERNEL,
    "Kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "Memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "Memset": Kind.MEMSET,
    "cuda_sync": Kind.GPU_SYNC,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
}
# ``record_function`` ranges torch.distributed opens around a collective ("nccl:all_reduce",
# "gloo:all_gather"): the loader keeps their recorded inputs (the message), and the collective
# analysis reads them. For gloo the range is the collective's execution on its worker thread.
COMM_ANNOTATION = re.compile(r"(nccl|gloo|ucc|mpi|xccl|rccl):([A-Za-z_]+)")

# Categories that are known and deliberately not analysed (not "unknown event types").
IGNORED_CATEGORIES: frozenset[str] = frozenset(
    {"Trace", "ac2g", "async", "fwdbwd", "async_cpu_to_gpu", "cuda_profiler_range"}
)
GPU_KINDS: tuple[Kind, ...] = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_SYNC)
# Kinds that run work on a stream (the idle-time breakdown walks these, as HTA does).
GPU_WORK_KINDS: tuple[Kind, ...] = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
HOST_KINDS: tuple[Kind, ...] = (
    Kind.CPU_OP,
    Kind.ANNOTATION,
    Kind.RUNTIME,
    Kind.PYTHON,
    Kind.STEP,
    Kind.OTHER,
)


@dataclass(frozen=True)
class DeviceProperties:
    """One GPU as the trace's ``deviceProperties`` records it (CUDA's cudaDeviceProp names)."""

    id: int
    name: str
    compute_capability: tuple[int, int] | None
    num_sms: int | None
    total_memory_bytes: int | None
    max_threads_per_sm: int | None
    registers_per_sm: int | None
    shared_memory_per_sm_bytes: int | None
    shared_memory_per_block_optin_bytes: int | None
    warp_size: int | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> DeviceProperties:
        def num(key: str) -> int | None:
            # A negative, non-finite or absurd figure (a corrupt file) is "not recorded".
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return None
            return int(value) if 0 <= value <= 1 << 53 else None

        major, minor = num("computeMajor"), num("computeMinor")
        return cls(
            id=num("id") or 0,
            name=str(row.get("name", "unknown GPU")),
            compute_capability=(major, minor) if major is not None and minor is not None else None,
            num_sms=num("numSms"),
            total_memory_bytes=num("totalGlobalMem"),
            max_threads_per_sm=num("maxThreadsPerMultiprocessor"),
            registers_per_sm=num("regsPerMultiprocessor"),
            shared_memory_per_sm_bytes=num("sharedMemPerMultiprocessor"),
            shared_memory_per_block_optin_bytes=num("sharedMemPerBlockOptin"),
            warp_size=num("warpSize"),
            raw=dict(row),
        )

    def spec(self) -> Any:
        """This device's row of the spec table (``gpudiag.specs.GpuSpec``: NVIDIA by name, AMD
        Instinct by name or by compute units and memory); None when the table lacks it."""
        from gpudiag import specs

        return specs.lookup_device(
            self.name, sm_count=self.num_sms, memory_bytes=self.total_memory_bytes
        )

    def roofline_system(self) -> Any:
        """What ``gd.roofline`` takes for this device: its name where the spec table knows it
        by that name (an NVIDIA GPU, whose recorded name is the more precise), else its row (an
        AMD Instinct, matched by name or by size), else the name."""
        spec = self.spec()
        return spec if spec is not None and spec.vendor != "nvidia" else self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "compute_capability": list(self.compute_capability)
            if self.compute_capability
            else None,
            "num_sms": self.num_sms,
            "total_memory_bytes": self.total_memory_bytes,
            "max_threads_per_sm": self.max_threads_per_sm,
            "registers_per_sm": self.registers_per_sm,
            "shared_memory_per_sm_bytes": self.shared_memory_per_sm_bytes,
            "shared_memory_per_block_optin_bytes": self.shared_memory_per_block_optin_bytes,
            "warp_size": self.warp_size,
        }


@dataclass(frozen=True, eq=False)
class LaunchTable:
    """Launch arguments of GPU events (kernels, memcpy, memset), indexed by ``Events.extra``."""

    blocks: I64  # grid x*y*z; -1 when not recorded
    threads_per_block: I64  # block x*y*z; -1 when not recorded
    registers_per_thread: I64  # -1 when not recorded
    shared_memory_bytes: I64  # static + dynamic, -1 when not recorded
    nbytes: I64  # memcpy/memset size, -1 when not recorded
    kineto_achieved_occupancy: F64  # Kineto's "est. achieved occupancy %" / 100, NaN if absent
    grid: tuple[tuple[int, int, int] | None, ...]
    block: tuple[tuple[int, int, int] | None, ...]
    # Every launch field the loader keeps, by name (``schema.LAUNCH_FIELDS``): the typed
    # columns above and any added there.
    columns: Mapping[str, npt.NDArray[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class OpInputs:
    """What Kineto recorded about a costed operator's inputs (``record_shapes=True``).

    One entry per input, in order: ``dims`` is () for a scalar, None or a tensor list (whose
    dims are dropped); ``types`` and ``concrete`` are "" where not recorded. A field is None
    when the trace has no such list, or a malformed one.
    """

    dims: tuple[tuple[int, ...], ...] | None
    types: tuple[str, ...] | None
    concrete: tuple[str, ...] | None


@dataclass(frozen=True)
class CommArgs:
    """What newer PyTorch (2.1+) records on a communication kernel: the collective, its message
    in elements, the element type, the process group and its size. None/"" where not recorded."""

    collective: str
    in_nelems: int | None
    out_nelems: int | None
    dtype: str
    group_size: int | None
    process_group: str


@dataclass(frozen=True, eq=False)
class Events:
    """Every complete event of one trace file as parallel arrays (one row per event).

    Integer columns use -1 for "not recorded". ``name`` and ``thread`` index ``names`` and
    ``threads``. Times are microseconds on the trace's own clock.
    """

    kind: I8
    name: Ids
    thread: Ids
    ts: F64
    dur: F64
    correlation: Ids
    stream: Ids
    device: Ids
    extra: Ids
    names: tuple[str, ...]
    threads: tuple[tuple[str, str], ...]
    launches: LaunchTable
    stacks: Mapping[int, str]  # event row -> "Call stack" arg, kept for sync events only
    # event row -> input shapes, for the few operators the roofline can cost
    # (costed_ops.is_costed: COSTED_OPS and custom operators named like a matrix product)
    # and the collective ranges (COMM_ANNOTATION)
    inputs: Mapping[int, OpInputs] = field(default_factory=dict)
    # event row -> the collective a communication kernel belongs to (newer traces only)
    comm_args: Mapping[int, CommArgs] = field(default_factory=dict)
    # Every per-row args field the loader keeps, by name (``schema.ROW_FIELDS``): the typed
    # columns above (correlation, stream, device) and any added there.
    columns: Mapping[str, npt.NDArray[Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @classmethod
    def empty(cls) -> Events:
        """No events (what a trace's header keeps once its rank has been analysed)."""
        i64: I64 = np.zeros(0, np.int64)
        f64: F64 = np.zeros(0, np.float64)
        i32: I32 = np.zeros(0, np.int32)
        launches = LaunchTable(i64, i64, i64, i64, i64, f64, (), ())
        kind: I8 = np.zeros(0, np.int8)
        return cls(kind, i32, i32, f64, f64, i64, i64, i64, i64, (), (), launches, {})

    @property
    def end(self) -> F64:
        return self.ts + self.dur

    def rows(self, *kinds: Kind) -> I64:
        """Row indices of events of the given kinds, in file order."""
        return np.flatnonzero(self.kind_in(kinds))

    # Membership tests over whole columns look the values up in a table of every id, as
    # np.isin would not: it sorts or offsets a copy of the column (50 MB and 0.1 s on a
    # 4-million-event trace, against 4 MB and 10 ms).
    def kind_in(self, kinds: Iterable[int]) -> Bool:
        """Whether each row is of one of ``kinds``."""
        return member_of(self.kind.view(np.uint8), kinds, 256)

    def name_in(self, ids: Iterable[int] | np.ndarray) -> Bool:
        """Whether each row's name is one of ``ids`` (indices into ``names``)."""
        return member_of(self.name, ids, len(self.names))

    def thread_in(self, ids: Iterable[int] | np.ndarray) -> Bool:
        """Whether each row's thread is one of ``ids`` (indices into ``threads``)."""
        return member_of(self.thread, ids, len(self.threads))


def member_of(values: np.ndarray, ids: Iterable[int] | np.ndarray, size: int) -> Bool:
    """Whether each of ``values`` (ids from 0 to ``size`` - 1) is one of ``ids``: the same as
    ``np.isin(values, ids)``, by a table lookup."""
    table = np.zeros(size, dtype=bool)
    chosen = np.fromiter(ids, np.int64) if not isinstance(ids, np.ndarray) else ids
    if chosen.size:
        table[chosen] = True
    out: Bool = table[values]
    return out


@dataclass(frozen=True, eq=False)
class RankTrace:
    """One decoded trace file: its events, its GPUs and what the file says about itself."""

    path: str
    rank: int | None
    world_size: int | None
    events: Events
    devices: tuple[DeviceProperties, ...]
    metadata: Mapping[str, Any]
    unknown_event_types: Mapping[str, int]  # "ph/cat" -> count, for the report's notes
    file_bytes: int
    load_notes: tuple[str, ...] = ()  # what was wrong in the file and how it was read around


# Host calls that block the CPU until the GPU catches up (CUDA and HIP runtime names).
SYNC_RUNTIME_NAMES: frozenset[str] = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",  # the synchronous (non-Async) copy
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipCtxSynchronize",
        "hipMemcpy",
        # HIP's copy on a stream returns once the copy is done: PyTorch's blocking copies
        # (``.item()``, ``.cpu()``) on ROCm.
        "hipMemcpyWithStream",
    }
)
# Asynchronous copy calls that still block the host when one side is pageable host memory:
# "for transfers between device memory and pageable host memory, the function might be
# synchronous with respect to host" (CUDA runtime API, "API synchronization behavior"); a
# device-to-host copy into pageable memory returns only once the copy is done, so after every
# earlier piece of work on its stream. The trace tells which ones did: the memcpy the call
# launched (same correlation id) names a Pageable side, and the call's duration is the wait.
ASYNC_COPY_RUNTIME_NAMES: frozenset[str] = frozenset(
    {
        "cudaMemcpyAsync",
        "cudaMemcpy2DAsync",
        "cudaMemcpy3DAsync",
        "cuMemcpyAsync",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyHtoDAsync_v2",
        "hipMemcpyAsync",
        "hipMemcpy2DAsync",
        "hipMemcpyDtoHAsync",
        "hipMemcpyHtoDAsync",
    }
)
# Host calls that launch GPU work (a kernel, or a CUDA/HIP graph's kernels).
LAUNCH_RUNTIME_NAMES: frozenset[str] = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaGraphLaunch",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipModuleLaunchKernel",
        "hipGraphLaunch",
    }
)
# ATen operators that copy a GPU scalar to the host (``.item()``, ``bool(t)``, ``int(t)``).
SYNC_OP_NAMES: frozenset[str] = frozenset({"aten::_local_scalar_dense"})
STEP_PREFIX = "ProfilerStep#"
DATALOADER_PREFIX = "enumerate(DataLoader)"
# Operators inside which a sync call usually happens; their "Call stack" is kept so that a
# sync recorded without its own stack can borrow its operator's.
SYNC_CONTEXT_OPS: frozenset[str] = SYNC_OP_NAMES | frozenset(
    {
        "aten::copy_",
        "aten::to",
        "aten::_to_copy",
        "aten::item",
        "aten::nonzero",
        "aten::is_nonzero",
        "aten::equal",
        "aten::masked_select",
        "aten::unique",
        "aten::_unique2",
        "aten::repeat_interleave",
    }
)


def dense_codes(ids: npt.NDArray[np.integer[Any]]) -> tuple[I64, I64]:
    """``np.unique(ids, return_inverse=True)`` for small non-negative ids, without sorting."""
    if ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    present = np.bincount(ids) > 0
    uniq = np.flatnonzero(present)
    code = np.cumsum(present) - 1
    return uniq, code[ids]


def fields_json(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as JSON-safe values (nested results use their own to_dict)."""
    from gpudiag._report import jsonable

    out: dict[str, Any] = jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    return out
