"""One rank of a distributed trial: the workload under DDP (the baseline) and under FSDP2.

Every rank rebuilds the workload from the same seed (so all arms start from the same weights),
wraps it per arm, and steps the same batch (data-parallel semantics with identical shards: the
averaged gradient is the single-process one, so losses compare across arms and with a plain
run). Per arm and rank:

- memory: on a CPU, torch.profiler's allocator events from *before the model is built*
  (session A: build, wrap, optimizer; session B: the first steps); the step peak is the bytes
  live after A (sharded parameters, DDP's gradient buckets) plus B's high-water mark. Building
  inside the session matters: FSDP frees the full parameters it replaces, and frees of blocks
  allocated before a session are invisible to it. The profiler sees only the profiling
  thread's frees, so a block freed on a gloo thread is retired when its address is reused
  (see live_bytes); what remains makes FSDP's CPU peak vary by a few MiB from run to run.
  On a GPU: ``max_memory_allocated`` over the steps (untested on a real GPU).
- time: after the memory steps, rounds in which each arm runs ``steps_per_round`` steps in a
  seeded random order shared by all ranks, between barriers; each rank's time and the slowest
  rank's (what the job runs at) are kept.
- loss: each step's loss averaged over the ranks, for the drift check.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudiag.errors import UnsupportedFixError
from gpudiag.probe import cuda
from gpudiag.step import Step, Workload, split_batch


@dataclass(frozen=True)
class DdpOptions:
    """DistributedDataParallel's knobs that matter for speed and memory (its defaults)."""

    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    static_graph: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DdpOptions:
        known = {"bucket_cap_mb", "gradient_as_bucket_view", "static_graph"}
        data = dict(data or {})
        unknown = sorted(set(data) - known)
        if unknown:
            from gpudiag.distributed.group import DistributedError

            raise DistributedError(
                f"unknown DDP option {', '.join(unknown)}; use {', '.join(sorted(known))}"
            )
        return cls(
            bucket_cap_mb=float(data.get("bucket_cap_mb", 25.0)),
            gradient_as_bucket_view=bool(data.get("gradient_as_bucket_view", False)),
            static_graph=bool(data.get("static_graph", False)),
        )


@dataclass
class RankArm:
    """An arm as one rank runs it."""

    label: str
    strategy: str  # "ddp" or "fsdp"
    params: dict[str, Any] = field(default_factory=dict)  # fsdp.wrap's parameters
    model: Any = None
    optimizer: Any = None
    micro_batches: list[Any] = field(default_factory=list)
    loss_fn: Callable[[Any, Any], Any] | None = None
    training: Step | None = None  # runs the arm's step (model, optimizer, micro-batches)
    samples_per_step: int = 0  # this rank's samples per optimizer step
    tokens_per_sample: int | None = None
    peak_bytes: int | None = None
    init_peak_bytes: int | None = None
    resident_bytes: int | None = None
    memory_method: str = ""
    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # this rank, per round
    slowest_step_s: list[float] = field(default_factory=list)  # max over ranks, per round
    notes: list[str] = field(default_factory=list)
    error: str = ""
    proof: dict[str, Any] | None = None  # fsdp.wrap's proof of effect on this rank's model

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "strategy": self.strategy,
            "params": self.params,
            "samples_per_step": self.samples_per_step,
            "tokens_per_sample": self.tokens_per_sample,
            "peak_bytes": self.peak_bytes,
            "init_peak_bytes": self.init_peak_bytes,
            "resident_bytes": self.resident_bytes,
            "memory_method": self.memory_method,
            "losses": self.losses,
            "step_s": self.step_s,
            "slowest_step_s": self.slowest_step_s,
            "notes": self.notes,
            "error": self.error,
            "proof": self.proof,
        }


CPU_MEMORY = "torch.profiler allocator events from before the build: live after wrap + step peak"
GPU_MEMORY = "torch.cuda.max_memory_allocated over the first steps (untested on a real GPU)"


MemoryEvent = tuple[float, int, int]  # (time, address, signed bytes)


