"""What a busy machine does to a verdict: timings taken while other work competed for the CPUs
cannot show that a fix makes no difference.

Contention widens the spread of every arm's step times, so the interval of a real speed-up can
widen until it contains 1: under load a comparison turned "faster" into "no significant
difference" (1 kHz monitor beside a comparison on a 2-core host). A verdict of no difference
taken on a busy machine (gpudiag.probe.contention.MachineLoad.busy) is therefore "undecided",
with the reason. "faster" / "slower" stand: their interval cleared the tolerance in spite of the
noise (the rounds interleave the arms, so a busy spell slows them alike); the comparison still
says the machine was busy.
"""

from __future__ import annotations

from gpudiag.analysis.verdict import NO_DIFFERENCE, UNDECIDED
from gpudiag.probe.contention import MachineLoad


def verdict_on(load: MachineLoad | None, verdict: str | None) -> tuple[str | None, str]:
    """(the verdict this load allows, why it changed; "" when it did not). The reason is what
    the undecided arm needs (``Judgement.needs``'s words), so it reads after "undecided: "."""
    if load is None or verdict != NO_DIFFERENCE or not load.busy:
        return verdict, ""
    return UNDECIDED, (
        "no significant difference within the margin, but the machine was busy while it was "
        f"measured ({'; '.join(load.reasons())}); measure again on a quieter machine"
    )


__all__ = ["NO_DIFFERENCE", "UNDECIDED", "verdict_on"]
