"""The fields of a Kineto event the loader keeps, and for which kinds: the one place to add one.

A Kineto event is a JSON object with ``ph``, ``cat``, ``name``, ``pid``, ``tid``, ``ts``, ``dur``
and an ``args`` object whose keys depend on its category. The loader (``load.py``) decodes the
top-level keys and only the ``args`` keys declared here; every other key is skipped unparsed, so
a multi-GB trace costs what the analyses read, not what the profiler wrote.

* ``ROW_FIELDS``: numbers kept as a column over every event row
  (``Events.columns[name]``, the first three also ``Events.correlation`` etc.).
* ``LAUNCH_FIELDS``: numbers of GPU work (kernels, memcpy, memset) kept in the launch table
  (``LaunchTable.columns[name]``), one row per such event (``Events.extra``).

Integers read -1, floats NaN, where the event does not record the key or is not of the field's
kinds. **Adding a field is one line** in the table it belongs to, e.g. the bytes of memcpy
events on every row:

    ArgField("memcpy_bytes", ("bytes",), kinds=frozenset({Kind.MEMCPY})),

The typed decoder, the slow path for malformed files and the column follow from the line. A new
category is one line in ``model.KIND_OF_CATEGORY``; the fields read with more than a number's
logic (launch grid and block, operator inputs, collective arguments, call stacks: the
``RAW_ARGS``) are decoded by ``load.py`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analysis.trace.model import Kind

ALL_KINDS: frozenset[Kind] = frozenset(Kind)
# Events on a GPU stream: their stream and device are kept (from the trace's tid and pid when
# the args do not say).
STREAM_KINDS: frozenset[Kind] = frozenset(
    {Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_SYNC, Kind.GPU_ANNOTATION}
)
# GPU work with launch arguments: one launch-table row each.
LAUNCH_KINDS: frozenset[Kind] = frozenset({Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET})


@dataclass(frozen=True)
class ArgField:
    """A number in an event's ``args``, kept as a column.

    ``keys``: its spellings across Kineto versions, the first one recorded wins. ``kinds``:
    the rows that keep it (others read the missing value). ``is_float``: a float64 column
    (missing: NaN), else int64 (missing: -1; a value beyond int64 is dropped with a note).
    ``divisor``: the value kept is the recorded one divided by it (a percentage as a fraction).
    """

    name: str
    keys: tuple[str, ...]
    kinds: frozenset[Kind] = ALL_KINDS
    is_float: bool = False
    divisor: float = 1.0


# Kineto's "External id" (an operator's link to its launches) is not kept: no analysis reads
# it (``nesting`` rebuilds the link from containment, as some traces repeat the correlation id
# there), and it would cost 4 bytes a row.
ROW_FIELDS: tuple[ArgField, ...] = (
    ArgField("correlation", ("correlation",)),
    ArgField("stream", ("stream",), kinds=STREAM_KINDS),
    ArgField("device", ("device",), kinds=STREAM_KINDS),
)

LAUNCH_FIELDS: tuple[ArgField, ...] = (
    ArgField("registers_per_thread", ("registers per thread",), kinds=LAUNCH_KINDS),
    ArgField("shared_memory_bytes", ("shared memory",), kinds=LAUNCH_KINDS),
    ArgField("nbytes", ("bytes",), kinds=LAUNCH_KINDS),
    ArgField(
        "kineto_achieved_occupancy",
        ("est. achieved occupancy %",),
        kinds=LAUNCH_KINDS,
        is_float=True,
        divisor=100.0,
    ),
)

# args read by their own code in load.py: attribute -> JSON key. They stay undecoded JSON
# until an event proves to need them (a costed operator's inputs, a sync call's stack).
RAW_ARGS: dict[str, str] = {
    "call_stack": "Call stack",
    "input_dims": "Input Dims",
    "input_type": "Input type",
    "concrete_inputs": "Concrete Inputs",
    "collective_name": "Collective name",
    "in_msg_nelems": "In msg nelems",
    "out_msg_nelems": "Out msg nelems",
    "msg_dtype": "dtype",
    "group_size": "Group size",
    "pg_name": "Process Group Name",
}
# Launch grid and block, x y z: a tuple each, kept per launch-table row.
DIM_ARGS: dict[str, str] = {"grid": "grid", "block": "block"}
