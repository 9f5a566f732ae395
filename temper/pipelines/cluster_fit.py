"""Pre-flight of the placement: the devices the roles ask for against the cluster's.

On the Ray backend ``temper train`` asks Ray for one bundle per device id the roles use
and waits for them. On a cluster that cannot hold them that wait only ends at its
deadline, so what can be known before is refused here, by ``temper check`` too:

- no ``resources.ray.address``: temper starts Ray on this machine, so the cluster is
  this one node, its CPUs and GPUs. A placement on more than one node (ids beyond
  ``devices_per_node``, ``nnodes`` > 1: ROLL derives ``nnodes`` from the largest
  device id) or on more GPUs than the machine has is refused; on CPU a device is a
  process slot and the local Ray is given as many as the placement names, unless
  ``resources.ray.num_cpus`` caps them.
- an address: a Ray cluster must answer there (its size is Ray's to say at train time).
"""

from __future__ import annotations

import os

from temper.cluster.placement import format_ids, placed_roles, placement_key, worker_device
from temper.cluster.ray import check_ray_address
from temper.config.derive import Derived
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig


def _gpus() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def machine_description() -> str:
    """This machine as a Ray cluster of one node: its CPUs and GPUs."""
    gpus = _gpus()
    return f"one node, {_plural(os.cpu_count() or 1, 'CPU')} and {_plural(gpus, 'GPU')}"


def _where(place: dict[str, list[int]]) -> str:
    """``actor 0..3; rollout 4,5; judge 6``: each role's device ids."""
    return "; ".join(f"{role} {format_ids(ids)}" for role, ids in place.items())


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def check_placement(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The roles' devices fit the cluster Ray will have (see the module doc)."""
    if cfg.resources.backend != "ray":
        return  # one process: the device ids place nothing
    rc = cfg.resources.ray
    if rc.address:
        check_ray_address(rc.address)
        return
    place = placed_roles(cfg, plan)
    asked = f"the roles' devices ({_where(place)})"
    per_node = cfg.resources.devices_per_node
    if cfg.resources.nnodes > 1:
        # named: the role whose own device list reaches furthest beyond this node (ROLL
        # derives nnodes from it), else nnodes (a role without a list spans all nodes)
        beyond = {
            role: ids
            for role, ids in place.items()
            if max(ids) >= per_node and getattr(cfg.resources, placement_key(role)) is not None
        }
        far_role = max(beyond, key=lambda r: max(beyond[r])) if beyond else None
        key = f"resources.{placement_key(far_role)}" if far_role else "resources.nnodes"
        nodes = cfg.resources.nnodes  # validation holds every id within these nodes
        raise ConfigError(
            key,
            f"{asked} are placed on {nodes} nodes of {_plural(per_node, 'device')}, but with "
            f"no Ray cluster address Ray runs on this machine alone: {machine_description()}",
            f"place every role on this node's devices ({format_ids(list(range(per_node)))}), "
            "raise resources.devices_per_node to this node's devices, or start Ray on "
            f"{nodes} nodes and set resources.ray.address",
        )
    devices = sorted({i for ids in place.values() for i in ids})
    if worker_device(cfg) == "cuda":
        gpus, cpus = _gpus(), rc.num_cpus or os.cpu_count() or 1
        if len(devices) > min(gpus, cpus):
            raise ConfigError(
                "resources",
                f"{asked} ask Ray for {len(devices)} bundles of 1 GPU and 1 CPU, and this "
                f"machine has {_plural(gpus, 'GPU')} and {_plural(cpus, 'CPU')} for Ray",
                "place the roles on as many devices as this machine has (device ids and "
                "resources.devices_per_node), or start Ray on more nodes and set "
                "resources.ray.address",
            )
    elif rc.num_cpus is not None and len(devices) > rc.num_cpus:
        raise ConfigError(
            "resources.ray.num_cpus",
            f"{asked} ask Ray for {len(devices)} process slots of 1 CPU, and the local Ray "
            f"gets {rc.num_cpus}",
            f"set resources.ray.num_cpus to at least {len(devices)}, or remove it (Ray then "
            "gets a slot per device)",
        )
