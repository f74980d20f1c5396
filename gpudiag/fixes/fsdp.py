"""fsdp.wrap: shard parameters, gradients and optimizer state across ranks with FSDP2.

``torch.distributed.fsdp.fully_shard`` is applied to every block of the classes named in
``wrap_classes`` (by name or qualified name), or else to the model's repeated blocks (the
children of ``nn.ModuleList`` / ``nn.Sequential`` containers holding two or more modules of
one class, as activation.checkpointing finds them), then to the root module.
``reshard_after_forward`` frees each block's gathered parameters after its forward (ZeRO-3;
False keeps them until the backward, ZeRO-2-like: more memory, one all-gather less). The root
keeps torch's default (not resharded: the backward needs its parameters at once); torch 2.11
fails the backward when the root is resharded with a tied embedding in it, as the demo GPT has
("setStorage: ... out of bounds for storage of size 0"; 2.13 accepts it).
``mixed_precision`` sets ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=float32)``.

It needs a process group: inside a torchrun job it applies to each rank's model; from a
notebook, ``gd.compare(workload, fixes=["fsdp.wrap"], nproc=2)`` launches the ranks (see
gpudiag.distributed.compare). Sharding cannot be undone on a module, so it is applied to a
trial's own model (or, through a recipe, to a training script's model for good). Runs for
real with gloo on a CPU; the NCCL path is untested on a real GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Literal

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes.checkpointing import named_blocks, repeated_blocks
from gpudiag.fixes.proof import Observation, Proof, applied, not_applied
from gpudiag.fixes.spec import FixParams, FixSpec, Need, Step, register

if TYPE_CHECKING:
    from gpudiag.probe.system import SystemReport

NEEDS_RANKS = (
    "fsdp.wrap shards across ranks and needs a process group: "
    "gd.compare(workload, fixes=['fsdp.wrap'], nproc=2) runs it as a distributed trial "
    "(inside a torchrun job it applies to each rank's model)"
)


class FsdpParams(FixParams):
    wrap_classes: tuple[str, ...] = ()
    reshard_after_forward: bool = True
    mixed_precision: Literal["bf16", "fp16", "none"] = "none"


def mixed_precision_policy(name: str) -> Any:
    """FSDP2's policy for ``mixed_precision``; None for "none" (parameters stay as they are)."""
    if name == "none":
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = torch.bfloat16 if name == "bf16" else torch.float16
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard_blocks(model: Any, params: Mapping[str, Any]) -> list[str]:
    """Apply fully_shard to the blocks, then to the root; returns the blocks' class names
    (taken before sharding: fully_shard swaps each module's class for an ``FSDP...`` one)."""
    from torch.distributed.fsdp import fully_shard

    classes = tuple(params.get("wrap_classes") or ())
    blocks = named_blocks(model, classes) if classes else repeated_blocks(model)
    if classes and not blocks:
        raise UnsupportedFixError(
            f"fsdp.wrap: no module of class {', '.join(classes)} in {type(model).__name__}; "
            "name the class of its repeated blocks (e.g. wrap_classes=['Block'])"
        )
    root: dict[str, Any] = {}
    policy = mixed_precision_policy(str(params.get("mixed_precision", "none")))
    if policy is not None:
        root["mp_policy"] = policy
    reshard = bool(params.get("reshard_after_forward", True))
    names = [type(b).__name__ for b in blocks]
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard, **root)
    fully_shard(model, **root)
    return names


def fsdp_proof(fix_id: str, model: Any) -> Proof:
    """Module and parameter inspection of a model fully_shard was applied to."""
    from torch.distributed.fsdp import FSDPModule

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5 keeps it under _tensor
        from torch.distributed._tensor import DTensor

    wrapped = [m for m in model.modules() if isinstance(m, FSDPModule)]
    params = list(model.parameters())
    sharded = [
        p for p in params if isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements)
    ]
    if not wrapped or not sharded:
        return not_applied(
            fix_id,
            f"{len(wrapped)} FSDP module(s), {len(sharded)} of {len(params)} parameter(s) "
            "sharded: fully_shard did not reach the model",
        )
    ranks = sharded[0].device_mesh.size()
    return applied(
        fix_id,
        f"{len(wrapped)} module(s) wrapped by fully_shard; {len(sharded)} of {len(params)} "
        f"parameter(s) sharded (DTensor) over {ranks} rank(s)",
    )


