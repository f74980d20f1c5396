"""Show what gpudiag does: this machine, a recorded A100, a profile, a before/after experiment."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpudiag._values import arg_float
from gpudiag.data import A100_MIG, recording
from gpudiag.errors import GpuDiagError
from gpudiag.probe.system import inspect

# Where the demo writes what it makes (relative to the working directory).
DEFAULT_OUT = "gpudiag-demo"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="only the reports, no experiments")
    parser.add_argument(
        "--budget",
        type=arg_float(0, 86_400, low_open=True),
        default=40.0,
        help="seconds the before/after experiment may take",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        default=DEFAULT_OUT,
        help=f"folder for the profiler trace and the recipe (default: ./{DEFAULT_OUT})",
    )


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def run(args: argparse.Namespace) -> int:
    _section("This machine (live)")
    system = inspect()
    print(system)
    _section("A recorded machine: NVIDIA A100-SXM4-80GB with MIG (replay)")
    print(inspect(replay=recording(A100_MIG)))
    _section("Occupancy of a kernel on the A100 (cc 8.0): 256 threads, 64 registers")
    from gpudiag.analysis.occupancy import best_block_size, block_size_advice, occupancy

    current = occupancy((8, 0), threads_per_block=256, regs_per_thread=64)
    print(current)
    _, best = best_block_size((8, 0), regs_per_thread=64)
    print("\n".join(block_size_advice(current, best)))
    if args.quick:
        return 0

    from gpudiag import workloads
    from gpudiag._progress import ProgressBar
    from gpudiag.experiment.compare import compare
    from gpudiag.profiling import profile
    from gpudiag.step import Step

    out = Path(args.out)
    print(f"\nThe trace and the recipe go into {out}/")
    _section("Profile one training step of the demo GPT (fp32, hand-written attention)")
    training = Step.of(workloads.get("gpt", seq_len=512))
    training.new_optimizer()

    def train_step() -> None:
        training.run()

    with ProgressBar("demo") as bar:
        report = profile(train_step, steps=2, warmup=1, trace_dir=out / "traces", on_progress=bar)
    print(report)

    _section("Before/after on the demo GPT: bf16 autocast and SDPA attention")
    comparison = compare(
        workloads.get("gpt"),
        fixes=["precision.bf16", "attention.backend=flash"],
        system=system,
        time_budget_s=args.budget,
        progress=True,
    )
    print(comparison)
    path = save_recipe(comparison, out)
    print(f"\nRecipe of what helped, written to {path}; to apply it in a training script:\n")
    print(comparison.recipe().to_python(path=str(path)))
    return 0


def save_recipe(comparison: Any, out: Path) -> Path:
    """Write the comparison's recipe as ``out/recipe.yaml`` (the file its snippet loads)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        saved: Path = comparison.recipe().save(out / "recipe.yaml")
    except OSError as exc:
        raise GpuDiagError(
            f"cannot write the recipe into {out}: {exc.strerror or exc}; "
            "pass --out a writable folder"
        ) from None
    return saved
