"""``analyze_trace``: decode trace files and run every analysis on each rank."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from gpudiag import _progress
from gpudiag._progress import ProgressFn
from gpudiag.analysis.costed_ops import dtype_of
from gpudiag.analysis.trace.attention import attention_use
from gpudiag.analysis.trace.breakdown import (
    GpuRows,
    comm_compute_overlap,
    gpu_rows,
    host_wait_gaps,
    overlap_by_category_set,
    stream_idle,
    temporal,
)
from gpudiag.analysis.trace.collectives import MIN_MATCHED_CALLS, rank_collectives
from gpudiag.analysis.trace.cpu_ops import cpu_ops
from gpudiag.analysis.trace.host_activity import inside, spans, warmup_rows
from gpudiag.analysis.trace.intervals import merge
from gpudiag.analysis.trace.kernels import (
    KernelColumns,
    kernel_category,
    kernel_table,
    launch_columns,
    tensor_core_use,
)
from gpudiag.analysis.trace.launches import launch_stats
from gpudiag.analysis.trace.ledger import LedgerInput, build_ledger
from gpudiag.analysis.trace.load import DEFAULT_MAX_BYTES, load_trace
from gpudiag.analysis.trace.model import (
    I64,
    LAUNCH_RUNTIME_NAMES,
    SYNC_RUNTIME_NAMES,
    Events,
    Kind,
    RankTrace,
    dense_codes,
)
from gpudiag.analysis.trace.nesting import Nesting, nest
from gpudiag.analysis.trace.ranks import check_one_job, stragglers, summarize
from gpudiag.analysis.trace.report import RankReport, TraceReport
from gpudiag.analysis.trace.shapes import shaped_ops
from gpudiag.analysis.trace.steps import dataloader_share, step_reports
from gpudiag.analysis.trace.syncs import (
    SyncEvent,
    find_syncs,
    pageable_copy_calls,
    sync_sites,
)
from gpudiag.analysis.trace.transfers import transfers
from gpudiag.analysis.trace.window import analysis_window, find_steps, gpu_mask
from gpudiag.errors import ArgumentError, TraceError

PathLike = str | os.PathLike[str]
_TRACE_SUFFIXES = (".json", ".json.gz", ".gz")


def _launch_rows(events: Events, rows: I64) -> I64:
    """For each GPU row, the runtime row with the same correlation id (-1: not recorded)."""
    rt = np.flatnonzero((events.kind == Kind.RUNTIME) & (events.correlation >= 0))
    out = np.full(rows.size, -1, dtype=np.int64)
    if rt.size == 0 or rows.size == 0:
        return out
    corr = events.correlation[rt]
    order = np.argsort(corr, kind="stable")
    corr_sorted, rt_sorted = corr[order], rt[order]
    want = events.correlation[rows]
    pos = np.clip(np.searchsorted(corr_sorted, want), 0, corr_sorted.size - 1)
    hit = (corr_sorted[pos] == want) & (want >= 0)
    out[hit] = rt_sorted[pos[hit]]
    return out


def _per_key(keys: np.ndarray, value_of: Callable[[int], object]) -> np.ndarray:
    """``value_of(key)`` for each of ``keys`` (non-negative ints), called once per distinct
    key."""
    if keys.size and keys.max() < _DENSE_KEYS:
        uniq, inv = dense_codes(keys)  # a table lookup, no sort
    else:
        uniq, inv = np.unique(keys, return_inverse=True)
    values = np.empty(uniq.size, dtype=object)
    values[:] = [value_of(k) for k in uniq.tolist()]
    return values[inv.reshape(-1)]


_DENSE_KEYS = 1 << 22  # keys below it are counted in a table (at most 32 MB)


def _categories(events: Events, rows: I64) -> np.ndarray:
    # One (name, kind) code per row; the category of each distinct pair.
    code = events.name[rows].astype(np.int64) * 256 + events.kind[rows]
    return _per_key(code, lambda c: kernel_category(c % 256, events.names[c // 256]))


def _op_dtypes(events: Events, op_rows: I64) -> np.ndarray:
    """The dtype each launching operator's recorded Input type says (None: not recorded)."""
    out = np.full(op_rows.size, None, dtype=object)
    inputs = events.inputs
    if not inputs or op_rows.size == 0:
        return out
    # The operators with recorded inputs, sorted, and each one's dtype: one dtype_of call per
    # distinct record (the loader shares one record among the calls that spell it alike).
    keys = np.fromiter(inputs, np.int64, len(inputs))
    order = np.argsort(keys)
    keys = keys[order]
    by_record: dict[int, str | None] = {}
    dtypes = np.empty(keys.size, dtype=object)
    records = list(inputs.values())
    for j, i in enumerate(order.tolist()):
        record = records[i]
        dtype = by_record.get(id(record), by_record)
        if dtype is by_record:
            dtype = by_record[id(record)] = dtype_of(record.types) if record.types else None
        dtypes[j] = dtype
    pos = np.clip(np.searchsorted(keys, op_rows), 0, keys.size - 1)
    hit = keys[pos] == op_rows
    out[hit] = dtypes[pos[hit]]
    return out


