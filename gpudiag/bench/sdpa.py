"""Attention ceiling: time and peak memory per backend and sequence length, forward and backward."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._progress import ProgressFn, iterate, resolve
from gpudiag._report import jsonable
from gpudiag._views import Card, Carded, Grid, Lines
from gpudiag.analysis.measurement import noise_warning
from gpudiag.bench import _env
from gpudiag.bench.timing import Measurement, Rotation, copies_to_exceed_cache, measure
from gpudiag.errors import GpuDiagError

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

BACKENDS: tuple[str, ...] = ("flash", "efficient", "cudnn", "math", "flash_attn", "te")
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
# Backends whose code path has only been exercised against import-level fakes.
UNTESTED_ON_GPU = ("flash_attn", "te")

# Relative error allowed against a float64 math-backend reference on one (batch, head) slice.
TOLERANCE: Mapping[str, float] = {"fp32": 2e-3, "bf16": 3e-2, "fp16": 1e-2}

# FlashAttention-2 (Dao, 2023) convention: the backward pass costs 2.5x the forward's FLOPs
# (five matmuls instead of two).
BACKWARD_FLOP_FACTOR = 2.5


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool) -> int:
    """Forward FLOPs of attention: two matmuls of 2*S*S*D per head; half of it when causal."""
    flops = 4 * batch * heads * seq_len * seq_len * head_dim
    return flops // 2 if causal else flops


@dataclass(frozen=True, slots=True)
class AttentionRow:
    """One backend at one sequence length. Times are per call; memory is the peak above the
    inputs during one forward + backward."""

    backend: str
    seq_len: int
    forward: Measurement | None = None
    backward: Measurement | None = None
    forward_tflops: float | None = None
    backward_tflops: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_source: str = ""
    max_rel_error: float | None = None
    correct: bool = False
    reason: str = ""
    untested_on_gpu: bool = False

    @property
    def ran(self) -> bool:
        return self.forward is not None

    @property
    def forward_ms(self) -> float | None:
        return self.forward.median_s * 1e3 if self.forward is not None else None

    @property
    def backward_ms(self) -> float | None:
        return self.backward.median_s * 1e3 if self.backward is not None else None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "backend": self.backend,
                "seq_len": self.seq_len,
                "forward_ms": self.forward_ms,
                "backward_ms": self.backward_ms,
                "forward_tflops": self.forward_tflops,
                "backward_tflops": self.backward_tflops,
                "peak_memory_bytes": self.peak_memory_bytes,
                "peak_memory_source": self.peak_memory_source,
                "max_rel_error": self.max_rel_error,
                "correct": self.correct,
                "reason": self.reason,
                "untested_on_gpu": self.untested_on_gpu,
                "forward": self.forward,
                "backward": self.backward,
            }
        )


@dataclass(frozen=True, slots=True)
class AttentionResult(Carded):
    """``gd.bench.attention()``: one row per (backend, sequence length); a backend that cannot
    run has rows with ``reason`` and no times."""

    device: str
    dtype: str
    batch: int
    heads: int
    head_dim: int
    causal: bool
    rows: tuple[AttentionRow, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.backend for r in self.rows))

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(sorted({r.seq_len for r in self.rows}))

    def row(self, backend: str, seq_len: int) -> AttentionRow:
        for r in self.rows:
            if r.backend == backend and r.seq_len == seq_len:
                return r
        raise GpuDiagError(
            f"No result for backend {backend!r} at sequence length {seq_len}: measured backends "
            f"{', '.join(self.backends)} at {', '.join(map(str, self.seq_lens))}."
        )

    def time_ms(self, backend: str, seq_len: int, *, backward: bool = False) -> float | None:
        """Median milliseconds per call; None when the backend could not run (see ``reason``)."""
        r = self.row(backend, seq_len)
        return r.backward_ms if backward else r.forward_ms

    def reason(self, backend: str) -> str:
        reasons = {r.reason for r in self.rows if r.backend == backend and r.reason}
        if not any(r.backend == backend for r in self.rows):
            raise GpuDiagError(f"Backend {backend!r} was not part of this run.")
        return "; ".join(sorted(reasons))

    def fastest(self, seq_len: int, *, backward: bool = False) -> str | None:
        """The backend with the lowest correct median time at ``seq_len``."""
        timed = [
            (t, r.backend)
            for r in self.rows
            if r.seq_len == seq_len
            and r.correct
            and (t := (r.backward_ms if backward else r.forward_ms)) is not None
        ]
        return min(timed)[1] if timed else None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "attention",
                "device": self.device,
                "dtype": self.dtype,
                "batch": self.batch,
                "heads": self.heads,
                "head_dim": self.head_dim,
                "causal": self.causal,
                "rows": self.rows,
                "notes": self.notes,
            }
        )

    def plot(self) -> Any:
        return _views.build("figure", self)

    def _table(self) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for r in self.rows:
            if not r.ran or not r.correct:
                out.append((r.backend, str(r.seq_len), "", "", "", r.reason))
                continue
            mem = (
                f"{r.peak_memory_bytes / (1 << 20):.1f} MiB"
                if r.peak_memory_bytes is not None
                else "N/A"
            )
            fwd = (
                f"{r.forward_ms:.3f} ({r.forward_tflops:.2f} TF/s)"
                if r.forward_ms is not None and r.forward_tflops
                else ""
            )
            bwd = (
                f"{r.backward_ms:.3f} ({r.backward_tflops:.2f} TF/s)"
                if r.backward_ms is not None and r.backward_tflops
                else "N/A"
            )
            note = "ok" + (" (untested on a real GPU)" if r.untested_on_gpu else "")
            out.append((r.backend, str(r.seq_len), fwd, bwd, mem, note))
        return out

    def __repr__(self) -> str:
        head = (
            f"AttentionResult on {self.device}: {self.dtype}, batch {self.batch}, "
            f"{self.heads} heads "
            f"x {self.head_dim}, {'causal' if self.causal else 'full'} mask"
        )
        lines = [
            head,
            f"  {'backend':<11}{'seq':>6}  {'fwd ms':>16}  {'bwd ms':>16}  {'peak mem':>10}",
        ]
        for backend, seq, fwd, bwd, mem, note in self._table():
            if not fwd:
                lines.append(f"  {backend:<11}{seq:>6}  {note}")
            else:
                lines.append(f"  {backend:<11}{seq:>6}  {fwd:>16}  {bwd:>16}  {mem:>10}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_card(self) -> Card:
        table = Grid(
            ("backend", "seq len", "forward ms", "backward ms", "peak memory", "status"),
            self._table(),
        )
        notes = Lines(self.notes, "note")
        subtitle = (
            f"{self.device} · {self.dtype} · batch {self.batch} · {self.heads} heads x "
            f"{self.head_dim} · {'causal' if self.causal else 'no mask'}"
        )
        return Card("Attention backends", [table, notes], subtitle=subtitle)


@dataclass
class _Runner:
    """How to call one backend: the input layout, the call, and a context to run it in."""

    layout: str  # "bhsd" or "bshd"
    call: Callable[[Any, Any, Any], Any]
    causal: bool
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def _sdpa_runner(backend: str, causal: bool) -> _Runner:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    return _Runner(
        "bhsd",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        causal,
        lambda: sdpa_kernel(which),
    )


def _flash_attn_runner(causal: bool) -> _Runner:
    import flash_attn

    return _Runner(
        "bshd", lambda q, k, v: flash_attn.flash_attn_func(q, k, v, causal=causal), causal
    )


def _te_runner(heads: int, head_dim: int, causal: bool, device: str) -> _Runner:
    import transformer_engine.pytorch as te

    module = te.DotProductAttention(
        heads,
        head_dim,
        attention_dropout=0.0,
        attn_mask_type="causal" if causal else "no_mask",
        qkv_format="bshd",
    )

    def call(q: Any, k: Any, v: Any) -> Any:
        out = module(q, k, v)
        return out.view(q.shape)  # TE returns (B, S, H*D)

    return _Runner("bshd", call, causal)


def _runner(backend: str, *, heads: int, head_dim: int, causal: bool, device: str) -> _Runner | str:
    """The runner, or the reason the backend cannot be used here."""
    if backend in SDPA_BACKENDS:
        return _sdpa_runner(backend, causal)
    if backend == "flash_attn":
        try:
            return _flash_attn_runner(causal)
        except ImportError as exc:
            return (
                f"flash-attn not installed ({exc}); pip install flash-attn "
                "(needs a CUDA build of torch)"
            )
    try:
        return _te_runner(heads, head_dim, causal, device)
    except Exception as exc:  # TE raises OSError/RuntimeError at import without a GPU driver
        return (
            f"Transformer Engine unavailable ({type(exc).__name__}: {_first_line(exc)}); "
            "pip install transformer-engine[pytorch] on a CUDA machine"
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _torch_dtype(dtype: str) -> Any:
    import torch

    try:
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise GpuDiagError(f"Attention dtype {dtype!r}: use fp32, bf16 or fp16.") from None


def _make_inputs(
    layout: str, b: int, h: int, s: int, d: int, dtype: Any, device: str
) -> tuple[Any, ...]:
    import torch

    shape = (b, h, s, d) if layout == "bhsd" else (b, s, h, d)
    return tuple(torch.randn(shape, device=device).to(dtype).requires_grad_(True) for _ in range(3))


def _head0(x: Any, layout: str) -> Any:
    """The (batch 0, head 0) slice as (1, 1, S, D)."""
    return (x[0, 0] if layout == "bhsd" else x[0, :, 0]).unsqueeze(0).unsqueeze(0)


def _check(runner: _Runner, qkv: tuple[Any, ...], dout: Any) -> float:
    """Largest relative error of output and input gradients on one head, vs float64 math."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = qkv
    with runner.context():
        out = runner.call(q, k, v)
        grads = torch.autograd.grad(out, qkv, dout)
    ref_in = tuple(_head0(x, runner.layout).detach().double().requires_grad_(True) for x in qkv)
    with sdpa_kernel(SDPBackend.MATH):
        ref_q, ref_k, ref_v = ref_in
        ref_out = F.scaled_dot_product_attention(ref_q, ref_k, ref_v, is_causal=runner.causal)
        ref_grads = torch.autograd.grad(ref_out, ref_in, _head0(dout, runner.layout).double())
    worst = 0.0
    with torch.no_grad():
        pairs = [
            (g.detach(), r.detach())
            for g, r in zip((out, *grads), (ref_out, *ref_grads), strict=True)
        ]
    for got, ref in pairs:
        got0 = _head0(got, runner.layout).double()
        denom = float(torch.linalg.vector_norm(ref))
        err = float(torch.linalg.vector_norm(got0 - ref)) / denom if denom > 0 else math.inf
        worst = max(worst, err)
    return worst


