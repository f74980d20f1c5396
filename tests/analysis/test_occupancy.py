"""gd.occupancy against NVIDIA's occupancy calculator and hand-derived cases.

``data/occupancy_reference.json`` holds 525 results of NVIDIA's own calculator
(``cuda_occupancy.h`` from CUDA 13.0). They were produced by a small C++ program, compiled with
g++ against that header and kept out of this repository (the header's licence does not allow
redistributing derived code): for random launches it filled ``cudaOccDeviceProp`` per compute
capability (7.0 to 12.1, limits from gpudiag's compute_capabilities.json), ``cudaOccFuncAttributes``
(registers, static shared memory, opt-in dynamic shared memory, named barriers) and
``cudaOccDeviceState`` (carveout percentage), called ``cudaOccMaxActiveBlocksPerMultiprocessor``
and ``cudaOccMaxPotentialOccupancyBlockSizeVariableSMem``, and printed the results as JSON. The
same comparison over about 100 000 random launches against the CUDA 12.9 and 13.0 headers gave
no difference. The hand-derived cases below spell out the arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.occupancy import (
    Occupancy,
    OccupancyInputError,
    best_block_size,
    carveout_config_bytes,
    occupancy,
    occupancy_curve,
)
from gpudiag.errors import GpuDiagError

KIB = 1024
REFERENCE = Path(__file__).parent / "data" / "occupancy_reference.json"


def _reference() -> list[dict[str, Any]]:
    return list(json.loads(REFERENCE.read_text())["cases"])


# --- NVIDIA's calculator ------------------------------------------------------------------


def test_reference_table_covers_every_compute_capability_and_resource() -> None:
    cases = [c for c in _reference() if c["kind"] == "occupancy"]
    assert len(cases) >= 400
    assert {c["cc"] for c in cases} >= {"7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"}
    limiting = {name for c in cases for name in c["header_limiting"]}
    assert limiting == {"warps", "registers", "shared_memory", "blocks", "barriers"}
    assert any(c["active_blocks"] == 0 for c in cases)
    assert {c["carveout_percent"] for c in cases} > {-1, 0, 100}


def test_occupancy_matches_nvidias_calculator() -> None:
    cases = [c for c in _reference() if c["kind"] == "occupancy"]
    for case in cases:
        occ = occupancy(
            case["cc"],
            case["threads"],
            case["regs"],
            case["static_smem"],
            dynamic_smem_per_block=case["dynamic_smem"],
            carveout_percent=case["carveout_percent"],
            barriers_per_block=case["num_barriers"],
        )
        expected = {
            k: case[k] for k in ("warps", "registers", "shared_memory", "blocks", "barriers")
        }
        assert occ.active_blocks_per_sm == case["active_blocks"], case
        assert dict(occ.blocks_limit) == expected, case
        assert occ.allocated_registers_per_block == case["allocated_regs"], case
        assert occ.allocated_smem_per_block_bytes == case["allocated_smem"], case
        header = set(case["header_limiting"])
        if expected["barriers"] == case["active_blocks"] and header != set(occ.limiting):
            # the header keeps flags it set before applying the barrier limit
            assert header > set(occ.limiting), case
        else:
            assert set(occ.limiting) == header, case


def test_best_block_size_matches_nvidias_calculator() -> None:
    cases = [c for c in _reference() if c["kind"] == "best_block_size"]
    assert len(cases) >= 100
    for case in cases:
        kwargs: dict[str, Any] = {
            "dynamic_smem_per_block": case["dynamic_smem"],
            "smem_per_thread": case["smem_per_thread"],
            "block_size_limit": case["block_size_limit"],
            "carveout_percent": case["carveout_percent"],
        }
        if case["block_size"] == 0:
            with pytest.raises(OccupancyInputError, match="no block size"):
                best_block_size(case["cc"], case["regs"], case["static_smem"], **kwargs)
            continue
        size, occ = best_block_size(case["cc"], case["regs"], case["static_smem"], **kwargs)
        assert (size, occ.active_blocks_per_sm) == (case["block_size"], case["blocks_per_sm"]), case


# --- hand-derived cases -------------------------------------------------------------------


def test_register_limited_a100() -> None:
    occ = occupancy((8, 0), 256, 64)
    # registers: 64 x 32 = 2048 per warp (a multiple of 256); 65536 / 4 sub-partitions = 16384
    #   per sub-partition -> 8 warps each -> 32 warps per SM -> 32 // 8 warps per block = 4 blocks
    # warps: 64 // 8 = 8 blocks; shared memory: only the 1 KiB reserved -> 164 KiB // 1 KiB = 164
    # blocks: 32. Result 4 blocks x 8 warps = 32 of 64 warps = 50%.
    assert occ.blocks_limit == {
        "warps": 8,
        "registers": 4,
        "shared_memory": 164,
        "blocks": 32,
        "barriers": None,  # applied from cc 9.0 on
    }
    assert (occ.active_blocks_per_sm, occ.active_warps_per_sm, occ.occupancy) == (4, 32, 0.5)
    assert occ.limiting == ("registers",)
    assert occ.allocated_registers_per_block == 2048 * 8
    # 4 blocks x 1 KiB fit the smallest 8 KiB split, leaving the rest of the cache to L1
    assert occ.min_shared_memory_config_bytes == 8 * KIB
    assert occ.can_launch
    assert occ.reason == ""


def test_best_practices_guide_32_registers_give_full_occupancy_on_volta() -> None:
    # CUDA C++ Best Practices Guide: on cc 7.0 (64K registers, 2048 threads per SM) a thread may
    # use at most 32 registers for 100% occupancy. 32 x 32 = 1024 per warp -> 16 warps per
    # sub-partition -> 64 warps; 33 registers round up to 1280 per warp -> 12 x 4 = 48 warps.
    assert occupancy((7, 0), 256, 32).occupancy == 1.0
    occ33 = occupancy((7, 0), 256, 33)
    assert occ33.blocks_limit["registers"] == 48 // 8
    assert occ33.occupancy == 0.75
    assert occ33.limiting == ("registers",)


def test_warp_limited_ada_and_ampere_ga10x() -> None:
    for cc in ((8, 6), (8, 9), (12, 0)):
        occ = occupancy(cc, 1024, 16)
        # 1536 threads per SM = 48 warps; a 1024-thread block takes 32 -> 1 block, 32/48 warps
        assert occ.blocks_limit["warps"] == 1
        assert occ.limiting == ("warps",)
        assert occ.occupancy == pytest.approx(32 / 48)


def test_block_limited_small_blocks() -> None:
    # 32-thread blocks: one warp each. Hopper holds at most 32 blocks -> 32 of 64 warps.
    hopper = occupancy((9, 0), 32, 16)
    assert hopper.limiting == ("blocks",)
    assert hopper.occupancy == 0.5
    # Turing: 16 blocks of one warp -> 16 of 32 warps.
    turing = occupancy((7, 5), 32, 16)
    assert turing.limiting == ("blocks",)
    assert turing.occupancy == 0.5
    # cc 12.0: 24 blocks; barrier slots = 24 x 1 per block -> barriers bind at the same 24.
    rtx50 = occupancy((12, 0), 32, 16)
    assert rtx50.blocks_limit["blocks"] == rtx50.blocks_limit["barriers"] == 24
    assert rtx50.limiting == ("blocks", "barriers")
    assert rtx50.occupancy == pytest.approx(24 / 48)


def test_barrier_limited_hopper() -> None:
    occ = occupancy((9, 0), 64, 16, barriers_per_block=4)
    # 32 blocks x 2 barrier slots = 64 barriers per SM; 4 per block -> 16 blocks of 2 warps
    assert occ.blocks_limit["barriers"] == 16
    assert occ.limiting == ("barriers",)
    assert occ.occupancy == 0.5
    assert any("barriers" in note for note in occ.notes)
    # barriers_per_block=0 removes the limit altogether
    assert occupancy((9, 0), 64, 16, barriers_per_block=0).blocks_limit["barriers"] is None


def test_shared_memory_limited_with_reserved_memory() -> None:
    occ = occupancy((8, 0), 128, 32, 48 * KIB)
    # 49152 + 1024 reserved = 50176 B (a multiple of 128); 167936 // 50176 = 3 blocks of 4 warps
    assert occ.allocated_smem_per_block_bytes == 50176
    assert occ.blocks_limit["shared_memory"] == 3
    assert occ.limiting == ("shared_memory",)
    assert occ.occupancy == pytest.approx(12 / 64)
    # Without the reservation it would have been 167936 // 49152 = 3 as well; at 40 KiB it shows:
    # 40960 + 1024 = 41984 -> 167936 // 41984 = 4 (not 167936 // 40960 = 4.1 -> 4); at 32 KiB:
    # 33792 -> 4 blocks, where 32 KiB alone would give 5.
    assert occupancy((8, 0), 128, 32, 32 * KIB).blocks_limit["shared_memory"] == 4


def test_no_shared_memory_means_no_limit_before_ampere_only() -> None:
    # cc 7.x reserves nothing: a kernel without shared memory is not limited by it ...
    assert occupancy((7, 0), 128, 32).blocks_limit["shared_memory"] is None
    # ... from 8.0 on the 1 KiB reservation counts: 228 KiB // 1 KiB = 228 on Hopper.
    assert occupancy((9, 0), 128, 32).blocks_limit["shared_memory"] == 228


def test_shared_memory_allocation_unit() -> None:
    # 1 byte rounds up to the unit: 256 B on cc 7.5 (64 KiB // 256 B = 256 blocks by smem) ...
    turing = occupancy((7, 5), 64, 16, 1)
    assert turing.allocated_smem_per_block_bytes == 256
    assert turing.blocks_limit["shared_memory"] == 64 * KIB // 256
    # ... and 1 + 1024 reserved -> 1152 B (9 x 128) on cc 8.6: 102400 // 1152 = 88.
    ga10x = occupancy((8, 6), 64, 16, 1)
    assert ga10x.allocated_smem_per_block_bytes == 1152
    assert ga10x.blocks_limit["shared_memory"] == 88


def test_register_file_check_rounds_warps_to_sub_partitions() -> None:
    # 288 threads = 9 warps at 224 registers: 224 x 32 = 7168 per warp; 9 x 7168 = 64512 fits in
    # 64K, but the hardware checks 12 warps (9 rounded up to a multiple of 4): 86016 > 65536.
    occ = occupancy((8, 0), 288, 224)
    assert occ.active_blocks_per_sm == 0
    assert not occ.can_launch
    assert occ.limiting == ("registers",)
    assert occ.blocks_limit["registers"] == 0
    assert "multiple of 4" in occ.reason
    # 256 threads (8 warps, already a multiple of 4) at 224 registers: 57344 fits.
    # Per sub-partition 16384 // 7168 = 2 warps -> 8 per SM -> 1 block of 8 warps = 12.5%.
    fits = occupancy((8, 0), 256, 224)
    assert fits.active_blocks_per_sm == 1
    assert fits.occupancy == 0.125


def test_carveout_choices() -> None:
    base: dict[str, Any] = {
        "cc": (8, 0),
        "threads_per_block": 64,
        "regs_per_thread": 16,
        "smem_per_block": 16 * KIB,
    }
    # 16384 + 1024 = 17408 B per block; warps allow 32 blocks of 2 warps, blocks 32.
    default = occupancy(**base)
    assert default.shared_memory_config_bytes == 164 * KIB
    assert default.blocks_limit["shared_memory"] == 167936 // 17408 == 9
    # carveout 64 KiB: 65536 // 17408 = 3 blocks
    assert occupancy(**base, carveout_kib=64).blocks_limit["shared_memory"] == 3
    # carveout 40 KiB is not a configuration: it rounds up to 64 KiB
    assert occupancy(**base, carveout_kib=40).shared_memory_config_bytes == 64 * KIB
    # 50%: 167936 x 50 // 100 = 83968 B -> the 100 KiB configuration -> 102400 // 17408 = 5
    half = occupancy(**base, carveout_percent=50)
    assert half.shared_memory_config_bytes == 100 * KIB
    assert half.blocks_limit["shared_memory"] == 5
    assert carveout_config_bytes((8, 0), carveout_percent=50) == 100 * KIB
    # 0 (prefer L1): one block needs 17408 B, so the driver takes the 32 KiB configuration
    l1 = occupancy(**base, carveout_percent=0)
    assert l1.shared_memory_config_bytes == 32 * KIB
    assert l1.blocks_limit["shared_memory"] == 1
    assert any("carveout" in note for note in l1.notes)
    # Turing has only 32 and 64 KiB configurations: 0 means 32 KiB
    assert carveout_config_bytes((7, 5), carveout_kib=0) == 32 * KIB
    with pytest.raises(OccupancyInputError, match="valid shared-memory configurations"):
        occupancy(**base, carveout_kib=200)
    with pytest.raises(OccupancyInputError, match="not both"):
        occupancy(**base, carveout_kib=64, carveout_percent=50)
    with pytest.raises(OccupancyInputError, match="carveout_percent"):
        occupancy(**base, carveout_percent=101)


def test_opt_in_shared_memory_and_kernels_that_cannot_launch() -> None:
    # 48 KiB static + 115 KiB dynamic + 1 KiB reserved = 164 KiB: exactly an A100 SM.
    full = occupancy((8, 0), 256, 32, 48 * KIB, dynamic_smem_per_block=115 * KIB)
    assert full.active_blocks_per_sm == 1
    assert full.limiting == ("shared_memory",)
    # one more KiB is over the 163 KiB opt-in limit (+1 KiB reserved)
    over = occupancy((8, 0), 256, 32, 48 * KIB, dynamic_smem_per_block=116 * KIB)
    assert over.active_blocks_per_sm == 0
    assert over.limiting == ("shared_memory",)
    assert over.shared_memory_config_bytes is None
    assert "exceeds" in over.reason
    # a block over 1024 threads cannot launch anywhere: the warp limit is 0
    big = occupancy((9, 0), 1056, 16)
    assert big.active_blocks_per_sm == 0
    assert big.limiting == ("warps",)
    assert "1024" in big.reason
    assert occupancy((9, 0), 1056, 16).occupancy == 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threads_per_block": 0}, "at least 1"),
        ({"threads_per_block": -32}, "at least 1"),
        ({"regs_per_thread": 256}, "255"),
        ({"regs_per_thread": -1}, "regs_per_thread"),
        ({"smem_per_block": 48 * KIB + 1}, "dynamic_smem_per_block"),
        ({"smem_per_block": -1}, "smem_per_block"),
        ({"dynamic_smem_per_block": -5}, "dynamic_smem_per_block"),
        ({"barriers_per_block": 17}, "16 named barriers"),
        ({"threads_per_block": 12.5}, "whole number"),
        ({"threads_per_block": True}, "whole number"),
        ({"regs_per_thread": "32"}, "whole number"),
        ({"cc": (6, 1)}, "6.1"),
        ({"cc": "13.0"}, "13.0"),
        ({"cc": "hopper"}, "compute capability"),
    ],
)
def test_invalid_inputs_raise_a_clear_error(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"cc": (8, 0), "threads_per_block": 256, "regs_per_thread": 32}
    args.update(kwargs)
    with pytest.raises(OccupancyInputError, match=match) as info:
        occupancy(**args)
    assert isinstance(info.value, GpuDiagError)
    assert isinstance(info.value, ValueError)


def test_whole_floats_and_cc_spellings_are_accepted() -> None:
    a = occupancy("sm_80", 256.0, 64)  # type: ignore[arg-type]
    b = occupancy(8.0, 256, 64)
    assert a.to_dict() == b.to_dict()


# --- best block size and the curve ---------------------------------------------------------


def test_best_block_size_prefers_the_larger_block_on_ties() -> None:
    # 64 registers allow 32 warps per SM on cc 8.0. 1024 threads: 1 block = 1024 threads; 512
    # threads: 2 blocks = 1024 threads too. Sizes are tried from 1024 down and only a strictly
    # better one replaces the best, so 1024 wins.
    size, occ = best_block_size((8, 0), 64)
    assert size == 1024
    assert occ.occupancy == 0.5
    # With block sizes capped at 1000: 1000 (32 warps) -> 1000 threads; 512 -> 2 x 512 = 1024.
    size, occ = best_block_size((8, 0), 64, block_size_limit=1000)
    assert size == 512
    assert occ.active_blocks_per_sm == 2


def test_best_block_size_with_shared_memory_per_thread() -> None:
    # 128 B per thread + 1 KiB reserved, cc 9.0 (228 KiB = 233472 B per SM):
    #   1024 threads: 128 + 1 = 129 KiB -> 1 block  = 1024 threads
    #    896 threads: 112 + 1 = 113 KiB -> 2 blocks = 1792 threads
    #    448 threads:  56 + 1 =  57 KiB -> 4 blocks = 1792 threads (a tie: 896 was tried first)
    #    256 threads:  32 + 1 =  33 KiB -> 6 blocks = 1536 threads
    # no size reaches 2048 threads, so the larger of the tied sizes, 896, wins.
    size, occ = best_block_size((9, 0), 32, smem_per_thread=128)
    assert size == 896
    # at 896 threads (28 warps) warps (64 // 28) and registers (64 warps at 32 registers) allow
    # 2 blocks as well: three resources bind at once
    assert occ.active_blocks_per_sm == 2
    assert occ.limiting == ("warps", "registers", "shared_memory")
    assert (
        occupancy((9, 0), 448, 32, dynamic_smem_per_block=448 * 128).active_threads_per_sm == 1792
    )


def test_best_block_size_raises_when_nothing_launches() -> None:
    with pytest.raises(OccupancyInputError, match="no block size"):
        best_block_size((8, 6), 32, 48 * KIB, dynamic_smem_per_block=60 * KIB)


def test_occupancy_curve_spans_all_block_sizes() -> None:
    curve = occupancy_curve((8, 9), 64)
    assert [o.threads_per_block for o in curve] == list(range(32, 1025, 32))
    _, best = best_block_size((8, 9), 64)
    assert max(o.occupancy for o in curve) == best.occupancy
    # at 64 registers the register file holds 32 warps: the curve never passes 32/48
    assert all(o.active_warps_per_sm <= 32 for o in curve)


# --- the result object ----------------------------------------------------------------------


def test_result_is_json_safe_escaped_and_readable() -> None:
    occ = occupancy((8, 0), 288, 224)
    data = json.loads(json.dumps(occ.to_dict()))
    assert data["cc"] == "8.0"
    assert data["active_blocks_per_sm"] == 0
    assert data["blocks_limit"]["barriers"] is None
    assert "cannot launch" in repr(occ)
    html = occ._repr_html_()
    assert "no limit" in html
    assert "<script" not in html
    launched = occupancy((9, 0), 128, 40)
    assert "75.0%" in repr(launched)
    assert "registers" in repr(launched)
    assert isinstance(launched, Occupancy)
    assert launched.active_threads_per_sm == 12 * 128
