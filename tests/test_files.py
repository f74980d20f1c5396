"""gpudiag._files: a user's file is read bounded; folders and devices are refused by name."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpudiag._files import OVERRIDE, read_bytes, read_json, read_text
from gpudiag.errors import GpuDiagError, ReplayError


def test_a_file_within_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("hello\n")
    assert read_bytes(path, "note", max_bytes=100) == b"hello\n"
    assert read_text(path, "note", max_bytes=100) == "hello\n"


def test_a_larger_file_is_refused_before_it_is_read_and_the_cap_can_be_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * (2 << 20))
    with pytest.raises(ReplayError, match=rf"larger than 1 MiB.*{OVERRIDE}"):
        read_bytes(path, "recording", max_bytes=1 << 20, error=ReplayError)
    monkeypatch.setenv(OVERRIDE, "4")
    assert len(read_bytes(path, "recording", max_bytes=1 << 20)) == 2 << 20
    monkeypatch.setenv(OVERRIDE, "²")  # not a number: the reader's own cap stays
    with pytest.raises(GpuDiagError, match="larger than"):
        read_bytes(path, "recording", max_bytes=1 << 20)


def test_devices_folders_and_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(GpuDiagError, match="is a device"):
        read_bytes("/dev/zero", "config", max_bytes=1 << 20)
    with pytest.raises(GpuDiagError, match="is a folder"):
        read_bytes(tmp_path, "config", max_bytes=1 << 20)
    with pytest.raises(GpuDiagError, match="cannot read config"):
        read_bytes(tmp_path / "missing.json", "config", max_bytes=1 << 20)


def test_a_pipe_is_read_up_to_the_cap_and_no_further(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "wb") as fh:
            try:
                while True:  # an endless producer, like `cat /dev/zero`
                    fh.write(b"0" * 65536)
            except BrokenPipeError:
                pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    with pytest.raises(GpuDiagError, match="larger than 1 MiB"):
        read_bytes(fifo, "recording", max_bytes=1 << 20)
    assert time.perf_counter() - t0 < 10
    thread.join(timeout=10)


def test_text_must_be_utf8_without_nul_bytes(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.py"
    latin.write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(GpuDiagError, match="not UTF-8 text"):
        read_text(latin, "code file", max_bytes=1 << 20)
    assert "caf" in read_text(latin, "log", max_bytes=1 << 20, replace=True)
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(GpuDiagError, match="binary file"):
        read_text(binary, "code file", max_bytes=1 << 20, replace=True)


def test_json_files_are_checked_like_json_text(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"layers": NaN}')
    with pytest.raises(GpuDiagError, match=r"config .*config\.json is not valid JSON: NaN"):
        read_json(path, "config", max_bytes=1 << 20)
