"""Parallel layout for a transformer over N GPUs: DP / FSDP (ZeRO) / TP / PP / SP, ranked.

gpudiag plan llama3-70b --gpus 64 --seq-len 8192 --global-batch 512
gpudiag plan config.json --gpus 8 --topology topo.txt        # a Hugging Face config.json
gpudiag plan --layers 24 --hidden 2048 --heads 16 --vocab 50257 --gpus 8 --json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpudiag._files import CONFIG_BYTES, read_json
from gpudiag._values import arg_float, arg_int, whole_number
from gpudiag.errors import ArgumentError, GpuDiagError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a known model (gpt3-175b, llama3-70b, ...) or a JSON config file",
    )
    parser.add_argument(
        "--layers", type=arg_int(1, 100_000), default=None, help="without a model: layers"
    )
    parser.add_argument(
        "--hidden", type=arg_int(1, 1 << 20), default=None, help="without a model: hidden size"
    )
    parser.add_argument(
        "--heads", type=arg_int(1, 1 << 16), default=None, help="without a model: heads"
    )
    parser.add_argument(
        "--kv-heads", type=arg_int(1, 1 << 16), default=None, help="key/value heads (GQA)"
    )
    parser.add_argument(
        "--ffn", type=arg_int(1, 1 << 24), default=None, help="MLP hidden size (default 4 x)"
    )
    parser.add_argument("--vocab", type=arg_int(0, 1 << 31), default=0, help="vocabulary size")
    parser.add_argument("--gpus", type=arg_int(1, 1_000_000), required=True, help="GPUs in all")
    parser.add_argument("--gpu", default="H100 SXM5 80GB", help="a GPU the spec table knows")
    parser.add_argument("--gpu-memory", default=None, help="memory per GPU, e.g. 80GiB")
    parser.add_argument(
        "--nodes",
        type=arg_int(1, 1_000_000),
        default=None,
        help="machines (default: one, or the recorded one's)",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=arg_int(1, 4096),
        default=None,
        help="GPUs per machine (default up to 8)",
    )
    parser.add_argument(
        "--seq-len",
        type=arg_int(1, 1 << 30),
        default=None,
        help="tokens per sequence (default: the model's)",
    )
    parser.add_argument(
        "--global-batch", type=arg_int(1, 1 << 30), default=None, help="sequences per step"
    )
    parser.add_argument(
        "--micro-batch",
        type=arg_int(1, 1 << 30),
        default=1,
        help="sequences per GPU per micro-step (%(default)s)",
    )
    parser.add_argument("--topology", default=None, help="a recorded `nvidia-smi topo -m` file")
    parser.add_argument("--precision", default="bf16", help="bf16, fp16 or fp32 (%(default)s)")
    parser.add_argument(
        "--mfu", type=arg_float(0, 1, low_open=True), default=None, help="assumed model FLOPs use"
    )
    parser.add_argument(
        "--network-gbps", type=arg_float(0, 1e6, low_open=True), default=None, help="GB/s per GPU"
    )
    parser.add_argument("--zero", default=None, help="ZeRO stages to consider, e.g. 0,1")
    parser.add_argument("--top", type=arg_int(0, 100_000), default=10, help="layouts to print")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def model_from_args(args: argparse.Namespace, namespace: dict[str, Any] | None = None) -> Any:
    """The model argument: a notebook variable, a known name, a JSON file, or the sizes."""
    from gpudiag.experiment.plan import KNOWN_MODELS

    name = args.model
    if name is None:
        if not (args.layers and args.hidden and args.heads):
            raise GpuDiagError(
                "name a model (e.g. llama3-8b), a JSON config file, or give --layers, "
                "--hidden and --heads"
            )
        cfg: dict[str, Any] = {
            "layers": args.layers,
            "hidden": args.hidden,
            "heads": args.heads,
            "vocab_size": args.vocab,
        }
        if args.kv_heads:
            cfg["kv_heads"] = args.kv_heads
        if args.ffn:
            cfg["ffn_hidden"] = args.ffn
        return cfg
    if namespace is not None and name in namespace:
        return namespace[name]
    if name.lower().replace("_", "-") in KNOWN_MODELS:
        return name
    path = Path(name)
    if path.suffix.lower() == ".json" or path.exists():
        return read_json(path, "config", max_bytes=CONFIG_BYTES)
    raise GpuDiagError(
        f"{name!r} is neither a known model ({', '.join(KNOWN_MODELS)}) nor a JSON config file"
    )


def compute(args: argparse.Namespace, namespace: dict[str, Any] | None = None) -> Any:
    """The Plan for the parsed arguments (``namespace``: notebook variables for the model)."""
    from gpudiag.experiment import plan as planner

    topology = None
    if args.topology:
        from gpudiag.probe.topology import load_topology

        topology = load_topology(args.topology)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    if args.zero:
        try:
            zero = tuple(
                whole_number(z, "a ZeRO stage", low=0, high=3) for z in args.zero.split(",")
            )
        except ArgumentError:
            raise GpuDiagError(f"--zero {args.zero!r}: list stages, e.g. 0,1,2,3") from None
    return planner.plan(
        model_from_args(args, namespace),
        gpus=args.gpus,
        gpu=args.gpu,
        gpu_memory=args.gpu_memory,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        topology=topology,
        precision=args.precision,
        mfu=planner.DEFAULT_MFU if args.mfu is None else args.mfu,
        network_gbps=(
            planner.DEFAULT_NETWORK_GBPS if args.network_gbps is None else args.network_gbps
        ),
        zero_stages=zero,
    )


def run(args: argparse.Namespace) -> int:
    result = compute(args)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    text = repr(result).splitlines()
    print(text[0])
    from gpudiag.experiment.plan import RULE_WORDS, _row_text

    for n, lay in enumerate(result.layouts[: max(0, args.top)], 1):
        print(f"  {n}. {_row_text(lay)}")
    if not result.layouts:
        print("  no layout fits")
    for rule, count in result.ruled_out_counts().items():
        print(f"  ruled out {count}: {RULE_WORDS.get(rule, rule)}")
    for note in result.assumptions:
        print(f"  assumes: {note}")
    return 0
