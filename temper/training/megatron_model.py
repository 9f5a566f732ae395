"""Building a Megatron-Core ``GPTModel`` from a Hugging Face checkpoint.

* :func:`transformer_config` — the HF architecture (layers, heads, GQA groups, head dim,
  FFN, RMSNorm epsilon, biases, qk-norm) plus the role's ``megatron`` section
  (parallel degrees, recompute, ``extra`` TransformerConfig arguments) as Megatron's
  ``TransformerConfig``. Weights are fp32 masters (the torch engine's default; another
  ``master_dtype`` is refused at load); compute runs under autocast in ``model.dtype``.
* :func:`build_model` — ``GPTModel`` with the layer spec of :mod:`megatron_layers`,
  Hugging Face's RoPE, and for a critic the scalar value head; then every parameter is
  filled with this TP rank's shard of the HF tensors (:mod:`megatron_convert`), read one
  tensor at a time from the checkpoint's safetensors (:mod:`hf_reader`; no full model
  in memory). Under pipeline parallelism each rank builds its stage only (Megatron's
  ``pre_process`` / ``post_process``, its share of the layers) and reads only that
  stage's tensors; with virtual (interleaved) stages, one ``GPTModel`` per model chunk
  it holds (Megatron's ``vp_stage``, :mod:`megatron_chunks`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from temper.config.errors import ConfigError
from temper.config.schema import MEGATRON_DEGREES, MegatronConfig
from temper.training.hf_reader import HFCheckpoint
from temper.training.megatron_check import check_divisible, check_vision, unavailable_fusions
from temper.training.megatron_convert import (
    HFLayout,
    ParamMap,
    hf_inv_freq,
    hf_layout,
    param_maps,
    text_config,
    to_megatron_shard,
)
from temper.training.megatron_moe import (
    OWNED_MOE_FIELDS,
    is_expert_param,
    moe_config_kwargs,
    unavailable_moe_options,
)
from temper.training.megatron_parallel import Parallel, megatron_degrees
from temper.training.megatron_sp import (
    host_sequence_parallel,
    use_host_sequence_parallel,
    uses_sequence_parallel,
    with_sequence_parallel_norms,
)
from temper.training.megatron_vocab import VocabShard
from temper.training.models import load_hf_config
from temper.training.spec import EngineSpec
from temper.utils.model_path import resolve_model_path

log = logging.getLogger(__name__)

# TransformerConfig fields temper sets from the HF config or the megatron section: an
# ``extra`` entry may not override them
_OWNED_FIELDS = frozenset(
    {
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
        "ffn_hidden_size",
        "normalization",
        "layernorm_epsilon",
        "gated_linear_unit",
        "activation_func",
        "add_bias_linear",
        "add_qkv_bias",
        "qk_layernorm",
        *MEGATRON_DEGREES,
        "sequence_parallel",
        "params_dtype",
        "pipeline_dtype",
        "use_cpu_initialization",
        "perform_initialization",
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "recompute_modules",
        *OWNED_MOE_FIELDS,
        "mrope_section",
    }
)


@dataclass
class MegatronModel:
    """A built model and what the engine needs to run and export it.

    ``chunks``: this rank's ``GPTModel`` of each virtual pipeline stage it holds (one
    without interleaving); ``module``: what holds their parameters — the one chunk, or
    a ``ModuleList`` of them (parameter names ``"{chunk}.…"``, which ``maps`` use)."""

    module: torch.nn.Module
    layout: HFLayout
    hf_config: Any
    maps: list[ParamMap]
    vocab: VocabShard
    use_te: bool
    chunks: list[Any] = dataclasses.field(default_factory=list)
    sequence_parallel: bool = False  # Megatron's, on: sequences split over TP (megatron_sp)
    # a vision-language model's M-RoPE positions (megatron_vision.rope_index); else None
    rope_index: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None

    def name_of(self, hf: str, *, tied_copy: bool = False) -> str | None:
        """The module name of the parameter made of HF tensor ``hf`` on this rank (the
        tied copy of the embedding with ``tied_copy``); None when the rank lacks it."""
        for pm in self.maps:
            if pm.hf == (hf,) and pm.tied_copy == tied_copy:
                return pm.megatron
        return None


def transformer_config(
    layout: HFLayout,
    hf_config: Any,
    m: MegatronConfig,
    *,
    role: str,
    device: torch.device,
    gradient_checkpointing: bool = False,
    lora: bool = False,
) -> Any:
    """Megatron's ``TransformerConfig`` for this model and section (see module doc);
    ``lora``: the model carries LoRA adapters."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    key = f"{role}.megatron"
    valid = {f.name for f in dataclasses.fields(TransformerConfig)}
    for name in m.extra:
        if name in _OWNED_FIELDS:
            raise ConfigError(
                f"{key}.extra.{name}",
                "is set by temper from the model's config or the megatron section",
                f"remove it{' and set ' + key + '.' + name if hasattr(m, name) else ''}",
            )
        if name not in valid:
            from temper.config.errors import did_you_mean

            raise ConfigError(
                f"{key}.extra.{name}",
                f"not a Megatron-Core TransformerConfig field{did_you_mean(name, valid)}",
                "remove it or fix the name",
            )
    cuda = device.type == "cuda"
    kwargs: dict[str, Any] = dict(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_kv_heads,
        kv_channels=layout.head_dim,
        ffn_hidden_size=layout.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=layout.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        qk_layernorm=layout.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        **megatron_degrees(m),
        sequence_parallel=uses_sequence_parallel(m, moe=layout.moe is not None, lora=lora),
        params_dtype=torch.float32,
        # weights come from the checkpoint: no random init (on CPU, Megatron would
        # initialize each full matrix and split it)
        perform_initialization=False,
        use_cpu_initialization=not cuda,
        cuda_graph_scope=[],  # the default ["full"] only warns that it is deprecated
        # Megatron requires it with PP > 1 (its schedules' buffer dtype); temper's own
        # schedule sends each activation's dtype with it (megatron_pipeline)
        pipeline_dtype=torch.float32,
    )
    if layout.vision:  # Megatron's multimodal RoPE (megatron_vision)
        from temper.training.megatron_vision import mrope_section

        kwargs["mrope_section"] = mrope_section(hf_config)
    if cuda:
        # activation recompute saves CUDA RNG states, so it runs on CUDA only (see
        # megatron_check.unapplied_options); model.enable_gradient_checkpointing asks
        # for whole-layer recompute
        if m.recompute_granularity is None and gradient_checkpointing:
            kwargs.update(recompute_granularity="full", recompute_method="uniform")
            kwargs["recompute_num_layers"] = 1
        if m.recompute_granularity:
            full = m.recompute_granularity == "full"
            kwargs["recompute_granularity"] = m.recompute_granularity
            # full recompute without a method: every layer (Megatron requires a method)
            kwargs["recompute_method"] = m.recompute_method or ("uniform" if full else None)
            kwargs["recompute_num_layers"] = m.recompute_num_layers or (1 if full else None)
            if m.recompute_modules is not None:
                kwargs["recompute_modules"] = list(m.recompute_modules)
    # noted by the pre-flight
    unavailable = set(unavailable_fusions(m.extra, device.type))
    if layout.moe is not None:
        kwargs.update(moe_config_kwargs(layout.moe, m.extra, device.type))
        unavailable |= set(unavailable_moe_options(m.extra, device.type))
    kwargs.update({k: v for k, v in m.extra.items() if k not in unavailable})
    try:
        return TransformerConfig(**kwargs)
    except (AssertionError, ValueError, TypeError) as err:
        raise ConfigError(key, f"Megatron-Core rejects the configuration: {err}", "") from err


