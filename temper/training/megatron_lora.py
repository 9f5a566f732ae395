"""LoRA adapters on the megatron engine's parallel linear layers (``model.lora``).

Each adapted Hugging Face projection gets its own pair ``A (r, in)``, ``B (out, r)`` and
adds ``scale · B A x`` (``scale = alpha / rank``) to its output, as peft's LoRA does on
the torch engine — so the same adapters give the same model on both engines, and they
export under peft's names. Megatron fuses projections: ``linear_qkv`` holds q, k and v
(interleaved by query group), ``linear_fc1`` gate and up; their adapters stay one per
projection and their outputs are laid out as the fused weight's rows are.

Sharding follows the base weight, so no adapter tensor is ever gathered in a forward:

* column-parallel (``linear_qkv``, ``linear_fc1``): ``A`` whole on every TP rank, ``B``
  split on its output rows like the weight. ``h = A x`` goes through Megatron's
  ``copy_to_tensor_model_parallel_region`` (identity forward, all-reduce backward),
  so ``A``'s gradient and the input's are the full sums on every rank;
* row-parallel (``linear_proj``, ``linear_fc2``): ``A`` split on its input columns like
  the weight, ``B`` whole. ``h = A_t x_t`` is summed over TP with
  ``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity backward)
  — the all-reduce Megatron does for the weight's partial outputs.

Mixture-of-experts models: every expert's ``linear_fc1`` / ``linear_fc2`` (Megatron's
``SequentialMLP``: a module per local expert) and the shared expert's get pairs of their
own, named after the HF expert (``mlp.experts.N.gate_proj``, Mixtral's
``block_sparse_moe.experts.N.w1``) by its global index: under expert parallelism an EP
rank holds its experts' adapters, which checkpoints and exports name as the whole model
does. An expert's adapters are split over its expert-TP group (ETP) as its weights are,
and communicate nothing: the token dispatcher gives each ETP rank the whole input and
sums the partial outputs, so the adapter tensors kept whole there (a column-parallel
``A``, a row-parallel ``B``) get partial gradients, summed over ETP by the engine
(:func:`etp_summed_grads`).

The adapters hang on the linear modules (``….linear_qkv.lora.A.q``) and a forward hook
adds their output, so the base weights keep their names (checkpoint and export maps).
The hook runs before any other hook on the linear: under sequence parallelism temper's
host collectives (:mod:`megatron_sp`) split a row-parallel linear's whole output after
it, so the adapters add to the whole output as they read the whole input.
TransformerEngine's linear layers fuse the preceding norm into ``linear_qkv`` /
``linear_fc1`` (their input is the un-normed hidden state): a LoRA model is built on
Megatron's local layer spec, whose linears take the normed input.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from temper.config.schema import LoraConfig
from temper.training.megatron_convert import HFLayout, ParamMap
from temper.training.megatron_lora_targets import PARTS, lora_projections
from temper.training.megatron_moe import is_expert_param

ROW_PARALLEL = ("linear_proj", "linear_fc2")
PEFT_PREFIX = "base_model.model.model."

Split = Literal["col", "row"]


def kaiming_uniform_bound(fan_in: int) -> float:
    """peft's ``A`` init, ``kaiming_uniform_(a=√5)``: ``U(-b, b)``,
    ``b = gain·√(3/fan_in)`` with ``gain = √(2/(1+a²))``, i.e. ``b = 1/√fan_in``."""
    return 1.0 / math.sqrt(fan_in)


def lora_delta(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """The weight a LoRA pair adds: ``ΔW = scale · B A`` (``(out, r) @ (r, in)``)."""
    return scale * (b.float() @ a.float())


def interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    """Megatron's fused QKV layout along the last dim: per query group, its query
    heads, then its key and value head (``[q_g ‖ k_g ‖ v_g]`` for each of ``groups``)."""
    lead = q.shape[:-1]
    parts = [t.reshape(*lead, groups, t.shape[-1] // groups) for t in (q, k, v)]
    return torch.cat(parts, dim=-1).reshape(*lead, -1)


@dataclass(frozen=True)
class Part:
    """One projection's adapter in a module: its full input and output sizes."""

    hf: str
    fan_in: int
    fan_out: int


