"""torch.distributed process groups for the ranks of one role.

Ray workers (:mod:`temper.cluster.ray`) and :func:`spawn_ranks` (tests, benchmarks, a
quick N-rank run on one machine) both end up in :func:`init_process_group`: TCP
rendezvous at ``addr:port`` chosen by rank 0's host, gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

#: The address :func:`spawn_ranks`' ranks meet on.
LOOPBACK = "127.0.0.1"

#: How long a rank of :func:`spawn_ranks` waits for the others to join.
RENDEZVOUS_TIMEOUT_S = 1800.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (bind to port 0; the OS picks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def group_store(host: str, world_size: int, timeout_s: float = 1800.0) -> dist.TCPStore:
    """The rendezvous store of a new group, served by the calling process (rank 0's) on a
    port the OS picks and the store holds from now on (``store.port``).

    Asking for a free port and binding it later races: another group set up at the same
    time on the host, or any outgoing connection, can be handed the same port in between
    (EADDRINUSE when rank 0 binds). A store bound to port 0 cannot lose its port."""
    return dist.TCPStore(
        host,
        0,
        world_size,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,  # the other ranks join later, in init_process_group
    )


def default_backend(device_type: str) -> str:
    """nccl for GPU ranks, gloo for CPU ranks."""
    return "nccl" if device_type == "cuda" else "gloo"


def init_process_group(
    rank: int,
    world_size: int,
    *,
    addr: str,
    port: int,
    backend: str = "gloo",
    timeout_s: float = 1800.0,
    local_rank: int | None = None,
    store: dist.TCPStore | None = None,
) -> None:
    """Join the group of ``world_size`` ranks meeting at ``addr:port``: rank 0 serves the
    rendezvous store there (``store``, from :func:`group_store`, when it already does).

    Also sets the ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*`` variables that
    torch and transformers read, as torchrun would.
    """
    env = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
    }
    os.environ.update(env)
    if backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("the nccl backend needs CUDA GPUs; on CPU use gloo")
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        # every rank passes a store of its own making: torch prefixes the keys of a store
        # it made from an init_method and not those of one it is given, so a mix would
        # never meet
        store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def _meet(rank: int, world: int, out_dir: Path, timeout_s: float) -> None:
    """Join the group of :func:`spawn_ranks`: rank 0 serves its store on a port the OS
    picks (:func:`group_store`, so no other process can take it first) and writes the
    port to ``out_dir/port``; the other ranks read it from there."""
    published = out_dir / "port"
    if rank == 0:
        store = group_store(LOOPBACK, world, timeout_s)
        staged = out_dir / "port.tmp"
        staged.write_text(str(store.port))
        staged.replace(published)  # whole: a reader never sees half a number
        init_process_group(0, world, addr=LOOPBACK, port=int(store.port), store=store)
        return
    deadline = time.monotonic() + timeout_s
    while not published.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {rank}: rank 0 published no rendezvous port in {timeout_s:.0f} s"
            )
        time.sleep(0.01)
    init_process_group(
        rank, world, addr=LOOPBACK, port=int(published.read_text()), timeout_s=timeout_s
    )


def _rank_entry(
    rank: int,
    world: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    out_dir: str,
    threads: int,
) -> None:
    torch.set_num_threads(threads)
    _meet(rank, world, Path(out_dir), RENDEZVOUS_TIMEOUT_S)
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def spawn_ranks(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    threads: int = 1,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` new processes joined by a gloo group
    on the loopback interface; returns each rank's return value (``torch.save``-able).

    ``start_method`` defaults to ``fork`` where that is safe (Linux, neither CUDA nor a
    process group initialized in this process): the ranks inherit the already imported torch and
    transformers instead of importing them again, which dominates a small run's time
    (``spawn``: ``fn`` must then be importable at module level). A failing rank raises
    here with its traceback (``torch.multiprocessing.ProcessRaisedException``).
    """
    import sys

    import torch.multiprocessing as mp

    if start_method is None:
        cuda_live = torch.cuda.is_available() and torch.cuda.is_initialized()
        # a process group's threads (gloo) do not survive a fork: a child would hang
        group_live = dist.is_available() and dist.is_initialized()
        fork_safe = sys.platform == "linux" and not cuda_live and not group_live
        start_method = "fork" if fork_safe else "spawn"
    with tempfile.TemporaryDirectory(prefix="temper-ranks-") as out:
        mp.start_processes(
            _rank_entry,
            args=(world, fn, args, out, threads),
            nprocs=world,
            join=True,
            start_method=start_method,
        )
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]
