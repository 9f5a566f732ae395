"""DeepEyes (``env_type: deepeyes``): answer a question about an image, zooming in with a
tool first when that helps; an LLM judge grades the answer.

An episode is one row of a DeepEyes dataset (ROLL's ``DeepEyesEnv``, the
``ChenShawn/DeepEyes-Datasets-47k`` parquet files):

- ``prompt``: the chat messages, a system message (the tool's description) and a user
  message whose text marks the image with ``<image>`` (a plain string is the user text);
- ``images``: the row's images (``{"bytes": …}``, ``{"path": …}``, raw bytes or a path);
  the first one is shown;
- ``reward_model.ground_truth``: the reference answer; ``extra_info.question``: the bare
  question the judge reads.

The first observation is the user text with the image in place of ``<image>``
(:attr:`image_observations`; the row's system message is the conversation's,
:meth:`system_prompt`). Each answer then is read whole (:attr:`whole_response`):

- an ``<answer>…</answer>`` with text, or no ``<tool_call>`` at all: the episode ends;
- otherwise its last ``<tool_call>`` runs on the original image
  (:mod:`temper.envs.image_zoom`): the next observation is the new image inside
  ``<tool_response>`` with the turn prompt, or the call's ``Error: …`` text (no image);
- after ``max_steps`` answers the episode is cut (truncated) and scored as it stands.

The reward, 0 on every step but the last, is :mod:`temper.envs.deepeyes_reward`'s: the
judge (the run's ``reward.judge`` engine) grades the last answer. The step that ends the
episode leaves its :meth:`judge_request`; the env manager sends the requests of all envs
that ended in a turn to the judge at once and hands each verdict to :meth:`judged` (so
the judge sees batches, as ROLL's concurrent env threads give its vLLM server). A judge
call that fails scores accuracy 0 and is recorded in ``info`` (``judge_error``; ROLL
marks the sample -999).

``data_args.preprocessing_num_workers`` is ROLL's parallelism for encoding the dataset;
rows are read here once per process, as they are asked for.

Rows: the reset seed picks the row (``Random(seed)``), so an env group shares its row and
a resumed run replays the same rows (ROLL walks a shuffled order, handing each new seed the
next row: the same distribution). Rows that cannot be used — no image, an image that is not
one, no ground truth, no question, a prompt without exactly one ``<image>`` — are skipped
and reported by file and row (:class:`temper.data.errors.SkippedRows`), never crashed on.
"""

from __future__ import annotations

import functools
import io
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from temper.data.errors import DataError, RowIssue, SkippedRows
from temper.data.sources import read_rows

from .base import JudgeRequest, TextEnv
from .deepeyes_reward import combine, extract_answer, judge_messages, verdict_score
from .image_zoom import last_tool_call, run_tool_call
from .registry import register_env

__all__ = ["DeepEyesEnv", "DeepEyesRow", "load_rows"]

log = logging.getLogger("temper.envs")
IMAGE = "<image>"
KEY = "env_config.data_args.file_name"
TURN_PROMPT = (
    "\nThink, call image_zoom_in_tool again if a closer look helps, then answer. Reply as "
    "<think>...</think> <tool_call>...</tool_call> (only when calling a tool) "
    "<answer>...</answer>"
)
_DATA_ARGS = {"file_name", "preprocessing_num_workers"}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class DeepEyesRow:
    """One usable row: its texts and its first image's encoded bytes."""

    system: str
    user: str  # holds exactly one <image>
    image: bytes
    question: str
    ground_truth: str


def _messages(prompt: Any) -> tuple[str, str]:
    """(system, user) texts of a row's prompt (ROLL's reading: a leading system message,
    then the next message's content)."""
    if isinstance(prompt, str):
        return "", prompt
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError("prompt is neither text nor a list of messages")
    first = prompt[0]
    if not isinstance(first, dict):
        raise ValueError("prompt messages must be {role, content} objects")
    if first.get("role") == "system":
        if len(prompt) < 2 or not isinstance(prompt[1], dict):
            raise ValueError("prompt has a system message but no user message")
        return str(first.get("content") or ""), str(prompt[1].get("content") or "")
    return "", str(first.get("content") or "")


