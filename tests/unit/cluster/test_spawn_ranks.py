"""spawn_ranks and the group store: ranks meet on a port nothing else can take."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from temper.cluster import process_group


def _world_size(rank: int, world: int) -> tuple[int, int]:
    return rank, dist.get_world_size()


def test_ranks_meet_on_a_port_rank_0_holds_not_on_one_asked_for_earlier(monkeypatch):
    """A port asked for in advance can be taken by any process before rank 0 binds it
    (EADDRINUSE, and torch's failing store constructor can even abort the rank): rank 0
    binds port 0 itself, so spawn_ranks never asks for a free port."""

    def no_free_port(host: str = "127.0.0.1") -> int:
        raise AssertionError("spawn_ranks asked for a free port")

    monkeypatch.setattr(process_group, "free_port", no_free_port)
    assert process_group.spawn_ranks(_world_size, 2) == [(0, 2), (1, 2)]
    assert process_group.spawn_ranks(_world_size, 3, start_method="spawn") == [
        (0, 3),
        (1, 3),
        (2, 3),
    ]


def _fails_on_rank_1(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank 1 broke")
    return rank


def test_a_failing_rank_raises_in_the_caller_with_its_traceback():
    import torch.multiprocessing as mp

    with pytest.raises(mp.ProcessRaisedException, match="rank 1 broke"):
        process_group.spawn_ranks(_fails_on_rank_1, 2)


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
