"""``gd.plan``: which data / FSDP (ZeRO) / tensor / pipeline / sequence-parallel layout to use.

Every layout whose degrees multiply to the GPU count is costed on paper, nothing runs:

* memory per GPU from gpudiag.analysis.memory_estimate (the same formulas as
  ``gd.estimate_memory``), which must fit the GPU's memory less a stated headroom;
* step time = compute + exposed communication + pipeline bubble. Compute is
  ``6 x parameters x tokens`` (``8 x`` with full activation recomputation: the forward runs
  twice) over ``GPUs x peak x MFU``, the peak from gpudiag.specs for the named GPU. Traffic per
  GPU and step, each over the bandwidth of the link its group crosses:

  - DP (DDP, ZeRO-1/2): one ring all-reduce of the gradients, ``2(d-1)/d x gradient bytes``
    (ZeRO-1/2 use a reduce-scatter and an all-gather of the same total, ZeRO paper sec. 7);
  - FSDP / ZeRO-3: all-gather of the weights in the forward and again in the backward, plus a
    reduce-scatter of the gradients, ``3(d-1)/d x weight bytes`` (1.5x DP, ZeRO sec. 7.2.2);
    with pipeline parallelism the gathers repeat for every micro-batch;
  - TP: two all-reduces of the activations per layer in the forward and two in the backward
    (Megatron-LM, Shoeybi et al. 2019, sec. 3), two more when recomputing the forward;
    sequence parallelism replaces each by a reduce-scatter + all-gather of the same volume;
  - PP: the bubble ``(p-1)/(m+p-1)`` of the step (1F1B, Narayanan et al. 2021 sec. 2.2) and
    the activations of every micro-batch sent forward and their gradients back.

  TP traffic sits on the critical path and is never hidden. DP / FSDP traffic overlaps the
  backward (forward and backward for FSDP): ``OVERLAP`` of the part that fits under that
  compute is hidden, the rest is exposed. Pipeline sends are exposed.

Groups are laid out tensor-innermost, then data, then pipeline (Megatron-LM's order), so a
group stays inside a node when its stride x degree fits the node; a group inside a node uses
NVLink (the spec table's per-GPU figure, one direction) or PCIe when the recorded topology has
no NVLink, one that crosses nodes uses the network. Tensor parallelism across nodes is ruled
out. Each ruled-out layout says why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpudiag import _views
from gpudiag._report import card, html_grid, html_lines, html_table, jsonable
from gpudiag._values import finite_number, whole_number
from gpudiag._views import Card, Carded, Facts
from gpudiag.analysis.memory_estimate import (
    MemoryEstimate,
    MemoryEstimateError,
    Parallelism,
    TransformerConfig,
    bytes_per_parameter,
    estimate_transformer,
    normalize_precision,
)
from gpudiag.errors import GpuDiagError, PlanError
from gpudiag.specs import GpuSpec, lookup_gpu
from gpudiag.units import format_bytes

__all__ = [
    "KNOWN_MODELS",
    "Layout",
    "Plan",
    "PlanError",
    "plan",
    "resolve_model",
]


# Assumptions, each stated in the Plan's notes.
DEFAULT_MFU = 0.45  # Megatron-LM reached 52 % of A100 peak at 1T (Narayanan et al. 2021, Table 1)
DEFAULT_HEADROOM = 0.10  # of GPU memory kept free for the allocator, CUDA context, NCCL buffers
OVERLAP = 0.8  # share of DP/FSDP traffic hidden when it fits under the compute it overlaps
DEFAULT_NETWORK_GBPS = 50.0  # GB/s per GPU across nodes: one 400 Gb/s NIC per GPU (DGX H100)
PCIE_GBPS = {3: 12.0, 4: 25.0, 5: 50.0}  # GB/s one direction, x16, after protocol overhead
COLLECTIVE_EFFICIENCY = 0.8  # of the link bandwidth a ring collective achieves (bus bandwidth)

# Published configurations. GPT-3 (Brown et al. 2020, Table 2.1); Megatron-LM 530B and 1T
# (Narayanan et al. 2021, Table 1; vocabulary 51200); Llama 2 (Touvron et al. 2023, Table 1 and
# the released configs); Llama 3 (Grattafiori et al. 2024, Table 3).
KNOWN_MODELS: Mapping[str, Mapping[str, Any]] = {
    "gpt3-175b": {"layers": 96, "hidden": 12288, "heads": 96, "vocab_size": 51200},
    "megatron-530b": {"layers": 105, "hidden": 20480, "heads": 128, "vocab_size": 51200},
    "megatron-1t": {"layers": 128, "hidden": 25600, "heads": 160, "vocab_size": 51200},
    "llama2-7b": {
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "ffn_hidden": 11008,
        "gated_mlp": True,
        "vocab_size": 32000,
        "tied_embeddings": False,
        "seq_len": 4096,
    },
    "llama2-70b": {
        "layers": 80,
        "hidden": 8192,
        "heads": 64,
        "kv_heads": 8,
        "ffn_hidden": 28672,
        "gated_mlp": True,
        "vocab_size": 32000,
        "tied_embeddings": False,
        "seq_len": 4096,
    },
    "llama3-8b": {
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "ffn_hidden": 14336,
        "gated_mlp": True,
        "vocab_size": 128256,
        "tied_embeddings": False,
        "seq_len": 8192,
    },
    "llama3-70b": {
        "layers": 80,
        "hidden": 8192,
        "heads": 64,
        "kv_heads": 8,
        "ffn_hidden": 28672,
        "gated_mlp": True,
        "vocab_size": 128256,
        "tied_embeddings": False,
        "seq_len": 8192,
    },
    "llama3-405b": {
        "layers": 126,
        "hidden": 16384,
        "heads": 128,
        "kv_heads": 8,
        "ffn_hidden": 53248,
        "gated_mlp": True,
        "vocab_size": 128256,
        "tied_embeddings": False,
        "seq_len": 8192,
    },
}


def resolve_model(model_or_config: Any) -> tuple[TransformerConfig, str]:
    """A TransformerConfig and a name from a known name, a config, a module with ``.config``
    or a ``gd.Workload`` whose model has one."""
    if isinstance(model_or_config, TransformerConfig):
        return model_or_config, "transformer"
    if isinstance(model_or_config, str):
        key = model_or_config.strip().lower().replace("_", "-")
        if key not in KNOWN_MODELS:
            raise PlanError(
                f"unknown model {model_or_config!r}: use one of {', '.join(KNOWN_MODELS)}, a "
                "config (dict, Hugging Face config, TransformerConfig) or a module with .config"
            )
        return TransformerConfig(**KNOWN_MODELS[key]), key
    config = model_or_config
    name = ""
    inner = getattr(config, "model", None)  # a gd.Workload: plan its model
    if not isinstance(config, Mapping) and hasattr(inner, "config"):
        config = inner
    if not isinstance(config, Mapping) and hasattr(config, "config"):
        name = type(config).__name__
        config = config.config
    try:
        return TransformerConfig.from_mapping(config), name or "transformer"
    except MemoryEstimateError as exc:
        raise PlanError(f"cannot plan this model: {exc}") from None
    except TypeError as exc:
        raise PlanError(f"cannot plan this model: the config has a bad field ({exc})") from None


@dataclass(frozen=True)
class Layout(Carded):
    """One way to spread the step over the GPUs, costed; ``ruled_out`` says why it cannot run."""

    dp: int
    tp: int
    pp: int
    zero: int = 0
    sequence_parallel: bool = False
    micro_batch: int = 1
    micro_batches: int = 1  # per pipeline and step (gradient accumulation without a pipeline)
    checkpointing: str | None = None
    memory_bytes: int | None = None
    memory_breakdown: Mapping[str, int] = field(default_factory=dict)
    compute_s: float | None = None
    communication_s: Mapping[str, float] = field(default_factory=dict)  # exposed, by kind
    traffic_bytes: Mapping[str, float] = field(default_factory=dict)  # sent per GPU and step
    bubble_s: float = 0.0
    ruled_out: str | None = None
    rule: str = ""  # short key of ruled_out: tp_across_nodes, tp_node_split, heads, ...

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(self.dp, self.zero, self.tp, self.pp, self.sequence_parallel)

    @property
    def fits(self) -> bool:
        return self.ruled_out is None

    @property
    def step_s(self) -> float | None:
        if self.compute_s is None:
            return None
        return self.compute_s + sum(self.communication_s.values()) + self.bubble_s

    @property
    def name(self) -> str:
        parts = []
        if self.dp * self.tp * self.pp == 1:
            parts.append("1 GPU")
        elif self.dp > 1:
            kind = {0: "DP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "FSDP"}[self.zero]
            parts.append(f"{kind} {self.dp}")
        if self.tp > 1:
            parts.append(f"TP {self.tp}" + ("+SP" if self.sequence_parallel else ""))
        if self.pp > 1:
            parts.append(f"PP {self.pp}")
        text = " x ".join(parts)
        return text + (" + recompute" if self.checkpointing else "")

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "name": self.name,
                "dp": self.dp,
                "tp": self.tp,
                "pp": self.pp,
                "zero": self.zero,
                "sequence_parallel": self.sequence_parallel,
                "micro_batch": self.micro_batch,
                "micro_batches": self.micro_batches,
                "checkpointing": self.checkpointing,
                "memory_bytes": self.memory_bytes,
                "memory_breakdown": dict(self.memory_breakdown),
                "compute_s": self.compute_s,
                "communication_s": dict(self.communication_s),
                "traffic_bytes": dict(self.traffic_bytes),
                "bubble_s": self.bubble_s,
                "step_s": self.step_s,
                "ruled_out": self.ruled_out,
                "rule": self.rule,
            }
        )

    def as_card(self) -> Card:
        if self.ruled_out:
            return Card(f"Layout {self.name}", [Facts([("ruled out", self.ruled_out)])])
        rows: list[tuple[object, object]] = [
            ("step (estimated)", _secs(self.step_s)),
            ("compute", _secs(self.compute_s)),
            *((f"{kind} (exposed)", _secs(t)) for kind, t in self.communication_s.items()),
            ("pipeline bubble", _secs(self.bubble_s)),
            ("memory per GPU", format_bytes(self.memory_bytes)),
            ("micro-batch x micro-batches", f"{self.micro_batch} x {self.micro_batches}"),
            ("activation recomputation", self.checkpointing or "off"),
        ]
        return Card(f"Layout {self.name}", [Facts(rows)])

    def __repr__(self) -> str:
        if self.ruled_out:
            return f"Layout({self.name}: ruled out, {self.ruled_out})"
        comm = sum(self.communication_s.values())
        return (
            f"Layout({self.name}: step {self.step_s:.3g} s = compute {self.compute_s:.3g} + "
            f"comm {comm:.3g} + bubble {self.bubble_s:.3g}; {format_bytes(self.memory_bytes)}/GPU)"
        )


@dataclass(frozen=True)
class Plan:
    """Layouts that fit, fastest first (``layouts``), and those ruled out with the reason."""

    model: str
    parameters: int
    gpus: int
    nodes: int
    gpu: str
    gpu_memory_bytes: int
    usable_bytes: int
    seq_len: int
    global_batch: int
    layouts: tuple[Layout, ...]
    ruled_out: tuple[Layout, ...]
    assumptions: tuple[str, ...] = ()

    @property
    def best(self) -> Layout | None:
        return self.layouts[0] if self.layouts else None

    def rank_of(self, *, dp: int, tp: int, pp: int, zero: int | None = None) -> int | None:
        """1-based rank of the first fitting layout with these degrees (None if none fits)."""
        for n, lay in enumerate(self.layouts, 1):
            if (lay.dp, lay.tp, lay.pp) == (dp, tp, pp) and zero in (None, lay.zero):
                return n
        return None

    def why_ruled_out(self, *, dp: int, tp: int, pp: int) -> list[str]:
        """The reasons layouts with these degrees were ruled out."""
        return [
            lay.ruled_out or ""
            for lay in self.ruled_out
            if (lay.dp, lay.tp, lay.pp) == (dp, tp, pp)
        ]

    def ruled_out_counts(self) -> dict[str, int]:
        """How many layouts each rule ruled out, most first."""
        counts: dict[str, int] = {}
        for lay in self.ruled_out:
            counts[lay.rule] = counts.get(lay.rule, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "kind": "plan",
                "model": self.model,
                "parameters": self.parameters,
                "gpus": self.gpus,
                "nodes": self.nodes,
                "gpu": self.gpu,
                "gpu_memory_bytes": self.gpu_memory_bytes,
                "usable_bytes": self.usable_bytes,
                "seq_len": self.seq_len,
                "global_batch": self.global_batch,
                "best": self.best,
                "layouts": list(self.layouts),
                "ruled_out": list(self.ruled_out),
                "assumptions": list(self.assumptions),
            }
        )

    def plot(self, top: int = 12) -> Any:
        """A plotly bar chart of the fastest layouts' step time by part (needs plotly)."""
        return _views.build("figure", self, top)

    def _head(self) -> str:
        return (
            f"{self.model} ({self.parameters / 1e9:.3g} B parameters) on {self.gpus} x "
            f"{self.gpu} in {self.nodes} node{'s' if self.nodes != 1 else ''}, seq {self.seq_len}, "
            f"global batch {self.global_batch}"
        )

    def __repr__(self) -> str:
        lines = [f"Plan({self._head()})"]
        if not self.layouts:
            lines.append("  no layout fits: see ruled_out")
        for n, lay in enumerate(self.layouts[:8], 1):
            lines.append(f"  {n}. {_row_text(lay)}")
        if len(self.layouts) > 8:
            lines.append(f"  ... {len(self.layouts) - 8} more that fit")
        for why, count in self.ruled_out_counts().items():
            lines.append(f"  ruled out {count}: {RULE_WORDS.get(why, why)}")
        lines += [f"  assumes: {a}" for a in self.assumptions]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        header = ("#", "layout", "step", "compute", "comm", "bubble", "memory/GPU", "micro-batches")
        rows = [
            (
                n,
                lay.name,
                _secs(lay.step_s),
                _secs(lay.compute_s),
                _secs(sum(lay.communication_s.values())),
                _secs(lay.bubble_s),
                format_bytes(lay.memory_bytes),
                lay.micro_batches,
            )
            for n, lay in enumerate(self.layouts[:20], 1)
        ]
        out = html_table(
            [
                ("model", f"{self.model}, {self.parameters / 1e9:.3g} B parameters"),
                ("GPUs", f"{self.gpus} x {self.gpu}, {self.nodes} node(s)"),
                (
                    "memory per GPU",
                    f"{format_bytes(self.usable_bytes)} usable of "
                    f"{format_bytes(self.gpu_memory_bytes)}",
                ),
                ("batch", f"{self.global_batch} sequences of {self.seq_len} tokens"),
            ]
        )
        out += html_grid(header, rows) if rows else "<p>No layout fits.</p>"
        ruled = [(lay.name, lay.ruled_out) for lay in self.ruled_out[:30]]
        if ruled:
            out += "<details><summary>ruled out</summary>"
            out += html_grid(("layout", "why"), ruled) + "</details>"
        out += html_lines(self.assumptions, "note")
        return card("Parallelism plan", out, subtitle=self._head())


