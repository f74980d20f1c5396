"""The host probe: CPU flags that matter for ML, NUMA, torch build; real on this machine."""

from __future__ import annotations

from pathlib import Path

from gpudiag.probe.host import numa_node_count, parse_cpuinfo, probe_host

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
    assert host.cpu_bf16_fast == host.cpu_bf16_instructions  # the old name: flags only
