"""Rules the FSDP2-family engines of verl 0.9 share (VeOmni, NeMo AutoModel, TorchTitan):
each runs on temper's ``fsdp2``, and each spells its strategy, offload, parallelism and
compile/entropy switches alike."""

from __future__ import annotations

from temper.config.dialects.core.rules import Map, Note, Refuse, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.table import PERF

MEGATRON = "temper's tensor, pipeline, context and expert parallelism are its Megatron engine's"


def no_parallelism(what: str, engine: str, fix: str) -> Refuse:
    """A degree of ``what`` other than 1 in ``engine``, refused with ``fix``."""
    return Refuse(
        f"{what} in the {engine} engine is not supported: {MEGATRON}",
        f"set it to 1, or {fix}",
        ok=(1, None),
        why="no such parallelism",
    )


def compile_and_entropy(prefix: str, role: str) -> dict[str, Rule]:
    """``use_torch_compile`` and ``entropy_from_logits_with_chunking`` of the engine
    section ``prefix`` of ``role`` (the reference: noted)."""
    if role == "reference":
        return {
            f"{prefix}.use_torch_compile": Note(PERF),
            f"{prefix}.entropy_from_logits_with_chunking": Note("this role computes no entropy"),
        }
    return {
        f"{prefix}.use_torch_compile": Map(f"{role}.use_torch_compile", weak=True),
        f"{prefix}.entropy_from_logits_with_chunking": (
            Map("actor.entropy_chunk_size", r.entropy_chunk, weak=True)
            if role == "actor"
            else Note("this role computes no entropy")
        ),
    }


def strategy_and_offload(prefix: str, role: str) -> dict[str, Rule]:
    """The engine section's ``strategy`` (an FSDP2 engine: ``fsdp2``), ``param_offload``
    and ``optimizer_offload`` (the reference's own offload; it has no optimizer)."""
    trained = role != "reference"
    return {
        f"{prefix}.strategy": Map(f"{role}.strategy", r.strategy, weak=True),
        f"{prefix}.param_offload": Map(
            f"{role}.fsdp.param_offload" if trained else "reference.param_offload"
        ),
        f"{prefix}.optimizer_offload": (
            Map(f"{role}.fsdp.optimizer_offload")
            if trained
            else Note("the reference has no optimizer")
        ),
    }