def _secs(value: float | None) -> str:
    if value is None:
        return "N/A"
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _row_text(lay: Layout) -> str:
    comm = sum(lay.communication_s.values())
    return (
        f"{lay.name:<32} step {_secs(lay.step_s):>9}  (compute {_secs(lay.compute_s)}, "
        f"comm {_secs(comm)}, bubble {_secs(lay.bubble_s)})  {format_bytes(lay.memory_bytes)}/GPU"
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _gpu_memory(value: Any, spec: GpuSpec | None) -> int:
    if value is None:
        if spec is None:
            raise PlanError("give gpu_memory= (e.g. '80GiB') or a GPU name the spec table knows")
        return spec.memory_bytes
    if isinstance(value, str):
        from gpudiag.experiment.memory_report import parse_budget

        try:
            parsed = parse_budget(value)
        except GpuDiagError as exc:
            raise PlanError(f"gpu_memory: {exc}") from None
        assert parsed is not None
        return parsed
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"gpu_memory must be bytes or a string such as '80GiB', got {value!r}")
    number = finite_number(
        value, "gpu_memory (GiB, or bytes)", low=0, high=2**60, low_open=True, error=PlanError
    )
    # A small number is GiB (gpu_memory=80), a large one bytes.
    return int(number * 2**30) if number < 4096 else int(number)


