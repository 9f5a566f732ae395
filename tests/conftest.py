"""Shared fixtures: a tiny random model with a real tokenizer, built once per session."""

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
