"""Each env's declared ``render_modes`` is what its ``render`` draws: the env manager's
frames and the VL env manager's check read the declaration, never a trial render."""

from __future__ import annotations

import numpy as np
import pytest

from temper.envs.registry import env_class

#: env types constructible with their defaults (the dataset envs need a data file)
PLAIN = [
    "bandit",
    "countdown",
    "frozen_lake",
    "sokoban",
    "sokoban_native_env",
    "game:GuessTheNumber-v0",
    "rg:letter_counting",
]


@pytest.mark.parametrize("env_type", PLAIN)
def test_declared_render_modes_are_what_render_draws(env_type: str) -> None:
    env = env_class(env_type)()
    env.reset(0)
    assert isinstance(env.render("text"), str)
    if "rgb_array" in env.render_modes:
        frame = env.render("rgb_array")
        assert isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3
    else:
        with pytest.raises(ValueError):
            env.render("rgb_array")
    env.close()


def test_the_board_games_draw_images():
    assert "rgb_array" in env_class("sokoban").render_modes
    assert "rgb_array" in env_class("frozen_lake").render_modes
    assert env_class("rg:letter_counting").render_modes == ("text",)