def _field(row: dict[str, Any], column: str, key: str) -> Any:
    """``row[column][key]``, None when absent; ``ValueError`` when the column is not a
    mapping."""
    value = row.get(column)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"column '{column}' is {type(value).__name__}, not an object with '{key}'")
    return value.get(key)


def _row(row: dict[str, Any], base: Path) -> DeepEyesRow:
    """A usable row, or ``ValueError`` saying why not."""
    from PIL import Image

    from temper.data.vision import image_bytes

    system, user = _messages(row.get("prompt"))
    if user.count(IMAGE) != 1:
        raise ValueError(f"the prompt's user text has {user.count(IMAGE)} {IMAGE} marks, not 1")
    images = row.get("images")
    if images is None or (isinstance(images, (list, tuple)) and not images):
        raise ValueError("no image (column 'images')")
    first = images[0] if isinstance(images, (list, tuple)) else images
    try:
        data = image_bytes(first, base, "image 0 of column 'images'")
        with Image.open(io.BytesIO(data)) as img:
            img.size  # noqa: B018 - reads the header: is it an image at all
    except Exception as err:  # PIL raises many types for a broken file
        raise ValueError(f"image 0 cannot be read ({type(err).__name__}: {err})") from err
    truth = _field(row, "reward_model", "ground_truth")
    if truth is None or str(truth).strip() == "":
        raise ValueError("no ground truth (reward_model.ground_truth)")
    question = _field(row, "extra_info", "question")
    if question is None:
        raise ValueError("no question (extra_info.question)")
    return DeepEyesRow(system, user, data, str(question), str(truth))


@functools.cache
def load_rows(files: tuple[str, ...]) -> tuple[DeepEyesRow, ...]:
    """The usable rows of ``files``, read once per process (bad rows skipped, reported)."""
    skipped = SkippedRows(KEY, "skip")
    rows, read = [], 0
    for src in read_rows(list(files), KEY):
        read += 1
        if src.row is None:
            skipped.add(RowIssue(src.file, src.where, src.problem or "unreadable"))
            continue
        try:
            rows.append(_row(src.row, Path(src.file).parent))
        except ValueError as err:
            skipped.add(RowIssue(src.file, src.where, str(err)))
    skipped.summarize("deepeyes data", read)
    if not rows:
        raise DataError(
            KEY,
            f"{', '.join(files)} has no usable DeepEyes row{skipped.first()}",
            "point data_args.file_name at DeepEyes rows (prompt, images, "
            "reward_model.ground_truth, extra_info.question)",
        )
    return tuple(rows)


