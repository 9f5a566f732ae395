"""Which Ray a run joins: resources.ray.address, else a launcher's RAY_ADDRESS, else a
Ray of its own — never the cluster a `ray start` on this machine happened to leave
(ray.init's own default joins that one and then refuses num_cpus). Ray's init is
replaced by a recorder: the choice of arguments is what is tested here; the Ray
integration tests start real clusters with it."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from temper.cluster import ray as ray_module
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig


class _Ray:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)


@pytest.fixture
def fake_ray(monkeypatch) -> _Ray:
    fake = _Ray()
    monkeypatch.setattr(ray_module, "require_ray", lambda: fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return fake


def _cfg(**ray: Any) -> TemperConfig:
    cfg = TemperConfig()
    cfg.resources.backend = "ray"
    cfg.experiment.device = "cpu"
    for key, value in ray.items():
        setattr(cfg.resources.ray, key, value)
    return cfg


def test_without_an_address_the_run_starts_its_own_ray(fake_ray) -> None:
    ray_module.init_ray(_cfg())
    (call,) = fake_ray.calls
    assert call["address"] == "local" and call["num_cpus"] >= 1


def test_a_launchers_ray_address_is_joined_without_resources(fake_ray, monkeypatch) -> None:
    with socket.socket() as server:  # something answering, as a Ray head would
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setenv("RAY_ADDRESS", address)
        ray_module.init_ray(_cfg(num_cpus=4))
    (call,) = fake_ray.calls
    assert call["address"] == address and "num_cpus" not in call


def test_a_dead_ray_address_from_the_environment_says_where_it_came_from(
    fake_ray, monkeypatch
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="RAY_ADDRESS's; unset it"):
        ray_module.init_ray(_cfg())
    assert fake_ray.calls == []
