"""Parallel layout for a transformer over N GPUs: DP / FSDP (ZeRO) / TP / PP / SP, ranked."""

from __future__ import annotations

from gpudiag.commands.plan import add_arguments, run

__all__ = ["add_arguments", "run"]