def model_dir(path: str) -> str:
    """A local directory for ``path`` (a hub id is downloaded like ``from_pretrained``)."""
    resolved = resolve_model_path(path)
    if Path(resolved).is_dir():
        return resolved
    from huggingface_hub import snapshot_download

    return str(snapshot_download(resolved, allow_patterns=["*.json", "*.safetensors"]))


@dataclass
class ModelSource:
    """The checkpoint a megatron engine loads, read and checked before any process group
    or Megatron state exists (a bad ``model.path`` fails cleanly)."""

    path: str
    hf_config: Any
    layout: HFLayout
    inv_freq: torch.Tensor


def read_model_source(spec: EngineSpec) -> ModelSource:
    """``model.path`` (or the critic's ``model_path``) as a :class:`ModelSource`."""
    role = spec.role
    src = model_dir(spec.model_path or spec.model.path)
    hf_config = load_hf_config(spec.model, src)
    try:
        layout = hf_layout(hf_config)
        inv_freq = hf_inv_freq(hf_config)
    except ValueError as err:
        raise ConfigError(
            "model.path", f"{src}: {err}", f"use {role}.strategy: fsdp2 for this model"
        ) from err
    check_divisible(layout, spec.megatron_config, role)
    check_vision(
        layout, spec.megatron_config, role, value=spec.value_head, lora=spec.model.lora.rank > 0
    )
    return ModelSource(src, hf_config, layout, inv_freq)


