"""Diagnose a run (system, trace, demo workload); under torchrun, every rank in one report.

One command, two situations. In one process (``gpudiag doctor``, alias ``gpudiag diagnose``)
it is ``gd.diagnose``: the rules over this machine (or a recorded one), a trace, a demo
workload it profiles, a file of code. Under torchrun (``torchrun --nproc-per-node=N -m gpudiag
doctor``: RANK and WORLD_SIZE set) every rank gathers its evidence, rank 0 prints one merged
report (stragglers, environment mismatches, the all-reduce). The rank options (``--set``,
``--no-profile``, ``--no-collective``, ``--sizes``, ``--threshold``) also run the rank doctor
in one process, as a job of one rank that says so.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpudiag._files import CODE_BYTES, read_text
from gpudiag._values import arg_float, arg_int
from gpudiag.commands.bench import byte_size
from gpudiag.errors import GpuDiagError

# The demo GPT at a sequence length that steps in well under a second on a laptop CPU.
DEFAULT_OVERRIDES: dict[str, dict[str, Any]] = {"gpt": {"seq_len": 256}}
RANK_WORKLOAD = "gpt"  # what every rank runs without --workload
STEPS = 3  # profiled steps in one process
RANK_STEPS = 5  # timed steps per rank
THRESHOLD = 0.10

# option -> its argparse dest, for the options that belong to one of the two situations
_ONE_PROCESS_ONLY = {
    "--trace": "trace",
    "--replay": "replay",
    "--topology": "topology",
    "--code": "code",
    "--no-scaling": "no_scaling",
}
_RANK_ONLY = {
    "--set": "overrides",
    "--no-profile": "no_profile",
    "--no-collective": "no_collective",
    "--sizes": "sizes",
    "--threshold": "threshold",
}


def _override(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r} (e.g. seq_len=512)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--workload",
        metavar="NAME",
        default=None,
        help="a demo workload (gpt, mlp, cnn, input_bound) to profile (default: none, only "
        "the machine is checked); under torchrun also package.module:function returning a "
        "gd.Workload, rebuilt on every rank (default there: gpt)",
    )
    parser.add_argument(
        "--steps",
        type=arg_int(1, 10_000),
        default=None,
        help=f"profiled steps of --workload ({STEPS}); timed steps per rank ({RANK_STEPS})",
    )
    one = parser.add_argument_group("one process")
    one.add_argument(
        "--trace",
        metavar="T",
        action="append",
        default=[],
        help="a torch.profiler / Kineto trace (.json or .json.gz); repeat for one file per rank",
    )
    one.add_argument(
        "--replay",
        metavar="FILE",
        help="diagnose a recorded machine: `nvidia-smi -q -x` XML, `nvidia-smi -q` or "
        "`nvidia-smi` text, or a `gpudiag inspect --json` snapshot",
    )
    one.add_argument(
        "--topology",
        metavar="FILE",
        action="append",
        help="with --replay: the machine's `nvidia-smi topo -m` (and `topo -p2p r`) output",
    )
    one.add_argument(
        "--no-scaling",
        action="store_true",
        help="skip timing the workload at 4x its batch (the per-step overhead rule)",
    )
    one.add_argument("--code", metavar="FILE", help="a Python file to scan for API misuse")
    ranks = parser.add_argument_group("every rank (under torchrun)")
    ranks.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        type=_override,
        action="append",
        default=None,
        help="a workload parameter, repeatable (default for gpt: seq_len=256)",
    )
    ranks.add_argument("--no-profile", action="store_true", help="skip the one profiled step")
    ranks.add_argument(
        "--no-collective", action="store_true", help="skip the all-reduce measurement"
    )
    ranks.add_argument(
        "--sizes", nargs="+", type=byte_size, default=None, help="all-reduce sizes (64K style)"
    )
    ranks.add_argument(
        "--threshold",
        type=arg_float(),
        default=None,
        help=f"a rank this much slower than the others is a straggler (default {THRESHOLD})",
    )


def _given(args: argparse.Namespace, options: dict[str, str]) -> list[str]:
    return [
        opt for opt, dest in options.items() if getattr(args, dest, None) not in (None, False, [])
    ]


def on_every_rank(args: argparse.Namespace) -> bool:
    """Whether this is the rank doctor: under torchrun, or asked for with a rank option. Mixing
    the options of the two situations is a GpuDiagError that names them."""
    from gpudiag.distributed.group import rank_env

    one, rank = _given(args, _ONE_PROCESS_ONLY), _given(args, _RANK_ONLY)
    under_torchrun = rank_env() is not None
    if one and (rank or under_torchrun):
        why = "under torchrun" if under_torchrun else f"with {', '.join(rank)}"
        raise GpuDiagError(
            f"{', '.join(one)} diagnose{'s' if len(one) == 1 else ''} one process; {why} "
            "gpudiag doctor runs on every rank: leave one of them out"
        )
    return under_torchrun or bool(rank)


def run_one_process(args: argparse.Namespace) -> int:
    """``gd.diagnose`` over the arguments; prints the diagnosis."""
    from gpudiag.doctor import diagnose
    from gpudiag.probe.system import inspect

    steps = STEPS if args.steps is None else args.steps
    # Trace files, analysed by gd.diagnose, which then knows they may come from elsewhere.
    trace = (args.trace[0] if len(args.trace) == 1 else args.trace) if args.trace else None
    code = None
    if args.code:
        code = read_text(args.code, "--code file", max_bytes=CODE_BYTES)
    if steps < 1:
        raise GpuDiagError("--steps must be at least 1")
    system = inspect(replay=args.replay, topology=args.topology or None)
    from gpudiag._progress import ProgressBar

    with ProgressBar("diagnose", enabled=not args.json) as bar:
        diagnosis = diagnose(
            workload=args.workload,
            trace=trace,
            system=system,
            code=code,
            steps=steps,
            scaling=not args.no_scaling,
            progress=bar,
        )
    if args.json:
        print(json.dumps(diagnosis.to_dict(), indent=2))
        return 0
    if not (args.workload or args.trace or args.code):
        print(
            "no workload or trace given: only the machine was checked. `--workload gpt` profiles "
            "a demo, `--trace FILE` reads your own torch.profiler trace, and `%%gpudiag doctor` "
            "in a notebook profiles the cell's training step."
        )
    if diagnosis.trace is not None and diagnosis.trace.has_gpu_events:
        # Where the step's time goes opens the report, as it opens the notebook's card.
        print("\n".join(diagnosis.trace.ledger().lines()) + "\n")
    print(diagnosis)
    return 0


def run_every_rank(args: argparse.Namespace) -> int:
    """The rank doctor: rank 0 prints the merged report (exit 1 when a rank failed)."""
    from gpudiag.distributed.run import doctor

    workload = args.workload or RANK_WORKLOAD
    steps = RANK_STEPS if args.steps is None else args.steps
    threshold = THRESHOLD if args.threshold is None else args.threshold
    if steps < 1:
        raise GpuDiagError("--steps must be at least 1")
    if not 0 < threshold < 10:
        raise GpuDiagError(f"--threshold is a fraction such as 0.10 (10 %), got {threshold}")
    overrides = dict(args.overrides) if args.overrides else DEFAULT_OVERRIDES.get(workload)
    report = doctor(
        workload=workload,
        overrides=overrides,
        steps=steps,
        profile=not args.no_profile,
        collective=not args.no_collective,
        sizes=args.sizes,
        threshold=threshold,
    )
    if report is None:  # not rank 0: rank 0 prints the merged report
        return 0
    print(json.dumps(report.to_dict(), indent=2) if args.json else repr(report))
    return 1 if any(r.error for r in report.ranks) else 0


def run(args: argparse.Namespace) -> int:
    return run_every_rank(args) if on_every_rank(args) else run_one_process(args)