def _op_names(events: Events, op_rows: I64) -> np.ndarray:
    """The name of each launching operator (None where it is not known)."""
    if op_rows.size == 0:
        return np.empty(0, dtype=object)
    names = np.empty(len(events.names) + 1, dtype=object)
    names[:-1] = events.names  # the last: None, for rows without an operator
    known = op_rows >= 0
    ids = np.full(op_rows.size, len(events.names), dtype=np.int64)
    ids[known] = events.name[op_rows[known]]
    return names[ids]


def analyze_rank(trace: RankTrace, rank: int, *, include_last_step: bool = False) -> RankReport:
    """Every analysis of one decoded trace file."""
    ev = trace.events
    notes: list[str] = []
    steps = find_steps(ev)
    window = analysis_window(ev, steps, include_last_step=include_last_step)
    all_gpu = np.flatnonzero(gpu_mask(ev))
    has_gpu = bool(all_gpu.size)
    all_launch = _launch_rows(ev, all_gpu)
    sync_ids = np.array(
        [i for i, n in enumerate(ev.names) if n in SYNC_RUNTIME_NAMES], dtype=np.int32
    )
    sync_calls = np.flatnonzero((ev.kind == Kind.RUNTIME) & ev.name_in(sync_ids))
    nesting = nest(ev, np.concatenate((all_launch[all_launch >= 0], sync_calls)))
    # The analyses run in an order that frees each big intermediate as soon as the last one
    # reading it is done (a multi-GB trace's rank holds millions of rows): the results do not
    # depend on the order.
    cpu = cpu_ops(ev, nesting, window.host)
    nesting = Nesting(nesting.parent_op, np.zeros(0))  # self times: read by cpu_ops alone
    all_launch_ts = np.where(all_launch >= 0, ev.ts[np.clip(all_launch, 0, None)], np.nan)
    all_cats = _categories(ev, all_gpu)
    g_all: GpuRows | None = gpu_rows(ev, all_gpu, all_cats, all_launch_ts) if has_gpu else None
    n_steps_in_window = (
        len(steps) - 1 if window.excluded_last_step and len(steps) >= 2 else len(steps)
    )
    step_list = step_reports(ev, steps, g_all, n_steps_in_window)
    busy = merge(g_all.starts, g_all.ends) if g_all is not None else None
    del g_all
    collectives, collective_notes = rank_collectives(
        ev, all_gpu, all_launch, all_cats, trace.world_size or 1
    )
    blocking_copies = pageable_copy_calls(ev, all_gpu, all_launch)
    syncs = find_syncs(ev, nesting, steps, window.host, busy, blocking_copies)
    del busy, blocking_copies
    warm = spans(ev, warmup_rows(ev))
    if warm[0].size:
        syncs = tuple(
            dataclasses.replace(s, during_warmup=True)
            if inside(warm, s.start_us, s.start_us + s.duration_us)
            else s
            for s in syncs
        )

    in_win = window.gpu[all_gpu]
    win_rows = all_gpu[in_win]
    win_launch = all_launch[in_win]
    win_cats = all_cats[in_win]
    any_launch = bool((all_launch >= 0).any())
    g_win = gpu_rows(ev, win_rows, win_cats, all_launch_ts[in_win])
    del all_launch_ts, all_gpu, all_launch, all_cats, in_win

    breakdown = temporal(g_win) if win_rows.size else None
    launches = (
        launch_stats(ev, win_rows, win_launch, breakdown, host_wait_gaps(g_win))
        if breakdown is not None
        else None
    )
    busy_by_category_set = overlap_by_category_set(g_win) if win_rows.size else {}
    overlap = comm_compute_overlap(g_win) if win_rows.size else None
    idle_by_stream = stream_idle(g_win) if win_rows.size else ()
    idle_in_waits = _idle_in_waits(g_win, syncs) if win_rows.size else None
    del g_win

    cols: KernelColumns = launch_columns(ev, win_rows, trace.devices, win_cats)
    del win_cats
    op_rows = np.where(win_launch >= 0, nesting.parent_op[np.clip(win_launch, 0, None)], -1)
    op_names = _op_names(ev, op_rows)
    op_dtypes = _op_dtypes(ev, op_rows)
    kernels = kernel_table(ev, cols, op_names, op_dtypes)
    tc = tensor_core_use(ev, cols, op_rows, op_names.tolist()) if kernels else None
    del op_names
    attention = attention_use(ev, nesting, window.host, win_rows, op_rows)
    shaped = shaped_ops(
        ev,
        nesting,
        window.host,
        steps,
        win_rows,
        op_rows,
        cols.tensor_cores,
        attention_rows=attention.matmul_rows,
    )
    del cols, op_rows
    ledger = build_ledger(
        LedgerInput(
            events=ev,
            rows=win_rows,
            launch_rows=win_launch,
            op_dtypes=op_dtypes,
            eager_rows=attention.eager_kernel_rows,
            syncs=syncs,
            nesting=nesting,
            window=window.description,
            rank=rank,
        )
    )
    del nesting, op_dtypes

    missing = kernels_not_recorded(trace)
    if missing is not None:
        notes.append(missing)
    elif not has_gpu:
        notes.append(
            "CPU-only trace: no kernels, memory copies or GPU timeline were recorded, so the "
            "GPU time breakdown, idle time, kernels, tensor cores, occupancy and memcpy "
            "bandwidth cannot be told; the CPU operators, steps, DataLoader share and "
            "host-copy operators (.item()) can. Profile on a CUDA machine for the GPU side."
        )
    elif not trace.devices:
        notes.append(
            "the trace has no deviceProperties: occupancy, SM efficiency and peak-bandwidth "
            "comparisons are not available (they need the GPU's SM count and compute "
            "capability)."
        )
    if has_gpu and not any_launch:
        notes.append(
            "no GPU event can be tied to the CUDA runtime call that launched it (no "
            "cuda_runtime events or correlation ids): host-wait idle time, launch delays and "
            "tensor-core-eligible operators are not available."
        )
    if has_gpu and kernels and all(k.grid is None for k in kernels):
        notes.append("kernels carry no launch configuration (grid/block/registers).")
    if not steps:
        notes.append(
            "no ProfilerStep ranges (prof.step() was not called): the whole trace is analysed "
            "as one window; per-step breakdown and DataLoader share are not available."
        )
    elif dataloader_share(step_list) is None:
        notes.append(
            "no DataLoader events inside the steps: the share of step time spent waiting on "
            "data cannot be told (the loop may not iterate a torch DataLoader)."
        )
    if tc is not None and tc.eligible_without_tensor_cores_us is None:
        notes.append(
            "kernels could not be tied to the operators that launched them, so "
            "tensor-core-eligible work without tensor cores is not available."
        )
    notes += trace.load_notes
    if trace.unknown_event_types:
        listed = ", ".join(f"{k} ({v})" for k, v in sorted(trace.unknown_event_types.items()))
        notes.append(f"events of types gpudiag does not analyse were skipped: {listed}.")

    return RankReport(
        rank=rank,
        path=trace.path,
        world_size=trace.world_size,
        devices=trace.devices,
        events=len(ev),
        file_bytes=trace.file_bytes,
        window=window.description,
        has_gpu_events=has_gpu,
        breakdown=breakdown,
        busy_by_category_set=busy_by_category_set,
        comm_compute_overlap=overlap,
        stream_idle=idle_by_stream,
        kernels=kernels,
        tensor_cores=tc,
        cpu_ops=cpu,
        launches=launches,
        transfers=transfers(ev, win_rows, trace.devices),
        syncs=syncs,
        sync_sites=sync_sites(syncs),
        steps=step_list,
        dataloader_share=dataloader_share(step_list),
        notes=tuple(notes),
        metadata=trace.metadata,
        shaped_ops=shaped,
        attention=attention,
        collectives=collectives,
        collective_notes=collective_notes,
        idle_in_host_waits_us=idle_in_waits,
        ledger=ledger,
        kernels_missing=missing,
    )