@dataclass(frozen=True)
class _Links:
    """Bandwidths (GB/s, one direction, per GPU) a group sees inside a node and across nodes."""

    intra_gbps: float
    inter_gbps: float
    gpus_per_node: int
    intra_name: str

    def bandwidth(self, stride: int, degree: int) -> float:
        span = stride * degree
        inside = span <= self.gpus_per_node and self.gpus_per_node % span == 0
        return (self.intra_gbps if inside else self.inter_gbps) * COLLECTIVE_EFFICIENCY


def _links(
    spec: GpuSpec | None, topology: Any, gpus_per_node: int, network_gbps: float
) -> tuple[_Links, list[str]]:
    notes: list[str] = []
    nvlink = spec.nvlink_bandwidth_gbps if spec is not None else None
    pcie = PCIE_GBPS.get(spec.pcie_gen or 4, 25.0) if spec is not None else 25.0
    has_nvlink = nvlink is not None
    if topology is not None:
        has_nvlink = bool(topology.has_nvlink) and nvlink is not None
        all_nv = all(topology.link(i, j).is_nvlink for i, j in topology.pairs())
        notes.append(f"topology ({topology.source or 'recorded'}): {topology.summary()}")
        if topology.has_nvlink and not all_nv:
            notes.append("not every GPU pair has NVLink: collectives run at PCIe speed")
            has_nvlink = False
    if has_nvlink:
        assert nvlink is not None
        intra, name = nvlink / 2, f"NVLink {nvlink / 2:g} GB/s per direction"
    else:
        intra, name = pcie, f"PCIe {pcie:g} GB/s"
    notes.append(
        f"links: {name} inside a node of {gpus_per_node} GPUs, network {network_gbps:g} GB/s per "
        f"GPU across nodes; collectives reach {COLLECTIVE_EFFICIENCY:.0%} of that"
    )
    return _Links(intra, network_gbps, gpus_per_node, name), notes


