"""gd.bench.bandwidth: real host-memory copies on the CPU; host<->device kinds N/A with reasons."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpudiag.bench import _env, memory
from gpudiag.bench.memory import BandwidthResult, bandwidth, pcie_bandwidth_gbps
from gpudiag.errors import GpuDiagError
from gpudiag.probe.model import Gpu, GpuInfo, GpuState, PcieLink
from gpudiag.probe.readings import ok


@pytest.fixture(scope="module")
def result() -> BandwidthResult:
    return bandwidth(sizes=[1 << 16, 1 << 20], device="cpu", repeats=3, progress=False)


def test_copy_runs_and_counts_read_plus_write(result: BandwidthResult) -> None:
    rows = [r for r in result.rows if r.kind == "copy"]
    assert [r.size_bytes for r in rows] == [1 << 16, 1 << 20]
    for r in rows:
        assert r.correct
        assert r.bytes_per_call == 2 * r.size_bytes
        assert r.measurement is not None
        assert r.gbps == pytest.approx(r.bytes_per_call / r.measurement.median_s / 1e9)
    gbps = result.gbps("copy")
    assert gbps is not None
    assert gbps == max(r.gbps or 0 for r in rows)


def test_host_device_kinds_are_none_with_the_reason_on_a_cpu(result: BandwidthResult) -> None:
    for kind in ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable"):
        assert result.gbps(kind) is None
        assert "CUDA" in result.reason(kind)
    assert "h2d_pinned" in repr(result)


def test_unknown_and_unmeasured_kinds_raise(result: BandwidthResult) -> None:
    with pytest.raises(GpuDiagError, match="Unknown bandwidth kind"):
        result.gbps("nvlink")
    only_copy = bandwidth(["copy"], [1 << 16], device="cpu", repeats=2, progress=False)
    with pytest.raises(GpuDiagError, match="not measured"):
        only_copy.gbps("h2d_pinned")
    with pytest.raises(GpuDiagError, match="Unknown bandwidth kind"):
        bandwidth(["hbm"], device="cpu", progress=False)


def test_a_copy_that_differs_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch, "equal", lambda a, b: False)
    r = bandwidth(["copy"], [1 << 16], device="cpu", repeats=2, progress=False)
    assert r.gbps("copy") is None
    assert "wrong result" in r.reason("copy")


def test_json_and_html(result: BandwidthResult) -> None:
    data = json.loads(json.dumps(result.to_dict()))
    assert data["kind"] == "bandwidth"
    assert data["best_gbps"]["h2d_pinned"] is None
    html = dataclasses.replace(result, notes=("<img src=x>",))._repr_html_()
    assert "<img" not in html
    assert "&lt;img src=x&gt;" in html
    assert "needs a CUDA device" in html


@pytest.mark.parametrize(
    ("gen", "width", "expected"),
    [(3, 16, 15.7538), (4, 16, 31.5077), (5, 16, 63.0154), (2, 8, 4.0), (1, 1, 0.25)],
)
def test_pcie_theoretical_bandwidth(gen: int, width: int, expected: float) -> None:
    assert pcie_bandwidth_gbps(gen, width) == pytest.approx(expected, rel=1e-4)


def test_pcie_rejects_unknown_links() -> None:
    with pytest.raises(ValueError, match="unknown PCIe link"):
        pcie_bandwidth_gbps(9, 16)


def _system_with_link(gen: int, width: int) -> Any:
    info = GpuInfo(
        index=0,
        name=ok("NVIDIA A100-SXM4-40GB"),
        pcie=PcieLink(gen_max=ok(gen), width_max=ok(width)),
        cuda_index=0,
    )
    return type("System", (), {"gpus": (Gpu(info, GpuState()),)})()


def test_theoretical_host_device_bandwidth_from_the_gpu_link() -> None:
    target = _env.Target("cuda", 0, "NVIDIA A100-SXM4-40GB")
    reading = memory._theoretical(target, "h2d_pinned", _system_with_link(4, 16))
    assert reading.ok
    assert reading.value == pytest.approx(31.5077, rel=1e-4)
    assert "gen 4 x16" in reading.source
    missing = memory._theoretical(target, "d2h_pinned", None)
    assert not missing.ok
    assert "PCIe" in missing.reason
    copy = memory._theoretical(target, "copy", None)
    assert copy.ok
    assert copy.value == pytest.approx(1555)


def test_sizes_below_the_cache_do_not_set_the_ceiling() -> None:
    from gpudiag.bench.memory import BandwidthRow
    from gpudiag.bench.timing import Measurement

    m = Measurement((1.0,))
    rows = (
        BandwidthRow("copy", 1 << 16, 2 << 16, m, 100.0, correct=True),  # served by the cache
        BandwidthRow("copy", 4 << 20, 8 << 20, m, 20.0, correct=True),
        BandwidthRow("copy", 8 << 20, 16 << 20, m, 22.0, correct=True),
    )
    assert BandwidthResult("cpu", rows, cache_bytes=1 << 20).gbps("copy") == 22.0
    assert BandwidthResult("cpu", rows[:1], cache_bytes=1 << 20).gbps("copy") == 100.0


def test_gh200_host_device_ceiling_is_nvlink_c2c_not_its_x1_pcie_link() -> None:
    # The recorded GH200 shows its GPU's own PCIe link at gen 4 x1 (~2 GB/s): the host path
    # is NVLink-C2C (900 GB/s both ways), so that is the ceiling for host<->device copies.
    from gpudiag.probe.system import inspect
    from tests.conftest import FIXTURES

    system = inspect(replay=FIXTURES / "nvidia-smi-text" / "gh200.nvidia-smi-q.txt")
    link = system.gpus[0].info.pcie
    assert (link.gen_max.value, link.width_max.value) == (4, 1)
    target = _env.Target("cuda", 0, "NVIDIA GH200 480GB")
    for kind in ("h2d_pinned", "d2h_pageable"):
        reading = memory._theoretical(target, kind, system)
        assert reading.value == 450
        assert "NVLink-C2C" in reading.source
    # A PCIe board keeps its PCIe figure.
    h100 = _env.Target("cuda", 0, "NVIDIA H100 80GB HBM3")
    assert "gen 4 x16" in memory._theoretical(h100, "h2d_pinned", _system_with_link(4, 16)).source