MISSING_KERNELS_MIN_LAUNCHES = 20


def kernels_not_recorded(trace: RankTrace) -> str | None:
    """Why a trace with GPUs and kernel launches but no kernel records lost them (None when
    it has kernels, or does not look like a GPU run)."""
    ev = trace.events
    if (ev.kind == Kind.KERNEL).any():
        return None
    ids = np.array([i for i, n in enumerate(ev.names) if n in LAUNCH_RUNTIME_NAMES], dtype=np.int32)
    launches = int(np.count_nonzero((ev.kind == Kind.RUNTIME) & ev.name_in(ids)))
    if launches < MISSING_KERNELS_MIN_LAUNCHES:
        return None
    gpus = f"{len(trace.devices)} GPUs listed in deviceProperties, " if trace.devices else ""
    return (
        f"the GPU's kernel records are missing: {gpus}{launches:,} kernel launches on the host, "
        "and no kernel events. This is a GPU run whose device activity was not recorded, not "
        "a CPU-only one: the profiler's CUPTI (or roctracer) activity buffer was dropped or "
        "overflowed, or ProfilerActivity.CUDA was not among the activities. Profile again with "
        "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] and fewer active steps "
        "(schedule active=1-3; warm-up steps fill the same buffer), or raise the buffer "
        "(ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB in a Kineto config file named by KINETO_CONFIG)."
    )


