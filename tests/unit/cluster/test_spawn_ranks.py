"""spawn_ranks: a rendezvous port taken before rank 0 listens is a retry, not a failure."""

from __future__ import annotations

import socket

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
