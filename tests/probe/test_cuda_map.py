"""CUDA index <-> NVML device matching: by UUID, honouring CUDA_VISIBLE_DEVICES and device order."""

from __future__ import annotations

from gpudiag.probe.cuda_map import match_cuda_indices, parse_visible_devices
from gpudiag.probe.model import GpuInfo
from gpudiag.probe.readings import ok

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
C = "GPU-cccccccc-1111-2222-3333-444444444444"


def _infos(names: tuple[str, ...] = ("A100", "A100", "A100")) -> list[GpuInfo]:
    return [
        GpuInfo(index=i, name=ok(name), uuid=ok(uuid))
        for i, (name, uuid) in enumerate(zip(names, (A, B, C), strict=False))
    ]


def test_parse_visible_devices_stops_at_first_invalid_entry() -> None:
    assert parse_visible_devices(None) is None
    assert parse_visible_devices("") == []
    assert parse_visible_devices("-1") == []
    assert parse_visible_devices("2,0") == ["2", "0"]
    assert parse_visible_devices("1,foo,0") == ["1"]
    assert parse_visible_devices(f"{B}, 0") == [B, "0"]


def test_all_visible_in_pci_order_for_identical_gpus() -> None:
    m = match_cuda_indices(_infos(), env={})
    assert dict(m.cuda_index) == {0: 0, 1: 1, 2: 2}
    assert m.note == ""


def test_visible_devices_by_index_reorders() -> None:
    m = match_cuda_indices(_infos(), env={"CUDA_VISIBLE_DEVICES": "2,0"})
    assert dict(m.cuda_index) == {2: 0, 0: 1}


def test_visible_devices_by_uuid_prefix() -> None:
    m = match_cuda_indices(_infos(), env={"CUDA_VISIBLE_DEVICES": "GPU-cccc,GPU-aaaa"})
    assert dict(m.cuda_index) == {2: 0, 0: 1}
    assert m.method.startswith("uuid")


def test_ambiguous_uuid_prefix_ends_the_list() -> None:
    m = match_cuda_indices(_infos(), env={"CUDA_VISIBLE_DEVICES": "GPU-cccc,GPU-"})
    assert dict(m.cuda_index) == {2: 0}


def test_out_of_range_index_ends_the_list() -> None:
    m = match_cuda_indices(_infos(), env={"CUDA_VISIBLE_DEVICES": "1,7,0"})
    assert dict(m.cuda_index) == {1: 0}


def test_torch_uuids_win_over_the_environment() -> None:
    m = match_cuda_indices(
        _infos(), env={"CUDA_VISIBLE_DEVICES": "0,1"}, torch_uuids=[C[4:].upper(), A]
    )
    assert dict(m.cuda_index) == {2: 0, 0: 1}
    assert m.method == "uuid (torch.cuda)"


def test_mixed_models_without_pci_order_are_flagged() -> None:
    infos = _infos(("A100", "T4", "A100"))
    flagged = match_cuda_indices(infos, env={})
    assert "fastest first" in flagged.note
    exact = match_cuda_indices(infos, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert exact.note == ""
