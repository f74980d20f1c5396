"""Measure hardware ceilings: matmul, memory bandwidth, attention, collectives; parse nccl-tests."""

from __future__ import annotations

from gpudiag.commands.bench import add_arguments, run

__all__ = ["add_arguments", "run"]
