"""vLLM inside the trainer's process: what it would change there, and the undoing.

temper runs vLLM in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment
says otherwise): it starts in seconds on CPU, a failure raises in the caller instead of
leaving a dead child process, and weights sync without pickling. But vLLM's worker
expects a process of its own, and while it starts it seeds the global RNGs and pins
torch's threads; :func:`preserve_process_state` gives the trainer its state back.

Importing this module also quiets vLLM's INFO logging (see below); the engine module
imports it before vLLM.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

# vLLM logs at INFO by default, which in an RL run means one "reset prefix cache" line per
# weight sync between the step lines; warnings and errors still show. Set before vLLM is
# first imported (it reads the level then); VLLM_LOGGING_LEVEL=INFO brings them back.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def use_in_process_engine() -> None:
    """Ask vLLM for an in-process engine, unless the environment already chose.

    Call before vLLM's engine is imported: vLLM reads the variable then.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@contextlib.contextmanager
def preserve_process_state() -> Iterator[None]:
    """Undo what an in-process vLLM engine does to the process while it starts.

    vLLM's worker seeds Python/NumPy/torch RNGs with the engine seed (that would
    silently reset the driver's resumable RNG streams), cuts torch to one thread
    ("for serving") and replaces ``torch.set_num_threads`` with a no-op that warns —
    all meant for its own pinned worker process, which an in-process engine is not:
    here the trainer shares the process and its threads.
    """
    py_state, np_state = random.getstate(), np.random.get_state()
    torch_state = torch.random.get_rng_state()
    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.random.set_rng_state(torch_state)
        torch.set_num_threads = set_threads
        set_threads(threads)


#: Prefix of the shared-memory segments of temper's tensor-parallel CPU engines.
SHM_PREFIX = "temper-vllm-"


def name_cpu_shm_segments(tag: str) -> None:
    """Name the shared-memory segments of vLLM's CPU communicator after ``tag`` (the
    engine's meeting port). vLLM names them after the engine's init method, which is
    ``env://`` for every externally launched engine: two tensor-parallel engines on one
    node, or a killed run's leftovers, would take the same names ("create shm ...
    failed. errno: 17"). Each rank of an engine calls this before the engine starts."""
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    def group_name(communicator: Any) -> str:
        ranks = "-".join(str(rank) for rank in communicator.ranks)
        return f"{SHM_PREFIX}{tag}-{communicator.unique_name}-[{ranks}]-cpushm"

    _CPUSHMDistributed.make_group_name = staticmethod(group_name)  # type: ignore[method-assign]


def unlink_cpu_shm_segments(tag: str, rank: int) -> None:
    """Remove the name of this rank's segments once every rank has mapped them (vLLM's
    start ends with a barrier after the join): the memory stays until the engine's
    processes end, and a process that is killed (Ray's shutdown) leaves nothing behind
    in ``/dev/shm``."""
    for path in glob.glob(f"/dev/shm/{glob.escape(SHM_PREFIX + tag)}-*_{rank}"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
