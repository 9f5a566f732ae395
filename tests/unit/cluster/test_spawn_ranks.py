"""spawn_ranks: a rendezvous port taken before rank 0 listens is a retry, not a failure."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from temper.cluster import process_group


def _world_size(rank: int, world: int) -> tuple[int, int]:
    return rank, dist.get_world_size()


def test_a_taken_rendezvous_port_is_retried_with_another(monkeypatch):
    """The first port handed out is held by a listening socket (as another process's
    connection may take it between free_port and rank 0's bind): the ranks meet on the
    next one."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    ports = iter([taken])
    real = process_group.free_port
    handed: list[int] = []

    def free_port(host: str = "127.0.0.1") -> int:
        port = next(ports, None) or real(host)
        handed.append(port)
        return port

    monkeypatch.setattr(process_group, "free_port", free_port)
    try:
        assert process_group.spawn_ranks(_world_size, 2) == [(0, 2), (1, 2)]
    finally:
        held.close()
    assert handed[0] == taken and len(handed) == 2


def _join_served_group(rank: int, world: int, port: int) -> int:
    """Rank ``rank`` of a group whose store the parent test process serves."""
    process_group.init_process_group(rank, world, addr="127.0.0.1", port=port)
    try:
        dist.barrier()
        return dist.get_world_size()
    finally:
        dist.destroy_process_group()


def test_a_group_store_holds_its_port_until_the_ranks_join():
    """The Ray path's rendezvous: the store binds its port when it is made, so nothing
    can take the port before the ranks meet on it (they join through their own
    client stores, as the non-zero Ray ranks do)."""
    store = process_group.group_store("127.0.0.1", 2, timeout_s=60)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", store.port))
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:  # rank 1 in another process, rank 0 here with the store
        rank1 = pool.apply_async(_join_served_group, (1, 2, store.port))
        process_group.init_process_group(0, 2, addr="127.0.0.1", port=store.port, store=store)
        try:
            assert dist.get_world_size() == 2
            dist.barrier()
        finally:
            dist.destroy_process_group()
        assert rank1.get(timeout=60) == 2
