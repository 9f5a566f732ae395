"""The Sokoban game as a standalone, standard-library-only program (``sokoban_sandbox``).

:class:`temper.envs.sokoban_sandbox.SokobanSandboxEnv` ships this file into the sandbox
(:mod:`temper.rewards.sandbox`), where only the base interpreter's standard library is
importable, and runs it once per reset or step. It reads one JSON request on stdin and
prints one JSON reply on stdout:

- ``{"op": "reset", "seed": s, "config": {...}}`` →
  ``{"observation", "info", "state"}``;
- ``{"op": "step", "action": "Up", "config": {...}, "state": {...}}`` →
  ``{"observation", "reward", "terminated", "truncated", "info", "state"}``.

``config`` holds ``rows``, ``cols``, ``num_boxes``, ``max_steps``, ``search_depth`` and
``symbols`` (the 7 cell symbols, ids 0..6); ``state`` holds ``fixed`` and ``cells`` (the
two grids as lists of rows) and ``steps``. The program keeps nothing between runs: the
caller hands the state back with each step.

This module is where the game's rules are written — moves and pushes, rewards,
termination, level generation, the text of a grid — and :mod:`temper.envs.sokoban` (the
in-process env, whose docstring states the rules) imports them, so the two cannot drift
apart: a seed gives the same room and the same actions the same observations and rewards
in process and in the sandbox. The generator draws from :class:`Pcg64`, a
re-implementation of the draws numpy's ``default_rng(seed)`` makes (SeedSequence seeding,
PCG64 XSL-RR, ``integers`` by Lemire's method on 32-bit words, ``random`` from the top 53
bits, ``permutation`` by Fisher-Yates with masked rejection): the same numbers without
numpy, so the rooms are those numpy's generator deals.
"""

from __future__ import annotations

import json
import sys
from typing import Any

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
ACTIONS = ["Up", "Down", "Left", "Right"]
DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
M32, M64, M128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1
Grid = list[list[int]]
Cell = tuple[int, int]


# --------------------------------------------------------------------------- random


