"""%gpudiag occupancy in a real in-process IPython shell, the explorer widget and its plot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpudiag.analysis.occupancy import Occupancy, occupancy, occupancy_curve
from gpudiag.plots.occupancy import RESOURCE_COLORS, occupancy_curve_figure
from gpudiag.ui.occupancy import OccupancyExplorer, occupancy_explorer, split_smem


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


@pytest.fixture
def explorers() -> Iterator[list[OccupancyExplorer]]:
    made: list[OccupancyExplorer] = []
    yield made
    for explorer in made:  # close every widget the test opened: no comm outlives the test
        for child in explorer.children:
            child.close()
        explorer.close()


def _bars(fig: Any) -> dict[str, list[int]]:
    return {t.name: list(t.x) for t in fig.data if t.type == "bar"}


def test_magic_returns_an_explorer_showing_the_launch(ip: Any, explorers: list[Any]) -> None:
    widget = ip.run_line_magic("gpudiag", "occupancy --cc 8.0 --threads 256 --regs 64 --smem 0")
    explorers.append(widget)
    assert isinstance(widget, OccupancyExplorer)
    assert widget.occupancy is not None
    assert widget.occupancy.occupancy == 0.5
    assert "50.0%" in widget.result.value
    assert "256 threads already gives the highest occupancy" in widget.result.value
    assert "at most 48 registers/thread" in widget.result.value
    # every block size is on the plot, coloured by what limits it (64 registers -> registers)
    bars = _bars(widget.figure)
    assert sorted(x for xs in bars.values() for x in xs) == list(range(32, 1025, 32))
    assert "limited by registers" in bars


def test_sliders_update_the_result_and_the_plot(ip: Any, explorers: list[Any]) -> None:
    widget = ip.run_line_magic("gpudiag", "occupancy --cc 8.0 --threads 256 --regs 64")
    explorers.append(widget)
    widget.regs.value = 32
    assert widget.occupancy.occupancy == 1.0
    assert "100.0%" in widget.result.value
    widget.smem_kib.value = 100  # 100 KiB + 1 KiB reserved: one block of 8 warps per SM
    assert widget.occupancy.active_blocks_per_sm == 1
    assert widget.occupancy.limiting == ("shared_memory",)
    assert "limited by shared memory" in _bars(widget.figure)
    widget.threads.value = 512
    assert widget.occupancy.threads_per_block == 512
    assert widget.occupancy.active_warps_per_sm == 16


def test_changing_compute_capability_updates_limits_and_carveouts(explorers: list[Any]) -> None:
    widget: Any = occupancy_explorer((9, 0), 256, 32, 200 * 1024)
    explorers.append(widget)
    assert widget.smem_kib.max == 227
    widget.carveout.value = 228
    widget.cc_dropdown.value = (7, 5)
    # Turing: 64 KiB per block at most, carveouts 32/64 KiB, and the old choice is gone
    assert widget.smem_kib.max == 64
    assert list(widget.carveout.options) == ["default", 32, 64]
    assert widget.carveout.value == "default"
    assert widget.occupancy is not None
    assert widget.occupancy.cc == (7, 5)
    assert (
        widget.occupancy.smem_per_block_bytes + widget.occupancy.dynamic_smem_per_block_bytes
        == 64 * 1024
    )


def test_carveout_choice_changes_the_result(explorers: list[Any]) -> None:
    widget: Any = occupancy_explorer((8, 0), 64, 16, 16 * 1024)
    explorers.append(widget)
    default_blocks = widget.occupancy.blocks_limit["shared_memory"]
    widget.carveout.value = 64
    assert widget.occupancy.blocks_limit["shared_memory"] == 3 < default_blocks
    assert widget.occupancy.shared_memory_config_bytes == 64 * 1024


def test_magic_without_widget_and_as_json(ip: Any) -> None:
    occ = ip.run_line_magic("gpudiag", "occupancy --cc 9.0 --threads 128 --regs 40 --no-widget")
    assert isinstance(occ, Occupancy)
    assert occ.active_blocks_per_sm == 12
    data = ip.run_line_magic(
        "gpudiag", "occupancy --gpu 'NVIDIA H100 PCIe' --regs 40 --threads 128 --json"
    )
    assert data["cc"] == "9.0"
    assert data["active_blocks_per_sm"] == 12


def test_magic_percent_carveout_reaches_the_widget(ip: Any, explorers: list[Any]) -> None:
    widget = ip.run_line_magic("gpudiag", "occupancy --cc 8.0 --carveout-percent 50")
    explorers.append(widget)
    assert widget.carveout.value == 100  # 50% of 164 KiB rounds up to the 100 KiB split


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("occupancy --cc 8.0 --threads 0", "threads_per_block must be at least 1"),
        ("occupancy --cc 6.1", "no SM limits for compute capability 6.1"),
        ("occupancy --gpu 'Graphics Device'", "not in the spec table"),
        ("occupancy --regs many", "written in ASCII digits"),
    ],
)
def test_magic_reports_bad_input_without_raising(
    ip: Any, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    assert ip.run_line_magic("gpudiag", line) is None
    assert message in capsys.readouterr().out


def test_split_smem_keeps_static_memory_legal() -> None:
    assert split_smem(0) == (0, 0)
    assert split_smem(40 * 1024) == (40 * 1024, 0)
    assert split_smem(100 * 1024) == (48 * 1024, 52 * 1024)


def test_plot_marks_the_current_and_best_block_size() -> None:
    curve = occupancy_curve((8, 0), 64)
    current = occupancy((8, 0), 256, 64)
    best = max(curve, key=lambda o: o.active_threads_per_sm)
    fig = occupancy_curve_figure(curve, current=current, best=best)
    bars = [t for t in fig.data if t.type == "bar"]
    assert {b.marker.color for b in bars} <= set(RESOURCE_COLORS.values())
    assert sum(len(b.x) for b in bars) == len(curve)
    assert any(t.type == "scatter" and list(t.x) == [best.threads_per_block] for t in fig.data)
    assert [s.x0 for s in fig.layout.shapes] == [256]
    assert "cc 8.0" in fig.layout.title.text


def test_plot_shows_launches_that_cannot_run() -> None:
    # 224 registers: blocks above 256 threads exceed the register file (see the occupancy tests)
    curve = occupancy_curve((8, 0), 224)
    fig = occupancy_curve_figure(curve)
    bars = _bars(fig)
    zero = [o.threads_per_block for o in curve if o.active_blocks_per_sm == 0]
    assert zero
    assert set(zero) <= set(bars["limited by registers"])
    assert all(
        y == 0
        for t in fig.data
        if t.type == "bar"
        for x, y in zip(t.x, t.y, strict=True)
        if x in zero
    )
