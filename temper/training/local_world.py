"""The one-rank ``torch.distributed`` world of an engine on the local backend.

DeepSpeed and Megatron-Core run inside a process group. On the Ray backend each rank's
worker joins its role's group (:mod:`temper.cluster.process_group`, which sets the
variables torchrun would); on the local backend a role runs in the driver process,
which has none, so the first such engine creates a world of one rank here.

The libraries also read the launcher's environment, not only the group: DeepSpeed's
``zero.Init`` (entered by transformers' ``from_pretrained`` under ZeRO-3) reads
``os.environ["LOCAL_RANK"]``, Megatron's and torch's helpers read ``RANK`` and
``WORLD_SIZE``. So the world is created together with the variables that describe it,
whichever engine comes first — an engine finding a one-rank group another library made
(vLLM in process, the other engine) fills in the variables that group left unset.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

LOCAL_ADDR = "127.0.0.1"

#: Collectives of a one-rank world wait on no other rank; this only bounds a wedged one.
LOCAL_TIMEOUT = datetime.timedelta(minutes=30)

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

#: the launcher variables as they were before this module made the world (None: it made
#: none that is still alive)
_MADE: list[dict[str, str | None] | None] = [None]


def rank_env(device: torch.device) -> dict[str, str]:
    """The rank variables of a one-rank world on ``device``: ``LOCAL_RANK`` is the GPU
    index (DeepSpeed and Megatron put the rank on ``cuda:LOCAL_RANK``), 0 on CPU."""
    local_rank = (device.index or 0) if device.type == "cuda" else 0
    return {"RANK": "0", "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "1"}


def ensure_local_world(device: torch.device) -> bool:
    """A one-rank default process group (gloo on CPU, nccl on GPU) and its launcher
    variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``:
    where it met), unless this process is already in a group; returns whether it made one.

    A group that exists is left as it is; if it is a one-rank world, the rank variables
    it left unset are filled in (a group of several ranks was made by a launcher that set
    them; where another library's group met is its own business)."""
    if dist.is_initialized():
        if dist.get_world_size() == 1:
            for name, value in rank_env(device).items():
                os.environ.setdefault(name, value)
        return False
    # a store bound to port 0 holds its port from the start: a port asked for first and
    # bound later can be taken in between by another process of the host
    store = dist.TCPStore(LOCAL_ADDR, 0, 1, is_master=True, timeout=LOCAL_TIMEOUT)
    _MADE[0] = {name: os.environ.get(name) for name in LAUNCHER_VARS}
    os.environ.update(rank_env(device), MASTER_ADDR=LOCAL_ADDR, MASTER_PORT=str(store.port))
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=store,
        rank=0,
        world_size=1,
        timeout=LOCAL_TIMEOUT,
    )
    return True


def release_local_world() -> None:
    """End the world :func:`ensure_local_world` made, once the run that needed it is done,
    with what the libraries keep about it (Megatron's model-parallel groups, DeepSpeed's
    cached subgroups) and the launcher variables as they were: a later run of the same
    process (a notebook, a test suite) starts as the first did, where a live world would
    be taken for a launcher's — vLLM builds on it, FSDP2 shards over it, ranks forked
    from it inherit gloo threads that do not survive a fork. A world made by anything
    else is left alone."""
    before = _MADE[0]
    if before is None:
        return
    _MADE[0] = None
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None and ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        comm = sys.modules.get("deepspeed.comm")
        if comm is not None and comm.cdb is not None:
            comm.destroy_process_group()  # DeepSpeed's view of the world goes with it
        else:
            dist.destroy_process_group()
    forget_stale_deepspeed_groups()
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def forget_stale_deepspeed_groups() -> None:
    """Drop DeepSpeed's cached subgroups when no default group is alive. Another library
    may destroy the default group behind DeepSpeed's back (vLLM's shutdown does), which
    leaves DeepSpeed holding groups of a dead world; the next engine of this process would
    then fail in ``initialize`` ("Group ... is not registered"). DeepSpeed clears them
    itself only on its own ``destroy_process_group``; this is that same release."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None and not dist.is_initialized():
        groups._release_process_group_references(group=None)
