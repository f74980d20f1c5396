"""The host probe: CPU flags that matter for ML, NUMA, torch build; real on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.probe.host import (
    cpu_max_mhz,
    last_level_cache_bytes,
    numa_node_count,
    parse_cpuinfo,
    probe_host,
)

X86 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve bf16
CPU implementer\t: 0x41
"""


def test_parse_x86_cpuinfo_keeps_ml_flags_from_the_first_cpu() -> None:
    model, flags = parse_cpuinfo(X86)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert "avx512_bf16" in flags
    assert "amx_bf16" in flags
    assert "fpu" not in flags


def test_parse_arm_cpuinfo() -> None:
    model, flags = parse_cpuinfo(ARM)
    assert model is None
    assert set(flags) == {"asimd", "sve", "bf16"}


def test_numa_nodes_from_sysfs(tmp_path: Path) -> None:
    for name in ("node0", "node1", "online", "possible"):
        (tmp_path / name).mkdir()
    assert numa_node_count(tmp_path).value == 2
    assert not numa_node_count(tmp_path / "missing").ok


def test_probe_host_on_this_machine() -> None:
    host = probe_host()
    assert host.logical_cores.value >= 1
    assert host.memory_total_bytes.value > 0
    assert host.torch.version.ok
    # This project's CI runs the CPU build of torch: the report must say so.
    if not host.torch.cuda_build.ok:
        assert host.torch.build == "CPU"
        assert "CPU-only" in host.torch.cuda_build.reason
    assert host.cpu_bf16_instructions == ("avx512_bf16" in host.cpu_flags or host.has_amx)
    # The old name read the flags as a speed: it now says where the measured answer is.
    with pytest.raises(AttributeError, match=r"gd\.bench\.cpu_bf16_speed\(\)"):
        host.cpu_bf16_fast  # noqa: B018


def test_cpu_clock_prefers_cpufreq_max_then_the_cpuinfo_clock(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 2445.406\n")
    current = cpu_max_mhz(tmp_path / "sys", cpuinfo)
    assert current.value == pytest.approx(2445.406)
    assert "current clock" in current.source
    freq = tmp_path / "sys" / "cpu0" / "cpufreq"
    freq.mkdir(parents=True)
    (freq / "cpuinfo_max_freq").write_text("3500000\n")
    top = cpu_max_mhz(tmp_path / "sys", cpuinfo)
    assert (top.value, top.source) == (3500.0, "cpufreq max")
    assert not cpu_max_mhz(tmp_path / "none", tmp_path / "none").ok


def test_last_level_cache_is_the_largest_cache_index(tmp_path: Path) -> None:
    for index, size in (("index0", "32K"), ("index2", "512K"), ("index3", "32768K")):
        entry = tmp_path / "cpu0" / "cache" / index
        entry.mkdir(parents=True)
        (entry / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path).value == 32 << 20
    assert not last_level_cache_bytes(tmp_path / "missing").ok
