"""Training-step memory from closed-form formulas: bytes per parameter, activations, KV cache.

Pure arithmetic on a model's description; no torch. ``gd.estimate_memory`` (in
gpudiag.experiment.estimate) uses these formulas for a transformer config and a traced step for
any other ``nn.Module``; both return the ``MemoryEstimate`` defined here.

Sources of the formulas (each is checked against the published figure in the tests):

* Model states, Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models" (SC 2020, arXiv:1910.02054), section 3.1: mixed-precision Adam keeps fp16
  weights (2 bytes/param) and gradients (2) plus K = 12 bytes of optimizer state (fp32 master
  weights, momentum, variance): 16 bytes per parameter, 120 GB for 7.5 B parameters; ZeRO
  stages 1/2/3 over N_d ranks divide the optimizer state, then gradients, then weights (Figure 1:
  31.4 / 16.6 / 1.9 GB at N_d = 64).
* Activations, Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models" (MLSys 2023, arXiv:2205.05198), section 4: ``s*b*h*(34 + 5*a*s/h)`` bytes per layer
  with 16-bit activations and dropout; ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` with tensor
  parallelism t; ``34/t`` with sequence parallelism; full recomputation keeps ``2*s*b*h`` per
  layer; the first pipeline stage holds as many activations as the whole unsplit model.
* KV cache: ``2 x layers x kv_heads x head_dim x sequence x batch x bytes`` (keys and values of
  every layer); NVIDIA's "Mastering LLM Techniques: Inference Optimization" (2023) works it for
  Llama 2 7B: batch 1, 4096 tokens, fp16 -> about 2 GB.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from gpudiag._report import jsonable
from gpudiag._values import whole_number
from gpudiag._views import Card, Carded, Facts, Grid, Lines
from gpudiag.errors import MemoryEstimateError
from gpudiag.units import format_bytes

CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "kv_cache",
    "inputs",
    "other",
)

# Element size of weights/activations by precision name.
PRECISION_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Optimizer state bytes per parameter, without fp32 master weights (those depend on precision).
# adam/adamw: two fp32 moments; sgd with momentum: one fp32 buffer; adam8bit: bitsandbytes'
# blockwise 8-bit moments (2 x 1 byte, plus a small per-block scale left out).
OPTIMIZER_STATE_BYTES: dict[str, float] = {
    "adam": 8.0,
    "adamw": 8.0,
    "sgd": 0.0,
    "sgd_momentum": 4.0,
    "adam8bit": 2.0,
    "adafactor": 4.0 / 1024,  # factored second moment: O(rows + cols), negligible per parameter
    "none": 0.0,
}
_OPTIMIZER_ALIASES = {
    "adamw8bit": "adam8bit",
    "adam_8bit": "adam8bit",
    "paged_adamw8bit": "adam8bit",
    "momentum": "sgd_momentum",
    "sgd+momentum": "sgd_momentum",
    "inference": "none",
}


def normalize_precision(precision: str | None) -> str:
    if precision is not None and not isinstance(precision, str):
        raise MemoryEstimateError(f"precision must be a name such as 'bf16', got {precision!r}")
    name = (precision or "fp32").lower().replace("float32", "fp32").replace("bfloat16", "bf16")
    name = name.replace("float16", "fp16").replace("half", "fp16").removeprefix("precision.")
    if name not in PRECISION_BYTES:
        raise MemoryEstimateError(
            f"unknown precision {precision!r}: use one of {', '.join(PRECISION_BYTES)}"
        )
    return name


def normalize_optimizer(optimizer: str | None) -> str:
    if optimizer is not None and not isinstance(optimizer, str):
        raise MemoryEstimateError(f"optimizer must be a name such as 'adamw', got {optimizer!r}")
    name = (optimizer or "adamw").lower().replace("-", "").replace(" ", "")
    name = _OPTIMIZER_ALIASES.get(name, name)
    if name not in OPTIMIZER_STATE_BYTES:
        raise MemoryEstimateError(
            f"unknown optimizer {optimizer!r}: use one of {', '.join(OPTIMIZER_STATE_BYTES)}"
        )
    return name


@dataclass(frozen=True)
class BytesPerParameter:
    """Model-state bytes per parameter: weights, gradients, optimizer state (master included)."""

    weights: float
    gradients: float
    optimizer_state: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_state


def bytes_per_parameter(
    precision: str | None = "fp32", optimizer: str | None = "adamw", *, training: bool = True
) -> BytesPerParameter:
    """Bytes each parameter costs in a training step (ZeRO paper, section 3.1).

    ``fp32``: 4 + 4 + optimizer state. ``bf16`` / ``fp16`` (mixed precision as in ZeRO and
    Megatron): 16-bit weights and gradients plus fp32 master weights (4) in the optimizer
    state: with Adam 2 + 2 + 12 = 16. torch autocast keeps fp32 weights instead (the traced
    route measures that layout). Inference (``training=False``): the weights only.
    """
    prec = normalize_precision(precision)
    width = PRECISION_BYTES[prec]
    if not training:
        return BytesPerParameter(float(width), 0.0, 0.0)
    opt = normalize_optimizer(optimizer)
    master = 4.0 if width < 4 and opt != "none" else 0.0
    return BytesPerParameter(float(width), float(width), OPTIMIZER_STATE_BYTES[opt] + master)


@dataclass(frozen=True)
class Parallelism:
    """How a step is spread over GPUs; ``estimate_memory`` returns the figure of one GPU.

    ``dp``: data-parallel ranks; ``zero``: 0 (DDP, full replicas), 1 (optimizer state
    sharded), 2 (+ gradients), 3 (+ weights: FSDP full shard); ``tp`` / ``pp``: tensor and
    pipeline degrees; ``sequence_parallel`` splits the layer-norm/dropout activations over tp.
    Parse one with ``Parallelism.parse("fsdp:8")``, ``"ddp:4"``, ``"zero2:8,tp:2"``.
    """

    dp: int = 1
    zero: int = 0
    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp"):
            number = whole_number(
                getattr(self, name), f"parallelism {name}", low=1, high=1 << 24,
                error=MemoryEstimateError,
            )  # fmt: skip
            object.__setattr__(self, name, number)
        if not isinstance(self.sequence_parallel, bool):
            raise MemoryEstimateError("parallelism sequence_parallel must be true or false")
        if isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3):
            raise MemoryEstimateError("parallelism zero stage must be 0, 1, 2 or 3")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @classmethod
    def parse(cls, value: Any) -> Parallelism:
        """A Parallelism from itself, None, a mapping of its fields, or a ``kind:N`` string."""
        if value is None:
            return cls()
        if isinstance(value, Parallelism):
            return value
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise MemoryEstimateError(
                    f"unknown parallelism keys {unknown}: use {', '.join(sorted(known))}"
                )
            return cls(**value)
        if isinstance(value, str):
            out: dict[str, Any] = {}
            zero_of = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
            for part in filter(None, (p.strip().lower() for p in value.split(","))):
                kind, _, degree = part.partition(":")
                if kind in ("sp", "sequence_parallel"):
                    out["sequence_parallel"] = True
                    continue
                n = 1
                if degree:
                    n = whole_number(
                        degree, f"parallelism {part!r}: the degree", low=1, high=1 << 24,
                        error=MemoryEstimateError,
                    )  # fmt: skip
                if kind in zero_of:
                    out.update(dp=n, zero=zero_of[kind])
                elif kind in ("dp", "tp", "pp"):
                    out[kind] = n
                else:
                    raise MemoryEstimateError(
                        f"unknown parallelism {kind!r}: use ddp, fsdp, zero1/2/3, dp, tp, pp, sp "
                        "(e.g. 'fsdp:8,tp:2')"
                    )
            return cls(**out)
        raise MemoryEstimateError(
            f"parallelism must be a string, mapping or Parallelism: {value!r}"
        )

    def describe(self) -> str:
        if self.gpus == 1:
            return "one GPU"
        parts = []
        if self.dp > 1:
            parts.append(
                {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "FSDP/ZeRO-3"}[self.zero] + f" x{self.dp}"
            )
        if self.tp > 1:
            parts.append(f"TP x{self.tp}" + (" + SP" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"PP x{self.pp}")
        return ", ".join(parts)


@dataclass(frozen=True)
class MemoryEstimate(Carded):
    """Estimated peak memory of one training step (or of generation, with a KV cache).

    ``peak_bytes`` is what ``torch.cuda.max_memory_allocated()`` would report for the step on a
    GPU (live tensor bytes; parameters, gradients and optimizer state included), per GPU under
    ``parallelism``. ``breakdown`` is category -> bytes at that peak. ``per_sample_bytes``:
    what one more sample adds (for scaling by batch). ``route``: "formula" or "traced".
    ``step_peaks`` (formula route, training): the peak of each phase the formulas model,
    ``"backward"`` (grows with the batch) and ``"optimizer step"`` (does not); ``peak_bytes`` is
    the larger. A traced estimate measured the whole step and leaves it empty.
    """

    peak_bytes: int
    breakdown: Mapping[str, int]
    route: str
    model: str = ""
    batch_size: int | None = None
    seq_len: int | None = None
    precision: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: str | None = None
    parallelism: Parallelism = field(default_factory=Parallelism)
    per_sample_bytes: int | None = None
    parameters: int | None = None
    assumptions: tuple[str, ...] = ()
    step_peaks: Mapping[str, int] = field(default_factory=dict)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / 2**30

    @property
    def peak_phase(self) -> str | None:
        """The phase whose peak is ``peak_bytes`` ("backward" / "optimizer step"), if modelled."""
        if not self.step_peaks:
            return None
        return max(self.step_peaks, key=lambda phase: self.step_peaks[phase])

    def _scaling(self) -> tuple[int, int, int]:
        """(batch, per-sample bytes, the peak that grows with the batch) or an error."""
        if self.per_sample_bytes is None or self.batch_size is None:
            raise MemoryEstimateError("this estimate has no per-sample figure to scale by batch")
        grows = self.step_peaks.get("backward", self.peak_bytes)
        return self.batch_size, self.per_sample_bytes, grows

    def at_batch(self, batch_size: int) -> int:
        """Peak bytes at another batch size: the batch-dependent peak scaled linearly by
        ``per_sample_bytes``, never below the optimizer step's (which no batch changes)."""
        batch, per_sample, grows = self._scaling()
        if batch_size < 1:
            raise MemoryEstimateError("batch_size must be at least 1")
        scaled = int(grows + (batch_size - batch) * per_sample)
        return max(scaled, self.step_peaks.get("optimizer step", 0))

    def largest_batch(self, budget_bytes: int) -> int:
        """The largest batch whose scaled peak fits ``budget_bytes`` (0 when none does)."""
        batch, per_sample, grows = self._scaling()
        if self.step_peaks.get("optimizer step", 0) > budget_bytes:
            return 0
        fixed = grows - batch * per_sample
        if per_sample <= 0:
            return batch if self.peak_bytes <= budget_bytes else 0
        return max(0, int((budget_bytes - fixed) // per_sample))

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "memory_estimate",
                "peak_bytes": self.peak_bytes,
                "breakdown": dict(self.breakdown),
                "route": self.route,
                "model": self.model,
                "batch_size": self.batch_size,
                "seq_len": self.seq_len,
                "precision": self.precision,
                "optimizer": self.optimizer,
                "checkpointing": self.checkpointing,
                "parallelism": self.parallelism,
                "parallelism_description": self.parallelism.describe(),
                "per_sample_bytes": self.per_sample_bytes,
                "parameters": self.parameters,
                "assumptions": list(self.assumptions),
                "step_peaks": dict(self.step_peaks),
                "peak_phase": self.peak_phase,
            }
        )

    def _settings(self) -> str:
        parts = [f"batch {self.batch_size}" if self.batch_size else "", self.precision]
        if self.seq_len:
            parts.append(f"seq {self.seq_len}")
        parts += [self.optimizer, f"checkpointing {self.checkpointing or 'off'}"]
        parts.append(self.parallelism.describe())
        return ", ".join(p for p in parts if p)

    def __repr__(self) -> str:
        lines = [
            f"MemoryEstimate({self.model or 'model'}: peak {format_bytes(self.peak_bytes)} "
            f"per GPU{self._phase_text()}, {self.route} route; {self._settings()})"
        ]
        for name, value in self.breakdown.items():
            if value:
                lines.append(f"  {name:<16} {format_bytes(value):>12}")
        lines += [f"  assumes: {a}" for a in self.assumptions]
        return "\n".join(lines)

    def _phase_text(self) -> str:
        if len(self.step_peaks) < 2 or self.peak_phase is None:
            return ""
        others = ", ".join(
            f"{phase} {format_bytes(value)}"
            for phase, value in self.step_peaks.items()
            if phase != self.peak_phase
        )
        return f" at the {self.peak_phase} ({others})"

    def as_card(self) -> Card:
        rows = [
            (name, format_bytes(value), f"{value / self.peak_bytes:.0%}" if self.peak_bytes else "")
            for name, value in self.breakdown.items()
            if value
        ]
        head = Facts(
            [
                ("peak per GPU", format_bytes(self.peak_bytes) + self._phase_text()),
                ("route", self.route),
                ("settings", self._settings()),
            ]
        )
        return Card(
            f"Memory estimate: {self.model or 'model'}",
            [head, Grid(("category", "bytes", "share"), rows), Lines(self.assumptions, "note")],
        )


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer as its config describes it (Hugging Face names accepted
    through ``from_mapping``). ``ffn_hidden`` defaults to 4 x hidden; ``kv_heads`` to heads."""

    layers: int
    hidden: int
    heads: int
    vocab_size: int = 0
    seq_len: int = 2048
    ffn_hidden: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    gated_mlp: bool = False  # SwiGLU-style: three ffn matrices instead of two
    tied_embeddings: bool = True
    experts: int = 1  # Mixtral-style mixture of experts: this many MLPs per layer, all stored

    # Each field's accepted range: beyond these no model exists, and the arithmetic of the
    # estimate and the planner stays small (1e300 layers would loop or overflow).
    LIMITS: ClassVar[dict[str, tuple[int, int]]] = {
        "layers": (1, 100_000),
        "hidden": (1, 1 << 20),
        "heads": (1, 1 << 16),
        "vocab_size": (0, 1 << 31),
        "seq_len": (1, 1 << 30),
        "ffn_hidden": (1, 1 << 24),
        "kv_heads": (1, 1 << 16),
        "head_dim": (1, 1 << 16),
        "experts": (1, 1 << 16),
    }

    def __post_init__(self) -> None:
        for name, (low, high) in self.LIMITS.items():
            value = getattr(self, name)
            if value is None and name in ("ffn_hidden", "kv_heads", "head_dim"):
                continue
            number = whole_number(
                value, f"transformer config {name}", low=low, high=high, error=MemoryEstimateError
            )
            object.__setattr__(self, name, number)
        for name in ("gated_mlp", "tied_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise MemoryEstimateError(
                    f"transformer config {name} must be true or false, got {getattr(self, name)!r}"
                )
        if self.head_dim is None and self.hidden % self.heads:
            raise MemoryEstimateError("hidden must be a multiple of heads (or give head_dim)")

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def layer_parameters(self) -> int:
        """Weights of one transformer block: attention (q, k, v, o), MLP and its two norms."""
        h, d = self.hidden, self.dim_per_head
        attn = h * self.heads * d * 2 + h * self.key_value_heads * d * 2  # q, o, k, v
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn * self.experts
        router = h * self.experts if self.experts > 1 else 0
        return attn + mlp + router + 2 * h

    def outer_parameters(self) -> int:
        """Weights outside the blocks: embeddings, the output head unless tied, the final norm."""
        return self.vocab_size * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden

    def parameter_count(self) -> int:
        """Weights of attention, MLP, norms and embeddings (biases left out: < 0.1 %)."""
        return self.layers * self.layer_parameters() + self.outer_parameters()

    _ALIASES: ClassVar[dict[str, tuple[str, ...]]] = {
        "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
        "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
        "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
        "vocab_size": ("vocab_size",),
        "seq_len": ("max_position_embeddings", "n_positions", "seq_len", "max_seq_len"),
        "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
        "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
        "head_dim": ("head_dim",),
        "tied_embeddings": ("tie_word_embeddings",),
    }

    @classmethod
    def from_mapping(cls, config: Any) -> TransformerConfig:
        """From a dict or a config object (Hugging Face ``PretrainedConfig``, a dataclass)."""
        get = (
            config.get
            if isinstance(config, Mapping)
            else (lambda key, default=None: getattr(config, key, default))
        )
        values: dict[str, Any] = {}
        for name, keys in cls._ALIASES.items():
            for key in (name, *keys):
                value = get(key, None)
                if value is not None:
                    values[name] = value
                    break
        missing = [n for n in ("layers", "hidden", "heads") if n not in values]
        if missing:
            raise MemoryEstimateError(
                f"the config does not say the transformer's {', '.join(missing)} "
                "(num_hidden_layers / hidden_size / num_attention_heads)"
            )
        family = _family(get)
        if any(get(key, None) for key in _OTHER_MOE_KEYS) and not get("num_local_experts", None):
            raise MemoryEstimateError(
                f"{family or 'this model'}: a mixture-of-experts layout with shared or "
                "differently sized experts is not modelled (only Mixtral's num_local_experts "
                "x intermediate_size); give the estimate a TransformerConfig whose ffn_hidden "
                "and experts add up to its parameters"
            )
        values["experts"] = get("num_local_experts", None) or 1
        named = (
            get("hidden_act", "") or get("hidden_activation", "") or get("activation_function", "")
        )
        act = named.lower() if isinstance(named, str) else ""  # a name, or no activation known
        if family in GATED_MLP_FAMILIES:
            values["gated_mlp"] = True
        elif family in PLAIN_MLP_FAMILIES:
            values["gated_mlp"] = False
        else:
            values["gated_mlp"] = act in ("silu", "swiglu", "swish", "geglu") and (
                "ffn_hidden" in values
            )
        if "tied_embeddings" not in values and family in UNTIED_FAMILIES:
            values["tied_embeddings"] = False
        return cls(**values)


# Hugging Face model types by their MLP (transformers' modeling code): gate, up and down
# projections (SwiGLU, or GeGLU in Gemma, whatever ``hidden_act`` says), or two matrices.
GATED_MLP_FAMILIES = frozenset(
    {
        "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
        "gemma3_text", "phi3", "olmo", "olmo2", "cohere", "granite", "internlm2", "stablelm",
    }
)  # fmt: skip
PLAIN_MLP_FAMILIES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "mpt", "phi", "starcoder2",
     "gpt_bigcode"}
)  # fmt: skip
# Types whose config class defaults tie_word_embeddings to False (the base class says True).
UNTIED_FAMILIES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "olmo", "olmo2", "granite",
     "internlm2", "stablelm", "gpt_neox", "falcon"}
)  # fmt: skip
_OTHER_MOE_KEYS = ("num_experts", "n_routed_experts", "moe_intermediate_size")


def _family(get: Any) -> str:
    """The config's model type ("llama"), from ``model_type`` or its first architecture."""
    model_type = get("model_type", None)
    if isinstance(model_type, str) and model_type:
        return model_type.lower()
    architectures = get("architectures", None) or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    if isinstance(architectures, (list, tuple)) and architectures:
        if not isinstance(architectures[0], str):
            return ""  # not a class name: no family (a nested list is not printed either)
        name = architectures[0]
        for suffix in ("ForCausalLM", "ForConditionalGeneration", "Model", "LMHeadModel"):
            name = name.removesuffix(suffix)
        return name.lower()
    return ""


