"""Mixture-of-experts models on the megatron engine: the HF layout of Qwen2-MoE,
Qwen3-MoE and Mixtral, their Megatron ``TransformerConfig`` fields, and the parameter
maps of an MoE layer under expert parallelism.

A Hugging Face MoE layer is a router (``gate``: ``(experts, hidden)``), ``experts``
gated MLPs and, for Qwen2-MoE, a shared expert whose output is scaled by
``sigmoid(shared_expert_gate(x))``. Megatron-Core's ``MoELayer`` has the same parts:
``router.weight``, ``experts.local_experts.{e}.linear_fc1/fc2`` (``SequentialMLP``,
the expert implementation that runs on CPU) and ``shared_experts`` with ``gate_weight``.

Routing, as both libraries compute it in fp32:

* ``norm_topk_prob`` true (Qwen3-MoE, Mixtral): the top-k logits' softmax, which is the
  top-k of the full softmax renormalised — Megatron's ``moe_router_pre_softmax=False``;
* false (Qwen2-MoE's default): the top-k of the full softmax as they are —
  ``moe_router_pre_softmax=True``.

Ties between equal router scores are broken by ``torch.topk`` in both, on the same
scores; with random fp32 weights they do not occur.

Expert parallelism (EP) splits each layer's experts over the ranks of an EP group
(Megatron lays EP inside data parallelism): EP rank ``r`` of ``n`` holds experts
``r·E/n … (r+1)·E/n`` as its local experts ``0 … E/n-1``. Checkpoints and exports name
an expert by its global index, so they do not depend on the EP size.

Also here: which ``moe_*`` options are applied, noted or refused
(:func:`unavailable_moe_options`, :func:`refused_moe_option`), the weight of each
micro-batch's router losses (:func:`router_loss_scales`) and the tokens-per-expert
record behind the ``moe_load_imbalance`` metric (:class:`RouterStats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from temper.utils.router_replay_hf import moe_layer_indices

MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral")
#: MoE architectures with no conversion here, and why (refused when the model is read)
REFUSED_MOE = {
    "deepseek_v3": "multi-latent attention (MLA) and grouped routing have no conversion here",
    "deepseek_v2": "multi-latent attention (MLA) and grouped routing have no conversion here",
}

Naming = Literal["qwen", "mixtral"]


@dataclass(frozen=True)
class MoELayout:
    """The experts of an HF MoE config."""

    num_experts: int
    topk: int
    ffn_hidden_size: int  # per expert
    shared_ffn_hidden_size: int  # 0: no shared expert
    norm_topk_prob: bool
    moe_layers: tuple[bool, ...]  # per decoder layer: MoE (True) or dense MLP
    naming: Naming

    def local_experts(self, ep: int, ep_rank: int) -> range:
        """Global indices of the experts EP rank ``ep_rank`` of ``ep`` holds."""
        n = self.num_experts // ep
        return range(ep_rank * n, (ep_rank + 1) * n)


def moe_layout(hf_config: Any, model_type: str, num_layers: int) -> MoELayout:
    """The MoE part of a Qwen2-MoE / Qwen3-MoE / Mixtral config; ``ValueError`` for what
    the conversion does not cover."""
    if model_type == "mixtral":
        experts = int(hf_config.num_local_experts)
        return MoELayout(
            num_experts=experts,
            topk=int(hf_config.num_experts_per_tok),
            ffn_hidden_size=int(hf_config.intermediate_size),
            shared_ffn_hidden_size=0,
            norm_topk_prob=True,  # Mixtral always renormalises the top-k weights
            moe_layers=(True,) * num_layers,
            naming="mixtral",
        )
    moe = set(moe_layer_indices(hf_config))  # transformers' rule
    layers = tuple(i in moe for i in range(num_layers))
    shared = int(getattr(hf_config, "shared_expert_intermediate_size", 0) or 0)
    return MoELayout(
        num_experts=int(hf_config.num_experts),
        topk=int(hf_config.num_experts_per_tok),
        ffn_hidden_size=int(hf_config.moe_intermediate_size),
        shared_ffn_hidden_size=shared if model_type == "qwen2_moe" else 0,
        norm_topk_prob=bool(getattr(hf_config, "norm_topk_prob", False)),
        moe_layers=layers,
        naming="qwen",
    )


#: ``moe_*`` TransformerConfig fields temper sets from the HF config
OWNED_MOE_FIELDS = frozenset(
    {
        "num_moe_experts",
        "moe_ffn_hidden_size",
        "moe_shared_expert_intermediate_size",
        "moe_shared_expert_gate",
        "moe_router_pre_softmax",
        "moe_router_score_function",
        "moe_layer_freq",
    }
)

#: ``moe_*`` settings read from ``megatron.extra`` (verl's override_transformer_config,
#: ROLL's keys) and passed to Megatron as they are
HONOURED_MOE_FIELDS = (
    "moe_router_topk",
    "moe_router_load_balancing_type",
    "moe_aux_loss_coeff",
    "moe_z_loss_coeff",
    "moe_router_dtype",
    "moe_token_dispatcher_type",
    "moe_input_jitter_eps",
    "moe_expert_capacity_factor",
    "moe_token_drop_policy",
    "moe_pad_expert_input_to_capacity",
    "moe_router_topk_scaling_factor",
)

#: Megatron's token dispatcher that runs on CPU (gloo): all-gather and reduce-scatter.
#: The all-to-all dispatcher creates a CUDA stream when it is built.
CPU_DISPATCHER = "allgather"


def moe_config_kwargs(moe: MoELayout, extra: dict[str, Any], device_type: str) -> dict[str, Any]:
    """TransformerConfig fields for ``moe`` (the router as HF's; aux-loss settings from
    ``extra``, HF's defaults otherwise: no auxiliary loss unless asked for)."""
    kwargs: dict[str, Any] = dict(
        num_moe_experts=moe.num_experts,
        moe_ffn_hidden_size=moe.ffn_hidden_size,
        moe_router_topk=moe.topk,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_aux_loss_coeff=0.0,  # Megatron's default: no auxiliary loss unless asked
        moe_router_dtype="fp32",
        moe_token_dispatcher_type=CPU_DISPATCHER,
        moe_grouped_gemm=False,
        moe_layer_freq=[int(x) for x in moe.moe_layers],
    )
    if moe.shared_ffn_hidden_size:
        kwargs["moe_shared_expert_intermediate_size"] = moe.shared_ffn_hidden_size
        kwargs["moe_shared_expert_gate"] = True
    for name in HONOURED_MOE_FIELDS:
        if name in extra:
            kwargs[name] = extra[name]
    if device_type != "cuda":
        kwargs["moe_token_dispatcher_type"] = CPU_DISPATCHER
    return kwargs


def moe_mlp_maps(
    moe: MoELayout, h: str, ep: int, ep_rank: int
) -> list[tuple[str, tuple[str, ...], str, str]]:
    """``(local name, HF names, kind, global name)`` of an MoE layer's MLP parameters on
    EP rank ``ep_rank`` (names under the layer; ``h``: the HF layer prefix). The global
    name numbers the expert as in the whole model."""
    qwen = moe.naming == "qwen"
    block = f"{h}mlp." if qwen else f"{h}block_sparse_moe."
    out: list[tuple[str, tuple[str, ...], str, str]] = [
        ("mlp.router.weight", (f"{block}gate.weight",), "rep", "mlp.router.weight")
    ]
    gate, up, down = ("gate_proj", "up_proj", "down_proj") if qwen else ("w1", "w3", "w2")
    for local, e in enumerate(moe.local_experts(ep, ep_rank)):
        hf = f"{block}experts.{e}."
        here, whole = f"mlp.experts.local_experts.{local}.", f"mlp.experts.local_experts.{e}."
        glu = (f"{hf}{gate}.weight", f"{hf}{up}.weight")
        out.append((here + "linear_fc1.weight", glu, "glu", whole + "linear_fc1.weight"))
        fc2 = (f"{hf}{down}.weight",)
        out.append((here + "linear_fc2.weight", fc2, "row", whole + "linear_fc2.weight"))
    if moe.shared_ffn_hidden_size:
        s = f"{block}shared_expert."
        shared = [
            ("linear_fc1.weight", (f"{s}gate_proj.weight", f"{s}up_proj.weight"), "glu"),
            ("linear_fc2.weight", (f"{s}down_proj.weight",), "row"),
            ("gate_weight", (f"{block}shared_expert_gate.weight",), "rep"),
        ]
        out += [
            (f"mlp.shared_experts.{n}", hf_names, k, f"mlp.shared_experts.{n}")
            for n, hf_names, k in shared
        ]
    return out


def is_expert_param(name: str) -> bool:
    """An expert's weight (split over EP ranks; its gradient is summed over the
    expert-data-parallel group, not the data-parallel group)."""
    return ".mlp.experts." in name


#: MoE options that need CUDA (grouped GEMM, fused permute/router kernels, a CUDA stream
#: for overlapping the shared expert): off CUDA they are left out, which computes the same
CUDA_MOE_OPTIONS = (
    "moe_permute_fusion",
    "moe_router_fusion",
    "moe_shared_expert_overlap",
)


def unavailable_moe_options(extra: dict[str, Any], device_type: str) -> list[str]:
    """``extra``'s MoE options not applied here (speed only: the layer computes the same).
    ``moe_grouped_gemm`` everywhere (the conversion maps ``SequentialMLP``'s per-expert
    weights, not the grouped GEMM's), CUDA options and another token dispatcher off CUDA
    (Megatron's all-to-all dispatcher makes a CUDA stream when it is built)."""
    out = ["moe_grouped_gemm"] if extra.get("moe_grouped_gemm") else []
    if device_type == "cuda":
        return out
    out += [name for name in CUDA_MOE_OPTIONS if extra.get(name)]
    dispatcher = extra.get("moe_token_dispatcher_type")
    if dispatcher is not None and dispatcher != CPU_DISPATCHER:
        out.append("moe_token_dispatcher_type")
    return out


#: MoE options that cannot run off CUDA: Megatron allocates their buffers with
#: ``torch.cuda.current_device()``
CUDA_ONLY_MOE = {
    "moe_router_enable_expert_bias": "aux-loss-free expert bias",
}


def refused_moe_option(extra: dict[str, Any], device_type: str) -> tuple[str, str] | None:
    """``(key, reason)`` of an MoE option this build cannot run here, else None."""
    if device_type != "cuda":
        for name, what in CUDA_ONLY_MOE.items():
            if extra.get(name):
                return name, f"{what}: Megatron keeps its buffers on CUDA; not on CPU"
        kinds = extra.get("moe_router_load_balancing_type")
        listed = kinds if isinstance(kinds, list) else [kinds]
        if "global_aux_loss" in listed:
            key = "moe_router_load_balancing_type"
            return key, "global_aux_loss: Megatron keeps its token counts on CUDA; not on CPU"
    return None


def router_loss_scales(groups: list[list[int]], total: float) -> list[float]:
    """The weight of each micro-batch's router losses (auxiliary and z-loss) in the
    mini-batch loss (``groups[i]``: micro-batch i's rows, empty for padding; ``total``:
    the real micro-batches over the DP group). Megatron scales them by 1 / micro-batches
    and averages gradients over DP, i.e. their mean over the DP group's micro-batches;
    temper sums gradients over DP, so each real one weighs 1 / total, padding 0."""
    return [1.0 / total if rows and total else 0.0 for rows in groups]


def set_router_loss_scale(scale: float) -> None:
    """Before a micro-batch's backward: its router losses' weight. Megatron's
    ``MoEAuxLossAutoScaler`` reads it in the backward, where the router losses'
    gradient joins the main loss's (the losses are attached to the routing
    probabilities in the forward)."""
    import torch
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale))