def build_model(
    spec: EngineSpec, source: ModelSource, parallel: Parallel, device: torch.device
) -> MegatronModel:
    """The role's ``GPTModel`` shards on ``device`` (one per model chunk this rank
    holds), holding the checkpoint's weights."""
    from temper.training.megatron_layers import has_transformer_engine

    layout, hf_config = source.layout, source.hf_config
    # LoRA adapts the linears' own input: TransformerEngine fuses the norm into them
    # (megatron_lora), so a LoRA model takes Megatron's local layer spec
    use_te = device.type == "cuda" and has_transformer_engine() and spec.model.lora.rank == 0
    config = transformer_config(
        layout,
        hf_config,
        spec.megatron_config,
        role=spec.role,
        device=device,
        gradient_checkpointing=spec.model.enable_gradient_checkpointing and spec.train is not None,
        lora=spec.model.lora.rank > 0,
    )
    value = spec.value_head
    padded = layout.padded_vocab(parallel.tp)
    chunks, maps = [], []
    for c in range(parallel.vp):
        chunk, chunk_maps = _build_chunk(
            config,
            layout,
            source,
            parallel,
            device,
            chunk=c,
            value=value,
            use_te=use_te,
            lora=spec.model.lora.rank > 0,
            attn=spec.model.attn_implementation,
        )
        if parallel.vp > 1:  # the chunk's names in the ModuleList; its global names kept
            chunk_maps = [
                dataclasses.replace(pm, megatron=f"{c}.{pm.megatron}", key=pm.global_name)
                for pm in chunk_maps
            ]
        chunks.append(chunk)
        maps += chunk_maps
    module: torch.nn.Module = chunks[0] if parallel.vp == 1 else torch.nn.ModuleList(chunks)
    _mark_tensor_parallel(module, maps)
    dist = spec.megatron_config.dist_checkpoint_path
    if dist:  # a checkpoint converted ahead of time (verl's use_dist_checkpointing)
        from temper.training.megatron_dist_init import load_dist_checkpoint

        head = (lambda name, t: _fresh_head(name, t, spec.seed, source.path)) if value else None
        prefix = spec.megatron_config.dist_checkpoint_prefix
        load_dist_checkpoint(chunks, dist, prefix=prefix, value_head=head)
    else:
        _load_weights(
            module,
            maps,
            source.path,
            layout,
            parallel,
            value=value,
            seed=spec.seed,
            score=spec.kind == "score",
        )
    tp_group = parallel.tp_group if parallel.tp > 1 else None
    vocab = VocabShard.of(parallel.tp_rank, parallel.tp, padded, layout.vocab_size, tp_group)
    rope_index = None
    if layout.vision:
        from temper.training.megatron_vision import rope_index as vl_rope_index

        rope_index = vl_rope_index(hf_config)
    return MegatronModel(
        module,
        layout,
        hf_config,
        maps,
        vocab,
        use_te,
        chunks,
        config.sequence_parallel,
        rope_index,
    )


