"""The fix registry: the stable ids, parameters, parsing, and what each needs to apply."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from gpudiag.errors import UnsupportedFixError
from gpudiag.fixes import Fix, FixError, FixKind, get_spec, registry
from tests.fakes.machines import cpu_system

# The stable vocabulary (findings, recipes and the CLI use these ids) and each id's kind.
STABLE_IDS = {
    "precision.tf32": FixKind.AMBIENT,
    "precision.bf16": FixKind.AMBIENT,
    "precision.fp16": FixKind.AMBIENT,
    "precision.fp8": FixKind.STRUCTURAL,
    "batch.size": FixKind.STRUCTURAL,
    "attention.backend": FixKind.AMBIENT,
    "fsdp.wrap": FixKind.STRUCTURAL,
    "activation.checkpointing": FixKind.STRUCTURAL,
    "compile": FixKind.STRUCTURAL,
    "dataloader.tuning": FixKind.STRUCTURAL,
    "cudnn.benchmark": FixKind.AMBIENT,
    "cuda.graphs": FixKind.STRUCTURAL,
    "allocator.config": FixKind.ENVIRONMENT,
    "nccl.env": FixKind.ENVIRONMENT,
    "sync.remove": FixKind.ADVICE,
}
IMPLEMENTED = {
    "precision.tf32",
    "precision.bf16",
    "precision.fp16",
    "precision.fp8",
    "attention.backend",
    "compile",
    "cudnn.benchmark",
    "batch.size",
    "dataloader.tuning",
    "activation.checkpointing",
    "cuda.graphs",
    "fsdp.wrap",
}


def test_registry_holds_exactly_the_design_vocabulary() -> None:
    assert {k: s.kind for k, s in registry().items()} == STABLE_IDS


@pytest.mark.parametrize("fix_id", sorted(STABLE_IDS))
def test_every_fix_describes_itself(fix_id: str) -> None:
    spec = get_spec(fix_id)
    fix = Fix(fix_id) if fix_id != "nccl.env" else Fix(fix_id, NCCL_ALGO="Ring")
    assert fix.describe()
    assert json.loads(json.dumps(fix.to_dict()))["id"] == fix_id
    assert fix.implemented is (
        fix_id in IMPLEMENTED or spec.kind in (FixKind.ENVIRONMENT, FixKind.ADVICE)
    )
    assert fix.label in fix._repr_html_()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("precision.bf16", Fix("precision.bf16")),
        ("attention.backend=flash", Fix("attention.backend", backend="flash")),
        ("attention.backend=flash_attention_2", Fix("attention.backend", backend="flash_attn")),
        ("compile=reduce-overhead", Fix("compile", mode="reduce-overhead")),
        (
            "compile:mode=max-autotune,fullgraph=true",
            Fix("compile", mode="max-autotune", fullgraph=True),
        ),
        (
            "batch.size:micro_batch=4,accumulation=2",
            Fix("batch.size", micro_batch=4, accumulation=2),
        ),
        ("nccl.env:NCCL_ALGO=Ring", Fix("nccl.env", variables={"NCCL_ALGO": "Ring"})),
        ("activation.checkpointing=2", Fix("activation.checkpointing", every_n_layers=2)),
        (
            "activation.checkpointing:classes=Block+Attention",
            Fix("activation.checkpointing", classes=("Block", "Attention")),
        ),
    ],
)
def test_parse_and_label_round_trip(text: str, expected: Fix) -> None:
    fix = Fix.parse(text)
    assert fix == expected
    assert hash(fix) == hash(expected)
    assert Fix.parse(fix.label) == fix
    assert Fix.from_dict(fix.to_dict()) == fix


def test_unknown_ids_and_parameters_say_what_exists() -> None:
    with pytest.raises(FixError, match=r"Known fixes: .*precision\.bf16"):
        Fix("precision.bf17")
    with pytest.raises(FixError, match="It takes: mode"):
        Fix("compile", mod="default")
    with pytest.raises(FixError, match="backend"):
        Fix.parse("attention.backend=warp-speed")
    with pytest.raises(FixError, match="no main parameter"):
        Fix.parse("precision.bf16=yes")
    with pytest.raises(FixError, match="NCCL"):
        Fix("nccl.env", variables={"LD_PRELOAD": "x"})
    with pytest.raises(FixError, match="letters, digits"):
        Fix("nccl.env", NCCL_ALGO="Ring; rm -rf ~")
    with pytest.raises(FixError, match="multiple of micro_batch"):
        Fix("batch.size", micro_batch=3, global_batch=8)


def test_fix_is_immutable() -> None:
    fix = Fix("precision.bf16")
    with pytest.raises(AttributeError):
        fix.id = "precision.fp16"  # type: ignore[misc]
    fix.params["x"] = 1
    assert "x" not in fix.params


def test_fsdp_wrap_needs_a_process_group_and_says_how_to_get_one() -> None:
    fix = Fix("fsdp.wrap")
    assert fix.implemented
    assert fix.spec.saves_memory
    ok, why = fix.tryable(cpu_system())
    assert not ok
    assert "nproc=2" in why
    with pytest.raises(UnsupportedFixError, match="process group"):
        fix.apply(torch.nn.Linear(2, 2), check=False)


def test_environment_fixes_export_instead_of_applying() -> None:
    alloc = Fix("allocator.config", expandable_segments=True, max_split_size_mb=256)
    assert alloc.env() == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:256"
    }
    assert Fix("nccl.env", NCCL_IB_DISABLE="1").env() == {"NCCL_IB_DISABLE": "1"}
    with pytest.raises(UnsupportedFixError, match="to_env"):
        alloc.apply(check=False)


def test_advice_fix_carries_the_call_site() -> None:
    fix = Fix.parse("sync.remove=train.py:42 loss.item()")
    assert "train.py:42 loss.item()" in fix.describe()
    with pytest.raises(UnsupportedFixError, match="advice"):
        fix.apply(check=False)


def test_one_value_parser_for_fix_parameters_and_workload_overrides() -> None:
    from gpudiag.commands.compare import parse_overrides
    from gpudiag.fixes import parse_value

    spellings = ["true", "yes", "on", "false", "no", "off", "none", "null", "4", "0.5", "flash"]
    parsed = [parse_value(s) for s in spellings]
    assert parsed == [True, True, True, False, False, False, None, None, 4, 0.5, "flash"]
    # --set and a fix's key=value read values the same way (they used to disagree on yes/on)
    assert parse_overrides([f"k={s}" for s in spellings[:3]]) == {"k": True}
    loose = Fix.parse("dataloader.tuning:num_workers=2,pin_memory=no,persistent_workers=off")
    assert loose == Fix(
        "dataloader.tuning", num_workers=2, pin_memory=False, persistent_workers=False
    )
    # a number given for a text parameter is its text
    assert Fix.parse("sync.remove=12").params == {"call_site": "12"}


def test_fix_is_the_one_type_of_a_finding_a_trial_and_a_recipe_entry() -> None:
    from gpudiag.recipe import Evidence, Recipe, RecipeFix
    from gpudiag.rules.finding import FixRef

    assert FixRef is Fix
    assert RecipeFix is Fix
    entry = RecipeFix(id="batch.size", params={"micro_batch": 8}, evidence=Evidence(speedup=2.0))
    assert entry == Fix("batch.size", micro_batch=8) == FixRef("batch.size", {"micro_batch": 8})
    assert entry.evidence.speedup == 2.0
    recipe = Recipe(fixes=[entry])
    data = recipe.to_dict()["fixes"][0]
    assert data == {
        "id": "batch.size",
        "params": {"micro_batch": 8, "accumulation": 1, "global_batch": None},
        "evidence": {"speedup": 2.0},
    }
    assert Recipe.from_dict(recipe.to_dict()).fixes[0].evidence == Evidence(speedup=2.0)
    from gpudiag.errors import RecipeError

    with pytest.raises(RecipeError, match=r"unknown key\(s\) surprise in a recipe entry"):
        Recipe.from_dict({"fixes": [{"id": "compile", "surprise": 1}]})


def test_a_fix_kind_follows_from_its_hooks() -> None:
    from gpudiag.fixes import FixSpec

    class Ambient(FixSpec):
        id = "test.ambient"
        summary = "x"

        def scope(self, params: Any, target: Any) -> Any:
            return None

    assert Ambient.kind is FixKind.AMBIENT
    with pytest.raises(TypeError, match="follows from its hooks"):

        class Declared(FixSpec):
            id = "test.declared"
            summary = "x"
            kind = FixKind.STRUCTURAL
