"""Synchronisation rules: the host waiting for the GPU inside the training step."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from gpudiag.analysis.trace.ledger import SYNC_IDLE
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import (
    PIN_SOURCE_ADVICE,
    PINNED_DESTINATION_ADVICE,
    span_us,
    trace_source,
)
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity, severity_for_gain
from gpudiag.units import format_bytes

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "synchronisation"

# On a CPU-only trace, host conversions made by the user's code this often per step are
# reported (one ``loss.item()`` for logging is normal and stays quiet).
CPU_MIN_PER_STEP = 2

# Without the wait the host runs ahead and keeps the GPU's queue full: the idle time the GPU
# spends while the host is blocked is what removing (or making asynchronous) the wait gives.
_SYNC_REMOVE = 1.0
_SYNC_SOURCE = (
    "the GPU idle while the host is blocked: without the wait (or with a non-blocking copy "
    "from / to pinned memory) the host keeps launching ahead (CUDA runtime API, 'API "
    "synchronization behavior')"
)

# What a user wrote, for each way a trace shows a host sync.
_CAUSE = {
    "aten::item": "`.item()` (or `float(t)`, `print(t)`)",
    "aten::_local_scalar_dense": "`.item()` (or `float(t)`, `print(t)`)",
    "aten::copy_": "a blocking copy to/from the host (`.to(device)`, `.cpu()`, `.numpy()`)",
    "aten::to": "a blocking copy to/from the host (`.to(device)`, `.cpu()`)",
    "aten::nonzero": "a data-dependent shape (`nonzero`, boolean-mask indexing)",
    "aten::masked_select": "a data-dependent shape (boolean-mask indexing)",
    "cudaDeviceSynchronize": "`torch.cuda.synchronize()`",
    "cudaEventSynchronize": "`event.synchronize()` / timing with CUDA events",
    "hipDeviceSynchronize": "`torch.cuda.synchronize()`",
    "hipEventSynchronize": "`event.synchronize()` / timing with CUDA events",
    "hipMemcpyWithStream": "a blocking copy to/from the host (`.item()`, `.cpu()`, `.to(device)`)",
}


def gpu_idle_after_syncs(syncs: list[Any]) -> float:
    """GPU idle time (us) the waits left, counted once where waits share a gap.

    A wait costs the GPU the gap between running dry and its next work, but no more than the
    wait itself: that is the run-ahead the host lost. A wait on an already idle GPU (the host
    was the bottleneck) or one that ends while the GPU still runs other work costs nothing.
    """
    spans = [
        (s.gpu_gap_start_us, s.gpu_gap_start_us + min(s.gpu_gap_us, s.duration_us))
        for s in syncs
        if s.gpu_gap_start_us is not None and s.gpu_gap_us > 0
    ]
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _not_the_optimizers(syncs: Iterable[Any]) -> list[Any]:
    """Drop the host reads torch.optim makes inside its own ``step`` unless a wait showed.

    Adam and friends keep their step counts on the host unless ``capturable`` or ``fused``, and
    read them with ``.item()`` once per parameter: nothing waits for the GPU there, and it is
    not a line the user wrote. A call that did leave the GPU idle is kept.
    """
    return [s for s in syncs if s.optimizer is None or s.gpu_gap_us > 0]


def _outermost(syncs: list[Any]) -> list[Any]:
    """Drop sync calls made inside another recorded sync (``.item()`` -> its stream sync),
    so a wait is counted once."""
    spans = sorted((s.start_us, s.start_us + s.duration_us) for s in syncs if s.kind == "op")
    out = []
    for s in syncs:
        end = s.start_us + s.duration_us
        inside = any(a <= s.start_us and end <= b and (a, b) != (s.start_us, end) for a, b in spans)
        if not inside:
            out.append(s)
    return out


@rule("sync.host_sync", category=CATEGORY, needs=("trace",))
def host_sync_in_step(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The host waits for the GPU inside the step (``.item()``, blocking copies, synchronize)."""
    trace = evidence.trace_report
    if not trace.has_gpu_events:
        if not trace.kernels_missing:  # a GPU run that lost its kernels is no CPU run
            yield from _host_conversions_on_cpu(trace)
        return
    # Each rank's waits against its own steps (its own clock): pooled over the ranks, the
    # waits and the step time are both summed, so a share stays a share of step time.
    in_step: list[Any] = []
    window_us = idle_us = 0.0
    n_steps = 0
    for r in trace.ranks:
        # Waits inside compilation or graph capture are the warm-up's (trace.warmup says so),
        # not the steady state's, and often torch's own graph-recording code.
        syncs = [s for s in _not_the_optimizers(r.syncs) if not s.during_warmup]
        steps = {st.number: st.duration_us for st in r.steps}
        mine = [x for x in syncs if x.step is not None] if steps else list(syncs)
        mine = _outermost(mine)
        if not mine:
            continue
        in_step += mine
        idle_us += gpu_idle_after_syncs(mine)
        n_steps += max(1, len(steps))
        window_us += (
            sum(steps.values()) if steps else float(r.breakdown.span_us if r.breakdown else 0.0)
        )
    if not in_step:
        return
    # Group by call site and by the operator the wait happened in (the user-visible cause).
    groups: dict[tuple[str | None, str], list[float]] = {}
    for x in in_step:
        groups.setdefault((x.call_site, x.inside_op or x.name), []).append(x.duration_us)
    ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    wait_us = sum(x.duration_us for x in in_step)
    wait_share = wait_us / window_us if window_us > 0 else 0.0
    # The GPU idle while the host sat in these waits: the time ledger's sync row. It holds
    # idle time before the wait began too (a host blocked on a copy while the GPU has nothing
    # queued), which the gaps the waits leave after them miss.
    found = claim(trace, (SYNC_IDLE,), _SYNC_REMOVE, _SYNC_SOURCE)
    share = found.gain if found is not None else (idle_us / window_us if window_us > 0 else 0.0)
    (site, op), _durations = ranked[0]
    top = [s for s in in_step if (s.call_site, s.inside_op or s.name) == (site, op)]
    copies = [s for s in top if s.copy]
    cause = _copy_cause(copies, op) if copies else _CAUSE.get(op, f"`{op}`")
    where = f" at {site}" if site else ""
    src = trace_source(trace)
    ranks = len(trace.ranks)
    summed = f" ({ranks} ranks summed)" if ranks > 1 else ""
    pooled = f" ({ranks} ranks pooled)" if ranks > 1 else ""
    timed = [s for s in in_step if s.gpu_busy_us is not None]
    timed_us = sum(s.duration_us for s in timed)
    busy_share = sum(s.gpu_busy_us or 0.0 for s in timed) / timed_us if timed_us > 0 else None
    items: list[Evidence] = list(found.evidence(src)) if found is not None else []
    items += [
        Evidence(
            f"GPU idle in the gaps the waits leave after them{summed}",
            round(idle_us / 1e3, 3),
            "ms",
            src,
        ),
        Evidence(f"host time in the waits{summed}", round(wait_us / 1e3, 2), "ms", src),
        Evidence(f"host waits, share of step time{pooled}", round(100 * wait_share, 2), "%", src),
        Evidence(
            "syncs per step" + (" and rank" if ranks > 1 else ""),
            round(len(in_step) / n_steps, 1),
            source=src,
        ),
    ]
    if busy_share is not None:
        items.append(
            Evidence(
                "GPU busy with earlier work during the waits", round(100 * busy_share, 1), "%", src
            )
        )
    if copies:
        longest = max(copies, key=lambda c: c.duration_us)
        size = format_bytes(longest.copy_bytes, ".1f", si=True, none="an unrecorded size")
        items.append(
            Evidence(
                f"longest blocking copy ({longest.copy})",
                round(longest.duration_us / 1e3, 2),
                f"ms on the host for {size} that took {longest.copy_gpu_us or 0:.0f} us on the GPU",
                src,
            )
        )
    items += [
        Evidence(
            f"{s or 'call site not recorded'}: {o}{summed}",
            round(sum(d) / 1e3, 2),
            f"ms in {len(d)} calls",
            src,
        )
        for (s, o), d in ranked[:3]
    ]
    during = (
        f" (the GPU ran earlier work {busy_share:.0%} of that time)"
        if busy_share is not None
        else ""
    )
    yield Finding(
        "sync.host_sync_in_step",
        severity_for_gain(share),
        CATEGORY,
        f"the host blocks {len(in_step) / n_steps:.0f}x per step"
        f"{' on each rank' if ranks > 1 else ''}, {wait_share:.1%} of the step{during}, mostly "
        f"in {cause}{where}: the GPU sits idle {share:.1%} of the profiled time while the host "
        "waits",
        tuple(items),
        threshold="a host synchronisation (a sync call, a copy that blocks on pageable host "
        "memory, .item()) inside a profiled step; its estimated gain is the time ledger's "
        "'host blocked in a sync' row, the GPU idle while the host waits (severity medium from "
        "3 % of the profiled time, high from 10 %)",
        fix=FixRef("sync.remove", {"call_site": site or op}),
        instruction=(_copy_advice(copies) if copies else _SYNC_ADVICE)
        + ("" if site else "; profile with with_stack=True to name the call site"),
        estimated_gain=share,
        claims=(SYNC_IDLE,) if found is not None else (),
    )