def _layout_rule(
    cfg: TransformerConfig, lay: Layout, links: _Links, global_batch: int
) -> tuple[str, str]:
    """(rule key, why) a layout cannot run as asked, or ("", "") when it can."""
    if lay.tp > links.gpus_per_node:
        return "tp_across_nodes", (
            f"TP across nodes: tensor parallelism {lay.tp} > {links.gpus_per_node} GPUs per node "
            "(its per-layer all-reduces would cross the network)"
        )
    if links.gpus_per_node % lay.tp:
        return "tp_node_split", (
            f"TP {lay.tp} does not divide the {links.gpus_per_node} GPUs of a node (some tensor "
            "groups would straddle two nodes)"
        )
    if cfg.heads % lay.tp:
        return "heads", f"TP {lay.tp} does not divide the {cfg.heads} attention heads"
    kv = cfg.key_value_heads
    if kv % lay.tp and lay.tp % kv:
        return "heads", f"TP {lay.tp} and the {kv} key/value heads do not divide each other"
    if cfg.layers % lay.pp:
        return "layers", f"PP {lay.pp} does not divide the {cfg.layers} layers"
    if global_batch % (lay.dp * lay.micro_batch):
        return "batch", (
            f"data parallel {lay.dp} x micro-batch {lay.micro_batch} does not divide the global "
            f"batch {global_batch}"
        )
    return "", ""


