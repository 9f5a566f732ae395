"""Synthetic, seeded RLVR tasks that temper makes itself (quickstart, tests, CI).

No machine here reaches a dataset hub, and a learnable toy task is the fastest proof that
a pipeline trains. Rows have verl's shape, so the same files work with verl::

    {"data_source": "arithmetic", "ability": "math",
     "prompt": [{"role": "user", "content": "What is 7 + 5? Put the final answer after ####."}],
     "reward_model": {"style": "rule", "ground_truth": "12"},
     "extra_info": {"split": "train", "index": 0, ...}}

- ``arithmetic``: sums/differences (and, with ``ops="+-*"``, products) of numbers in
  ``[min_operand, max_operand]``; ground truth the result as a string (scored like gsm8k:
  the number after ``####``).
- ``arithmetic_hard``: the same rows with two-digit operands by default (10-99), a task
  SmolLM2-135M starts well below 50% on (~6% greedy) where ``arithmetic``'s one-digit
  default is nearly learnt within the quickstart's 25 steps.
- ``countdown``: reach ``target`` with ``numbers`` (each once, ``+ - * /``); ground truth
  the JSON *string* ``{"target": T, "numbers": [...]}`` (a string so that every file format,
  csv included, stores it the same). Targets are always reachable (built from an
  expression, kept in ``extra_info.solution``).
- ``visual_color``: an image task for vision-language models, in geometry3k's shape
  (``images: [{"bytes": PNG}]``, ``<image>`` in the prompt): a square of one of
  ``colors`` on a white background, "Which colour is the square?"; ground truth the
  colour's name (scored by the word the answer opens with).

    python -m temper.data.tasks arithmetic data/train.parquet --n 1000 --seed 0 max_operand=20
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temper.config.errors import unknown_name
from temper.data.row_files import write_rows

ARITHMETIC_SUFFIX = "Put the final answer after ####."


def _row(source: str, content: str, truth: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "data_source": source,
        "ability": "math",
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra,
    }


def evaluate_terms(terms: list[int], ops: list[str]) -> int:
    """``terms[0] ops[0] terms[1] ...`` with the usual precedence (``*`` before ``+ -``)."""
    total, sign, product = 0, 1, terms[0]
    for op, term in zip(ops, terms[1:]):
        if op == "*":
            product *= term
        else:
            total += sign * product
            sign, product = (1 if op == "+" else -1), term
    return total + sign * product


def arithmetic_rows(
    n: int,
    seed: int = 0,
    max_operand: int = 10,
    num_terms: int = 2,
    ops: str = "+-",
    allow_negative: bool = False,
    split: str = "train",
    min_operand: int = 0,
    response: bool = False,
    pairs: bool = False,
) -> list[dict[str, Any]]:
    """``n`` questions "What is a + b - c?" with operands in [min_operand, max_operand].

    ``ops`` is drawn from ``+ - *`` (``*`` binds tighter, as in Python). With
    ``allow_negative=False`` expressions whose value is below 0 are redrawn (small models
    find negative answers much harder, which hides whether training works at all).
    ``response=True`` adds a ``response`` column, a formatted right answer
    (``"27 + 82 = 109\n#### 109"``), for supervised fine-tuning (``pipeline: sft``).
    ``pairs=True`` adds a preference pair for ``pipeline: dpo``: ``chosen``, that right
    answer, and ``rejected``, the same format with a wrong value (off by 1 to 10, never
    negative). The wrong value comes from its own generator (seeded by ``seed`` and the
    row), so the questions are those of the same seed without pairs.
    """
    if (
        num_terms < 2
        or not 0 <= min_operand <= max_operand
        or max_operand < 1
        or not ops
        or set(ops) - set("+-*")
    ):
        raise ValueError(
            "arithmetic needs num_terms >= 2, 0 <= min_operand <= max_operand, "
            "max_operand >= 1, ops within '+-*'"
        )
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        while True:
            terms = [rng.randint(min_operand, max_operand) for _ in range(num_terms)]
            signs = [rng.choice(ops) for _ in range(num_terms - 1)]
            value = evaluate_terms(terms, signs)
            if allow_negative or value >= 0:
                break
        expr = str(terms[0]) + "".join(f" {s} {t}" for s, t in zip(signs, terms[1:]))
        extra = {"split": split, "index": index, "expression": expr, "num_terms": num_terms}
        row = _row("arithmetic", f"What is {expr}? {ARITHMETIC_SUFFIX}", str(value), extra)
        if response:
            row["response"] = f"{expr} = {value}\n#### {value}"
        if pairs:
            row["chosen"] = f"{expr} = {value}\n#### {value}"
            wrong = _wrong_value(value, random.Random(f"{seed}-{index}"))
            row["rejected"] = f"{expr} = {wrong}\n#### {wrong}"
        rows.append(row)
    return rows


def _wrong_value(value: int, rng: random.Random) -> int:
    """A value 1 to 10 away from ``value``, below it only where that stays >= 0."""
    offset = rng.randint(1, 10)
    if value - offset >= 0 and rng.random() < 0.5:
        return value - offset
    return value + offset


def arithmetic_hard_rows(
    n: int,
    seed: int = 0,
    min_operand: int = 10,
    max_operand: int = 99,
    num_terms: int = 2,
    ops: str = "+-",
    allow_negative: bool = False,
    split: str = "train",
    response: bool = False,
    pairs: bool = False,
) -> list[dict[str, Any]]:
    """``arithmetic`` with two-digit operands by default: "What is 27 + 82?".

    Rows are ``arithmetic`` rows (same data_source and reward); only the defaults differ.
    SmolLM2-135M-Instruct answers about 6% of them greedily before training (the
    one-digit quickstart task: about 25%), and ~19% of its groups of 4 samples at
    temperature 0.7 hold both a right and a wrong answer, so GRPO has signal from step 1.
    The one-digit task is hard only by format: given "a + b =" as the start of its
    answer the model completes 83% of one-digit sums right, but 19% of two-digit ones,
    so here RL has arithmetic to learn once the format is learnt. Three terms, three
    digits or ``*`` (``ops="+-*"``) are harder still (0-8% greedy).
    """
    return arithmetic_rows(
        n,
        seed,
        max_operand,
        num_terms,
        ops,
        allow_negative,
        split,
        min_operand=min_operand,
        response=response,
        pairs=pairs,
    )


def countdown_prompt(numbers: list[int], target: int) -> str:
    """The TinyZero countdown instruction (answer inside <answer> tags)."""
    return (
        f"Using the numbers {numbers}, create an equation that equals {target}. "
        "You can use basic arithmetic operations (+, -, *, /) and each number can only be "
        "used once. Show your work in <think> </think> tags. And return the final answer "
        "in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )


def countdown_rows(
    n: int,
    seed: int = 0,
    num_numbers: int = 3,
    max_number: int = 20,
    ops: str = "+-*",
    max_target: int = 1000,
    split: str = "train",
) -> list[dict[str, Any]]:
    """``n`` puzzles: ``num_numbers`` numbers in [1, max_number] and a reachable target.

    The target is the value (in 1..max_target) of a random left-to-right expression over a
    shuffle of all the numbers, so every puzzle has at least that solution.
    """
    if num_numbers < 2 or max_number < 1 or not ops or set(ops) - set("+-*"):
        raise ValueError("countdown needs num_numbers >= 2, max_number >= 1, ops within '+-*'")
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        while True:
            numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
            order = rng.sample(numbers, len(numbers))
            expr, value = str(order[0]), order[0]
            for number in order[1:]:
                op = rng.choice(ops)
                value = (
                    value + number
                    if op == "+"
                    else value - number
                    if op == "-"
                    else (value * number)
                )
                expr = f"({expr} {op} {number})"
            if 1 <= value <= max_target:
                break
        truth = json.dumps({"target": value, "numbers": numbers})
        extra = {"split": split, "index": index, "solution": expr[1:-1] if expr[0] == "(" else expr}
        rows.append(_row("countdown", countdown_prompt(numbers, value), truth, extra))
    return rows


VISUAL_COLORS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
    "black": (20, 20, 20),
    "purple": (140, 50, 170),
}
VISUAL_QUESTION = "Which colour is the square?"


def visual_color_rows(
    n: int,
    seed: int = 0,
    colors: str = "red,green,blue,yellow",
    size: int = 56,
    split: str = "train",
) -> list[dict[str, Any]]:
    """``n`` images (``size``×``size`` PNG) of a square in one of ``colors`` (comma-separated
    names of :data:`VISUAL_COLORS`) at a random place, 50-90% of the side long."""
    import io

    from PIL import Image, ImageDraw

    names = [c.strip() for c in colors.split(",") if c.strip()]
    unknown = [c for c in names if c not in VISUAL_COLORS]
    if len(names) < 2 or unknown or size < 28:
        raise ValueError(
            f"visual_color needs >= 2 colors among {', '.join(VISUAL_COLORS)} and size >= 28"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        color = rng.choice(names)
        side = rng.randint(int(0.5 * size), int(0.9 * size))
        x, y = rng.randint(0, size - side), rng.randint(0, size - side)
        image = Image.new("RGB", (size, size), (255, 255, 255))
        ImageDraw.Draw(image).rectangle([x, y, x + side - 1, y + side - 1], VISUAL_COLORS[color])
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        row = _row("visual_color", f"<image>{VISUAL_QUESTION}", color, {"split": split})
        row["ability"] = "vision"
        row["extra_info"]["index"] = index
        row["images"] = [{"bytes": buf.getvalue(), "path": None}]
        rows.append(row)
    return rows


TASKS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "arithmetic": arithmetic_rows,
    "arithmetic_hard": arithmetic_hard_rows,
    "countdown": countdown_rows,
    "visual_color": visual_color_rows,
}


def make_task_rows(name: str, n: int, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
    """``n`` rows of task ``name`` (deterministic in ``seed`` and ``kwargs``)."""
    if name not in TASKS:
        raise unknown_name("task", name, TASKS)
    return TASKS[name](n, seed, **kwargs)


def write_task(name: str, path: str | Path, n: int, seed: int = 0, **kwargs: Any) -> Path:
    """Write ``n`` rows of task ``name`` to ``path`` (.parquet, .jsonl, .json or .csv)."""
    return write_rows(make_task_rows(name, n, seed, **kwargs), path)


TASK_SCHEME = "task:"


def task_cache_dir() -> Path:
    """Where generated task files live: ``$TEMPER_CACHE/tasks`` (default ~/.cache/temper)."""
    root = os.environ.get("TEMPER_CACHE") or os.path.expanduser("~/.cache/temper")
    return Path(root) / "tasks"


def resolve_task_uri(uri: str) -> Path:
    """``task:NAME?n=N&seed=S&key=value`` -> a parquet file of that task (written once).

    Lets a config name a generated dataset directly (the quickstart does), so no
    separate data-preparation step is needed; the file is cached by its parameters.
    """
    spec = uri[len(TASK_SCHEME) :]
    name, _, query = spec.partition("?")
    params = {k: _value(v) for k, v in (p.split("=", 1) for p in query.split("&") if p)}
    n = int(params.pop("n", 1000))
    seed = int(params.pop("seed", 0))
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    path = task_cache_dir() / f"{name}-{digest}.parquet"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.parquet")
        write_task(name, tmp, n, seed, **params)
        tmp.replace(path)  # atomic: concurrent runs never read a half-written file
    return path


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a synthetic RLVR task dataset.")
    parser.add_argument("name", choices=sorted(TASKS))
    parser.add_argument("path")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("options", nargs="*", help="task knobs as key=value (max_operand=20)")
    args = parser.parse_intermixed_args(argv)
    kwargs = {}
    for option in args.options:
        key, sep, value = option.partition("=")
        if not sep:
            parser.error(f"option '{option}' is not key=value")
        kwargs[key] = _value(value)
    print(write_task(args.name, args.path, args.n, args.seed, **kwargs))


if __name__ == "__main__":
    main()