def _idle_in_waits(g: GpuRows, syncs: Sequence[SyncEvent]) -> tuple[float, float]:
    """GPU idle time (all streams) in the window's span that passed while the host sat in a
    wait for the GPU (the union of the sync and blocking-copy calls), and the part of it in
    gaps whose next GPU work was already launched (queued: the host was not what it lacked)."""
    calls = [s for s in syncs if s.kind == "runtime"]
    if not calls:
        return 0.0, 0.0
    lo, hi = float(g.starts.min()), float(g.ends.max())
    ws, we = merge(
        np.clip(np.array([s.start_us for s in calls]), lo, hi),
        np.clip(np.array([s.start_us + s.duration_us for s in calls]), lo, hi),
    )
    ms, me = merge(g.starts, g.ends)
    gap_lo, gap_hi = me[:-1], ms[1:]
    order = np.argsort(g.starts, kind="stable")
    first = order[np.searchsorted(g.starts[order], gap_hi, side="left")]
    queued = g.launch_ts[first] <= gap_lo  # NaN (launch not recorded) is not queued
    # Gaps are sorted and disjoint: a wait overlaps the gaps from the first that ends after
    # it begins to the last that starts before it ends. Most overlap one or two; those sums
    # are taken here for all waits at once, the others over every gap as before, so each
    # wait's share is the same float as summing over all gaps, and the shares add up in order.
    first_gap = np.searchsorted(gap_hi, ws, side="right")
    n_gaps = np.searchsorted(gap_lo, we, side="left") - first_gap
    shares = np.zeros(ws.size)
    queued_shares = np.zeros(ws.size)
    for k in (0, 1):
        has = n_gaps > k
        at = np.minimum(first_gap + k, max(gap_lo.size - 1, 0))
        if not has.any():
            continue
        part = np.clip(np.minimum(gap_hi[at], we) - np.maximum(gap_lo[at], ws), 0.0, None)
        shares += np.where(has, part, 0.0)
        queued_shares += np.where(has & queued[at], part, 0.0)
    for i in np.flatnonzero(n_gaps > 2).tolist():
        a, b = ws[i], we[i]
        span = slice(int(first_gap[i]), int(first_gap[i] + n_gaps[i]))
        part = np.clip(np.minimum(gap_hi[span], b) - np.maximum(gap_lo[span], a), 0.0, None)
        if not np.array_equal(part, np.round(part)):
            # Fractional microseconds: summed over every gap, zeros included, as numpy's
            # pairwise sum groups them (whole numbers add up the same in any order).
            span = slice(None)
            part = np.clip(np.minimum(gap_hi, b) - np.maximum(gap_lo, a), 0.0, None)
        shares[i], queued_shares[i] = part.sum(), part[queued[span]].sum()
    inside = inside_queued = 0.0
    for share, queued_share in zip(shares.tolist(), queued_shares.tolist(), strict=True):
        inside += share
        inside_queued += queued_share
    return inside, inside_queued