class ParallelLora(nn.Module):
    """The adapters of one Megatron linear (see module doc); ``forward(x)`` is their
    summed output in the module's local output layout."""

    def __init__(
        self,
        parts: list[Part],
        local_rows: dict[str, int],
        split: Split,
        *,
        rank: int,
        alpha: float,
        tp: int,
        tp_rank: int,
        groups: int,
        init_key: str,
        seed: int,
        group: Any = None,
        explicit_comm: bool = False,
    ) -> None:
        super().__init__()
        # an expert's linear: the token dispatcher gathers its input over the ETP group
        # and sums its partial outputs there, so the adapters communicate nothing either
        self.explicit_comm = explicit_comm
        self.split, self.tp, self.tp_rank, self.groups = split, tp, tp_rank, groups
        self.group = group  # the TP group the linear is split over (None: Megatron's TP)
        self.scale = alpha / rank
        self.local_rows = local_rows  # every part of the module, adapted or not
        self.fused_qkv = tuple(local_rows) == PARTS["linear_qkv"]
        self.enabled = True
        self.A = nn.ParameterDict()
        self.B = nn.ParameterDict()
        for p in parts:
            # A from a generator of its own (seed, global name): the same adapter at
            # any TP × PP layout, each rank taking its slice of the whole
            gen = torch.Generator().manual_seed(seed ^ zlib.crc32(f"{init_key}.{p.hf}".encode()))
            bound = kaiming_uniform_bound(p.fan_in)
            a = (torch.rand(rank, p.fan_in, generator=gen) * 2 - 1) * bound
            out = p.fan_out
            if split == "row":
                a = a.chunk(tp, dim=1)[tp_rank]
            else:
                out //= tp
            self.A[p.hf] = nn.Parameter(a.contiguous())
            self.B[p.hf] = nn.Parameter(torch.zeros(out, rank))

    def _assemble(self, pieces: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        """Per-part outputs (last dim) laid out as the module's local rows; zeros for a
        part without adapter."""
        full = [
            pieces[n] if n in pieces else like.new_zeros(*like.shape[:-1], rows)
            for n, rows in self.local_rows.items()
        ]
        if self.fused_qkv:
            return interleave_qkv(full[0], full[1], full[2], self.groups // self.tp)
        return torch.cat(full, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``Σ_parts scale · B_p (A_p x)`` in the local output layout; ``x`` is the
        linear's input (whole for a column-parallel one, this rank's columns for a
        row-parallel one)."""
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        pieces = {}
        for name, a in self.A.items():
            h = x @ a.to(x.dtype).t()
            if self.tp > 1 and not self.explicit_comm:
                if self.split == "col":
                    h = copy_to_tensor_model_parallel_region(h, group=self.group)
                else:
                    h = reduce_from_tensor_model_parallel_region(h, group=self.group)
            pieces[name] = (h @ self.B[name].to(x.dtype).t()) * self.scale
        return self._assemble(pieces, pieces[next(iter(pieces))])

    def hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        """Forward hook of the adapted linear: Megatron's parallel linears return
        ``(output, bias)``; the adapters' output is added to the first."""
        if not self.enabled:
            return output
        out, bias = output
        return out + self(args[0]), bias

    def delta(self, like: torch.Tensor) -> torch.Tensor:
        """This rank's ``ΔW`` shard, laid out as the base weight's local shard ``like``."""
        if self.split == "row":
            (name,) = self.A.keys()
            return lora_delta(self.A[name], self.B[name], self.scale).to(like.dtype)
        # column: rows assembled as the outputs are (ΔWᵀ = Aᵀ Bᵀ, parts on the last dim)
        pieces = {n: lora_delta(self.A[n], self.B[n], self.scale).t() for n in self.A}
        return self._assemble(pieces, next(iter(pieces.values()))).t().to(like.dtype)


@dataclass
class AdapterRow:
    """One adapter tensor: its parameter name here, its name in the whole model
    (checkpoints), its peft name (export), and how it is split over its linear's TP
    group (TP, or an expert's ETP group) of ``tp`` ranks, this rank being ``tp_rank``."""

    name: str
    key: str
    peft: str
    kind: Literal["col", "row", "rep"]
    layer: int
    tp: int = 1
    tp_rank: int = 0


class LoraAdapters:
    """The adapters of one rank's model: attaching them, switching them off (the
    reference policy), their merged weights and their checkpoint/export names."""

    def __init__(
        self,
        root: nn.Module,
        modules: dict[str, ParallelLora],
        rows: list[AdapterRow],
    ) -> None:
        self.root = root  # the rank's model (its chunks), whose parameters rows name
        self.modules = modules  # by the base weight's parameter name
        self.rows = rows

    def load_peft(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Set the adapters from peft-named whole tensors (``get_peft_model_state_dict``
        of the same model, or an ``adapter_model.safetensors``), each rank its shard
        (of its own experts)."""
        params = dict(self.root.named_parameters())
        missing = [r.peft for r in self.rows if r.peft not in tensors]
        if missing:
            raise KeyError(f"adapter tensors missing: {missing[:4]}")
        with torch.no_grad():
            for r in self.rows:
                full = tensors[r.peft]
                params[r.name].copy_(from_peft(r.kind, full, r.tp, r.tp_rank))

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        for m in self.modules.values():
            m.enabled = False
        try:
            yield
        finally:
            for m in self.modules.values():
                m.enabled = True

    def merged(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` (this rank's shard of parameter ``name``) with its adapters' ``ΔW``
        added; unchanged for a weight without adapters."""
        lora = self.modules.get(name)
        if lora is None:
            return weight
        with torch.no_grad():
            return weight + lora.delta(weight)

    def hf_targets(self) -> list[str]:
        """The HF module names adapted (peft's ``target_modules``: ``q_proj`` …, an
        expert's ``gate_proj`` or Mixtral's ``w1`` …); never the router."""
        leaves = {r.peft.removesuffix(".weight").rsplit(".", 2)[-2] for r in self.rows}
        return sorted(leaves)

    def maps(self) -> list[ParamMap]:
        """The adapter tensors as parameter maps (kind, global key, layer) for the
        checkpointer; their HF name is peft's."""
        return [ParamMap(r.name, (r.peft,), r.kind, r.layer, r.key) for r in self.rows]


@dataclass(frozen=True)
class TPSplit:
    """A TP group a linear is split over: its size, this rank's index, the group (None:
    Megatron's TP group)."""

    size: int = 1
    rank: int = 0
    group: Any = None


def attach_lora(
    module: nn.Module,
    maps: list[ParamMap],
    layout: HFLayout,
    lora: LoraConfig,
    *,
    tp: TPSplit,
    etp: TPSplit | None = None,
    seed: int,
) -> LoraAdapters:
    """Adapters on every targeted linear of ``module`` (this rank's chunks: attention,
    dense MLPs, each local expert and the shared expert), base weights frozen; only the
    adapters train. ``tp``: the dense layers' TP split, ``etp``: the experts' (TP's by
    default)."""
    from megatron.core.tensor_parallel.layers import (
        set_defaults_if_not_set_tensor_model_parallel_attributes,
        set_tensor_model_parallel_attributes,
    )

    targets = lora_projections(lora.target_modules)
    module.requires_grad_(False)
    by_name = {pm.megatron: pm for pm in maps}
    modules: dict[str, ParallelLora] = {}
    rows: list[AdapterRow] = []
    for mod_name, linear in module.named_modules():
        leaf = mod_name.rsplit(".", 1)[-1]
        pm = by_name.get(f"{mod_name}.weight")
        if leaf not in PARTS or pm is None:
            continue
        sizes = _sizes(layout, mod_name)
        hf_of = dict(zip(PARTS[leaf], pm.hf))  # each part's HF tensor name
        parts = [Part(p, *sizes[p]) for p in PARTS[leaf] if p in targets]
        if not parts:
            continue
        assert pm.layer is not None  # decoder-layer linears
        split: Split = "row" if leaf in ROW_PARALLEL else "col"
        expert = is_expert_param(mod_name)
        group = (etp or tp) if expert else tp
        key = pm.global_name.removesuffix(".weight")
        adapter = ParallelLora(
            parts,
            {p: sizes[p][1] // (group.size if split == "col" else 1) for p in PARTS[leaf]},
            split,
            rank=lora.rank,
            alpha=lora.alpha,
            tp=group.size,
            tp_rank=group.rank,
            groups=layout.num_kv_heads,
            init_key=key,
            seed=seed,
            group=group.group,
            explicit_comm=expert,
        )
        adapter.to(device=next(linear.parameters()).device)
        linear.lora = adapter
        # first among the linear's hooks: it adds to the linear's own output (module doc)
        linear.register_forward_hook(adapter.hook, prepend=True)
        modules[pm.megatron] = adapter
        for p in parts:
            peft = PEFT_PREFIX + hf_of[p.hf].removesuffix(".weight")
            a_kind: Literal["col", "row", "rep"] = "row" if split == "row" else "rep"
            b_kind: Literal["col", "row", "rep"] = "col" if split == "col" else "rep"
            for which, kind in (("A", a_kind), ("B", b_kind)):
                param = getattr(adapter, which)[p.hf]
                if kind != "rep":
                    dim = 1 if kind == "row" else 0
                    set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)
                set_defaults_if_not_set_tensor_model_parallel_attributes(param)
                if expert and kind == "rep" and group.size > 1:
                    param.etp_summed = True  # see etp_summed_grads
                rows.append(
                    AdapterRow(
                        name=f"{mod_name}.lora.{which}.{p.hf}",
                        key=f"{key}.lora.{which}.{p.hf}",
                        peft=f"{peft}.lora_{which}.weight",
                        kind=kind,
                        layer=pm.layer,
                        tp=group.size,
                        tp_rank=group.rank,
                    )
                )
    return LoraAdapters(module, modules, rows)


def _sizes(layout: HFLayout, module: str) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of each HF projection of the linear named ``module``: its MLP's
    FFN size is an expert's, the shared expert's or the dense MLP's."""
    h, d = layout.hidden_size, layout.head_dim
    f = layout.ffn_hidden_size
    if layout.moe is not None and ".mlp.experts." in module:
        f = layout.moe.ffn_hidden_size
    elif layout.moe is not None and ".mlp.shared_experts." in module:
        f = layout.moe.shared_ffn_hidden_size
    return {
        "q_proj": (h, layout.num_heads * d),
        "k_proj": (h, layout.num_kv_heads * d),
        "v_proj": (h, layout.num_kv_heads * d),
        "o_proj": (layout.num_heads * d, h),
        "gate_proj": (h, f),
        "up_proj": (h, f),
        "down_proj": (f, h),
    }


def etp_summed_grads(named_params: Iterable[tuple[str, nn.Parameter]]) -> list[torch.Tensor]:
    """The gradients to sum over the expert-TP group: of an expert's adapter tensors kept
    whole on every ETP rank (a column-parallel linear's ``A``, a row-parallel one's
    ``B``). The dispatcher gives each ETP rank the whole input and sums the partial
    outputs, so each rank's gradient of them is partial: ``∂L/∂A = Σ_t B_tᵀ ∂L/∂y_t · xᵀ``
    over the ETP shards ``t`` (``∂L/∂B = Σ_t ∂L/∂y · (A_t x_t)ᵀ``)."""
    return [
        p.grad for _, p in named_params if p.grad is not None and getattr(p, "etp_summed", False)
    ]


def to_peft(kind: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """An adapter tensor whole from its TP shards (rank order)."""
    if kind == "rep":
        return shards[0]
    return torch.cat(shards, dim=0 if kind == "col" else 1)


def from_peft(kind: str, full: torch.Tensor, tp: int, tp_rank: int) -> torch.Tensor:
    """TP rank ``tp_rank``'s shard of a whole adapter tensor."""
    if kind == "rep":
        return full
    return full.chunk(tp, dim=0 if kind == "col" else 1)[tp_rank]
