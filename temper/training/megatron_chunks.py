"""Which decoder layers each pipeline rank and model chunk holds (Megatron's layout).

With pipeline size ``p`` and virtual (interleaved) size ``v``, Megatron-Core cuts the
layers into ``p·v`` consecutive chunks and gives rank ``r`` chunks ``r, r+p, r+2p, …``:
its model chunk ``c`` (Megatron's ``vp_stage``) is virtual stage ``c·p + r``. Each rank
holds the same number of layers in each of its chunks (its per-stage count / ``v``).
Without ``num_layers_in_first/last_pipeline_stage`` every rank holds
``layers / p`` layers; with them the first (last) rank holds that many and the middle
ranks share the rest evenly. The embedding lives on chunk 0 of rank 0, the final norm and
the output layer on chunk ``v−1`` of rank ``p−1``.

These are Megatron's facts (``get_num_layers_to_build``, ``get_transformer_layer_offset``)
written as one rule: chunk ``c`` spans ``c·T … (c+1)·T`` with ``T`` the layers of one
chunk of every rank, and rank ``r``'s share of it starts after the shares of ranks
``< r``. Megatron builds the layers itself (from ``vp_stage``); this module lets the
check refuse an impossible split before any model loads, with the key to change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineSplit:
    """A pipeline's layer split: ``num_layers`` over ``pp`` ranks × ``vp`` chunks, with
    Megatron's optional uneven first/last stage sizes."""

    num_layers: int
    pp: int
    vp: int = 1
    first: int | None = None  # num_layers_in_first_pipeline_stage
    last: int | None = None  # num_layers_in_last_pipeline_stage

    def problem(self) -> tuple[str, str] | None:
        """``(reason, fix)`` when the layers cannot be split so; None when they can."""
        p, v, n = self.pp, self.vp, self.num_layers
        ends = [x for x in (self.first, self.last) if x is not None]
        if any(x <= 0 for x in ends):
            return "an uneven first/last stage must hold at least one layer", "raise it"
        if any(x % v for x in ends):
            return (
                f"each rank splits its layers over {v} virtual chunks: the uneven first/last "
                f"stage sizes {ends} are not multiples of {v}",
                f"make num_layers_in_first/last_pipeline_stage multiples of {v}",
            )
        middle_ranks = p - len(ends)
        middle = n - sum(ends)
        if middle_ranks == 0:
            if middle:
                return (
                    f"{middle} layers are left for no middle stage",
                    "make the first and last stage sizes add up to the model's layers",
                )
            if v > 1:
                # Megatron's interleaved offset divides by the middle stages' count
                return (
                    "interleaved stages with both num_layers_in_first_pipeline_stage and "
                    "num_layers_in_last_pipeline_stage need a middle stage (Megatron-Core "
                    "cannot place the layers otherwise)",
                    "set only one of them, or raise pipeline_model_parallel_size",
                )
            return None
        per_rank = middle // middle_ranks if middle > 0 else 0
        if middle <= 0 or middle % middle_ranks or per_rank % v:
            what = "middle " if ends else ""
            return (
                f"{middle} layers do not split into {middle_ranks} {what}stages of "
                f"{v} chunk{'s' * (v > 1)} each (a multiple of {middle_ranks * v} is needed)",
                "choose pipeline/virtual pipeline sizes whose product divides the layers"
                + (" left to the middle stages" if ends else ""),
            )
        return None

    def per_chunk(self) -> list[int]:
        """Layers in each chunk of each rank (rank order); see :meth:`problem`."""
        middle_ranks = self.pp - (self.first is not None) - (self.last is not None)
        middle = self.num_layers - (self.first or 0) - (self.last or 0)
        counts = [middle // middle_ranks if middle_ranks else 0] * self.pp
        if self.first is not None:
            counts[0] = self.first
        if self.last is not None:
            counts[-1] = self.last
        return [c // self.vp for c in counts]

    def layers(self, rank: int, chunk: int = 0) -> range:
        """The global (0-based) indices of the layers of ``rank``'s model ``chunk``."""
        counts = self.per_chunk()
        start = chunk * sum(counts) + sum(counts[:rank])
        return range(start, start + counts[rank])

    def virtual_stage(self, rank: int, chunk: int) -> int:
        """The chunk's place in the pipeline's order (a micro-batch's path)."""
        return chunk * self.pp + rank


def split_of(num_layers: int, pp: int, vp: int | None, extra: dict[str, object]) -> PipelineSplit:
    """The split a megatron section asks for (``extra``: its TransformerConfig fields)."""
    first = extra.get("num_layers_in_first_pipeline_stage")
    last = extra.get("num_layers_in_last_pipeline_stage")
    return PipelineSplit(
        num_layers,
        pp,
        vp or 1,
        first=None if first is None else int(str(first)),
        last=None if last is None else int(str(last)),
    )