@register_env("deepeyes")
class DeepEyesEnv(TextEnv):
    """A DeepEyes episode (module doc)."""

    whole_response = True
    image_observations = True
    uses_judge = True
    render_modes = ("text", "rgb_array")

    def __init__(
        self,
        *,
        data_args: dict[str, Any] | None = None,
        max_steps: int = 10,
        acc_weight: float = 0.8,
        format_weight: float = 0.2,
        tool_weight: float = 1.2,
        enable_thinking: bool = False,
        mode: str = "train",
        seed: int | None = None,
        epoch: int = 0,
        idx: int = 0,
    ) -> None:
        # mode / seed / epoch / idx: ROLL's dataset walk and its resume point; here the
        # reset seed picks the row and the env manager's state resumes (module doc)
        args = dict(data_args or {})
        unknown = sorted(set(args) - _DATA_ARGS)
        if unknown:
            raise ValueError(
                f"data_args {', '.join(unknown)}: not read (use {', '.join(sorted(_DATA_ARGS))})"
            )
        files = args.get("file_name")
        if not files:
            raise ValueError("data_args.file_name is required (DeepEyes parquet files)")
        self.files = tuple(str(f) for f in (files if isinstance(files, list) else [files]))
        if int(max_steps) < 1:
            raise ValueError(f"max_steps is {max_steps}; an episode needs at least 1 step")
        if mode not in ("train", "val"):
            raise ValueError(f"mode '{mode}' is neither train nor val")
        self.max_steps = int(max_steps)
        self.weights = (float(acc_weight), float(format_weight), float(tool_weight))
        self.template_kwargs = {"enable_thinking": bool(enable_thinking)}
        self.pending: tuple[str, bool] | None = None  # (answer, format error) to grade
        self.row: DeepEyesRow | None = None
        self.original: Any = None  # the row's image (PIL), what the tools work on
        self.shown: Any = None  # the image of the current observation, or None
        self.text_obs = ""
        self.steps = 0
        self.tool_failed = False

    # ------------------------------------------------------------------ interface

    @property
    def action_space_text(self) -> str:
        return ""

    @property
    def instructions(self) -> str:
        return ""

    def judge_request(self) -> JudgeRequest | None:
        if self.pending is None or self.row is None:
            return None
        answer = self.pending[0]
        messages = judge_messages(self.row.question, self.row.ground_truth, answer)
        return JudgeRequest(messages, dict(self.template_kwargs))

    def problem(self) -> str | None:
        missing = [f for f in self.files if not Path(f).expanduser().exists()]
        if missing:
            return f"{missing[0]} is not a file on this machine (DeepEyes rows)"
        return None

    def system_prompt(self) -> str:
        return self.row.system if self.row is not None else ""

    def observation_images(self) -> list[Any]:
        return [] if self.shown is None else [self.shown]

    def render(self, mode: str = "text") -> str | np.ndarray:
        if mode == "text":
            return self.text_obs
        if mode == "rgb_array":
            image = self.shown if self.shown is not None else self.original
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
        raise ValueError(f"deepeyes renders text or rgb_array, not {mode}")

    # ------------------------------------------------------------------ episodes

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        from temper.data.vision import decode

        rows = load_rows(self.files)
        index = random.Random(int(seed)).randrange(len(rows))
        self.row = rows[index]
        self.original = decode(self.row.image)
        self.shown = self.original
        self.text_obs = self.row.user
        self.steps, self.tool_failed, self.pending = 0, False, None
        return self.text_obs, {"index": index}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.row is None:
            raise ValueError("reset the env before stepping it")
        self.steps += 1
        info: dict[str, Any] = {"tool_call": False, "tool_error": False}
        answers = _ANSWER.findall(action_text)  # an answer with any text ends the episode
        call = None if answers and answers[-1] else last_tool_call(action_text)
        done = call is None
        if call is not None:
            result = run_tool_call(call, self.original)
            info.update(tool_call=True, tool_error=not result.ok)
            self.tool_failed |= not result.ok
            if result.ok:
                self.shown = result.image
                self.text_obs = f"<tool_response>{IMAGE}{TURN_PROMPT}</tool_response>"
            else:
                self.shown, self.text_obs = None, result.error
        truncated = not done and self.steps >= self.max_steps
        if not (done or truncated):
            return self.text_obs, 0.0, False, False, info
        self.pending = extract_answer(action_text)  # graded by judged()
        self.shown, self.text_obs = None, ""
        return "", 0.0, done, truncated, info

    def judged(self, verdict: str | None, error: str = "") -> tuple[float, dict[str, Any]]:
        """The episode's reward from the judge's verdict on its last answer
        (:mod:`temper.envs.deepeyes_reward`)."""
        if self.pending is None:
            raise ValueError("no episode end is waiting for the judge")
        answer, format_error = self.pending
        self.pending = None
        info: dict[str, Any] = {}
        score = None
        if verdict is None:
            info["judge_error"] = error or "the judge gave no verdict"
            log.warning("deepeyes judge failed: %s", info["judge_error"])
        else:
            score = verdict_score(verdict)
            info["judge_verdict"] = verdict[:200]
            info["judge_unreadable"] = score is None
        acc_w, fmt_w, tool_w = self.weights
        out = combine(
            score or 0.0,
            format_error,
            answer_length=len(answer),
            steps=self.steps,
            tool_failed=self.tool_failed,
            acc_weight=acc_w,
            format_weight=fmt_w,
            tool_weight=tool_w,
        )
        info.update(
            acc_reward=out.acc,
            format_reward=out.format,
            tool_reward=out.tool,
            success=out.acc > 0.5,
        )
        return out.reward, info
