"""`gpudiag bench ...` and `%gpudiag bench ...`: arguments, JSON output, the torchrun line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.nccl import CollectiveResult
from gpudiag.bench.gemm import MatmulResult
from gpudiag.cli import main
from gpudiag.commands.bench import byte_size, matmul_size


def test_matmul_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "matmul", "--sizes", "32", "--dtypes", "fp32", "--repeats", "2",
                 "--device", "cpu", "--json"])  # fmt: skip
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "matmul"
    assert data["rows"][0]["m"] == 32
    assert data["rows"][0]["correct"]


def test_bandwidth_table_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    html = tmp_path / "bw.html"
    code = main(["bench", "bandwidth", "--kinds", "copy", "h2d_pinned", "--sizes", "64K",
                 "--repeats", "2", "--device", "cpu", "--plot", str(html)])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "BandwidthResult on cpu" in out
    assert "needs a CUDA device" in out
    assert html.read_text().count("plotly") > 0


def test_allreduce_prints_the_multinode_command_only(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "allreduce", "--print-command", "--sizes", "1M", "--nnodes", "4",
                 "--nproc-per-node", "8", "--rdzv-endpoint", "node0:29500"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("torchrun --nnodes=4 --nproc-per-node=8")
    assert "--rdzv-endpoint=node0:29500" in out
    assert "--sizes 1048576" in out


def test_nccl_log(capsys: pytest.CaptureFixture[str], fixtures_dir: Path) -> None:
    log = fixtures_dir / "nccl-tests" / "superbench-nccl_allgather.log"
    assert main(["bench", "nccl-log", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["op"] == "all_gather"
    assert data["peak_busbw_gbps"] == pytest.approx(230.07)
    assert main(["bench", "nccl-log", "missing.log"]) == 1
    assert "not found" in capsys.readouterr().err


def test_size_parsers() -> None:
    assert byte_size("4096") == 4096
    assert byte_size("64K") == 64 << 10
    assert byte_size("1.5MiB") == 3 << 19
    assert matmul_size("2048") == 2048
    assert matmul_size("4096x1024x512") == (4096, 1024, 512)
    for bad in ("12Q", "0", "0.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            byte_size(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        matmul_size("2x3")


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


def test_magic_returns_the_result(ip: Any) -> None:
    result = ip.run_line_magic(
        "gpudiag", "bench matmul --sizes 32 --dtypes bf16 --repeats 2 --device cpu"
    )
    assert isinstance(result, MatmulResult)
    assert result.tflops("bf16") is not None


def test_magic_reads_nccl_logs_and_prints_usage_errors(
    ip: Any, fixtures_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = fixtures_dir / "nccl-tests" / "superbench-nccl_allreduce.log"
    result = ip.run_line_magic("gpudiag", f"bench nccl-log '{log}'")
    assert isinstance(result, CollectiveResult)
    assert result.op == "all_reduce"
    assert ip.run_line_magic("gpudiag", "bench matmul --sizes banana") is None
    assert "not a matmul size" in capsys.readouterr().out
    assert ip.run_line_magic("gpudiag", "bench nccl-log nowhere.log") is None
    assert "not found" in capsys.readouterr().out


def test_bench_without_a_benchmark_lists_them(
    capsys: pytest.CaptureFixture[str], ipython_shell: Any
) -> None:
    assert main(["bench"]) == 2
    out = capsys.readouterr().out
    for name in ("matmul", "bandwidth", "attention", "allreduce", "nccl-log"):
        assert f"\n  {name} " in out
    assert "required" not in out
    ipython_shell.run_line_magic("gpudiag", "bench")
    out = capsys.readouterr().out
    assert "%gpudiag bench matmul" in out
    assert "achieved TFLOP/s per dtype" in out
    assert "error" not in out
