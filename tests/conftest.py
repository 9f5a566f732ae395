"""Shared fixtures: a tiny random model with a real tokenizer, built once per session.

This folder is on the test path (pytest puts a rootdir conftest's folder there), so test
doubles live next to it in ``doubles.py`` and any test imports them as ``doubles``."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from temper.utils.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_path(tiny_model_dir) -> str:
    return str(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_dir(tiny_model_dir):
    return tiny_model_dir


#: Variables a library sets once for the life of the process, with state in memory that
#: must agree with them: Ray's first ``ray.init`` sets RAY_AUTH_MODE (and others) and a
#: later cluster of the same process (another module's) fails to start its actors
#: without them.
PROCESS_LIFETIME_PREFIXES = ("RAY_",)


@pytest.fixture(autouse=True)
def _restore_environment():
    """What a test's code does to ``os.environ`` is undone when it ends: a variable one
    test set (LOCAL_RANK by a one-rank world, a library's own) must not make a later
    test pass, so a test passes alone as it does in the suite."""
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before):
        if not name.startswith(PROCESS_LIFETIME_PREFIXES):
            del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def _release_local_process_group():
    """An engine built outside a run (a test's own DeepSpeed or Megatron engine) makes a
    one-rank process group in the test process that no run's close ends; later tests
    fork ranks or start vLLM, which must not find it."""
    yield
    import sys

    world = sys.modules.get("temper.training.local_world")
    if world is not None:
        world.release_local_world()


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A tiny random Qwen2-VL (vision-language) model, tokenizer and image processor."""
    from temper.utils.tiny_vlm import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))
