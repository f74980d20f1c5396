"""Collective bandwidth across processes (NCCL on GPUs, gloo on CPUs), in nccl-tests' terms."""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpudiag._rank_exit import ERRORS_DIR, first_failure, rank_failures
from gpudiag._values import digits
from gpudiag.analysis.nccl import CollectiveResult, normalize_op, rows_from_times
from gpudiag.bench._env import whole_numbers
from gpudiag.errors import GpuDiagError
from gpudiag.probe.jobs import run_job

BENCH_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter")
_KIB, _MIB = 1 << 10, 1 << 20
_CPU_SIZES = (4 * _KIB, 64 * _KIB, 1 * _MIB, 16 * _MIB, 64 * _MIB)
_GPU_SIZES = (1 * _MIB, 8 * _MIB, 64 * _MIB, 256 * _MIB, 1024 * _MIB)
_TYPE = {
    "fp32": ("float32", 4, "float"),
    "bf16": ("bfloat16", 2, "bfloat16"),
    "fp16": ("float16", 2, "half"),
}
# Largest magnitude a dtype may reach while an in-place all-reduce keeps summing (values grow
# by the world size on every call): stay well inside the dtype's range.
_LIMIT = {"fp32": 1e30, "bf16": 1e30, "fp16": 3e4}
PROGRESS_MARK = "GPUDIAG_PROGRESS"
WORKER_MODULE = "gpudiag.bench._collective_worker"


def default_sizes(on_gpu: bool) -> tuple[int, ...]:
    return _GPU_SIZES if on_gpu else _CPU_SIZES


def _check_args(op: str, dtype: str, sizes: Sequence[int]) -> str:
    name = normalize_op(op)
    if name not in BENCH_OPS:
        raise GpuDiagError(
            f"gd.bench measures {', '.join(BENCH_OPS)}; for {name} run nccl-tests and read its log "
            "with gd.bench.parse_nccl_tests()."
        )
    if dtype not in _TYPE:
        raise GpuDiagError(f"Collective dtype {dtype!r}: use one of {', '.join(_TYPE)}.")
    if not sizes or min(sizes) < 1:
        raise GpuDiagError("Collective sizes are bytes (the nccl-tests 'size' column), at least 1.")
    return name


def safe_iters(op: str, dtype: str, world_size: int, iters: int) -> int:
    """How many in-place all-reduces in a row keep the values inside the dtype's range."""
    if op != "all_reduce" or world_size < 2:
        return iters
    start = 4 * world_size * (world_size + 1) / 2  # largest value after the first call
    room = math.log(_LIMIT[dtype] / start) / math.log(world_size)
    return max(1, min(iters, int(room) + 1))


def torchrun_command(
    op: str = "all_reduce",
    sizes: Iterable[int] | None = None,
    *,
    nnodes: int | str = 2,
    nproc_per_node: int | str = 8,
    rdzv_endpoint: str = "$MASTER_ADDR:29500",
    dtype: str = "fp32",
    out: str | None = "gpudiag_collective.json",
    python: str | None = None,
) -> str:
    """The command to run the benchmark across nodes; run it on every node.

    Rank 0 prints the result table and writes JSON to ``out`` (read it with
    ``CollectiveResult.from_dict(json.load(...))``).
    """
    size_list = list(sizes) if sizes is not None else list(_GPU_SIZES)
    _check_args(op, dtype, size_list)
    words = [
        "torchrun" if python is None else f"{python} -m torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        "-m",
        WORKER_MODULE,
        "--op",
        normalize_op(op),
        "--dtype",
        dtype,
        "--sizes",
        *[str(s) for s in size_list],
    ]
    if out:
        words += ["--out", out]
    # Every word is a number, a fixed option or a name; only the output path needs quoting, and
    # the endpoint must stay unquoted so the shell expands $MASTER_ADDR.
    if out:
        words[-1] = shlex.quote(out)
    return " ".join(words)


# --- inside every rank -------------------------------------------------------------------------


def _nothing() -> None:
    return None


def _device_for_rank(backend: str) -> str:
    if backend != "nccl":
        return "cpu"
    text = os.environ.get("LOCAL_RANK", "0").strip()
    local_rank = int(text) if digits(text) and len(text) < 6 else 0
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "set_device_index"):
        accelerator.set_device_index(local_rank)
    return f"cuda:{local_rank}"