def _expand(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        items: list[Path] = [Path(paths)]
    else:
        items = [Path(p) for p in paths]
    out: list[Path] = []
    for p in items:
        if p.is_dir():
            found = sorted(
                q for q in p.iterdir() if q.is_file() and q.name.endswith(_TRACE_SUFFIXES)
            )
            if not found:
                raise TraceError(f"no .json or .json.gz trace files in the folder {p}.")
            out += found
        else:
            out.append(p)
    if not out:
        raise TraceError("no trace file given: pass a path, a list of paths or a folder.")
    return out


def _assign_ranks(traces: Sequence[RankTrace]) -> tuple[list[int], list[str]]:
    notes: list[str] = []
    claimed = Counter(t.rank for t in traces if t.rank is not None)
    dup = sorted(r for r, c in claimed.items() if c > 1)
    if dup:
        files = [os.path.basename(t.path) for t in traces if t.rank in dup]
        raise TraceError(
            f"several files claim rank {dup[0]} ({', '.join(files)}): pass one trace per rank "
            "(files from different runs cannot be compared rank by rank)."
        )
    used = set(claimed)
    ranks: list[int] = []
    unnamed: list[str] = []
    nxt = 0
    for t in traces:
        if t.rank is not None:
            ranks.append(t.rank)
            continue
        while nxt in used:
            nxt += 1
        ranks.append(nxt)
        used.add(nxt)
        unnamed.append(f"{os.path.basename(t.path)} -> {nxt}")
    if unnamed and len(traces) > 1:
        notes.append(
            "no distributedInfo.rank in some files; ranks given by order: " + ", ".join(unnamed)
        )
    return ranks, notes


def _check_events(trace: RankTrace) -> None:
    if len(trace.events) == 0:
        raise TraceError(
            f"{trace.path} holds no events (metadata only): the profiler recorded nothing. "
            "Make sure the profiled code ran inside the schedule's active steps and that "
            "prof.step() is called once per step."
        )


def _header(trace: RankTrace) -> RankTrace:
    """The trace without its events: what the checks across ranks read."""
    return dataclasses.replace(trace, events=Events.empty())


def analyze_traces(traces: Sequence[RankTrace], *, include_last_step: bool = False) -> TraceReport:
    if not traces:
        raise TraceError("no trace to analyse.")
    for t in traces:
        _check_events(t)
    check_one_job(traces)
    ranks, notes = _assign_ranks(traces)
    reports = [
        analyze_rank(t, r, include_last_step=include_last_step)
        for t, r in zip(traces, ranks, strict=True)
    ]
    return _combined(traces, ranks, reports, notes)


def _combined(
    traces: Sequence[RankTrace],
    ranks: Sequence[int],
    rank_reports: Sequence[RankReport],
    notes: list[str],
) -> TraceReport:
    """The report over the ranks: each rank's report, the comparison, the stragglers."""
    reports = sorted(rank_reports, key=lambda r: r.rank)
    worlds = {t.world_size for t in traces if t.world_size}
    missing: tuple[int, ...] = ()
    if len(worlds) == 1:
        world = worlds.pop()
        present = set(ranks)
        missing = tuple(r for r in range(world) if r not in present)
        if missing and len(missing) < world:
            shown = ", ".join(map(str, missing[:16])) + ("..." if len(missing) > 16 else "")
            notes.append(
                f"world size {world}, but no trace for ranks {shown}: the per-rank comparison "
                "and straggler search cover only the ranks given."
            )
    for r in reports:
        prefix = f"rank {r.rank}: " if len(reports) > 1 else ""
        notes += [prefix + n for n in r.notes]
    summaries = tuple(
        summarize(r.rank, r.breakdown, [s.duration_us for s in r.steps if s.in_window])
        for r in reports
        if r.breakdown is not None
    )
    report = TraceReport(
        ranks=tuple(reports),
        comparison=summaries,
        stragglers=stragglers(summaries),
        missing_ranks=missing,
        notes=tuple(notes),
    )
    if len(reports) < 2:
        return report
    # Who the others wait for is read from when each rank arrives at the matched collectives;
    # GPU work is the fallback: a rank that waits longer can show more GPU time without
    # holding anyone up.
    matched = report.collectives()
    if len(matched.calls) < MIN_MATCHED_CALLS:
        return report
    return dataclasses.replace(
        report,
        stragglers=tuple(sorted(w.rank for w in matched.stragglers)),
        straggler_basis="collective arrivals",
    )


def _one_rank(
    path: Path, include_last_step: bool, max_bytes: int, on_progress: ProgressFn | None = None
) -> tuple[RankTrace, RankReport]:
    """Read and analyse one file: its header and its report (rank -1 until ranks are known).
    Its events are dropped on return, so one rank at a time holds memory."""
    trace = load_trace(path, max_bytes=max_bytes, on_progress=on_progress)
    _check_events(trace)
    return _header(trace), analyze_rank(trace, -1, include_last_step=include_last_step)


# Below this much trace text, starting worker processes costs more than it saves.
_PARALLEL_FROM_BYTES = 256 << 20


def _workers(files: Sequence[Path], workers: int | None) -> int:
    """How many processes analyse ranks at once: as asked, else one per rank up to the CPU
    cores this process may use, for big traces only."""
    if workers is not None:
        if workers < 1:
            raise ArgumentError(f"workers={workers}: give 1 or more (or None to choose).")
        return min(workers, len(files))
    if len(files) < 2 or sum(_size(f) for f in files) < _PARALLEL_FROM_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(len(files), cores or 1))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def analyze_trace(
    path_or_paths: PathLike | Iterable[PathLike],
    *,
    include_last_step: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    workers: int | None = None,
    progress: bool | ProgressFn | None = True,
) -> TraceReport:
    """Analyse Kineto / torch.profiler traces: one file per rank (or a folder of them).

    Reads ``.json`` and ``.json.gz`` files as ``torch.profiler`` writes them, streamed: memory
    holds one rank's columns of the fields the analyses use, not the file. Ranks are read one
    at a time, or ``workers`` at once in separate processes (default: one per core for big
    traces of several ranks; each holds one rank). With two or more ``ProfilerStep`` ranges the
    last step is left out of the aggregates unless ``include_last_step`` (HTA does the same, so
    the numbers compare). ``max_bytes`` caps the JSON text read from one file (after gunzip;
    default 64 GiB). ``progress``: a bar for reads that take over two seconds (``False``: none;
    a callable: your own ``gpudiag._progress`` callback). Raises
    ``gpudiag.errors.TraceError`` for a missing, corrupt, truncated, empty or special file;
    what a readable trace cannot tell (and what was read around) is listed in
    ``report.notes``.
    """
    files = _expand(path_or_paths)
    on_progress = _progress.resolve(progress, "trace", delay_s=2.0)
    n_workers = _workers(files, workers)
    with _progress.closed_on_error(on_progress):
        if n_workers == 1:
            results = []
            for i, path in enumerate(files):
                results.append(_one_rank(path, include_last_step, max_bytes, on_progress))
                check_one_job([header for header, _ in results])
                _progress.report(on_progress, "ranks", i + 1, len(files))
        else:
            results = _in_processes(files, include_last_step, max_bytes, n_workers, on_progress)
            check_one_job([header for header, _ in results])
        _progress.finish(on_progress, "ranks")
    headers = [header for header, _ in results]
    ranks, notes = _assign_ranks(headers)
    reports = [_with_rank(report, rank) for (_, report), rank in zip(results, ranks, strict=True)]
    return _combined(headers, ranks, reports, notes)


def _with_rank(report: RankReport, rank: int) -> RankReport:
    """A report analysed before its rank was known (-1), with its rank: its ledger's too."""
    ledger = report.ledger
    if ledger is not None:
        ledger = dataclasses.replace(ledger, rank=rank)
    return dataclasses.replace(report, rank=rank, ledger=ledger)


def _in_processes(
    files: Sequence[Path],
    include_last_step: bool,
    max_bytes: int,
    workers: int,
    on_progress: ProgressFn | None,
) -> list[tuple[RankTrace, RankReport]]:
    """``_one_rank`` of each file in ``workers`` fresh processes (spawned: safe beside a
    notebook's threads), in file order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_one_rank, p, include_last_step, max_bytes) for p in files]
        results = []
        for i, future in enumerate(futures):
            results.append(future.result())
            _progress.report(on_progress, "ranks", i + 1, len(files))
    return results