class RouterStats:
    """Tokens routed to each expert of each MoE layer, per micro-batch, for the
    load-imbalance metric: a forward hook on every router of the model ``chunks`` (one
    ``GPTModel`` per virtual pipeline stage of the rank) adds its routing map's column
    sums (padding tokens left out) to the micro-batch begun last (:meth:`begin`)."""

    def __init__(self, chunks: list[Any], moe: MoELayout) -> None:
        import torch
        from megatron.core.transformer.moe.moe_layer import MoELayer

        self.shape = (len(moe.moe_layers), moe.num_experts)
        self.rows: list[torch.Tensor] = []
        self._current = -1
        for module in chunks:
            for layer in module.decoder.layers:
                if isinstance(layer.mlp, MoELayer):
                    hook = self._hook(int(layer.layer_number) - 1)
                    layer.mlp.router.register_forward_hook(hook)

    def _hook(self, index: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], output: tuple[Any, Any]) -> None:
            if not self.rows:
                return
            routing = output[1]
            padding = args[1] if len(args) > 1 else None
            if padding is not None:
                routing = routing & ~padding.reshape(-1, 1)
            row = self.rows[self._current]
            row[index] += routing.sum(dim=0).to(row.dtype).cpu()

        return hook

    def begin(self, index: int | None = None) -> None:
        """A micro-batch's forward starts: the next one, or micro-batch ``index`` of the
        step (a rank with several model chunks runs each micro-batch once per chunk)."""
        import torch

        index = len(self.rows) if index is None else index
        while len(self.rows) <= index:
            self.rows.append(torch.zeros(self.shape, dtype=torch.float64))
        self._current = index

    def take(self, groups: list[list[int]]) -> Any:
        """``(layers, experts)`` token counts of the real micro-batches (``groups[i]``
        non-empty) since the last call; the record is cleared."""
        import torch

        total = torch.zeros(self.shape, dtype=torch.float64)
        for rows, counts in zip(groups, self.rows):
            if rows:
                total += counts
        self.rows = []
        return total


def load_imbalance(counts: Any, moe: MoELayout) -> float:
    """Mean over MoE layers of ``max / mean`` tokens per expert: 1 when every expert gets
    as many tokens, ``experts / k`` at most (every token to the same k experts)."""
    values = []
    for i, is_moe in enumerate(moe.moe_layers):
        row = counts[i]
        if is_moe and float(row.sum()) > 0:
            values.append(float(row.max() / row.mean()))
    return sum(values) / len(values) if values else 1.0