def _peak_memory(target: _env.Target, step: Callable[[], None]) -> tuple[int | None, str]:
    """Peak bytes allocated above the baseline during ``step``."""
    if target.is_cuda:
        from gpudiag.probe import cuda

        cuda.synchronize(target.index)
        base = cuda.memory_allocated(target.index)
        cuda.reset_peak_memory_stats(target.index)
        step()
        cuda.synchronize(target.index)
        peak = cuda.max_memory_allocated(target.index)
        return (None, "") if peak is None else (max(0, peak - base), "CUDA caching allocator peak")
    # On the CPU torch keeps no allocator peak; the profiler's memory events give the running
    # total of torch allocations, whose maximum is the peak.
    from torch.profiler import ProfilerActivity, profile

    from gpudiag._native_stderr import quiet_profiler_stderr

    with (
        quiet_profiler_stderr(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak_bytes = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += int(event.nbytes())
        peak_bytes = max(peak_bytes, running)
    return peak_bytes, "torch profiler memory events (CPU allocations)"


# The timed parts of an attention case.
PARTS = ("forward", "backward")


def attention(
    seq_lens: Iterable[int] | None = None,
    backends: Iterable[str] | None = None,
    *,
    batch: int | None = None,
    heads: int | None = None,
    head_dim: int | None = None,
    dtype: str | None = None,
    causal: bool = True,
    backward: bool = True,
    device: str | int | None = None,
    repeats: int | None = None,
    warmup: int = 2,
    max_time_s: float | None = None,
    system: SystemReport | None = None,
    progress: bool | ProgressFn = True,
    seed: int = 0,
) -> AttentionResult:
    """Time attention backends per sequence length, forward and backward, with peak memory.

    SDPA backends (flash, efficient, cudnn, math) are forced one at a time with
    ``torch.nn.attention.sdpa_kernel``; flash-attn and Transformer Engine are used when they
    import. A backend that cannot run gets rows whose ``reason`` says why. Forward calls
    rotate copies of Q/K/V larger than the last-level cache; backward is
    ``torch.autograd.grad`` on a retained graph. Each backend's output and gradients on one
    (batch, head) slice are checked against a float64 math-backend reference.
    FLOPs: forward 4*B*H*S^2*D (halved when causal), backward 2.5x forward.
    flash-attn and Transformer Engine paths, and every GPU path, are untested on a real GPU.
    """
    import torch

    target = _env.resolve_device(device)
    if dtype is None:
        fast_bf16 = target.is_cuda or bool(
            set(_env.cpu_flags(system)) & {"avx512_bf16", "amx_bf16"}
        )
        dtype = "bf16" if fast_bf16 else "fp32"
    dtype = _env.normalize_dtype(dtype)
    tdtype = _torch_dtype(dtype)
    chosen = tuple(backends) if backends is not None else BACKENDS
    for name in chosen:
        if name not in BACKENDS:
            raise GpuDiagError(
                f"Unknown attention backend {name!r}: use one of {', '.join(BACKENDS)}."
            )
    seqs = tuple(
        _env.whole_numbers(
            seq_lens or ((1024, 2048, 4096, 8192) if target.is_cuda else (512, 1024, 2048)),
            "seq_lens",
            high=1 << 26,
        )
    )
    b, h, d = _env.whole_numbers(
        [
            batch if batch is not None else (4 if target.is_cuda else 1),
            heads if heads is not None else (16 if target.is_cuda else 8),
            head_dim if head_dim is not None else (128 if target.is_cuda else 64),
        ],
        "batch, heads and head_dim",
        high=1 << 20,
    )
    repeats = repeats if repeats is not None else (20 if target.is_cuda else 7)
    max_time_s = max_time_s if max_time_s is not None else (2.0 if target.is_cuda else 4.0)
    cache_bytes, _ = _env.last_level_cache_bytes(target, system)
    timer = _env.timer_for(target)
    notes = ["backward reuses one retained graph (no rotation)"]
    if target.is_cuda:
        notes.append("GPU path: untested on a real GPU in this version of gpudiag")
    torch.manual_seed(seed)
    rows: list[AttentionRow] = []
    runners = {
        n: _runner(n, heads=h, head_dim=d, causal=causal, device=target.torch_device)
        for n in chosen
    }
    cases = [(n, s) for n in chosen for s in seqs]
    for name, seq in iterate(cases, "attention", resolve(progress, "bench")):
        runner = runners[name]
        untested = name in UNTESTED_ON_GPU
        if isinstance(runner, str):
            rows.append(
                AttentionRow(name, seq, reason=f"cannot run: {runner}", untested_on_gpu=untested)
            )
            continue
        rows.append(
            _one_case(
                target,
                name,
                runner,
                b,
                h,
                seq,
                d,
                tdtype,
                dtype,
                cache_bytes,
                timer,
                backward=backward,
                repeats=repeats,
                warmup=warmup,
                max_time_s=max_time_s,
                untested=untested,
            )
        )
    if any(r.untested_on_gpu and r.ran for r in rows):
        notes.append(
            "flash-attn / Transformer Engine timings come from code untested on a real GPU"
        )
    swung = noise_warning(
        [(f"{r.backend} {r.seq_len} {part}", getattr(r, part)) for r in rows for part in PARTS]
    )
    notes += [swung] if swung else []
    return AttentionResult(target.label, dtype, b, h, d, causal, tuple(rows), tuple(notes))


def _one_case(
    target: _env.Target,
    name: str,
    runner: _Runner,
    b: int,
    h: int,
    s: int,
    d: int,
    tdtype: Any,
    dtype: str,
    cache_bytes: int,
    timer: Any,
    *,
    backward: bool,
    repeats: int,
    warmup: int,
    max_time_s: float,
    untested: bool,
) -> AttentionRow:
    import torch

    from gpudiag.probe import cuda

    dev = target.torch_device
    elem = torch.finfo(tdtype).bits // 8
    copies = copies_to_exceed_cache(3 * b * h * s * d * elem, cache_bytes, max_total_bytes=1 << 30)
    fwd_flops = attention_flops(b, h, s, d, causal=runner.causal)
    # q, k, v per copy (made in fp32, then converted), the output and its gradient
    refused = _env.too_big(target, (3 * copies + 2) * b * h * s * d * max(elem, 4))
    if refused:
        return AttentionRow(name, s, reason=refused, untested_on_gpu=untested)
    try:
        inputs = [_make_inputs(runner.layout, b, h, s, d, tdtype, dev) for _ in range(copies)]
        dout = torch.randn(inputs[0][0].shape, device=dev).to(tdtype)
        rotation = Rotation(inputs)
        with runner.context():
            fwd = measure(
                lambda: runner.call(*rotation.next()),
                repeats=repeats,
                warmup=warmup,
                max_time_s=max_time_s,
                timer=timer,
                label=f"{name} fwd S={s}",
            )
            bwd = None
            if backward:
                qkv = inputs[0]
                out = runner.call(*qkv)
                bwd = measure(
                    lambda: torch.autograd.grad(out, qkv, dout, retain_graph=True),
                    repeats=repeats,
                    warmup=warmup,
                    max_time_s=max_time_s,
                    timer=timer,
                    label=f"{name} bwd S={s}",
                )
                del out

            def step() -> None:
                o = runner.call(*inputs[0])
                torch.autograd.grad(o, inputs[0], dout)

            peak, peak_source = _peak_memory(target, step)
        error = _check(runner, inputs[0], dout)
    except (RuntimeError, ValueError, TypeError, AssertionError, NotImplementedError) as exc:
        what = "out of memory" if cuda.is_oom_error(exc) else "cannot run"
        hint = ""
        if not target.is_cuda and name in {"efficient", "cudnn"}:
            hint = " (this SDPA kernel exists only for CUDA)"
        return AttentionRow(
            name, s, reason=f"{what}{hint}: {_first_line(exc)}", untested_on_gpu=untested
        )
    tol = TOLERANCE[dtype]
    correct = error <= tol
    return AttentionRow(
        name,
        s,
        fwd,
        bwd,
        fwd.rate(fwd_flops) / 1e12,
        bwd.rate(BACKWARD_FLOP_FACTOR * fwd_flops) / 1e12 if bwd is not None else None,
        peak,
        peak_source,
        error,
        correct,
        "" if correct else f"wrong result: relative error {error:.2e} > {tol:.0e}",
        untested,
    )
