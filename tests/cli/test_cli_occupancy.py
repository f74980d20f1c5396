"""`gpudiag occupancy`: text and JSON output, GPU names, bad input."""

from __future__ import annotations

import json

import pytest

from gpudiag.cli import main


def test_text_output_names_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["occupancy", "--cc", "8.0", "--threads", "256", "--regs", "64", "--smem", "0"]) == 0
    )
    out = capsys.readouterr().out
    assert "occupancy 50.0%: 4 blocks/SM x 8 warps = 32 of 64 warps" in out
    assert "limited by: registers" in out
    # 1024 threads gains nothing over 256 (both 50 %): not recommended; registers are the lever.
    assert "1024 threads" not in out
    assert "256 threads already gives the highest occupancy of any block size (50.0%)" in out
    assert "at most 48 registers/thread gives 62.5%" in out
    assert "assumed" not in out


def test_a_block_size_that_gains_is_recommended(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["occupancy", "--cc", "8.0", "--threads", "64", "--regs", "32", "--smem", "40K"]) == 0
    )
    out = capsys.readouterr().out
    assert "best block size: 1024 threads (100.0%, up from 12.5% at 64)" in out


def test_less_shared_memory_is_named_when_it_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["occupancy", "--cc", "8.0", "--threads", "1024", "--regs", "16", "--smem", "100K"])
        == 0
    )
    out = capsys.readouterr().out
    assert "limited by: shared_memory" in out
    assert "less shared memory lifts it: at most" in out


def test_without_cc_or_gpu_the_a100_assumption_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["occupancy", "--threads", "256", "--regs", "32"]) == 0
    assert "compute capability 8.0 (A100) assumed" in capsys.readouterr().out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["occupancy", "--cc", "9.0", "--threads", "128", "--regs", "40", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cc"] == "9.0"
    assert data["active_blocks_per_sm"] == 12
    assert data["limiting"] == ["registers"]
    assert data["blocks_limit"]["barriers"] == 64
    assert data["best_block_size"] == 768
    assert data["best_occupancy"] == 0.75


def test_sizes_with_suffixes_and_large_shared_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # 100K is beyond the 48 KiB static limit: the rest counts as dynamic shared memory.
    assert main(["occupancy", "--cc", "8.0", "--smem", "100K", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["smem_per_block_bytes"] == 48 * 1024
    assert data["dynamic_smem_per_block_bytes"] == 52 * 1024
    assert data["allocated_smem_per_block_bytes"] == 101 * 1024


def test_gpu_name_gives_the_compute_capability(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["occupancy", "--gpu", "NVIDIA GeForce RTX 3090", "--threads", "1024", "--json"]) == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["cc"] == "8.6"
    assert data["max_warps_per_sm"] == 48


def test_a_kernel_that_cannot_launch_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["occupancy", "--cc", "8.6", "--smem", "120K"]) == 0
    out = capsys.readouterr().out
    assert "cannot launch:" in out
    assert "no block size lets this kernel launch" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cc", "8.0", "--threads", "0"], "threads_per_block must be at least 1"),
        (["--cc", "8.0", "--regs", "300"], "255"),
        (["--gpu", "Graphics Device"], "not in the spec table"),
        (["--cc", "13.0"], "no SM limits"),
        (["--cc", "8.0", "--carveout-kib", "500"], "valid shared-memory configurations"),
    ],
)
def test_bad_input_exits_1_with_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["occupancy", *argv]) == 1
    assert message in capsys.readouterr().err


def test_unparseable_size_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["occupancy", "--smem", "lots"])
    assert info.value.code == 2