@register
class FsdpWrap(FixSpec):
    id = "fsdp.wrap"
    needs = frozenset({Need.MODEL})
    multi_rank = True
    summary = (
        "Shard parameters, gradients and optimizer state across ranks with FSDP "
        "(fully_shard per block)."
    )
    Params = FsdpParams
    saves_memory = True

    def describe(self, params: Mapping[str, Any]) -> str:
        classes = params.get("wrap_classes") or ()
        which = f"blocks of class {', '.join(classes)}" if classes else "the repeated blocks"
        reshard = "resharded" if params.get("reshard_after_forward", True) else "kept gathered"
        after = f"{reshard} after forward"
        mp = params.get("mixed_precision", "none")
        precision = "" if mp == "none" else f", {mp} parameters with fp32 gradient reduction"
        return f"{self.summary} Shards {which} and the root, {after}{precision}."

    def supported(
        self, params: Mapping[str, Any], system: SystemReport | None, device_type: str
    ) -> tuple[bool, str]:
        try:
            import torch.distributed as dist
        except ImportError:
            return False, "this torch has no torch.distributed"
        if not dist.is_available():
            return False, "this torch was built without distributed support"
        if not dist.is_initialized():
            return False, NEEDS_RANKS
        return True, ""

    def prepare(self, params: Mapping[str, Any], target: Step, stack: ExitStack) -> None:
        import torch.distributed as dist
        from torch import nn

        if not dist.is_available() or not dist.is_initialized():
            raise UnsupportedFixError(NEEDS_RANKS)
        model = target.model
        if not isinstance(model, nn.Module):
            raise UnsupportedFixError(
                f"fsdp.wrap shards a torch.nn.Module; got {type(model).__name__}"
            )
        counts = Counter(shard_blocks(model, params))
        what = ", ".join(f"{n} {name}" for name, n in counts.items()) or "no repeated blocks"
        target.notes.append(
            f"fsdp.wrap: fully_shard on {what} and the root across "
            f"{dist.get_world_size()} ranks (cannot be undone on this model)"
        )

    def proof(
        self, params: Mapping[str, Any], arm: Observation, baseline: Observation | None
    ) -> Proof:
        """The wrapper and its shards: modules fully_shard turned into FSDP modules, and
        parameters held as sharded DTensors."""
        return fsdp_proof(self.id, arm.step.model)

    def code(self, params: Mapping[str, Any]) -> list[str]:
        classes = tuple(params.get("wrap_classes") or ())
        if classes:
            names = "{" + ", ".join(repr(c) for c in classes) + "}"
            find = f"blocks = [m for m in model.modules() if type(m).__name__ in {names}]"
        else:
            find = "blocks = list(model.layers)  # your model's repeated blocks (nn.ModuleList)"
        kwargs = f"reshard_after_forward={bool(params.get('reshard_after_forward', True))}"
        lines = ["from torch.distributed.fsdp import fully_shard"]
        mp = params.get("mixed_precision", "none")
        root = ""
        if mp != "none":
            dtype = "torch.bfloat16" if mp == "bf16" else "torch.float16"
            lines += [
                "from torch.distributed.fsdp import MixedPrecisionPolicy",
                f"mp = MixedPrecisionPolicy(param_dtype={dtype}, reduce_dtype=torch.float32)",
            ]
            kwargs += ", mp_policy=mp"
            root = ", mp_policy=mp"
        return [
            *lines,
            "# after torch.distributed.init_process_group(), before creating the optimizer",
            find,
            "for block in blocks:",
            f"    fully_shard(block, {kwargs})",
            f"fully_shard(model{root})  # the root: not resharded after forward (torch's default)",
        ]