def _memory_events(fn: Callable[[], Any]) -> list[MemoryEvent]:
    """CPU allocator events (time, address, bytes) of ``fn``, from the profiler's trace."""
    from torch.profiler import ProfilerActivity, profile

    from gpudiag._native_stderr import quiet_profiler_stderr
    from gpudiag.profiling.memory import allocator_events

    with (
        quiet_profiler_stderr(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        fn()
    return allocator_events(prof)


def live_bytes(events: list[MemoryEvent]) -> tuple[int, int]:
    """(bytes live at the end, peak) of a session's allocator events, start = 0.

    The profiler records a thread's allocations and frees only on the thread that profiles;
    a block freed on another thread (gloo's, when an asynchronous collective's work object
    dies) would stay counted forever. An allocation at an address that is still live means
    that block was freed unseen: it is retired first.
    """
    live: dict[int, int] = {}
    level = peak = 0
    for _, addr, nbytes in events:
        if nbytes > 0:
            level -= live.pop(addr, 0)
            live[addr] = nbytes
            level += nbytes
            peak = max(peak, level)
        else:
            level -= live.pop(addr, -nbytes)
    return level, peak


def _wrap(arm: RankArm, workload: Workload, device: str, ddp: DdpOptions) -> None:
    model = workload.model
    if arm.strategy == "fsdp":
        from gpudiag.fixes.fsdp import fsdp_proof, shard_blocks

        names = shard_blocks(model, arm.params)
        what = f"{len(names)} {names[0]}" if names else "no repeated blocks"
        arm.notes.append(f"fully_shard on {what} and the root")
        arm.model = model
        arm.proof = fsdp_proof("fsdp.wrap", model).to_dict()
    else:
        from torch.nn.parallel import DistributedDataParallel

        index = int(device.split(":")[1]) if device.startswith("cuda") else None
        same = _same_weights_everywhere(model)
        if not same:
            arm.notes.append("the ranks built different weights: DDP broadcast rank 0's")
        arm.model = DistributedDataParallel(
            model,
            device_ids=None if index is None else [index],
            # Every rank built the same weights from the same seed: DDP's initial broadcast
            # would copy them onto themselves (and its receive buffers, freed on gloo's
            # threads, escape the profiler's per-thread memory events).
            init_sync=not same,
            bucket_cap_mb=ddp.bucket_cap_mb,
            gradient_as_bucket_view=ddp.gradient_as_bucket_view,
            static_graph=ddp.static_graph,
        )
    factory = workload.optimizer_factory
    arm.optimizer = factory(arm.model.parameters()) if factory is not None else None


def _same_weights_everywhere(model: Any) -> bool:
    """Whether every rank holds the same parameters (a checksum's min and max agree)."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        total = sum(
            float(p.double().sum()) + float(p.double().abs().sum()) for p in model.parameters()
        )
    device = next(iter(model.parameters()), torch.empty(0)).device
    low = torch.tensor([total], dtype=torch.float64, device=device)
    high = low.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return bool(low.item() == high.item())


def _micro_batches(workload: Workload, accumulation: int) -> list[Any]:
    batch = workload.make_batch()
    if accumulation <= 1:
        return [batch]
    parts = split_batch(batch, accumulation)
    return parts if parts is not None else [batch] * accumulation


def _grad_sync(arm: RankArm, parts: int) -> Callable[[bool], Any]:
    """Gradient sync only on the last micro-batch (DDP's ``no_sync``, FSDP2's
    ``set_requires_gradient_sync(False)``)."""
    from contextlib import nullcontext

    model = arm.model

    def sync(last: bool) -> Any:
        if arm.strategy == "fsdp":
            if parts > 1:
                model.set_requires_gradient_sync(last)
            return nullcontext()
        return nullcontext() if last else model.no_sync()

    return sync


def step(arm: RankArm) -> Any:
    """One optimizer step over the arm's micro-batches (the arm's Step); its summed loss."""
    assert arm.training is not None
    arm.training.run()
    loss, arm.training.last_loss = arm.training.last_loss, None
    return loss


def _mean_over_ranks(value: Any) -> float:
    import torch.distributed as dist

    t = value.detach().float().reshape(1).clone()
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def _max_over_ranks(seconds: float, device: str) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def open_arm(
    arm: RankArm,
    build: Callable[[], Workload],
    *,
    device: str,
    ddp: DdpOptions,
    accumulation: int,
    memory_steps: int,
) -> None:
    """Build, wrap and run the first steps of one arm, measuring its memory and losses."""
    holder: dict[str, Workload] = {}

    def build_and_wrap() -> None:
        wl = build()
        holder["wl"] = wl
        _wrap(arm, wl, device, ddp)
        arm.micro_batches = _micro_batches(wl, accumulation)
        arm.loss_fn = wl.loss_fn()
        arm.training = Step.of(wl, arm.model, device_type=device.split(":")[0])
        arm.training.optimizer = arm.optimizer
        arm.training.grad_sync = _grad_sync(arm, len(arm.micro_batches))
        arm.training.keep_loss = True
        arm.training.feed(arm.micro_batches)
        arm.samples_per_step = wl.samples_per_step()
        arm.tokens_per_sample = wl.tokens_per_sample

    def first_steps() -> None:
        for _ in range(memory_steps):
            arm.losses.append(_mean_over_ranks(step(arm)))

    if device.startswith("cuda"):
        cuda.reset_peak_memory_stats()
        start = cuda.memory_allocated()
        build_and_wrap()
        arm.resident_bytes = cuda.memory_allocated() - start
        arm.init_peak_bytes = (cuda.max_memory_allocated() or 0) - start
        cuda.reset_peak_memory_stats()
        before = cuda.memory_allocated()
        first_steps()
        peak = cuda.max_memory_allocated()
        arm.peak_bytes = None if peak is None else peak - before + arm.resident_bytes
        arm.memory_method = GPU_MEMORY
        return
    resident, init_peak = live_bytes(_memory_events(build_and_wrap))
    _, step_peak = live_bytes(_memory_events(first_steps))
    arm.resident_bytes = resident
    arm.init_peak_bytes = init_peak
    arm.peak_bytes = resident + step_peak
    arm.memory_method = CPU_MEMORY


def run_rank(plan: Mapping[str, Any], device: str) -> list[RankArm]:
    """Run every arm of ``plan`` on this rank (call on every rank of the group)."""
    import torch
    import torch.distributed as dist

    from gpudiag.distributed.workload import build

    spec = str(plan["workload"])
    overrides = dict(plan.get("overrides") or {})
    seed = int(plan.get("seed", 0))
    ddp = DdpOptions.from_dict(plan.get("ddp"))
    accumulation = int(plan.get("accumulation", 1))
    memory_steps = int(plan.get("memory_steps", 3))
    rounds = int(plan.get("rounds", 5))
    per_round = int(plan.get("steps_per_round", 2))
    arms = [
        RankArm(label=a["label"], strategy=a["strategy"], params=dict(a.get("params") or {}))
        for a in plan["arms"]
    ]

    def builder() -> Workload:
        torch.manual_seed(seed)
        return build(spec, overrides, device=device, seed=seed)

    for arm in arms:
        try:
            open_arm(
                arm,
                builder,
                device=device,
                ddp=ddp,
                accumulation=accumulation,
                memory_steps=memory_steps,
            )
        except UnsupportedFixError as exc:
            # A fix that cannot apply says so before any collective, the same on every rank:
            # reported per arm. Anything else (the user's workload failing on one rank, an
            # out-of-memory) ends this rank: the others would wait for it in their next
            # collective until the group's timeout. torchrun then ends them, and the caller
            # reports this rank's own error as the first failure (gpudiag._rank_exit).
            arm.error = f"{type(exc).__name__}: {exc}"
    live = [a for a in arms if not a.error]
    order_rng = random.Random(seed)
    for _ in range(rounds):
        order = list(live)
        order_rng.shuffle(order)  # the same order on every rank: same seed, same draws
        for arm in order:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(per_round):
                step(arm)
            cuda.synchronize()
            mine = (time.perf_counter() - t0) / per_round
            arm.step_s.append(mine)
            arm.slowest_step_s.append(_max_over_ranks(mine, device))
    return arms