def activation_bytes_per_layer(
    cfg: TransformerConfig,
    batch_size: int,
    seq_len: int,
    *,
    element_bytes: int = 2,
    dropout: bool = True,
    flash_attention: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Activations one transformer layer keeps for its backward (Korthikanti et al., sec. 4).

    With 16-bit elements and dropout this is ``s*b*h*(34 + 5*a*s/h)``: 16 values of ``s*b*h``
    and 2 one-byte dropout masks, plus ``a*s*s*b`` scores and softmax (2 values) and a mask.
    ``flash_attention`` (SDPA/flash) keeps no ``s x s`` matrices. ``tp`` splits the 24 values
    inside attention and MLP over tensor ranks (10 stay replicated, or split too with
    sequence parallelism).
    """
    s, b, h, a = seq_len, batch_size, cfg.hidden, cfg.heads
    mask = 1 if dropout else 0
    sbh = s * b * h
    # Of 16 sbh-sized values (+2 masks), 5 sbh elements (layer-norm inputs, dropout outputs:
    # the paper's "10 sbh" bytes) are replicated across tensor ranks without sequence parallelism.
    replicated = (5 * element_bytes) * sbh
    split = (11 * element_bytes + 2 * mask) * sbh
    attention = 0.0 if flash_attention else (2 * element_bytes + mask) * a * s * s * b
    if sequence_parallel:
        return (replicated + split + attention) / tp
    return replicated + (split + attention) / tp


def kv_cache_bytes(
    cfg: TransformerConfig, batch_size: int, seq_len: int, *, element_bytes: int = 2
) -> int:
    """Keys and values of every layer: 2 x layers x kv_heads x head_dim x seq x batch x bytes."""
    return (
        2
        * cfg.layers
        * cfg.key_value_heads
        * cfg.dim_per_head
        * seq_len
        * batch_size
        * element_bytes
    )


def shard_model_states(
    breakdown: Mapping[str, int], parallelism: Parallelism
) -> tuple[dict[str, int], list[str]]:
    """Per-GPU parameters, gradients and optimizer state under ``parallelism`` (ZeRO, sec. 5)."""
    p = parallelism
    model_split = p.tp * p.pp  # tensor and pipeline ranks each hold their part of every state
    out = dict(breakdown)
    notes: list[str] = []
    for key in ("parameters", "gradients", "optimizer_state"):
        out[key] = math.ceil(breakdown.get(key, 0) / model_split)
    if p.dp > 1 and p.zero >= 1:
        out["optimizer_state"] = math.ceil(out["optimizer_state"] / p.dp)
    if p.dp > 1 and p.zero >= 2:
        out["gradients"] = math.ceil(out["gradients"] / p.dp)
    if p.dp > 1 and p.zero >= 3:
        out["parameters"] = math.ceil(out["parameters"] / p.dp)
    return out, notes


def optimizer_update_bytes(
    n_params: int, parallelism: Parallelism, optimizer: str | None = "adamw"
) -> int:
    """What Adam's update allocates beside the model states on one GPU: one fp32 copy of the
    parameters it updates.

    On CUDA, torch.optim's Adam/AdamW default to the foreach implementation, whose
    intermediates are whole tensor lists: ``sqrt`` of every second moment at once (measured on
    this CPU with ``foreach=True``: 32 MiB for 32 MiB of parameters). ``fused=True`` and the
    for-loop form hold about one tensor's worth instead. Other optimizers: 0 (their updates run
    in place).
    """
    if normalize_optimizer(optimizer) not in ("adam", "adamw"):
        return 0
    p = parallelism
    share = p.tp * p.pp * (p.dp if p.dp > 1 and p.zero >= 1 else 1)
    return math.ceil(n_params * 4 / share)


def ddp_bucket_bytes(
    gradient_bytes: int, parallelism: Parallelism, *, bucket_view: bool = False
) -> tuple[int, str | None]:
    """What DDP's gradient buckets add on one GPU, and the note that says so.

    ``DistributedDataParallel`` copies each gradient into a flat bucket for its all-reduce: one
    more copy of this GPU's gradients, unless ``gradient_as_bucket_view=True`` makes the
    gradients views into the buckets (PyTorch's DDP documentation). Only plain DDP (ZeRO 0).
    """
    if parallelism.dp < 2 or parallelism.zero != 0:
        return 0, None
    if bucket_view:
        return 0, "DDP gradient_as_bucket_view=True: the gradients live in the buckets"
    return gradient_bytes, (
        "DDP gradient buckets: one more copy of the gradients (PyTorch's default; "
        "gradient_as_bucket_view=True saves it)"
    )


def fsdp_gathered_bytes(
    cfg: TransformerConfig, parallelism: Parallelism, *, weight_bytes: int, grad_bytes: int
) -> tuple[int, str | None]:
    """Full (unsharded) weights and gradients FSDP holds on one GPU during the backward.

    FSDP2 ``fully_shard`` on each block, then on the root: the root unit (embeddings, an untied
    output head, the final norm) is not resharded after the forward (torch's documented
    heuristic for the root), and its gradients stay unsharded until the backward reaches the
    embedding, the last thing it computes; meanwhile one block is gathered with the next one
    prefetched, and the block's own gradients are whole until their reduce-scatter. Each is
    split over tensor ranks. Only FSDP / ZeRO-3 over more than one rank.
    """
    p = parallelism
    if p.dp < 2 or p.zero != 3:
        return 0, None
    root = cfg.outer_parameters() / p.tp
    block = cfg.layer_parameters() / p.tp
    total = root * (weight_bytes + grad_bytes) + block * (2 * weight_bytes + grad_bytes)
    return math.ceil(total), (
        "FSDP gathers whole units: the root's weights and gradients (embeddings, head) for the "
        "backward, one block and the prefetched next"
    )


def estimate_transformer(
    config: Any,
    *,
    batch_size: int = 1,
    seq_len: int | None = None,
    precision: str | None = "bf16",
    optimizer: str | None = "adamw",
    checkpointing: str | bool | None = None,
    parallelism: Any = None,
    flash_attention: bool = True,
    dropout: bool = False,
    training: bool = True,
    ddp_bucket_view: bool = False,
    micro_batches: int | None = None,
    name: str = "",
) -> MemoryEstimate:
    """Peak memory per GPU of a transformer training step (or, with ``training=False``, of
    generation with its KV cache) from its config; see the module docstring for the sources.

    The peak is taken at the start of the backward pass: model states, all kept activations,
    the logits and their gradient (``temporaries``), and under ``parallelism`` what the wrapper
    holds beside them (``other``: DDP's gradient buckets unless ``ddp_bucket_view``, FSDP's
    gathered units). ``checkpointing``: None/"none", "full" (each layer keeps its input; one
    layer's activations are rebuilt at a time). ``micro_batches``: per step under pipeline
    parallelism (1F1B holds min(m, pp) of them on the first stage; default pp). The optimizer
    step is a second peak (``step_peaks``); ``peak_bytes`` is the larger of the two.
    """
    cfg = (
        config if isinstance(config, TransformerConfig) else TransformerConfig.from_mapping(config)
    )
    batch_size = whole_number(
        batch_size, "batch_size", low=1, high=1 << 30, error=MemoryEstimateError
    )
    seq = whole_number(
        seq_len or cfg.seq_len, "seq_len", low=1, high=1 << 30, error=MemoryEstimateError
    )
    if micro_batches is not None:
        micro_batches = whole_number(
            micro_batches, "micro_batches", low=1, high=1 << 30, error=MemoryEstimateError
        )
    par = Parallelism.parse(parallelism)
    if cfg.heads % par.tp:  # Megatron splits whole heads over tensor ranks
        raise MemoryEstimateError(
            f"tensor parallel degree {par.tp} does not divide the {cfg.heads} attention heads"
        )
    prec = normalize_precision(precision)
    opt = normalize_optimizer(optimizer if training else "none")
    ckpt = _checkpointing_name(checkpointing)
    width = PRECISION_BYTES[prec]
    n_params = cfg.parameter_count()
    bpp = bytes_per_parameter(prec, opt, training=training)
    states = {
        "parameters": int(n_params * bpp.weights),
        "gradients": int(n_params * bpp.gradients),
        "optimizer_state": int(n_params * bpp.optimizer_state),
    }
    sharded, notes = shard_model_states(states, par)
    wrappers = buckets = 0
    if training:
        buckets, bucket_note = ddp_bucket_bytes(
            sharded["gradients"], par, bucket_view=ddp_bucket_view
        )
        gathered, gather_note = fsdp_gathered_bytes(
            cfg, par, weight_bytes=int(bpp.weights), grad_bytes=int(bpp.gradients)
        )
        wrappers = buckets + gathered
        notes += [n for n in (bucket_note, gather_note) if n]
    assumptions = [
        f"{cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads, "
        f"{n_params / 1e9:.3g} B parameters (biases left out)",
        f"{bpp.total:g} bytes per parameter ({prec}, {opt}; ZeRO paper section 3.1)",
        *notes,
    ]
    breakdown = dict.fromkeys(CATEGORIES, 0)
    breakdown.update(sharded)
    breakdown["other"] = wrappers  # what DDP / FSDP hold beside the model states (notes say)
    if training:
        layers_here = cfg.layers  # 1F1B: the first stage holds p micro-batches of L/p layers
        per_layer = activation_bytes_per_layer(
            cfg,
            batch_size,
            seq,
            element_bytes=width,
            dropout=dropout,
            flash_attention=flash_attention,
            tp=par.tp,
            sequence_parallel=par.sequence_parallel,
        )
        if ckpt == "full":
            kept = (
                2 * seq * batch_size * cfg.hidden * width / (par.tp if par.sequence_parallel else 1)
            )
            activations = layers_here * kept + per_layer
            assumptions.append("full recomputation: each layer keeps its input (2sbh bytes)")
        else:
            activations = layers_here * per_layer
        if par.pp > 1 and micro_batches is not None:
            # 1F1B keeps at most min(m, p) micro-batches in flight on the first stage, each with
            # L/p layers; the line above assumed p of them (the whole model's activations).
            activations *= min(micro_batches, par.pp) / par.pp
        breakdown["activations"] = int(activations)
        # Logits in fp32 and their gradient, split over tensor ranks (vocab-parallel head).
        breakdown["temporaries"] = int(2 * 4 * seq * batch_size * cfg.vocab_size / par.tp)
        assumptions.append(
            "activations per Korthikanti et al. 2022"
            + (" with flash/SDPA attention (no s x s scores)" if flash_attention else "")
            + ("" if dropout else ", no dropout masks")
        )
        per_sample = (breakdown["activations"] + breakdown["temporaries"]) / batch_size
    else:
        kv = kv_cache_bytes(cfg, batch_size, seq, element_bytes=width)
        breakdown["kv_cache"] = math.ceil(kv / par.tp)
        breakdown["temporaries"] = int(
            4 * batch_size * cfg.vocab_size + 2 * width * seq * cfg.hidden
        )
        assumptions.append(
            "generation: weights + KV cache (2 x layers x kv_heads x head_dim x seq)"
        )
        per_sample = (breakdown["kv_cache"] + breakdown["temporaries"]) / batch_size
    peak = sum(breakdown.values())
    step_peaks: dict[str, int] = {}
    if training:
        # The optimizer step: activations and the gathered units are gone, the states, the
        # gradients and DDP's buckets are not, and Adam's foreach update adds its copy.
        update = optimizer_update_bytes(n_params, par, opt)
        at_step = {
            **dict.fromkeys(CATEGORIES, 0),
            **sharded,
            "other": buckets,
            "temporaries": update,
        }
        step_peaks = {"backward": int(peak), "optimizer step": sum(at_step.values())}
        if update:
            assumptions.append(
                "optimizer step: Adam's foreach update holds one fp32 copy of the parameters "
                "it updates (torch's default on CUDA; fused=True holds about one tensor)"
            )
        if step_peaks["optimizer step"] > peak:
            breakdown, peak = at_step, step_peaks["optimizer step"]
    return MemoryEstimate(
        peak_bytes=int(peak),
        step_peaks=step_peaks,
        breakdown=breakdown,
        route="formula",
        model=name or "transformer",
        batch_size=batch_size,
        seq_len=seq,
        precision=prec,
        optimizer=opt,
        checkpointing=ckpt,
        parallelism=par,
        per_sample_bytes=int(per_sample),
        parameters=n_params,
        assumptions=tuple(assumptions),
    )


def _checkpointing_name(checkpointing: Any) -> str | None:
    if checkpointing in (None, False, "none", "off", 0):
        return None
    if checkpointing in (True, "full", "on", 1):
        return "full"
    raise MemoryEstimateError(
        f"checkpointing must be None, True/'full' or False, got {checkpointing!r}"
    )


def with_parallelism(estimate: MemoryEstimate, parallelism: Any) -> MemoryEstimate:
    """A single-GPU traced estimate turned into the per-GPU figure under ``parallelism``.

    Model states are sharded as ZeRO/FSDP/TP/PP shard them; activations and temporaries are
    divided by the tensor degree (an approximation: replicated layer-norm inputs are not split)
    and kept whole across pipeline stages (the first stage holds p micro-batches of L/p layers).
    """
    par = Parallelism.parse(parallelism)
    if par.gpus == 1:
        return replace(estimate, parallelism=par)
    sharded, notes = shard_model_states(estimate.breakdown, par)
    for key in ("activations", "temporaries", "kv_cache"):
        sharded[key] = math.ceil(estimate.breakdown.get(key, 0) / par.tp)
    buckets, bucket_note = ddp_bucket_bytes(sharded.get("gradients", 0), par)
    sharded["other"] = sharded.get("other", 0) + buckets
    notes += [bucket_note] if bucket_note else []
    if par.dp > 1 and par.zero == 3:
        notes.append("FSDP also gathers one wrapped unit's full weights at a time (not counted)")
    per_sample = (
        None if estimate.per_sample_bytes is None else math.ceil(estimate.per_sample_bytes / par.tp)
    )
    if par.tp > 1:
        notes.append("tensor parallel: activations divided by tp (replicated parts not modelled)")
    return replace(
        estimate,
        peak_bytes=sum(sharded.values()),
        breakdown=sharded,
        parallelism=par,
        per_sample_bytes=per_sample,
        assumptions=(*estimate.assumptions, *notes),
    )
