"""gpudiag._deadline: a hung step is stopped, a sys.exit in a step is reported, timers restored."""

from __future__ import annotations

import signal
import threading
import time

import pytest

import gpudiag
from gpudiag._deadline import deadline, raised_in_user_code, user_code_failures
from gpudiag.errors import StepExitError, StepFailedError, StepTimeoutError


def test_a_sleeping_step_is_stopped_at_its_deadline() -> None:
    t0 = time.perf_counter()
    expected = r"the step did not finish within 0\.2 s \(why\)"
    with pytest.raises(StepTimeoutError, match=expected), deadline(0.2, "the step", hint=" (why)"):
        time.sleep(60)
    assert time.perf_counter() - t0 < 5
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.default_int_handler, None)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_step_that_swallows_the_interruption_is_interrupted_again() -> None:
    swallowed: list[str] = []

    def stubborn() -> None:
        while True:  # a retry loop that catches everything, as user code sometimes does
            try:
                time.sleep(60)
            except BaseException as exc:
                swallowed.append(type(exc).__name__)
                if len(swallowed) > 1:
                    raise

    with pytest.raises(StepTimeoutError), deadline(0.1, "a stubborn step"):
        stubborn()
    assert len(swallowed) == 2  # the second alarm, a second later, got through


def test_a_finished_block_leaves_no_timer_and_the_callers_handler_is_back() -> None:
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        with deadline(5, "quick"):
            pass
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
        assert signal.getsignal(signal.SIGALRM) is not None
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(0.3)
        assert fired == [1]  # the caller's own handler runs again
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_nested_deadlines_report_the_one_that_expired() -> None:
    with pytest.raises(StepTimeoutError, match="outer"):  # noqa: SIM117 - nesting is tested
        with deadline(0.2, "outer"), deadline(30, "inner"):
            time.sleep(60)
    with pytest.raises(StepTimeoutError, match="inner"):  # noqa: SIM117
        with deadline(30, "outer"), deadline(0.2, "inner"):
            time.sleep(60)


def test_sys_exit_in_a_step_is_reported_not_raised() -> None:
    exits = r"the cell called sys\.exit\(3\)"
    with pytest.raises(StepExitError, match=exits), deadline(None, "the cell"):
        raise SystemExit(3)
    with pytest.raises(KeyboardInterrupt), deadline(5, "the cell"):
        raise KeyboardInterrupt  # the user's own Ctrl-C passes through as it is


def test_a_step_in_another_thread_is_stopped_too() -> None:
    outcome: list[str] = []

    def run() -> None:
        try:
            with deadline(0.2, "a thread's step"):
                for _ in range(10**9):  # Python code: interrupted at its next bytecode
                    pass
        except StepTimeoutError as exc:
            outcome.append(str(exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert outcome
    assert "did not finish within 0.2 s" in outcome[0]


def test_user_code_failures_wraps_only_the_users_exceptions() -> None:
    def users_loss() -> None:
        raise ValueError("shape mismatch in my loss")

    wrapped = r"gd\.memory stopped.*ValueError: shape mismatch"
    with pytest.raises(StepFailedError, match=wrapped), user_code_failures("gd.memory"):
        users_loss()
    with pytest.raises(ValueError, match="shape mismatch") as mine:
        users_loss()
    assert raised_in_user_code(mine.value)
    # An exception whose frames are all gpudiag's own is a gpudiag bug: left as it is.
    inside = compile("raise KeyError('a bug of ours')", gpudiag.__file__, "exec")
    with pytest.raises(KeyError) as ours:
        exec(inside, {})
    tb = ours.value.__traceback__
    assert tb is not None
    while tb.tb_frame.f_code.co_filename != gpudiag.__file__:
        assert tb.tb_next is not None
        tb = tb.tb_next  # only the frames of the code compiled as gpudiag's
    assert not raised_in_user_code(ours.value.with_traceback(tb))
