"""What the kernel classifier makes of every recorded trace: one line per trace.

    PYTHONPATH=. python benchmarks/kernel_classes.py [FIXTURES_DIR]

For each trace (and each folder of ranks) under ``tests/fixtures/traces``: the tensor-core
share of compute-kernel time (tensor cores on NVIDIA, MFMA matrix cores on AMD), the share
whose kernel names cannot tell, the communication share of kernel time (busy time, overlaps
merged, as the time breakdown counts it), and the library that ran the most compute time.
A last line counts the distinct kernel names and how many the classifier leaves "unknown"
or ``short_name`` leaves unreadable (empty, a bare namespace, or ending in "::").

On the fixtures (before the classifier, the AMD traces read 0-7 % tensor cores - MFMA
kernels were not recognised - and 51 of the 642 names were unreadable):

    trace                                               tensor unknown    comm  top library
    hta-amd_trace-mi250_minitoy_train_ROCm6_2_kineto.j   27.3%    0.0%    0.0%  PyTorch
    hta-critical_path-alexnet-benchmark_result_2869224   17.0%    0.0%    0.0%  cuBLAS/cuDNN
    hta-critical_path-cuda_event_sync.json.gz             0.0%    0.0%    0.0%  PyTorch
    hta-df_index_resolver.json.gz                         0.0%    0.0%   32.4%  cuBLAS/cuDNN
    hta-nccl_parser_config-nccl_data.json.gz             33.3%    0.0%   21.2%  cuDNN
    hta-negative_queue_length_values_check-rank0.json.   55.2%    3.9%   48.3%  CUTLASS
    hta-ns_resolution_trace-rank-0.pt.trace.json.gz       0.0%    0.0%    0.0%  cuBLAS/cuDNN
    hta-trace_diff-control.json.gz                       23.6%    2.0%   23.0%  PyTorch
    hta-trace_diff-test.json.gz                           0.0%    2.0%   12.1%  cuBLAS/cuDNN
    hta-triton_example.json.gz                            0.0%    0.0%    0.0%  Triton (inductor)
    kineto-resnet50_num_workers_0-worker0.162314308986    0.0%    0.0%    0.0%  cuDNN
    kineto-resnet50_num_workers_4-worker0.162321312936    0.0%    0.0%    0.0%  cuDNN
    tracelens-inference-sglang_Qwen3-8B_prefilldecode.   89.4%    1.2%    0.0%  hipBLASLt
    tracelens-inference-vllm_decode_full-graph_executi   83.6%    0.6%    0.0%  Triton
    tracelens-mi300-Qwen_Qwen1.5-0.5B-Chat.json.gz       52.4%    0.0%    0.0%  PyTorch
    tracelens-mi300-resnet_act_checkpoint.json.gz        24.1%    0.0%   65.1%  PyTorch
    tracelens-torch_compile_triton.json.gz               93.3%    0.0%    0.0%  hipBLASLt
    hta-trace_filter-2of128-ranks                        23.3%    1.0%   55.9%  FBGEMM
    param-dlrm-8rank-v100                                 0.0%    3.3%   84.1%  PyTorch

    642 distinct kernel names: 10 of unknown family, 0 unreadable short names
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from gpudiag.analysis.trace import analyze_trace
from gpudiag.analysis.trace.kernel_classes import classify_kernel
from gpudiag.analysis.trace.kernels import short_name
from gpudiag.analysis.trace.load import kernel_names


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:5.1f}%"


def main(root: Path) -> None:
    items = sorted(root.glob("*.json.gz")) + sorted(
        p for p in root.iterdir() if p.is_dir() and any(p.glob("*.json.gz"))
    )
    print(f"{'trace':50} {'tensor':>7} {'unknown':>7} {'comm':>7}  top library")
    for path in items:
        report = analyze_trace(path)
        tc = [r.tensor_cores for r in report.ranks if r.tensor_cores is not None]
        compute = sum(t.compute_us for t in tc)
        unknown = sum(t.unknown_us for t in tc) / compute if compute else None
        b = report.time_breakdown()
        kernel_us = (b["compute_us"] or 0.0) + (b["communication_us"] or 0.0)
        comm = (b["communication_us"] or 0.0) / kernel_us if kernel_us else None
        by_lib: Counter[str] = Counter()
        for k in report.kernels():
            if k.category == "compute":
                by_lib[k.provider or "?"] += k.total_us
        top = by_lib.most_common(1)[0][0] if by_lib else "-"
        print(
            f"{path.name[:50]:50} {_pct(report.tensor_core_share):>7} {_pct(unknown):>7} "
            f"{_pct(comm):>7}  {top}"
        )
    names = kernel_names(sorted(root.rglob("*.json.gz")))
    unknown_names = sum(classify_kernel(n).family == "unknown" for n in names)
    unreadable = sum(
        not (s := short_name(n)) or s.endswith("::") or s in ("at::native", "at::cuda")
        for n in names
    )
    print(
        f"\n{len(names)} distinct kernel names: {unknown_names} of unknown family, "
        f"{unreadable} unreadable short names"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/fixtures/traces"))
