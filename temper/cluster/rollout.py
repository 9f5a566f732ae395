"""The rollout engines on the Ray backend: one per ``rollout.tensor_parallel_size``
``actor_infer`` ranks.

ROLL's ``actor_infer`` (verl's rollout of the hybrid engine) is a role of its own: its
device ids (``resources.actor_infer``, default: the actor's) get a worker group, one rank
per device, whose every rank holds a whole engine (``hf`` or ``vllm``) with its own copy
of the weights — or, with ``tensor_parallel_size`` = t > 1, every t consecutive ranks
one vLLM engine (vLLM's external launcher: the t processes meet at their first rank's
address, each holds 1/t of every sharded weight and all run the same prompts, as verl's
SPMD rollout does). The driver sees one :class:`~temper.rollout.base.RolloutEngine`,
:class:`RemoteRollout`:

* ``generate`` cuts the prompts into one contiguous slice per engine (prompts, not
  samples, so the ``n`` responses of a prompt stay on one engine and in ``aabb`` order),
  runs the slices in parallel and concatenates them back in prompt order, padded to the
  longest response of any engine (every per-sample tensor travels with its rows: the
  MoE routing of router replay R3 too);
* ``load_weights`` takes the trainer's gathered weights as rank 0 of the trainer put them
  into Ray's object store (:class:`StoredWeights`) and every engine copies them from
  there (shared memory on a node): the driver never holds them, and one object serves
  however many engines there are;
* sampling stays reproducible: each call draws one seed from the driver's torch RNG
  (which checkpoints save and restore) and engine ``e``'s ranks seed their processes
  with ``seed + e`` before generating. Engines seeded once at start (vLLM) ignore it.

On the actor's device ids (the default) the rollout ranks share the actor's bundles, as
verl's hybrid engine shares its GPUs; on ids of their own they get their own; on ids that
overlap the actor's (ROLL) they share the devices in common (``placement.rank_slots``).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from temper.cluster.base import WorkerGroup, WorkerGroupError
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.data.padded import concat_padded
from temper.rollout.base import RolloutEngine, SamplingParams, TensorParallelShard
from temper.rollout.vllm_kv import EngineDemand

#: One stored weight: ``(array, torch dtype name)``, or ``(name, ALIAS)`` for a tensor
#: that is the same memory as the earlier entry ``name`` (a tied ``lm_head``).
Stored = dict[str, tuple[Any, str]]
ALIAS = "alias"


class RolloutRank:
    """What one ``actor_infer`` rank runs: an engine with an owned copy of the model, or
    (``rollout.tensor_parallel_size`` = t > 1) rank ``rank % t`` of engine ``rank // t``,
    whose t ranks meet at ``meet`` (its first rank's address) and hold 1/t of its
    weights each."""

    def __init__(
        self,
        cfg: TemperConfig,
        device: torch.device,
        rank: int,
        meet: tuple[str, int],
        demand: EngineDemand | None = None,
    ) -> None:
        from temper.rollout.registry import build_rollout_engine

        tp = cfg.rollout.tensor_parallel_size
        self.engine_index = rank // tp
        shard = None
        if tp > 1:
            local = rank % tp
            shard = TensorParallelShard(
                rank=local,
                world=tp,
                addr=meet[0],
                port=meet[1],
                local_rank=0 if device.type == "cuda" else local,  # Ray shows one GPU
            )
        # an engine's ranks sample alike: one seed per engine (vLLM seeds at build)
        torch.manual_seed(cfg.experiment.seed + self.engine_index)
        self.engine = build_rollout_engine(
            cfg.rollout, cfg.model, device=device, shard=shard, demand=demand
        )

    def generate(self, prompts: Batch, params: SamplingParams, seed: int) -> Batch:
        torch.manual_seed(seed + self.engine_index)
        return self.engine.generate(prompts, params)

    def pad_token_id(self) -> int:
        """The id this rank's engine right-pads responses with."""
        pad = self.engine.pad_token_id
        return int(pad) if pad is not None else 0

    def load_weights(self, stored: Stored) -> None:
        """Weights as :func:`to_store` wrote them (read from the object store)."""
        self.engine.load_weights(from_store(stored))

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        self.engine.close()


def prompt_slices(num_prompts: int, world: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` prompt ranges, one per rank, sizes differing by ≤ 1.

    Ranks beyond ``num_prompts`` get no slice (the list is shorter than ``world``).
    """
    base, extra = divmod(num_prompts, world)
    out, start = [], 0
    for r in range(min(world, num_prompts)):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


class TiedWeights:
    """Finds the tensors of a weight stream that are the same memory as an earlier one
    (a tied ``lm_head.weight`` is the embedding): the object store holds those once
    (SmolLM2's tied embedding is 113 MB of its 538).

    Same memory = one live storage, offset, shape, strides and dtype. Storages are held
    by weak reference: a tensor made during the stream (a LoRA-merged weight) and freed
    after its bucket was sent can leave its address to a later one, which is then *not*
    an alias (its storage is another object).
    """

    def __init__(self) -> None:
        self._first: dict[tuple[Any, ...], tuple[str, weakref.ref[Any]]] = {}

    def alias_of(self, name: str, tensor: torch.Tensor) -> str | None:
        """The earlier name of the same memory as ``tensor``, or None (then ``name`` is
        remembered as the first). Meta tensors are never aliases."""
        if tensor.device.type == "meta":
            return None
        storage = tensor.untyped_storage()
        if storage.data_ptr() == 0:
            return None
        key = (
            tensor.device,
            storage.data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        earlier = self._first.get(key)
        if earlier is not None and earlier[1]() is storage:
            return earlier[0]
        self._first[key] = (name, weakref.ref(storage))
        return None


def to_store(named: Iterable[tuple[str, torch.Tensor]]) -> Stored:
    """Weights as numpy arrays (plus their torch dtype) for Ray's object store: numpy is
    stored and read back without copies (measured here: 120 MB put + get in 0.1 s, against
    0.25-0.5 s for the same torch tensors, which Ray pickles). bf16 travels as int16 bits.
    A tensor sharing its memory with an earlier one (tied weights) is stored once and
    named as an alias of it: SmolLM2's tied embedding is 113 MB of its 538."""
    out: Stored = {}
    tied = TiedWeights()
    for name, tensor in named:
        earlier = tied.alias_of(name, tensor)
        if earlier is not None:
            out[name] = (earlier, ALIAS)
            continue
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        out[name] = (t.numpy(), str(tensor.dtype).removeprefix("torch."))
    return out


def from_store(stored: Stored) -> Iterator[tuple[str, torch.Tensor]]:
    """Inverse of :func:`to_store`: tensors viewing the (read-only) stored arrays (an
    alias views its source's); callers copy them into their own weights and never write
    to them."""
    with warnings.catch_warnings():  # torch warns once about read-only numpy memory
        warnings.simplefilter("ignore", UserWarning)
        seen: dict[str, torch.Tensor] = {}
        for name, (array, dtype) in stored.items():
            if dtype == ALIAS:
                yield name, seen[array]
                continue
            tensor = torch.from_numpy(array).view(getattr(torch, dtype))
            seen[name] = tensor
            yield name, tensor


class StoredWeights:
    """Weights that live in Ray's object store (a remote role's gathered export).

    Iterating yields ``(name, tensor)`` like any ``named_weights()`` (fetching them into
    this process); :class:`RemoteRollout` instead hands the ref to its ranks, so the
    weights go from the trainer's rank 0 to the engines without passing the driver.
    """

    def __init__(self, ref: Any, role: str = "actor", timeout_s: float | None = None) -> None:
        """``ref``: the object ``role``'s rank 0 stored; reading it waits ``timeout_s``
        at most (``resources.ray.rpc_timeout``)."""
        self.ref, self.role, self.timeout_s = ref, role, timeout_s

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        import ray
        from ray.exceptions import GetTimeoutError

        try:
            stored = ray.get(self.ref, timeout=self.timeout_s)
        except GetTimeoutError as err:
            raise WorkerGroupError(
                self.role,
                0,
                f"its gathered weights did not reach the driver within "
                f"resources.ray.rpc_timeout={self.timeout_s:g}s (raise it for a larger model)",
            ) from err
        return from_store(stored)


class RemoteRollout(RolloutEngine):
    """The driver's handle on the ``rollout`` worker group (see the module doc)."""

    shared = False  # the engines hold their own copies: Run.sync_weights pushes updates

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # the driver's RNG stream
        engines = self.group.data_ranks or list(range(self.group.world_size))
        slices = prompt_slices(len(prompts), max(engines) + 1)
        # every rank of an engine with work gets its slice (a tensor-parallel engine's
        # ranks run together); each engine's first rank returns the responses
        ranks = [r for r, e in enumerate(engines) if e < len(slices)]
        parts = self.group.call_first(
            "generate", [(prompts.slice(*slices[engines[r]]), params, seed) for r in ranks]
        )
        ordered = [parts[engines.index(e)] for e in range(len(slices))]
        if len({p["response_ids"].shape[1] for p in ordered}) == 1:
            return Batch.concat(ordered)
        # each engine padded its responses (and routing) to its own longest
        if self.pad_token_id is None:
            self.pad_token_id = self.group.call_first("pad_token_id", [()])[0]
        return concat_padded(ordered, self.pad_token_id)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if isinstance(named_tensors, StoredWeights):  # already in the store: pass the ref
            shared = named_tensors.ref
        else:
            shared = self.group.share(to_store(named_tensors))
        self.group.call_all("load_weights", shared)

    def sleep(self) -> None:
        self.group.call_all("sleep")

    def wake_up(self) -> None:
        self.group.call_all("wake_up")

    def close(self) -> None:
        if self.group.alive:
            self.group.call_all("close")

    def __repr__(self) -> str:
        return f"RemoteRollout({self.group.world_size} ranks)"
