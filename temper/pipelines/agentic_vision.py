"""The vision-language trajectory env manager (ROLL's ``VLTrajEnvManager``): the board as
an image.

One multi-turn conversation per episode, one sample per episode, as the ``trajectory``
manager makes, but the model *sees* each state: the env renders it as an RGB array
(``TextEnv.render("rgb_array")``, one 16×16 tile per cell for the grid games), and each
turn's user message is a content list

``[text: pre_step_template(turn_idx), image, text: next_step_template(actions_left,
max_response_length)]``

with the env instruction put before the first turn's ``pre_step`` text, and the tag's
``system_template`` (ROLL ``agent_system_template``) as the system message when it is not
empty.

An env whose observations hold images itself (``TextEnv.image_observations``: DeepEyes,
a question about a photo, then each zoomed crop) is shown its own way instead: the
observation text between the templates, each ``<image>`` it marks replaced by the env's
image (:func:`observation_content`), zero or more images a turn, only the tag's
``env_instruction`` before the first, and the env's own system message (its episode's,
``TextEnv.system_prompt``) over the tag's.

The model's answers are assistant messages in between; rewards are summed into the
episode's score, as ROLL's ``formulate_rollouts`` scores the last response token.

Tokens: the conversation is rendered with the chat template (an image part renders as the
model's placeholder, Qwen2-VL's ``<|vision_start|><|image_pad|><|vision_end|>``), and each
placeholder is expanded to its image's token count (the frame resized to the model's grid,
:func:`temper.data.vision.smart_resize`). Each turn is generated from the episode's
sequence so far with the pixel inputs of every image in it (ROLL re-renders the
conversation each turn; for a prefix-stable template the two are the same ids), and the
trained sample is that sequence: the generated ids learnt (``response_mask`` 1), the
rest context. Its ``multi_modal_inputs`` hold the pixel values of the images that remain
in it (observation images after the last answer are cut with the rest of that tail), so
the trainer's forward scatters each image into its placeholders wherever in the sequence
they are (:mod:`temper.training.vision`). An answer that holds an image or video
placeholder token ends its episode: in a later turn's context neither engine (nor ROLL's
processor) could tell it from an image slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from temper.config.schema import TemperConfig
from temper.data.vision import (
    MULTI_MODAL_DATA,
    MULTI_MODAL_INPUTS,
    ImageInput,
    load_vision_processor,
)
from temper.envs import EnvManager, EnvSlot
from temper.envs.registry import EnvSpec
from temper.pipelines.agentic_rollout import EnvResponder, EpisodeLog, Played, multi_turn_settings
from temper.pipelines.agentic_vision_checks import not_vision
from temper.pipelines.trajectories import trajectory_batch
from temper.pipelines.vl_turns import (
    IMAGE_MARK,
    expand_image_ids,
    frame_image,
    image_starts,
    observation_content,
    pil_image,
    vl_turn_content,
)
from temper.rollout import RolloutEngine, SamplingParams
from temper.rollout.chat import ChatTokenizer, Message
from temper.rollout.multiturn import Trajectory
from temper.rollout.partial import Segments
from temper.rollout.turns import Turn, generate_turns

__all__ = [
    "IMAGE_MARK",
    "VLPlayer",
    "expand_image_ids",
    "frame_image",
    "image_starts",
    "observation_content",
    "pil_image",
    "vl_turn_content",
]


@dataclasses.dataclass
class _Episode:
    """One VL episode in play: its trajectory, images (and where their tokens start)."""

    slot: EnvSlot
    spec: EnvSpec
    traj: Trajectory
    rendered: str  # the text the next turn is generated from (placeholders unexpanded)
    images: list[ImageInput]
    starts: list[int]  # sequence position of each image's first token


class VLPlayer:
    """Plays the VL trajectory manager's episodes (module doc); built once per run."""

    def __init__(self, cfg: TemperConfig, engine: RolloutEngine, tokenizer: Any) -> None:
        vision = load_vision_processor(
            cfg.model.path, tokenizer, cfg.data, trust_remote_code=cfg.model.trust_remote_code
        )
        if vision is None:
            raise not_vision(cfg.model.path)
        self.vision = vision
        self.placeholders = {vision.image_token_id}
        if vision.has_video_token:
            self.placeholders.add(int(tokenizer.convert_tokens_to_ids(vision.video_token)))
        self.engine = engine
        self.chat = ChatTokenizer(
            tokenizer, template_kwargs=dict(cfg.data.apply_chat_template_kwargs)
        )
        self.settings = multi_turn_settings(cfg)
        self.stop_ids = [int(i) for i in (engine.eos_token_ids or [tokenizer.eos_token_id])]
        pad = engine.pad_token_id
        self._pad = int(pad if pad is not None else (tokenizer.pad_token_id or 0))

    @property
    def pad_token_id(self) -> int:
        return self._pad

    def play_round(
        self,
        manager: EnvManager,
        step: int,
        params: SamplingParams,
        round_: int = 0,
        groups: Sequence[int] | None = None,
        segments: Segments | None = None,
    ) -> Played:
        """Every episode of ``manager`` (of ``groups``) for ``step``, one row each."""
        if segments is not None:  # refused by check_vl_trajectory
            raise ValueError("a partial rollout does not carry a VL episode's images")
        episodes = [
            self._start(manager, s, step, round_) for s in manager.reset(step, round_, groups)
        ]
        respond = EnvResponder(manager, [e.slot for e in episodes])
        live = list(range(len(episodes)))
        calls = 0
        while live:
            budgets = {i: self._budget(episodes[i]) for i in live}
            for i in live:
                if budgets[i] < 1:
                    episodes[i].traj.stop_reason = "context"
            live = [i for i in live if budgets[i] >= 1]
            if not live:
                break
            outs = self._generate([episodes[i] for i in live], [budgets[i] for i in live], params)
            calls += 1
            texts = []
            for i, turn in zip(live, outs):
                t = episodes[i].traj
                t.add_turn(turn)
                content = self.chat.assistant_content(turn.ids, self.stop_ids)
                t.messages.append({"role": "assistant", "content": content})
                texts.append(content)
            feedback = respond(list(live), texts)
            live = [
                i
                for i, turn, fb in zip(live, outs, feedback)
                if self._after_turn(manager, episodes[i], turn.ids, fb)
            ]
        for e in episodes:
            _finish(e)
        trajs = [e.traj for e in episodes]
        batch = trajectory_batch(trajs, self._pad)
        kept = [_kept_images(e) for e in episodes]
        data_inputs = [self.vision.model_inputs(images) for images in kept]
        batch.objects[MULTI_MODAL_INPUTS] = [inputs for _, inputs in data_inputs]
        # the prompt's ids show every board alike (image tokens): its state is the board
        batch.objects["start_key"] = [
            (e.slot.tag, tuple(e.traj.prompt_ids), e.slot.observation) for e in episodes
        ]
        logs = [
            EpisodeLog(
                e.slot,
                _text_messages(e.traj.messages),
                t.episode_return,
                t.num_turns,
                t.stop_reason,
            )
            for e, t in zip(episodes, trajs)
        ]
        n = max(len(trajs), 1)
        metrics = {
            "rollout/generate_calls": float(calls),
            "rollout/turn_cut_frac": sum(t.cut_turns for t in trajs)
            / max(sum(t.num_turns for t in trajs), 1),
            "rollout/context_stop_frac": sum(t.stop_reason == "context" for t in trajs) / n,
            "rollout/vision_token_stop_frac": sum(t.stop_reason == "vision_token" for t in trajs)
            / n,
            "rollout/sequence_length_mean": sum(len(t) for t in trajs) / n,
            "rollout/images_per_episode": sum(len(k) for k in kept) / n,
        }
        return Played(batch, batch, logs, metrics)

    # ------------------------------------------------------------------ an episode

    def _frame(self, manager: EnvManager, env_id: int) -> ImageInput:
        frame = manager.env(env_id).render("rgb_array")
        if isinstance(frame, str):
            raise TypeError(f"env {env_id} rendered text for rgb_array")
        return frame_image(frame, self.vision)

    def _observation(
        self, manager: EnvManager, env_id: int, spec: EnvSpec, turn: int, instruction: str = ""
    ) -> tuple[list[dict[str, Any]], list[ImageInput]]:
        """A turn's user content and its images: the env's own images where its text marks
        them (``image_observations``), else the rendered state between the templates."""
        env = manager.env(env_id)
        left = spec.max_turns - turn + 1
        if not env.image_observations:
            return vl_turn_content(spec, turn, left, instruction), [self._frame(manager, env_id)]
        images = [pil_image(img, self.vision) for img in env.observation_images()]
        text = manager.observation(env_id)
        if text.count(IMAGE_MARK) != len(images):
            raise ValueError(
                f"env {env_id} ({spec.env_type}) marks {text.count(IMAGE_MARK)} images in its "
                f"observation but returns {len(images)}"
            )
        return observation_content(spec, text, turn, left, instruction), images

    def _start(self, manager: EnvManager, slot: EnvSlot, step: int, round_: int) -> _Episode:
        spec = manager.specs[slot.tag]
        env = manager.env(slot.env_id)
        # an env that brings its own prompt states its own format: only the tag's
        # env_instruction goes first (ROLL's), not the manager's reply-format line
        instruction = spec.env_instruction if env.image_observations else slot.instruction
        content, images = self._observation(manager, slot.env_id, spec, 1, instruction)
        system = env.system_prompt() or spec.system_template
        messages: list[Message] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": content})
        ids, text = self.chat.prompt(messages)
        counts = [img.tokens for img in images]
        ids = expand_image_ids(ids, self.vision.image_token_id, counts)
        starts = image_starts(ids, self.vision.image_token_id, counts)
        suffix = f"#r{round_}" if round_ else ""
        meta = {
            "uid": f"{step}:{slot.group_id}{suffix}",
            "tag": slot.tag,
            "group_id": slot.group_id,
            "seed": slot.seed,
            "env_id": slot.env_id,
        }
        traj = Trajectory(meta, messages, ids)
        return _Episode(slot, spec, traj, text, images, starts)

    def _budget(self, e: _Episode) -> int:
        per_turn = e.spec.max_tokens_per_turn
        limit = self.settings.max_model_len
        return per_turn if limit is None else min(per_turn, limit - len(e.traj))

    def _after_turn(self, manager: EnvManager, e: _Episode, ids: list[int], fb: Any) -> bool:
        """Record the env's answer; show the next state; False when the episode ends."""
        t = e.traj
        t.turn_rewards.append(float(fb.reward))
        t.infos.append(dict(fb.info))
        if fb.done:
            t.stop_reason = "done"
            return False
        if self.placeholders.intersection(ids):
            # a generated image/video placeholder token: the model would count it as one
            # more image slot in the next turn's context (ROLL's processor as well), so
            # the episode ends with this answer (the trainer's forward handles it)
            t.stop_reason = "vision_token"
            return False
        turn = t.num_turns + 1
        content, images = self._observation(manager, e.slot.env_id, e.spec, turn)
        new = [{"role": "user", "content": content}]
        delta, text = self.chat.continuation(
            e.rendered, t.messages, ids, t.messages[-1]["content"], new
        )
        counts = [img.tokens for img in images]
        delta = expand_image_ids(delta, self.vision.image_token_id, counts)
        limit = self.settings.max_model_len
        if limit is not None and len(t) + len(delta) >= limit:
            t.stop_reason = "context"
            return False
        starts = image_starts(delta, self.vision.image_token_id, counts)
        e.starts.extend(len(t) + s for s in starts)
        e.images.extend(images)
        t.append(delta, 0)
        t.messages.extend(new)
        t.user_turns += 1
        e.rendered = text
        return True

    def _generate(
        self, eps: list[_Episode], budgets: list[int], params: SamplingParams
    ) -> list[Turn]:
        """One engine call for the live episodes, each with the pixels of its images."""
        rows = [e.traj.prompt_ids + e.traj.response_ids for e in eps]
        pairs = [self.vision.model_inputs(e.images) for e in eps]
        objects: dict[str, list[Any]] = {
            MULTI_MODAL_DATA: [data for data, _ in pairs],
            MULTI_MODAL_INPUTS: [inputs for _, inputs in pairs],
        }
        return generate_turns(self.engine, rows, self._pad, budgets, params, objects)


def _finish(e: _Episode) -> None:
    """Drop the context after the last answer (nobody answered it)."""
    e.traj.trim()


def _kept_images(e: _Episode) -> list[ImageInput]:
    """The images whose tokens are still in the finished sequence."""
    return [img for img, s in zip(e.images, e.starts) if s < len(e.traj)]


def _text_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages with content lists flattened to text (``<image>`` for an image), for
    dialogue files and validation samples."""
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = "".join(
                p.get("text", "") if p.get("type") == "text" else f"<{p.get('type')}>"
                for p in content
            )
        out.append({**m, "content": content})
    return out
