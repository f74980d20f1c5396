"""``analyze_trace``: decode trace files and run every analysis on each rank."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from gpudiag._progress import ProgressFn, Stages, closed_on_error, resolve
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
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import (
    I64,
    LAUNCH_RUNTIME_NAMES,
    SYNC_RUNTIME_NAMES,
    Events,
    Kind,
    RankTrace,
)
from gpudiag.analysis.trace.nesting import nest
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
from gpudiag.errors import TraceError

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


def _categories(events: Events, rows: I64) -> np.ndarray:
    cache: dict[tuple[int, int], str] = {}
    out = np.empty(rows.size, dtype=object)
    for i, (nid, kind) in enumerate(
        zip(events.name[rows].tolist(), events.kind[rows].tolist(), strict=True)
    ):
        cat = cache.get((nid, kind))
        if cat is None:
            cat = cache[(nid, kind)] = kernel_category(kind, events.names[nid])
        out[i] = cat
    return out


def _op_dtypes(events: Events, op_rows: I64) -> np.ndarray:
    """The dtype each launching operator's recorded Input type says (None: not recorded)."""
    out = np.full(op_rows.size, None, dtype=object)
    inputs = events.inputs
    if not inputs:
        return out
    cache: dict[int, str | None] = {}
    for i, o in enumerate(op_rows.tolist()):
        if o < 0 or o not in inputs:
            continue
        if o not in cache:
            types = inputs[o].types
            cache[o] = dtype_of(types) if types else None
        out[i] = cache[o]
    return out


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
    sync_calls = np.flatnonzero((ev.kind == Kind.RUNTIME) & np.isin(ev.name, sync_ids))
    nesting = nest(ev, np.concatenate((all_launch[all_launch >= 0], sync_calls)))
    all_launch_ts = np.where(all_launch >= 0, ev.ts[np.clip(all_launch, 0, None)], np.nan)
    all_cats = _categories(ev, all_gpu)
    g_all: GpuRows | None = gpu_rows(ev, all_gpu, all_cats, all_launch_ts) if has_gpu else None

    in_win = window.gpu[all_gpu]
    win_rows = all_gpu[in_win]
    win_launch = all_launch[in_win]
    g_win = gpu_rows(ev, win_rows, all_cats[in_win], all_launch_ts[in_win])

    breakdown = temporal(g_win) if win_rows.size else None
    cols: KernelColumns = launch_columns(ev, win_rows, trace.devices, all_cats[in_win])
    op_rows = np.where(win_launch >= 0, nesting.parent_op[np.clip(win_launch, 0, None)], -1)
    op_names = np.array(
        [ev.names[ev.name[o]] if o >= 0 else None for o in op_rows.tolist()], dtype=object
    )
    kernels = kernel_table(ev, cols, op_names, _op_dtypes(ev, op_rows))
    tc = tensor_core_use(ev, cols, op_rows, op_names.tolist()) if kernels else None
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
    launches = (
        launch_stats(ev, win_rows, win_launch, breakdown, host_wait_gaps(g_win))
        if breakdown is not None
        else None
    )
    n_steps_in_window = (
        len(steps) - 1 if window.excluded_last_step and len(steps) >= 2 else len(steps)
    )
    step_list = step_reports(ev, steps, g_all, n_steps_in_window)
    busy = merge(g_all.starts, g_all.ends) if g_all is not None else None
    blocking_copies = pageable_copy_calls(ev, all_gpu, all_launch)
    syncs = find_syncs(ev, nesting, steps, window.host, busy, blocking_copies)
    warm = spans(ev, warmup_rows(ev))
    if warm[0].size:
        syncs = tuple(
            dataclasses.replace(s, during_warmup=True)
            if inside(warm, s.start_us, s.start_us + s.duration_us)
            else s
            for s in syncs
        )

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
    if has_gpu and not (all_launch >= 0).any():
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

    collectives, collective_notes = rank_collectives(
        ev, all_gpu, all_launch, all_cats, trace.world_size or 1
    )
    ledger = build_ledger(
        LedgerInput(
            events=ev,
            rows=win_rows,
            launch_rows=win_launch,
            op_dtypes=_op_dtypes(ev, op_rows),
            eager_rows=attention.eager_kernel_rows,
            syncs=syncs,
            nesting=nesting,
            window=window.description,
            rank=rank,
        )
    )
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
        busy_by_category_set=overlap_by_category_set(g_win) if win_rows.size else {},
        comm_compute_overlap=comm_compute_overlap(g_win) if win_rows.size else None,
        stream_idle=stream_idle(g_win) if win_rows.size else (),
        kernels=kernels,
        tensor_cores=tc,
        cpu_ops=cpu_ops(ev, nesting, window.host),
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
        idle_in_host_waits_us=_idle_in_waits(g_win, syncs) if win_rows.size else None,
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
    launches = int(np.count_nonzero((ev.kind == Kind.RUNTIME) & np.isin(ev.name, ids)))
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
    inside = inside_queued = 0.0
    for a, b in zip(ws.tolist(), we.tolist(), strict=True):
        part = np.clip(np.minimum(gap_hi, b) - np.maximum(gap_lo, a), 0.0, None)
        inside += float(part.sum())
        inside_queued += float(part[queued].sum())
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


def analyze_traces(traces: Sequence[RankTrace], *, include_last_step: bool = False) -> TraceReport:
    if not traces:
        raise TraceError("no trace to analyse.")
    for t in traces:
        if len(t.events) == 0:
            raise TraceError(
                f"{t.path} holds no events (metadata only): the profiler recorded nothing. "
                "Make sure the profiled code ran inside the schedule's active steps and that "
                "prof.step() is called once per step."
            )
    check_one_job(traces)
    ranks, notes = _assign_ranks(traces)
    reports = sorted(
        (
            analyze_rank(t, r, include_last_step=include_last_step)
            for t, r in zip(traces, ranks, strict=True)
        ),
        key=lambda r: r.rank,
    )
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


def analyze_trace(
    path_or_paths: PathLike | Iterable[PathLike],
    *,
    include_last_step: bool = False,
    progress: bool | ProgressFn = True,
) -> TraceReport:
    """Analyse Kineto / torch.profiler traces: one file per rank (or a folder of them).

    Reads ``.json`` and ``.json.gz`` files as ``torch.profiler`` writes them. With two or more
    ``ProfilerStep`` ranges the last step is left out of the aggregates unless
    ``include_last_step`` (HTA does the same, so the numbers compare). Raises
    ``gpudiag.errors.TraceError`` for a missing, corrupt, truncated or empty file; what a
    readable trace cannot tell is listed in ``report.notes``. ``progress``: a bar over the
    files read and the analysis (``True``; a few seconds per 100 MB of JSON), or a callback.
    """
    files = _expand(path_or_paths)
    stages = Stages(resolve(progress), "trace", len(files) + 1)
    traces = []
    with closed_on_error(stages.on_progress):
        for path in files:
            stages.next(f"reading {path.name}")
            traces.append(load_trace(path))
        stages.next("analysing")
        report = analyze_traces(traces, include_last_step=include_last_step)
    stages.finish()
    return report
