"""Shared fixtures of the data tests: the tiny byte-level ChatML tokenizer.

Its ids are easy to check by hand: a printable ASCII character ``c`` is ``ord(c) - 33``,
space is 220, newline 198; ``<|im_start|>`` 257, ``<|im_end|>`` 258, ``<|pad|>`` 259.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from temper.utils.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tiny_tok"))
