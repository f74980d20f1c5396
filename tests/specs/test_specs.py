"""gpudiag.specs: the GPU table against recorded hardware, name matching, SM limits, features."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpudiag import specs
from gpudiag.errors import GpuDiagError
from gpudiag.specs import GpuSpec, SpecsError, UnknownComputeCapabilityError

# --- helpers over the recorded fixtures ---------------------------------------------------


def _smi_gpus(fixtures_dir: Path) -> list[tuple[str, ET.Element]]:
    out = []
    for path in sorted((fixtures_dir / "nvidia-smi-xml").glob("*.xml")):
        for gpu in ET.parse(path).getroot().findall("gpu"):
            out.append((path.name, gpu))
    return out


def _text(gpu: ET.Element, path: str) -> str | None:
    node = gpu.find(path)
    return node.text.strip() if node is not None and node.text else None


def _mhz(text: str | None) -> float | None:
    match = re.match(r"([\d.]+)\s*MHz", text or "")
    return float(match.group(1)) if match and float(match.group(1)) > 0 else None


def _trace_devices(fixtures_dir: Path) -> list[dict[str, object]]:
    devices: dict[str, dict[str, object]] = {}
    for path in sorted((fixtures_dir / "traces").glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            head = fh.read(1 << 20)  # Kineto writes deviceProperties near the top
        at = head.find('"deviceProperties"')
        if at < 0:
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                found = json.load(fh).get("deviceProperties", [])
        else:
            found, _ = json.JSONDecoder().raw_decode(head, head.index("[", at))
        for props in found:
            devices.setdefault(str(props["name"]), props)
    return list(devices.values())


# --- the table against recorded machines ---------------------------------------------------


def test_every_recorded_nvidia_smi_product_name_is_known(fixtures_dir: Path) -> None:
    names = {_text(gpu, "product_name") for _, gpu in _smi_gpus(fixtures_dir)}
    assert "Graphics Device" in names  # a driver that did not know the board yet
    for name in names - {"Graphics Device"}:
        assert name is not None
        assert specs.lookup_gpu(name) is not None, name
    assert specs.lookup_gpu("Graphics Device") is None


def test_recorded_architecture_matches_the_table(fixtures_dir: Path) -> None:
    checked = 0
    for file, gpu in _smi_gpus(fixtures_dir):
        arch = _text(gpu, "product_architecture")
        spec = specs.lookup_gpu(_text(gpu, "product_name") or "")
        if spec is None or arch is None:
            continue
        # nvidia-smi says "Ada Lovelace" where the table says "Ada".
        assert arch.split()[0] == spec.architecture, (file, arch, spec.key)
        checked += 1
    assert checked >= 10


def test_recorded_memory_is_a_little_below_the_nominal_capacity(fixtures_dir: Path) -> None:
    checked = 0
    for file, gpu in _smi_gpus(fixtures_dir):
        spec = specs.lookup_gpu(_text(gpu, "product_name") or "")
        total = re.match(r"(\d+) MiB", _text(gpu, "fb_memory_usage/total") or "")
        # Virtual GPUs show their profile's memory; the minimal GTX 1070 Ti dump has no clocks
        # and an implausible total, so only dumps with a real memory clock are compared.
        if spec is None or total is None or _mhz(_text(gpu, "max_clocks/mem_clock")) is None:
            continue
        ratio = int(total.group(1)) * 2**20 / spec.memory_bytes
        assert 0.9 <= ratio <= 1.0, (file, spec.key, ratio)
        checked += 1
    assert checked >= 15


def test_bandwidth_from_the_recorded_memory_clock_matches_the_datasheet(fixtures_dir: Path) -> None:
    # NVML's max memory clock x 2 x bus width reproduces the published bandwidth for GDDR5,
    # GDDR6, GDDR6X, GDDR7 and HBM2e cards alike.
    checked = set()
    for file, gpu in _smi_gpus(fixtures_dir):
        spec = specs.lookup_gpu(_text(gpu, "product_name") or "")
        clock = _mhz(_text(gpu, "max_clocks/mem_clock"))
        if spec is None or clock is None:
            continue
        derived = specs.bandwidth_from_clock(clock, spec.memory_bus_width_bits, spec.memory_type)
        assert derived == pytest.approx(spec.memory_bandwidth_gbps, rel=0.015), (file, spec.key)
        checked.add(spec.memory_type)
    assert {"GDDR5", "GDDR6", "GDDR6X", "GDDR7", "HBM2e"} <= checked


def test_trace_device_properties_match_the_table_and_the_sm_limits(fixtures_dir: Path) -> None:
    devices = _trace_devices(fixtures_dir)
    assert {d["name"] for d in devices} >= {
        "Tesla V100-SXM2-16GB",
        "Tesla V100-DGXS-32GB",
        "NVIDIA A100-PG509-200",
        "NVIDIA A100-SXM4-80GB",
    }
    # AMD GPUs (MI250, MI300X: "AMD ..." or an empty name with a gfx9 "compute capability") have
    # neither an entry in the NVIDIA table nor CUDA's SM limits.
    nvidia = [d for d in devices if re.match(r"NVIDIA|Tesla|Quadro|GeForce", str(d["name"]))]
    assert len(nvidia) < len(devices)
    for props in nvidia:
        spec = specs.lookup_gpu(str(props["name"]))
        assert spec is not None, props["name"]
        cc = (props["computeMajor"], props["computeMinor"])
        assert spec.compute_capability == cc
        assert spec.sm_count == props["numSms"]
        # what cudaGetDeviceProperties reported on the real GPU
        limits = specs.cc_limits(cc)
        assert limits.max_threads_per_sm == props["maxThreadsPerMultiprocessor"]
        assert limits.max_threads_per_block == props["maxThreadsPerBlock"]
        assert limits.registers_per_sm == props["regsPerMultiprocessor"]
        assert limits.max_registers_per_block == props["regsPerBlock"]
        assert limits.warp_size == props["warpSize"]
        assert limits.max_shared_memory_per_block_bytes == props["sharedMemPerBlock"]
        assert limits.shared_memory_per_sm_bytes == props["sharedMemPerMultiprocessor"]
        assert limits.max_shared_memory_per_block_optin_bytes == props["sharedMemPerBlockOptin"]
        nominal = spec.memory_bytes
        assert 0.9 * nominal <= int(str(props["totalGlobalMem"])) <= 1.1 * nominal


def test_gpus_named_in_other_recordings_are_known(fixtures_dir: Path) -> None:
    nccl = (fixtures_dir / "nccl-tests" / "superbench-nccl_allreduce.log").read_text()
    assert "A100-SXM4-40GB" in nccl
    nvbw = (fixtures_dir / "nccl-tests" / "superbench-nvbandwidth_results.log").read_text()
    assert "NVIDIA GH200 480GB" in nvbw
    prom = "".join(p.read_text() for p in (fixtures_dir / "dcgm-exporter").glob("*.prom"))
    models = set(re.findall(r'modelName="([^"]+)"', prom))
    assert models == {"NVIDIA L4", "NVIDIA L40S", "GRID A100-10C"}
    expected = {
        "A100-SXM4-40GB": "a100-sxm4-40gb",
        "NVIDIA GH200 480GB": "gh200-480gb",
        "NVIDIA L4": "l4",
        "NVIDIA L40S": "l40s",
        "GRID A100-10C": "a100-pcie-40gb",  # vGPU profile of a 40 GB A100 board
    }
    for name, key in expected.items():
        spec = specs.lookup_gpu(name)
        assert spec is not None, name
        assert spec.key == key, name


# --- name matching ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A30", "a30"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA RTX A5000", "rtx-a5000"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        (
            "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
            "rtx-pro-6000-blackwell-max-q",
        ),
        ("GRID P4-1Q", "tesla-p4"),
        # tolerant of case, spacing, dashes and brand words
        ("nvidia  a100-sxm4-80gb", "a100-sxm4-80gb"),
        ("A100 SXM4 80 GB", "a100-sxm4-80gb"),
        ("GeForce RTX 3090", "rtx-3090"),
        # a MIG device is its parent card
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "a100-sxm4-80gb"),
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "h100-sxm5-80gb"),
    ],
)
def test_lookup_matches_nvml_names(name: str, key: str) -> None:
    spec = specs.lookup_gpu(name)
    assert spec is not None, name
    assert spec.key == key


@pytest.mark.parametrize(
    "name",
    [
        "Graphics Device",
        "Quadro RTX 6000",  # Turing; must not borrow the RTX 6000 Ada row
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",  # not in the table: no guessing
        "NVIDIA A100",  # ambiguous between four boards
        "",
        "   ",
        "GRID Z9-4Q",
    ],
)
def test_lookup_returns_none_rather_than_guessing(name: str) -> None:
    assert specs.lookup_gpu(name) is None


def test_lookup_tolerates_non_strings() -> None:
    assert specs.lookup_gpu(None) is None  # type: ignore[arg-type]


# --- the table's own consistency -------------------------------------------------------------


def test_rows_are_complete_and_use_known_dtypes() -> None:
    rows = specs.all_gpus()
    assert len({r.key for r in rows}) == len(rows)
    for row in rows:
        assert set(row.peak_tflops) <= set(specs.DTYPES), row.key
        assert "fp32" in row.peak_tflops, row.key
        assert all(v > 0 for v in row.peak_tflops.values()), row.key
        assert row.sm_count > 0
        assert row.memory_bytes > 0
        assert row.memory_bus_width_bits > 0
        assert row.memory_bandwidth_gbps > 0
        assert row.source.strip(), row.key
        if row.vendor == "nvidia":
            assert row.architecture == specs.architecture_name(row.compute_capability), row.key
        else:  # CDNA2 is gfx90a (HIP reports 9.0), CDNA3 gfx942 (9.4)
            assert row.vendor == "amd", row.key
            gfx = {"CDNA2": (9, 0), "CDNA3": (9, 4)}
            assert gfx[row.architecture] == row.compute_capability, row.key
        assert row.pcie_gen in {3, 4, 5, 6}, row.key
        assert row.nvlink_bandwidth_gbps is None or row.nvlink_bandwidth_gbps > 0


def test_tensor_dtypes_follow_the_compute_capability() -> None:
    for row in specs.all_gpus():
        if row.vendor != "nvidia":
            continue  # an AMD row's "compute capability" is HIP's gcnArch, not CUDA's
        feats = specs.features(row.compute_capability)
        for dtype in ("tf32", "bf16", "fp8"):
            if dtype in row.peak_tflops:
                assert getattr(feats, dtype), (row.key, dtype)
        if row.compute_capability >= (8, 0):
            # every Ampere-or-newer card in the table publishes tf32/bf16 figures
            assert {"tf32", "bf16", "fp16"} <= set(row.peak_tflops), row.key


def test_peaks_are_dense_not_sparse() -> None:
    # Dense tensor rates double per halving of precision; a row mixing a sparse figure with
    # dense ones breaks these ratios. The A100's dense tf32 is 156 (312 only with sparsity).
    for row in specs.all_gpus():
        p = row.peak_tflops
        if "tf32" in p:
            assert p["fp16"] / p["tf32"] == pytest.approx(2.0, rel=0.03), row.key
            assert p["bf16"] == p["fp16"], row.key
        if "fp8" in p:
            assert p["fp8"] / p["fp16"] == pytest.approx(2.0, rel=0.03), row.key
        if "fp16" in p:
            assert p["fp16"] > p["fp32"], row.key
    a100 = specs.lookup_gpu("NVIDIA A100-SXM4-80GB")
    assert a100 is not None
    assert a100.peak_tflops_for("tf32") == 156.0
    h100 = specs.lookup_gpu("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert h100.peak_tflops_for("bf16") == pytest.approx(989.5)


def test_geforce_rows_use_fp32_accumulate_rates() -> None:
    # GeForce halves fp16 tensor throughput with fp32 accumulate: the RTX 3090 does 142 TFLOP/s
    # with fp16 accumulate but 71 with fp32 (GA102 whitepaper); the table keeps what PyTorch gets.
    rtx3090 = specs.lookup_gpu("NVIDIA GeForce RTX 3090")
    a6000 = specs.lookup_gpu("NVIDIA RTX A6000")  # same GA102 die, full-rate fp32 accumulate
    assert rtx3090 is not None
    assert a6000 is not None
    per_sm_clock_3090 = rtx3090.peak_tflops["fp16"] / rtx3090.peak_tflops["fp32"]
    per_sm_clock_a6000 = a6000.peak_tflops["fp16"] / a6000.peak_tflops["fp32"]
    assert per_sm_clock_a6000 == pytest.approx(2 * per_sm_clock_3090, rel=0.02)


def test_peak_tflops_for_rejects_unknown_dtypes_and_reports_missing_ones() -> None:
    v100 = specs.lookup_gpu("Tesla V100-SXM2-16GB")
    assert v100 is not None
    assert v100.peak_tflops_for("bf16") is None  # Volta tensor cores take fp16 only
    with pytest.raises(SpecsError, match="unknown dtype"):
        v100.peak_tflops_for("fp12")


def test_rows_report_json_html_and_repr() -> None:
    spec = specs.lookup_gpu("NVIDIA B200")
    assert spec is not None
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["compute_capability"] == "10.0"
    assert data["peak_tflops"]["fp8"] == spec.peak_tflops["fp8"]
    assert "B200" in repr(spec)
    evil = GpuSpec(
        key="x",
        name="<script>x</script>",
        architecture="Ampere",
        compute_capability=(8, 0),
        sm_count=1,
        memory_bytes=1,
        memory_bandwidth_gbps=1.0,
        memory_bus_width_bits=64,
        peak_tflops={"fp32": 1.0},
        nvlink_bandwidth_gbps=None,
        pcie_gen=4,
        tdp_w=None,
        source="<b>",
    )
    html = evil._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    assert "&lt;b&gt;" in html


def test_the_table_loads_lazily_once() -> None:
    code = (
        "import gpudiag.specs as s, gpudiag.specs._gpus as g, gpudiag.specs._cc as c\n"
        "assert g._load.cache_info().currsize == 0 and c._table.cache_info().currsize == 0\n"
        "s.lookup_gpu('Tesla T4'); s.lookup_gpu('NVIDIA L4'); s.cc_limits('9.0')\n"
        "i = g._load.cache_info(); assert (i.misses, i.hits) == (1, 1), i\n"
        "assert 'gpudiag.specs' in __import__('sys').modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- bandwidth and derived specs ------------------------------------------------------------


def test_bandwidth_from_clock_arithmetic_and_bad_input() -> None:
    # T4: 5001 MHz x 2 (NVML reports half the data rate) x 256 bit / 8 = 320.064 GB/s
    assert specs.bandwidth_from_clock(5001, 256) == pytest.approx(320.064)
    assert specs.bandwidth_from_clock(5001, 256, "GDDR6") == specs.bandwidth_from_clock(5001, 256)
    with pytest.raises(SpecsError, match="virtual GPUs"):
        specs.bandwidth_from_clock(0, 256)  # what NVML reports on a vGPU
    with pytest.raises(SpecsError, match="unknown memory type"):
        specs.bandwidth_from_clock(5001, 256, "SDRAM")


def test_derive_gpu_spec_for_an_unknown_card() -> None:
    spec = specs.derive_gpu_spec(
        "NVIDIA Future GPU",
        compute_capability=(8, 9),
        sm_count=60,
        memory_bytes=16 << 30,
        max_memory_clock_mhz=10501,
        memory_bus_width_bits=128,
        max_sm_clock_mhz=2500,
    )
    assert spec.derived
    assert "not a datasheet" in spec.source
    assert spec.memory_bandwidth_gbps == pytest.approx(10501 * 2 * 128 / 8 / 1000)
    # 60 SMs x 128 fp32 lanes (cc 8.9) x 2 FLOP per FMA x 2.5 GHz = 38.4 TFLOP/s
    assert spec.peak_tflops_for("fp32") == pytest.approx(38.4)
    assert spec.peak_tflops_for("fp16") is None


# --- compute capabilities ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cc"),
    [
        ("8.0", (8, 0)),
        ("sm_90a", (9, 0)),
        ("sm_100", (10, 0)),
        ("120", (12, 0)),
        (8.9, (8, 9)),
        (12.0, (12, 0)),
        ((7, 5), (7, 5)),
        ([8, 6], (8, 6)),
    ],
)
def test_parse_compute_capability(text: object, cc: tuple[int, int]) -> None:
    assert specs.parse_compute_capability(text) == cc


@pytest.mark.parametrize("bad", ["eight", "8", "8.10", None, (8,), 8])
def test_parse_compute_capability_rejects_garbage(bad: object) -> None:
    with pytest.raises(SpecsError, match="compute capability"):
        specs.parse_compute_capability(bad)


def test_sm_limits_are_consistent_for_every_known_compute_capability() -> None:
    known = specs.known_compute_capabilities()
    assert {(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)} <= set(known)
    for cc in known:
        lim = specs.cc_limits(cc)
        assert lim.max_warps_per_sm * lim.warp_size == lim.max_threads_per_sm
        assert lim.register_allocation_unit == 256
        assert lim.register_allocation_granularity == "warp"
        assert lim.max_registers_per_thread == 255
        assert lim.shared_memory_carveouts_kib[-1] * 1024 == lim.shared_memory_per_sm_bytes
        assert lim.max_shared_memory_per_block_bytes == 48 * 1024
        if cc >= (8, 0):
            # the opt-in maximum leaves room for the 1 KiB the driver reserves per block
            assert lim.reserved_shared_memory_per_block_bytes == 1024
            assert lim.shared_memory_allocation_unit_bytes == 128
            assert (
                lim.max_shared_memory_per_block_optin_bytes == lim.shared_memory_per_sm_bytes - 1024
            )
        else:
            assert lim.reserved_shared_memory_per_block_bytes == 0
            assert lim.shared_memory_allocation_unit_bytes == 256
            assert lim.max_shared_memory_per_block_optin_bytes == lim.shared_memory_per_sm_bytes
        assert lim.max_barriers_per_sm in {lim.max_blocks_per_sm, 2 * lim.max_blocks_per_sm}
        assert lim.barrier_limit_applies == (cc >= (9, 0))
        assert json.loads(json.dumps(lim.to_dict()))["compute_capability"] == f"{cc[0]}.{cc[1]}"


@pytest.mark.parametrize("cc", ["6.1", "8.8", "13.0", (5, 2)])
def test_unknown_compute_capability_raises_a_clear_error(cc: object) -> None:
    with pytest.raises(UnknownComputeCapabilityError, match=r"known: 7\.0") as info:
        specs.cc_limits(cc)
    assert isinstance(info.value, GpuDiagError)


@pytest.mark.parametrize(
    ("cc", "name"),
    [
        ((6, 1), "Pascal"),
        ((7, 0), "Volta"),
        ((7, 2), "Volta"),
        ((7, 5), "Turing"),
        ((8, 0), "Ampere"),
        ((8, 6), "Ampere"),
        ((8, 9), "Ada"),
        ((9, 0), "Hopper"),
        ((10, 0), "Blackwell"),
        ((12, 0), "Blackwell"),
    ],
)
def test_architecture_name(cc: tuple[int, int], name: str) -> None:
    assert specs.architecture_name(cc) == name


def test_architecture_name_of_an_unknown_major_raises() -> None:
    with pytest.raises(UnknownComputeCapabilityError):
        specs.architecture_name((13, 0))


def test_features_by_compute_capability() -> None:
    def on(cc: tuple[int, int]) -> set[str]:
        f = specs.features(cc).to_dict()
        return {k for k, v in f.items() if v is True}

    assert "tensor_cores" not in on((6, 1))
    assert {"tensor_cores", "fp16_tensor_cores"} <= on((7, 0))
    assert "int8_tensor_cores" not in on((7, 0))
    assert "int8_tensor_cores" in on((7, 5))
    assert not {"tf32", "bf16", "flash_attention_2"} & on((7, 5))
    assert {"tf32", "bf16", "flash_attention_2", "async_copy"} <= on((8, 0))
    assert "fp8" not in on((8, 6))
    assert "fp8" in on((8, 9))
    assert {"flash_attention_3", "tma", "wgmma"} <= on((9, 0))
    assert not {"flash_attention_3", "wgmma"} & on((10, 0))
    assert {"fp4", "tma"} <= on((10, 0))
    assert "fp4" in on((12, 0))
    assert "fp4" not in on((9, 0))
    feats = specs.features("8.0")
    assert feats.supports("tf32")
    assert feats.fp16
    assert not feats.supports("fp8")
    with pytest.raises(SpecsError, match="unknown dtype"):
        feats.supports("fp12")


def test_amd_rows_match_the_devices_the_amd_traces_record(fixtures_dir: Path) -> None:
    # The recorded MI250 trace names its GCD generically; the MI300X traces by product (one a
    # cloud VM's SR-IOV function, "VF").
    amd = [d for d in _trace_devices(fixtures_dir) if not re.match(r"NVIDIA|Tesla", d["name"])]
    assert {d["name"] for d in amd} >= {
        "AMD Radeon Graphics",
        "AMD Instinct MI300X",
        "AMD Instinct MI300X VF",
    }
    for props in amd:
        spec = specs.lookup_device(
            str(props["name"]),
            sm_count=props["numSms"],
            memory_bytes=int(str(props["totalGlobalMem"])),
        )
        assert spec is not None, props["name"]
        assert spec.vendor == "amd"
        assert spec.compute_capability == (props["computeMajor"], props["computeMinor"])
        assert spec.sm_count == props["numSms"]
        assert 0.95 * spec.memory_bytes <= int(str(props["totalGlobalMem"])) <= spec.memory_bytes
        assert specs.lookup_gpu(str(props["name"])) is None  # NVML names only


def test_an_amd_device_by_name_or_by_its_size() -> None:
    mi300x = specs.lookup_device("AMD Instinct MI300X VF")
    assert mi300x is not None
    assert mi300x.key == "mi300x"
    assert mi300x.peak_tflops_for("bf16") == pytest.approx(1307.4)
    assert mi300x.memory_bandwidth_gbps == 5300
    # One GCD of an MI250X: half the module's published 383.0 TFLOP/s and 3.2768 TB/s.
    gcd = specs.lookup_device("AMD Instinct MI250X")
    assert gcd is not None
    assert gcd.peak_tflops_for("bf16") == pytest.approx(383.0 / 2)
    assert gcd.memory_bandwidth_gbps == pytest.approx(3276.8 / 2)
    assert gcd.peak_tflops_for("fp8") is None  # CDNA2 has no fp8
    # A generic name: told by compute units and memory. 104 CUs and 64 GB are an MI210 or one
    # MI250 GCD, whose figures agree: the row says both.
    generic = specs.lookup_device("AMD Radeon Graphics", sm_count=104, memory_bytes=64 << 30)
    assert generic is not None
    assert generic.name == "AMD Instinct MI210 or MI250 (one GCD)"
    assert generic.peak_tflops_for("bf16") == pytest.approx(181.0)
    assert specs.lookup_device("AMD Radeon Graphics", sm_count=110, memory_bytes=64 << 30)
    # An APU or a card the table lacks: no neighbour's figures.
    assert specs.lookup_device("AMD Radeon Graphics", sm_count=12, memory_bytes=8 << 30) is None
    assert specs.lookup_device("AMD Radeon Graphics") is None
    assert specs.lookup_device("AMD Instinct MI100") is None
    # NVIDIA names go through lookup_gpu.
    a100 = specs.lookup_device("NVIDIA A100-SXM4-80GB")
    assert a100 is not None
    assert a100.vendor == "nvidia"
