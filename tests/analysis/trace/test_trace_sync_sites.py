"""Which Python frame a host sync is blamed on: the user's line, never gpudiag's caller."""

from __future__ import annotations

from gpudiag.analysis.trace.syncs import _from_call_stack


def test_the_innermost_user_frame_is_the_call_site() -> None:
    stack = (
        "/venv/lib/python3.11/site-packages/torch/_tensor.py(1087): item;"
        "/home/me/train.py(42): log_losses;"
        "/home/me/train.py(90): <module>"
    )
    assert _from_call_stack(stack) == "/home/me/train.py(42): log_losses"


def test_a_sync_inside_torch_under_gpudiags_own_step_has_no_user_call_site() -> None:
    # Adam's step count .item() while gd.diagnose drives the step: blaming the notebook cell
    # that called gd.diagnose would send the user to the wrong line.
    stack = (
        "/venv/lib/python3.11/site-packages/torch/optim/adam.py(212): _single_tensor_adam;"
        "/venv/lib/python3.11/site-packages/gpudiag/rules/__init__.py(140): step;"
        "/venv/lib/python3.11/site-packages/gpudiag/profiling/capture.py(120): profile;"
        "/home/me/notebook.py(3): <module>"
    )
    assert _from_call_stack(stack) is None