def _build_chunk(
    config: Any,
    layout: HFLayout,
    source: ModelSource,
    parallel: Parallel,
    device: torch.device,
    *,
    chunk: int,
    value: bool,
    use_te: bool,
    lora: bool = False,
    attn: str = "auto",
) -> tuple[Any, list[ParamMap]]:
    """This rank's ``GPTModel`` of virtual stage ``chunk`` (Megatron's ``vp_stage``: it
    picks the chunk's layers, see :mod:`megatron_chunks`) and its parameter maps
    (``lora``: the model will carry LoRA adapters); a vision-language model's first
    stage holds the vision tower (``attn``: its attention implementation, the model
    section's), and every stage M-RoPE."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    from temper.training.megatron_layers import (
        HFRotaryEmbedding,
        ValueHead,
        layer_spec,
        moe_block_spec,
        use_host_dispatchers,
    )

    vp_stage = chunk if parallel.vp > 1 else None
    first, last = parallel.first_chunk(chunk), parallel.last_chunk(chunk)
    if layout.moe is not None:
        spec_: Any = moe_block_spec(config, use_te=use_te, vp_stage=vp_stage)
    else:
        spec_ = layer_spec(qk_layernorm=layout.qk_norm, use_te=use_te)
    if config.sequence_parallel and not use_te:  # TransformerEngine's norms do it themselves
        spec_ = with_sequence_parallel_norms(spec_, config, vp_stage)
    module = GPTModel(
        config,
        spec_,
        vocab_size=layout.padded_vocab(parallel.tp),
        max_sequence_length=int(
            getattr(text_config(source.hf_config), "max_position_embeddings", 4096)
        ),
        position_embedding_type="rope",
        # over several stages a tied model's last stage holds a copy of the embedding,
        # which the engine keeps equal (megatron_pipeline.sync_tied_grads): Megatron's
        # own copy-at-init moves the weight to CUDA, so it is not asked for
        share_embeddings_and_output_weights=layout.tied_embeddings
        and not value
        and parallel.pp == 1,
        parallel_output=True,
        pre_process=first,
        post_process=last,
        vp_stage=vp_stage,
    )
    tower_maps: list[ParamMap] = []
    if layout.vision:
        from temper.training.megatron_vision import TOWER, MRopeEmbedding, build_tower
        from temper.training.megatron_vision import tower_maps as vision_maps

        # Megatron's mrope path, with HF's frequencies on any device (its own module
        # builds them on CUDA at construction, so the model is built as "rope")
        mrope = MRopeEmbedding(source.inv_freq)
        mrope.to_device(device)
        module.rotary_pos_emb = mrope
        module.position_embedding_type = "mrope"
        module.mrope_section = config.mrope_section
        if first:
            from temper.training.models import resolve_attn_implementation

            tower = build_tower(source.hf_config, resolve_attn_implementation(attn), device)
            module.add_module(TOWER, tower)
            tower_maps = vision_maps(tower)
    else:
        # Hugging Face's RoPE frequencies, on the model's device (see megatron_layers)
        rope = HFRotaryEmbedding(
            source.inv_freq, cp_group=getattr(module.rotary_pos_emb, "cp_group", None)
        )
        rope.to_device(device)
        module.rotary_pos_emb = rope
    if layout.moe is not None:
        # Megatron's all-gather dispatcher needs CUDA and equal token counts on every
        # rank; temper's ranks run micro-batches of their own lengths (megatron_layers)
        use_host_dispatchers(module)
    if config.sequence_parallel and host_sequence_parallel(device.type, lora=lora):
        use_host_sequence_parallel(module, parallel.tp_group)
    if value and last:
        group = parallel.tp_group if config.sequence_parallel else None
        module.output_layer = ValueHead(layout.hidden_size, torch.float32, device, group)
    module.to(device)
    names = {n for n, _ in module.named_parameters()} - {pm.megatron for pm in tower_maps}
    # Megatron numbers a chunk's layers from 0 in names, and from its offset in
    # ``layer_number`` (1-based): the global index of each
    layers = [int(layer.layer_number) - 1 for layer in module.decoder.layers]
    maps = param_maps(
        layout,
        names,
        value_head=value,
        layers=layers,
        first=first,
        last=last,
        ep=parallel.ep,
        ep_rank=parallel.ep_rank,
    )
    return module, tower_maps + maps


def _mark_tensor_parallel(module: torch.nn.Module, maps: list[ParamMap]) -> None:
    """Megatron tags TP-sharded weights (``tensor_model_parallel``, ``partition_dim``)
    only while it initializes them; with ``perform_initialization=False`` (weights come
    from the checkpoint) the tags are set here, as Megatron's initializers would, for
    what reads them (the gradient norm counts TP-replicated weights once)."""
    from megatron.core.tensor_parallel.layers import (
        set_defaults_if_not_set_tensor_model_parallel_attributes,
        set_tensor_model_parallel_attributes,
    )

    params = dict(module.named_parameters())
    for pm in maps:
        p = params[pm.megatron]
        if pm.kind != "rep" and not hasattr(p, "tensor_model_parallel"):
            dim = 1 if pm.kind == "row" else 0
            set_tensor_model_parallel_attributes(p, is_parallel=True, dim=dim, stride=1)
        set_defaults_if_not_set_tensor_model_parallel_attributes(p)


def _load_weights(
    module: torch.nn.Module,
    maps: list[ParamMap],
    src: str,
    layout: HFLayout,
    parallel: Parallel,
    *,
    value: bool,
    seed: int,
    score: bool = False,
) -> None:
    """Fill every parameter with this rank's shard; a value head missing from the
    checkpoint is initialised like the torch engine's (N(0, initializer_range²) from
    ``seed``, bias 0), so both engines start from the same critic. ``score``: a
    sequence classifier's bias-free ``score.weight`` (1, hidden) is the head, bias 0."""
    params = dict(module.named_parameters())
    ckpt = HFCheckpoint(src)
    try:
        with torch.no_grad():
            for pm in maps:
                target = params[pm.megatron]
                if score and pm.hf[0].startswith("value_head.") and ckpt.has("score.weight"):
                    if pm.hf[0].endswith(".bias"):
                        target.zero_()
                    else:
                        target.copy_(ckpt.get("score.weight").reshape(target.shape))
                    continue
                if value and pm.hf[0].startswith("value_head.") and not ckpt.has(pm.hf[0]):
                    target.copy_(_fresh_head(pm.hf[0], target, seed, src))
                    continue
                if pm.hf[0] == "lm_head.weight" and not ckpt.has("lm_head.weight"):
                    hf = [ckpt.get("embed_tokens.weight")]  # a tied checkpoint, untied config
                else:
                    hf = [ckpt.get(name) for name in pm.hf]
                # an expert's weight is split over the expert TP group, not the TP group
                if is_expert_param(pm.megatron):
                    rank, size = parallel.etp_rank, parallel.etp
                else:
                    rank, size = parallel.tp_rank, parallel.tp
                shard = to_megatron_shard(pm, hf, layout, rank, size)
                if tuple(shard.shape) != tuple(target.shape):
                    raise ValueError(
                        f"{pm.megatron}: shard {tuple(shard.shape)} does not fit the "
                        f"parameter {tuple(target.shape)}"
                    )
                target.copy_(shard.to(target.dtype))
    finally:
        ckpt.close()


def _fresh_head(name: str, target: torch.Tensor, seed: int, src: str) -> torch.Tensor:
    if name.endswith(".bias"):
        return torch.zeros_like(target)
    config = json.loads((Path(src) / "config.json").read_text())
    std = float(config.get("initializer_range", 0.02))
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(target.shape), generator=gen) * std