def run_collective(
    op: str = "all_reduce",
    sizes: Sequence[int] | None = None,
    *,
    dtype: str = "fp32",
    repeats: int | None = None,
    iters: int | None = None,
    warmup: int = 2,
    on_progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
) -> CollectiveResult:
    """Measure ``op`` on the process group that is already initialised; call on every rank.

    Per size: one validation call checked element by element against the exact expected sums,
    ``warmup`` untimed calls, then ``repeats`` repetitions of ``iters`` back-to-back calls
    between a barrier and a device sync (CUDA events on a GPU). Every rank times itself and
    the slowest rank's time counts for each repetition (a collective ends when its last rank
    does). Every rank returns the same result. NCCL paths are untested on a real GPU.
    """
    import torch
    import torch.distributed as dist

    from gpudiag.bench.timing import host_timer
    from gpudiag.probe import cuda

    if not dist.is_initialized():
        raise GpuDiagError(
            "run_collective needs torch.distributed initialised (run it under torchrun)."
        )
    backend = str(dist.get_backend())
    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device_for_rank(backend)
    on_gpu = device.startswith("cuda")
    size_list = whole_numbers(sizes or default_sizes(on_gpu), "collective sizes")
    name = _check_args(op, dtype, size_list)
    torch_name, type_bytes, nccl_type = _TYPE[dtype]
    tdtype = getattr(torch, torch_name)
    repeats = repeats or (20 if on_gpu else 10)
    iters = safe_iters(name, dtype, world, iters or (20 if on_gpu else 5))
    index = int(device.split(":")[1]) if on_gpu else None
    timer = (lambda: cuda.device_timer(index)) if on_gpu else host_timer()

    def barrier() -> None:
        if on_gpu:
            dist.barrier(device_ids=[index])
        else:
            dist.barrier()

    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    total_ranks = world * (world + 1) // 2
    measurements: list[tuple[int, list[float], int | None, bool]] = []
    notes: list[str] = []
    generator = torch.Generator().manual_seed(seed)
    for step, size in enumerate(size_list):
        per_rank = max(1, size // type_bytes // (world if name != "all_reduce" else 1))
        full = per_rank * world if name != "all_reduce" else per_rank
        # Small integers shared by every rank (same seed), scaled by rank + 1: sums are exact.
        base = torch.randint(1, 5, (full,), generator=generator).to(device=device, dtype=tdtype)
        mine = (
            base * (rank + 1)
            if name != "all_gather"
            else base[rank * per_rank : (rank + 1) * per_rank] * (rank + 1)
        )
        call: Callable[[], object]
        refresh: Callable[[], object]
        if name == "all_reduce":
            result_of = torch.empty_like(mine)
            expected = base * total_ranks
            call = functools.partial(dist.all_reduce, result_of)
            refresh = functools.partial(result_of.copy_, mine)
        elif name == "all_gather":
            result_of = torch.empty(full, device=device, dtype=tdtype)
            ranks = torch.arange(1, world + 1, device=device, dtype=tdtype)
            expected = base * ranks.repeat_interleave(per_rank)
            call = functools.partial(gather_single, result_of, mine)
            refresh = _nothing
        else:
            result_of = torch.empty(per_rank, device=device, dtype=tdtype)
            expected = base[rank * per_rank : (rank + 1) * per_rank] * total_ranks
            call = functools.partial(scatter_single, result_of, mine)
            refresh = _nothing
        refresh()
        call()
        rtol = 0.0 if dtype == "fp32" else 1e-2
        wrong = int((~torch.isclose(result_of, expected, rtol=rtol, atol=0.0)).sum())
        for _ in range(warmup):
            refresh()
            call()
        samples: list[float] = []
        for _ in range(repeats):
            refresh()
            barrier()
            with timer() as elapsed:
                for _ in range(iters):
                    call()
            samples.append(elapsed[0] / iters)
        slowest = torch.tensor(samples, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        wrong_t = torch.tensor([wrong], dtype=torch.int64, device=device)
        dist.all_reduce(wrong_t)
        measurements.append(
            (per_rank, [float(x) for x in slowest.cpu()], int(wrong_t.item()), name == "all_reduce")
        )
        if on_progress is not None:
            on_progress(step + 1, len(size_list))
    if world == 1:
        notes.append("one rank: the bus bandwidth of a collective is 0 by definition")
    if on_gpu:
        notes.append("NCCL path: untested on a real GPU in this version of gpudiag")
    notes.append(
        f"{repeats} repetitions x {iters} calls per size; slowest rank's time per repetition"
    )
    rows = rows_from_times(name, world, nccl_type, type_bytes, measurements)
    text = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    per_node = int(text) if digits(text) and 0 < len(text) < 7 else world
    nodes = max(1, world // max(per_node, 1))
    label = f"{world} processes on {nodes} node{'s' if nodes > 1 else ''}"
    return CollectiveResult(name, world, backend, "measured", rows, label=label, notes=tuple(notes))


# --- launching local processes -----------------------------------------------------------------


def _package_root() -> str:
    # gpudiag/bench/collectives.py -> the folder that holds the gpudiag package
    return str(Path(__file__).resolve().parents[2])


def allreduce(
    sizes: Iterable[int] | None = None,
    *,
    op: str = "all_reduce",
    world_size: int | None = None,
    backend: str | None = None,
    dtype: str = "fp32",
    repeats: int | None = None,
    iters: int | None = None,
    timeout_s: float = 600.0,
    progress: bool = True,
) -> CollectiveResult:
    """All-reduce (or ``op='all_gather'`` / ``'reduce_scatter'``) bandwidth, nccl-tests style.

    Inside a job already running under torchrun (``torch.distributed`` initialised) it measures
    that process group: call it on every rank. Otherwise it starts ``world_size`` local processes
    with ``torchrun --standalone`` (NCCL, one per GPU, when CUDA is usable; else gloo on the CPU,
    2 processes) and returns rank 0's result. For several nodes, run the line printed by
    ``gpudiag bench allreduce --nnodes N`` (see ``torchrun_command``) on each node.

    ``sizes`` are the nccl-tests "size" column in bytes. A run that fails returns a result whose
    ``error`` says why (no rows). NCCL paths are untested on a real GPU.
    """
    import torch.distributed as dist

    from gpudiag.probe import cuda

    size_list = whole_numbers(sizes, "collective sizes") if sizes is not None else None
    name = _check_args(op, dtype, size_list or [1])
    if dist.is_available() and dist.is_initialized():
        return run_collective(name, size_list, dtype=dtype, repeats=repeats, iters=iters)
    on_gpu = cuda.available() if backend is None else backend == "nccl"
    backend = backend or ("nccl" if on_gpu else "gloo")
    if world_size is None:
        world_size = cuda.device_count() if on_gpu else 2
    if world_size < 1:
        raise GpuDiagError("world_size must be at least 1.")
    if backend == "nccl" and world_size > cuda.device_count():
        raise GpuDiagError(
            f"NCCL needs one GPU per process: {world_size} asked, {cuda.device_count()} visible. "
            "Pass world_size= or backend='gloo'."
        )
    return _launch(name, size_list, world_size, backend, dtype, repeats, iters, timeout_s, progress)


def all_gather(sizes: Iterable[int] | None = None, **kwargs: Any) -> CollectiveResult:
    """``allreduce(op='all_gather')``: size is the gathered total, as in nccl-tests."""
    return allreduce(sizes, op="all_gather", **kwargs)


def reduce_scatter(sizes: Iterable[int] | None = None, **kwargs: Any) -> CollectiveResult:
    """``allreduce(op='reduce_scatter')``: size is the full input, as in nccl-tests."""
    return allreduce(sizes, op="reduce_scatter", **kwargs)


def _launch(
    op: str,
    sizes: list[int] | None,
    world_size: int,
    backend: str,
    dtype: str,
    repeats: int | None,
    iters: int | None,
    timeout_s: float,
    progress: bool,
) -> CollectiveResult:
    from tqdm.auto import tqdm

    with tempfile.TemporaryDirectory(prefix="gpudiag-collective-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world_size}",
            "-m",
            WORKER_MODULE,
            "--op",
            op,
            "--dtype",
            dtype,
            "--backend",
            backend,
            "--out",
            str(out),
            "--progress",
        ]
        if sizes:
            cmd += ["--sizes", *map(str, sizes)]
        if repeats:
            cmd += ["--repeats", str(repeats)]
        if iters:
            cmd += ["--iters", str(iters)]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_package_root(), env.get("PYTHONPATH")) if p
        )
        # One intra-op thread per process, as torchrun would set (and say so in a banner).
        env.setdefault("OMP_NUM_THREADS", "1")
        lines: list[str] = []
        bar = tqdm(
            total=len(sizes or default_sizes(backend == "nccl")),
            desc=op,
            disable=not progress,
            leave=False,
        )

        def on_line(line: str) -> None:
            if line.startswith(PROGRESS_MARK):
                bar.update(int(line.split()[1]) - bar.n)
            else:
                lines.append(line.rstrip())

        try:
            # A hung rank (a rendezvous that never completes) must not hang the caller, and no
            # rank outlives the call (gpudiag.probe.jobs).
            with tempfile.TemporaryDirectory(prefix="gpudiag-ranks-") as errors:
                env[ERRORS_DIR] = errors
                job = run_job(cmd, env=env, timeout_s=timeout_s, on_stdout_line=on_line,
                              merge_stderr=True)  # fmt: skip
                failures = rank_failures(errors)
        finally:
            bar.close()
        code = job.returncode
        if job.timed_out:
            lines.append(f"stopped after the {timeout_s:.0f} s timeout; every rank was ended")
        if code == 0 and out.is_file():
            return CollectiveResult.from_dict(json.loads(out.read_text()))
        text = "\n".join(ln for ln in lines if ln.strip() and not ln.startswith("="))
        return CollectiveResult(
            op,
            world_size,
            backend,
            "measured",
            (),
            error=f"the {world_size}-process run failed (exit {code}): "
            + first_failure(failures, text),
        )