RULE_WORDS: Mapping[str, str] = {
    "tp_across_nodes": "tensor parallelism across nodes",
    "tp_node_split": "tensor groups straddling nodes",
    "heads": "TP degree does not divide the heads",
    "layers": "PP degree does not divide the layers",
    "batch": "DP x micro-batch does not divide the global batch",
    "memory": "does not fit in memory",
}


def _cost(
    cfg: TransformerConfig,
    lay: Layout,
    *,
    n_params: int,
    seq_len: int,
    global_batch: int,
    precision: str,
    peak_flops: float,
    mfu: float,
    links: _Links,
) -> Layout:
    gpus = lay.dp * lay.tp * lay.pp
    tokens = global_batch * seq_len
    recompute = lay.checkpointing == "full"
    flops = (8 if recompute else 6) * n_params * tokens
    compute = flops / (gpus * peak_flops * mfu)
    m = lay.micro_batches
    width = bytes_per_parameter(precision, "adamw").weights
    comm: dict[str, float] = {}
    sent: dict[str, float] = {}
    # TP: 4 all-reduces of one micro-batch's activations per layer (+2 recomputing), exposed.
    if lay.tp > 1:
        act = lay.micro_batch * seq_len * cfg.hidden * width
        per_layer = (6 if recompute else 4) * 2 * (lay.tp - 1) / lay.tp * act
        traffic = per_layer * (cfg.layers / lay.pp) * m
        sent["tensor parallel"] = traffic
        comm["tensor parallel"] = traffic / (links.bandwidth(1, lay.tp) * 1e9)
    # DP / FSDP: gradients (and weights) of this GPU's model shard, overlapped with compute.
    if lay.dp > 1:
        shard = n_params / (lay.tp * lay.pp)
        ring = (lay.dp - 1) / lay.dp
        bw = links.bandwidth(lay.tp, lay.dp) * 1e9
        if lay.zero == 3:
            gathers = 2 * (m if lay.pp > 1 else 1)
            traffic = (gathers + 1) * ring * shard * width
            window = compute
            kind = "FSDP all-gather + reduce-scatter"
        else:
            traffic = 2 * ring * shard * width
            window = compute * 2 / 3
            kind = "DP all-reduce" if lay.zero == 0 else f"ZeRO-{lay.zero} reduce-scatter + gather"
        sent[kind] = traffic
        total = traffic / bw
        hidden = OVERLAP * min(total, window)
        comm[kind] = total - hidden
    bubble = 0.0
    if lay.pp > 1:
        act = lay.micro_batch * seq_len * cfg.hidden * width / lay.tp  # scatter-gather sends
        bw = links.bandwidth(lay.tp * lay.dp, lay.pp) * 1e9
        sent["pipeline send/recv"] = 2 * m * act
        comm["pipeline send/recv"] = 2 * m * act / bw
        busy = compute + comm.get("tensor parallel", 0.0)
        bubble = busy * (lay.pp - 1) / m  # = (p-1)/(m+p-1) of the whole step
    return replace(
        lay, compute_s=compute, communication_s=comm, traffic_bytes=sent, bubble_s=bubble
    )