def seed_words(seed: int, n_words: int) -> list[int]:
    """numpy ``SeedSequence(seed).generate_state(n_words, uint32)``: the entropy's 32-bit
    words hashed into a pool of 4, then the pool hashed out word by word."""
    entropy = [0] if seed == 0 else []
    while seed:
        entropy.append(seed & M32)
        seed >>= 32
    hash_a = 0x43B0D7E5

    def hashmix(value: int) -> int:
        nonlocal hash_a
        value ^= hash_a
        hash_a = (hash_a * 0x931E8875) & M32
        value = (value * hash_a) & M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        r = (0xCA01F9DD * x - 0x4973F715 * y) & M32
        return r ^ (r >> 16)

    pool = [hashmix(entropy[i] if i < len(entropy) else 0) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(4, len(entropy)):
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    out, hash_b = [], 0x8B51F9DD
    for i in range(n_words):
        value = pool[i % 4] ^ hash_b
        hash_b = (hash_b * 0x58F38DED) & M32
        value = (value * hash_b) & M32
        out.append(value ^ (value >> 16))
    return out


class Pcg64:
    """The draws of ``numpy.random.default_rng(seed)`` that level generation makes."""

    MULT = 0x2360ED051FC65DA44385DF649FCCF645

    def __init__(self, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        w = seed_words(int(seed), 8)
        words64 = [w[2 * i] | (w[2 * i + 1] << 32) for i in range(4)]
        init_state = (words64[0] << 64) | words64[1]
        self.inc = (((words64[2] << 64) | words64[3]) << 1 | 1) & M128
        self.state = 0
        self._step()
        self.state = (self.state + init_state) & M128
        self._step()
        self.half: int | None = None  # the unused high half of the last 64-bit draw

    def _step(self) -> None:
        self.state = (self.state * self.MULT + self.inc) & M128

    def next64(self) -> int:
        self._step()
        hi, lo = self.state >> 64, self.state & M64
        x, rot = hi ^ lo, hi >> 58
        return ((x >> rot) | (x << (64 - rot))) & M64

    def next32(self) -> int:
        if self.half is not None:
            out, self.half = self.half, None
            return out
        v = self.next64()
        self.half = v >> 32
        return v & M32

    def integers(self, low: int, high: int | None = None) -> int:
        """``Generator.integers(low, high)``: uniform in [low, high) (ranges below 2**32)."""
        if high is None:
            low, high = 0, low
        span = high - low  # Lemire's method on 32-bit words
        m = self.next32() * span
        if (m & M32) < span:
            threshold = (M32 - (span - 1)) % span
            while (m & M32) < threshold:
                m = self.next32() * span
        return low + (m >> 32)

    def random(self) -> float:
        """``Generator.random()``: the top 53 bits of a 64-bit draw, in [0, 1)."""
        return (self.next64() >> 11) * (1.0 / 9007199254740992.0)

    def interval(self, top: int) -> int:
        """Uniform in [0, top] by masked rejection (numpy's ``random_interval``)."""
        if top == 0:
            return 0
        mask = (1 << top.bit_length()) - 1
        draw = self.next32 if top <= M32 else self.next64
        while True:
            value = draw() & mask
            if value <= top:
                return value

    def permutation(self, n: int) -> list[int]:
        """``Generator.permutation(n)``: Fisher-Yates over 0..n-1 from the end."""
        out = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.interval(i)
            out[i], out[j] = out[j], out[i]
        return out


# --------------------------------------------------------------------------- levels


def carve(rng: Pcg64, rows: int, cols: int, need: int) -> Grid:
    """Floor carved by a random walk inside walls, at least ``need`` cells."""
    fixed = [[WALL] * cols for _ in range(rows)]
    inner = (rows - 2) * (cols - 2)
    target_cells = min(inner, max(need, int(0.7 * inner)))
    r, c = rng.integers(1, rows - 1), rng.integers(1, cols - 1)
    d = DELTAS[ACTIONS[rng.integers(4)]]
    fixed[r][c] = FLOOR
    floor = 1
    for _ in range(50 * inner):
        if floor >= target_cells:
            break
        if rng.random() < 0.35:
            d = DELTAS[ACTIONS[rng.integers(4)]]
        nr, nc = r + d[0], c + d[1]
        if 1 <= nr < rows - 1 and 1 <= nc < cols - 1:
            r, c = nr, nc
            floor += fixed[r][c] != FLOOR
            fixed[r][c] = FLOOR
    return fixed


def score(boxes: list[Cell], targets: list[Cell]) -> tuple[int, int]:
    """How far a reverse walk took the level from solved: boxes off their targets, then
    their total distance to them (the walk's best state is the level dealt)."""
    off = sum(b not in targets for b in boxes)
    dist = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in zip(boxes, targets))
    return off, dist


def generate(seed: int, rows: int, cols: int, num_boxes: int, depth: int) -> tuple[Grid, Grid]:
    """A solvable level ``(fixed, cells)`` by reverse play (see :mod:`temper.envs.sokoban`);
    ``fixed`` holds walls, floor and targets only."""
    rng = Pcg64(seed)
    for _ in range(100):
        fixed = carve(rng, rows, cols, num_boxes + 2)
        cells = [(r, c) for r in range(rows) for c in range(cols) if fixed[r][c] == FLOOR]
        if len(cells) < num_boxes + 2:
            continue
        pick = rng.permutation(len(cells))
        targets = [cells[i] for i in pick[:num_boxes]]
        start = cells[pick[num_boxes]]
        for t in targets:
            fixed[t[0]][t[1]] = TARGET
        best: tuple[list[Cell], Cell] | None = None
        best_score = (0, 0)
        for _walk in range(8):
            boxes, player = list(targets), start
            for _ in range(max(1, depth)):
                dr, dc = DELTAS[ACTIONS[rng.integers(4)]]
                nxt = (player[0] + dr, player[1] + dc)
                if fixed[nxt[0]][nxt[1]] == WALL or nxt in boxes:
                    continue
                behind = (player[0] - dr, player[1] - dc)
                if behind in boxes:  # pull the box into the player's old cell
                    boxes[boxes.index(behind)] = player
                player = nxt
                s = score(boxes, targets)
                if s[0] >= 1 and s > best_score:
                    best, best_score = (list(boxes), player), s
        if best is None:
            continue
        state = [list(row) for row in fixed]
        for b in best[0]:
            state[b[0]][b[1]] = BOX_ON_TARGET if fixed[b[0]][b[1]] == TARGET else BOX
        p = best[1]
        state[p[0]][p[1]] = PLAYER_ON_TARGET if fixed[p[0]][p[1]] == TARGET else PLAYER
        return fixed, state
    raise RuntimeError(f"could not generate a {rows}x{cols} room with {num_boxes} boxes")


# --------------------------------------------------------------------------- play


def render(cells: Grid, symbols: list[str]) -> str:
    """One symbol per cell, rows on lines; symbols of several characters are spaced."""
    sep = "" if all(len(s) == 1 for s in symbols) else " "
    return "\n".join(sep.join(symbols[v] for v in row) for row in cells)


def on_target(cells: Grid) -> int:
    """How many boxes are on targets."""
    return sum(v == BOX_ON_TARGET for row in cells for v in row)


def lookup(action: str) -> str | None:
    """The action an answer names (case and spaces aside, or its id 1-4); None if none."""
    s = " ".join(str(action).split()).lower()
    for i, a in enumerate(ACTIONS):
        if s in (a.lower(), str(i + 1)):
            return a
    return None


def move(
    fixed: Grid, cells: Grid, name: str, steps: int, max_steps: int
) -> tuple[float, bool, bool, bool]:
    """Apply a known action in place: ``(reward, moved, success, truncated)``."""
    rows, cols = len(cells), len(cells[0])
    reward = -0.1
    dr, dc = DELTAS[name]
    pr, pc = next(
        (r, c)
        for r in range(rows)
        for c in range(cols)
        if cells[r][c] in (PLAYER, PLAYER_ON_TARGET)
    )
    nr, nc, br, bc = pr + dr, pc + dc, pr + 2 * dr, pc + 2 * dc
    moved = False
    if cells[nr][nc] in (BOX, BOX_ON_TARGET):
        if 0 <= br < rows and 0 <= bc < cols and cells[br][bc] in (FLOOR, TARGET):
            was_on, now_on = fixed[nr][nc] == TARGET, fixed[br][bc] == TARGET
            cells[br][bc] = BOX_ON_TARGET if now_on else BOX
            reward += (1.0 if now_on else 0.0) - (1.0 if was_on else 0.0)
            moved = True
    elif cells[nr][nc] in (FLOOR, TARGET):
        moved = True
    if moved:
        cells[pr][pc] = TARGET if fixed[pr][pc] == TARGET else FLOOR
        cells[nr][nc] = PLAYER_ON_TARGET if fixed[nr][nc] == TARGET else PLAYER
    success = not any(v == BOX for row in cells for v in row)
    if success:
        reward += 10.0
    return reward, moved, success, not success and steps >= max_steps


def play(
    fixed: Grid, cells: Grid, steps: int, action: str, max_steps: int
) -> tuple[int, float, bool, bool, dict[str, Any]]:
    """One step on ``cells`` in place: ``(steps, reward, terminated, truncated, info)``,
    ``steps`` counting valid actions. An answer naming no action changes nothing, costs
    nothing and is not counted, so a model's malformed reply does not use up the episode."""
    name = lookup(action)
    if name is None:
        info: dict[str, Any] = {
            "action_is_valid": False,
            "action_is_effective": False,
            "success": False,
        }
        return steps, 0.0, False, False, info
    steps += 1
    reward, moved, success, truncated = move(fixed, cells, name, steps, max_steps)
    info = {
        "action_is_valid": True,
        "action_is_effective": moved,
        "success": success,
        "boxes_on_target": on_target(cells),
    }
    return steps, reward, success, truncated, info


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """One request → its reply (module docstring)."""
    cfg = request["config"]
    symbols = [str(s) for s in cfg["symbols"]]
    if request["op"] == "reset":
        seed = int(request["seed"])
        fixed, cells = generate(
            seed, cfg["rows"], cfg["cols"], cfg["num_boxes"], cfg["search_depth"]
        )
        return {
            "observation": render(cells, symbols),
            "info": {"seed": seed, "boxes_on_target": on_target(cells)},
            "state": {"fixed": fixed, "cells": cells, "steps": 0},
        }
    if request["op"] != "step":
        raise ValueError(f"unknown op {request['op']!r}")
    state = request["state"]
    fixed, cells = state["fixed"], state["cells"]
    steps, reward, terminated, truncated, info = play(
        fixed, cells, int(state["steps"]), str(request["action"]), int(cfg["max_steps"])
    )
    return {
        "observation": render(cells, symbols),
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "info": info,
        "state": {"fixed": fixed, "cells": cells, "steps": steps},
    }


def main() -> None:
    reply = handle(json.loads(sys.stdin.read()))
    sys.stdout.write(json.dumps(reply))


if __name__ == "__main__":
    main()