_SYNC_ADVICE = (
    "keep values on the GPU (accumulate losses as tensors, log every N steps), copy with "
    "non_blocking=True from pinned memory"
)


# A direction of blocking copy gets its advice when it holds this share of the copies' time.
DIRECTION_SHARE = 0.10


def _copy_advice(copies: list[Any]) -> str:
    """What fixes a blocking copy depends on its direction (the memcpy the trace recorded):
    the advice of each direction that holds a tenth of the copies' host time, largest first."""
    by: dict[str, float] = {}
    for c in copies:
        kind = "HtoD" if "HtoD" in (c.copy or "") else "DtoH" if "DtoH" in (c.copy or "") else ""
        if kind:
            by[kind] = by.get(kind, 0.0) + c.duration_us
    total = sum(by.values())
    advice = {
        "HtoD": "host-to-device: " + PIN_SOURCE_ADVICE,
        "DtoH": "device-to-host: " + PINNED_DESTINATION_ADVICE,
    }
    chosen = [
        k for k, us in sorted(by.items(), key=lambda kv: -kv[1]) if us >= DIRECTION_SHARE * total
    ]
    return "; ".join(advice[k] for k in chosen) or _SYNC_ADVICE


def _copy_cause(copies: list[Any], op: str) -> str:
    """The blocking copy in words, from the memcpy the trace recorded (the direction that
    holds most of the copies' time)."""
    to_host = sum(c.duration_us for c in copies if "DtoH" in (c.copy or ""))
    if to_host >= sum(c.duration_us for c in copies) / 2:
        return (
            f"a device-to-host copy into pageable memory in `{op}` (`.cpu()`, `.tolist()`, "
            "`.item()`, `.to('cpu')`): it returns only once the stream's earlier work is done"
        )
    return (
        f"a host-to-device copy from pageable memory in `{op}` (`.to(device)` of an unpinned "
        "tensor): it waits for the stream's earlier work"
    )