def plan(
    model_or_config: Any,
    *,
    gpus: int,
    gpu: str = "H100 SXM5 80GB",
    gpu_memory: Any = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    seq_len: int | None = None,
    global_batch: int | None = None,
    micro_batch: int = 1,
    topology: Any = None,
    precision: str = "bf16",
    mfu: float = DEFAULT_MFU,
    headroom: float = DEFAULT_HEADROOM,
    network_gbps: float = DEFAULT_NETWORK_GBPS,
    zero_stages: Sequence[int] = (0, 1, 2, 3),
    sequence_parallel: bool | None = None,
    recompute: bool | None = None,
    ddp_bucket_view: bool = False,
) -> Plan:
    """Rank the DP / FSDP (ZeRO 1-3) / TP / PP / SP layouts of a transformer over ``gpus``.

    ``model_or_config``: a known name (``gd.experiment.plan.KNOWN_MODELS``: "gpt3-175b",
    "llama3-70b", ...), a transformer config (dict, Hugging Face config, TransformerConfig) or a
    module with a ``.config``. ``gpu``: a spec-table name (peak bf16 TFLOP/s, NVLink, memory);
    ``gpu_memory``: bytes, GiB as a small number, or "80GiB" (default: the GPU's);
    ``nodes`` / ``gpus_per_node``: default one node of ``gpus`` up to 8, or the recorded
    ``topology``'s GPU count (a gpudiag Topology, e.g. from ``load_topology``, or the path of
    a recorded ``nvidia-smi topo -m``);
    ``global_batch``: sequences per step (default: ``gpus``); ``micro_batch``: sequences per
    forward on one GPU. ``recompute``: None tries without full activation recomputation
    first, then with it when the layout does not fit; True/False forces it.
    ``sequence_parallel``: None tries both with TP. ``ddp_bucket_view``: DDP layouts run with
    ``gradient_as_bucket_view=True`` (no second copy of the gradients). Nothing runs: see the
    module docstring for the formulas and assumptions, which the Plan repeats.
    """
    cfg, name = resolve_model(model_or_config)
    gpus = whole_number(gpus, "gpus", low=1, high=1_000_000, error=PlanError)
    for label, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if value is not None:
            whole_number(value, label, low=1, high=1_000_000, error=PlanError)
    if seq_len is not None:
        seq_len = whole_number(seq_len, "seq_len", low=1, high=1 << 30, error=PlanError)
    if global_batch is not None:
        global_batch = whole_number(
            global_batch, "global_batch", low=1, high=1 << 30, error=PlanError
        )
    micro_batch = whole_number(micro_batch, "micro_batch", low=1, high=1 << 30, error=PlanError)
    mfu = finite_number(mfu, "mfu", low=0, high=1, low_open=True, error=PlanError)
    headroom = finite_number(headroom, "headroom", low=0, high=0.99, error=PlanError)
    network_gbps = finite_number(
        network_gbps, "network_gbps (GB/s per GPU across nodes)", low=0, high=1e6,
        low_open=True, error=PlanError,
    )  # fmt: skip
    spec = lookup_gpu(gpu)
    if spec is None:
        raise PlanError(f"{gpu!r} is not in the spec table: name a GPU gpudiag.specs knows")
    prec = normalize_precision(precision)
    peak = spec.peak_tflops_for("tf32" if prec in ("fp32", "tf32") else prec)
    if not peak:
        raise PlanError(f"the spec table has no {prec} peak for {spec.name}")
    if not 0 < mfu <= 1:
        raise PlanError("mfu must be in (0, 1]")
    if not 0 <= headroom < 1:
        raise PlanError("headroom must be in [0, 1)")
    if not network_gbps > 0:
        raise PlanError("network_gbps (GB/s per GPU across nodes) must be positive")
    if micro_batch < 1:
        raise PlanError("micro_batch must be at least 1")
    bad_zero = set(zero_stages) - {0, 1, 2, 3}
    if bad_zero or not zero_stages:
        raise PlanError("zero_stages must list some of 0, 1, 2, 3")
    memory = _gpu_memory(gpu_memory, spec)
    topology = _topology(topology)
    if gpus_per_node is None:
        if topology is not None and topology.gpu_count:
            gpus_per_node = topology.gpu_count
        elif nodes:
            gpus_per_node = max(1, gpus // nodes)
        else:
            gpus_per_node = min(gpus, 8)
    if nodes is None:
        nodes = math.ceil(gpus / gpus_per_node)
    if nodes * gpus_per_node != gpus:
        raise PlanError(
            f"{gpus} GPUs are not {nodes} node(s) of {gpus_per_node}: give nodes= or "
            "gpus_per_node= that multiply to gpus"
        )
    seq = int(seq_len or cfg.seq_len)
    batch = int(global_batch or gpus)
    if seq < 1 or batch < 1:
        raise PlanError("seq_len and global_batch must be at least 1")
    usable = int(memory * (1 - headroom))
    links, link_notes = _links(spec, topology, gpus_per_node, network_gbps)
    n_params = cfg.parameter_count()
    fitting: list[Layout] = []
    ruled: list[Layout] = []
    sp_choices = (False, True) if sequence_parallel is None else (bool(sequence_parallel),)
    ckpt_choices: tuple[str | None, ...] = (
        (None, "full") if recompute is None else ("full",) if recompute else (None,)
    )
    for tp, pp in itertools.product(_divisors(gpus), repeat=2):
        if gpus % (tp * pp):
            continue
        dp = gpus // (tp * pp)
        zeros = sorted(set(zero_stages)) if dp > 1 else [0]
        for zero, sp in itertools.product(zeros, sp_choices if tp > 1 else (False,)):
            m = max(1, batch // (dp * micro_batch))
            base = Layout(dp, tp, pp, zero, sp, micro_batch, m)
            rule, why = _layout_rule(cfg, base, links, batch)
            if why:
                ruled.append(replace(base, ruled_out=why, rule=rule))
                continue
            chosen = None
            for ckpt in ckpt_choices:
                est = _estimate(cfg, base, seq, prec, ckpt, name, ddp_bucket_view)
                lay = replace(
                    base,
                    checkpointing=ckpt,
                    memory_bytes=est.peak_bytes,
                    memory_breakdown=dict(est.breakdown),
                )
                if est.peak_bytes <= usable:
                    chosen = lay
                    break
            if chosen is None:
                ruled.append(
                    replace(
                        lay,
                        ruled_out=(
                            f"does not fit: {format_bytes(lay.memory_bytes)} per GPU > "
                            f"{format_bytes(usable)} usable"
                            + (" even with full recomputation" if lay.checkpointing else "")
                        ),
                        rule="memory",
                    )
                )
                continue
            fitting.append(
                _cost(
                    cfg,
                    chosen,
                    n_params=n_params,
                    seq_len=seq,
                    global_batch=batch,
                    precision=prec,
                    peak_flops=peak * 1e12,
                    mfu=mfu,
                    links=links,
                )
            )
    fitting.sort(key=lambda lay: (lay.step_s or math.inf, lay.memory_bytes or 0))
    assumptions = (
        f"memory per GPU from the memory estimator ({prec} weights, AdamW, flash attention, "
        f"micro-batch {micro_batch}; DDP's gradient buckets "
        f"{'as views' if ddp_bucket_view else 'a second gradient copy'}, FSDP's gathered "
        f"units); {headroom:.0%} of {format_bytes(memory)} kept free",
        f"compute = 6 x {n_params / 1e9:.3g} B params x tokens (8x with recomputation) / (GPUs x "
        f"{peak:g} TFLOP/s {prec} peak x {mfu:.0%} MFU)",
        *link_notes,
        f"TP traffic exposed; {OVERLAP:.0%} of DP/FSDP traffic hidden under the backward "
        "(forward + backward for FSDP) where it fits; pipeline bubble (p-1)/(m+p-1) (1F1B)",
        "layout order tensor, data, pipeline (innermost first): a group stays in a node when "
        "it fits there",
    )
    return Plan(
        model=name,
        parameters=n_params,
        gpus=gpus,
        nodes=nodes,
        gpu=spec.name,
        gpu_memory_bytes=memory,
        usable_bytes=usable,
        seq_len=seq,
        global_batch=batch,
        layouts=tuple(fitting),
        ruled_out=tuple(ruled),
        assumptions=assumptions,
    )


def _topology(value: Any) -> Any:
    """A gpudiag Topology from itself, None, or a recorded ``nvidia-smi topo -m`` file path."""
    import os

    from gpudiag.probe.topology import Topology, load_topology

    if value is None or isinstance(value, Topology):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_topology(value)
    raise PlanError(
        f"topology must be a gpudiag Topology or a `nvidia-smi topo -m` file, got "
        f"{type(value).__name__}"
    )


def _estimate(
    cfg: TransformerConfig,
    lay: Layout,
    seq: int,
    prec: str,
    ckpt: str | None,
    name: str,
    ddp_bucket_view: bool,
) -> MemoryEstimate:
    return estimate_transformer(
        cfg,
        batch_size=lay.micro_batch,
        seq_len=seq,
        precision=prec,
        optimizer="adamw",
        checkpointing=ckpt,
        parallelism=lay.parallelism,
        ddp_bucket_view=ddp_bucket_view,
        micro_batches=lay.micro_batches,
        name=name,
    )
