"""The field table both ``nvidia-smi -q`` forms share, and what each form says when a GPU
retires pages, remaps rows, or has neither (real dumps, edited only where a test says so)."""

from __future__ import annotations

import pytest

from gpudiag.probe.readings import Status
from gpudiag.probe.smi_query import PRINTED_NA, QUERY_FIELDS
from gpudiag.probe.smi_text import parse_smi_text
from gpudiag.probe.smi_xml import parse_smi_xml
from tests.conftest import FIXTURES

XML = FIXTURES / "nvidia-smi-xml"
H200_TEXT = FIXTURES / "nvidia-smi-text" / "h200.nvidia-smi-q.txt"
REMAP_FIELDS = ("remapped_rows_uncorrectable", "row_remap_pending", "row_remap_failed")


@pytest.mark.parametrize("field", sorted(QUERY_FIELDS))
def test_each_field_has_as_many_places_in_both_forms(field: str) -> None:
    xml_paths, text_labels = QUERY_FIELDS[field]
    # A field that moved between drivers is looked up in the same order in both forms.
    assert xml_paths
    assert len(xml_paths) == len(text_labels)


def test_a_gpu_that_remaps_rows_says_so_instead_of_retired_pages() -> None:
    # A10G (Ampere): retired-page counts print N/A, the row remapper has counts.
    state = parse_smi_xml((XML / "a10g.xml").read_bytes()).states[0]
    assert state.retired_pages.status is Status.NOT_SUPPORTED
    assert "remaps rows" in state.retired_pages.reason
    assert state.remapped_rows_uncorrectable.value == 0
    assert state.row_remap_pending.value is False


def test_a_gpu_without_a_row_remapper_keeps_the_printed_na() -> None:
    # RTX 3080: <remapped_rows>N/A</remapped_rows>, retired pages N/A.
    state = parse_smi_xml((XML / "rtx-3080-v12.xml").read_bytes()).states[0]
    assert state.retired_pages.reason == PRINTED_NA
    for name in REMAP_FIELDS:
        reading = getattr(state, name)
        assert (reading.status, reading.reason) == (Status.NOT_SUPPORTED, PRINTED_NA), name


def test_text_with_remapped_rows_printed_na_reads_like_the_xml() -> None:
    text = H200_TEXT.read_text()
    start = text.index("    Remapped Rows\n")
    end = text.index("\n    Temperature\n")
    edited = text[:start] + "    Remapped Rows                         : N/A" + text[end:]
    state = parse_smi_text(edited).states[0]
    for name in REMAP_FIELDS:
        reading = getattr(state, name)
        assert (reading.status, reading.reason) == (Status.NOT_SUPPORTED, PRINTED_NA), name
    assert "remaps rows" not in state.retired_pages.reason
    # The untouched dump reads the remapper's counts.
    assert parse_smi_text(text).states[0].row_remap_pending.value is False
