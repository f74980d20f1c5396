"""gpudiag.probe.contention: who else used the CPUs during a measurement, and is that busy."""

from __future__ import annotations

import threading
import time

from gpudiag.probe.contention import MachineLoad, _Snapshot, between, snapshot


def _snap(wall: float, busy: float, total: float, steal: float, own: float) -> _Snapshot:
    return _Snapshot(wall, busy, total, steal, own, {})


def test_other_processes_are_the_busy_time_this_process_did_not_use() -> None:
    start = _snap(0.0, 10.0, 100.0, 0.0, 5.0)
    end = _snap(10.0, 25.0, 120.0, 0.0, 12.0)  # 15 s busy, 7 of them ours
    load = between(start, end)
    assert load.others_cpus == 0.8
    assert load.threads_cpus == 0.0
    assert load.steal_share == 0.0


def test_busy_needs_a_share_of_the_usable_cpus_or_steal() -> None:
    quiet = MachineLoad(10.0, 2, 0.1, 0.0, 0.0, 0.5)
    assert not quiet.busy
    assert quiet.reasons() == []
    others = MachineLoad(10.0, 2, 1.2, 0.0, 0.0, 3.0)
    assert others.busy
    assert "other processes 1.2" in others.reasons()[0]
    monitor = MachineLoad(10.0, 2, 0.0, 0.6, None, None)  # a 1 kHz sampler in this process
    assert monitor.busy
    assert "this process's other threads 0.6" in monitor.reasons()[0]
    stolen = MachineLoad(10.0, 16, 0.0, 0.0, 0.08, None)
    assert stolen.busy
    assert "steal" in stolen.reasons()[0]
    unknown = MachineLoad(10.0, 2, None, None, None, None)
    assert not unknown.busy
    assert "n/a" in unknown.describe()
    assert unknown.to_dict()["busy"] is False


def test_a_spinning_python_thread_of_this_process_is_counted() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    before = snapshot()
    time.sleep(1.0)
    load = between(before, snapshot())
    stop.set()
    thread.join()
    assert load.threads_cpus is not None
    assert load.threads_cpus > 0.05  # some of the second, however loaded the machine is
    assert load.seconds >= 1.0