def _host_conversions_on_cpu(trace: TraceReport) -> Iterator[Finding]:
    """On a CPU-only trace nothing waits, but the calls that would wait on a GPU are recorded
    with their call sites: report the ones the user's code makes, at their (small) CPU cost."""
    steps = [s for s in trace.steps() if s.in_window]
    step_numbers = {s.number for s in steps}
    mine = [
        s
        for s in _outermost(_not_the_optimizers(trace.syncs()))
        if s.call_site is not None and (not step_numbers or s.step in step_numbers)
    ]
    if not mine:
        return
    n_steps = max(1, len(steps))
    per_step = len(mine) / n_steps
    if per_step < CPU_MIN_PER_STEP:
        return
    window_us = sum(s.duration_us for s in steps) or float(span_us(trace) or 0.0)
    cost_us = sum(s.duration_us for s in mine)
    share = cost_us / window_us if window_us > 0 else 0.0
    groups: dict[tuple[str | None, str], list[float]] = {}
    for s in mine:
        groups.setdefault((s.call_site, s.inside_op or s.name), []).append(s.duration_us)
    ranked = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    (site, op), _calls = ranked[0]
    src = trace_source(trace)
    items = [
        Evidence("host conversions per step", round(per_step, 1), source=src),
        Evidence("their time on this CPU", round(100 * share, 2), "% of step time", src),
    ]
    items += [
        Evidence(f"{s}: {o}", len(d), f"calls ({round(sum(d) / 1e3, 2)} ms)", src)
        for (s, o), d in ranked[:3]
    ]
    yield Finding(
        "sync.host_sync_in_step",
        Severity.MEDIUM if share >= 0.05 else Severity.LOW,
        CATEGORY,
        f"the step turns tensors into host values {per_step:.0f}x per step, mostly "
        f"{_CAUSE.get(op, f'`{op}`')} at {site}: cheap on this CPU ({share:.1%} of the step), "
        "but on a GPU each one waits for the queue to drain",
        tuple(items),
        threshold=f">= {CPU_MIN_PER_STEP} host conversions per step from the user's code on a "
        "CPU-only trace (medium when they take >= 5 % of the step here)",
        fix=FixRef("sync.remove", {"call_site": site}),
        instruction="keep values as tensors inside the step (accumulate, then log every N "
        "steps with one .item()/.tolist())",
        estimated_gain=share,
    )
