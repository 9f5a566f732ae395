"""verl interactions: a simulated user that answers each final model answer, with a score.

verl's ``rollout.multi_turn.interaction_config_path`` names a YAML file::

    interaction:
      - name: gsm8k                      # optional; default: the class name without
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction  # "Interaction"
        config: {}

Each entry's ``class_name`` selects an entry of :data:`INTERACTIONS` (keyed by the short
name, with verl's class path as an alias); a class temper has not built is refused with
the list of those it has. An interaction follows verl's lifecycle, synchronously:
``start(instance_id, **interaction_kwargs)`` when an episode begins, ``respond(instance_id,
messages) -> (done, text, score, info)`` after every model answer without a tool call (the
text goes back as a ``user`` turn, masked out of the loss; ``done`` ends the episode;
``score`` is recorded in the sample's ``turn_scores``), ``finalize(instance_id)`` at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temper.registry import Registry
from temper.rewards.functions import gsm8k

#: ``respond``'s answer: (end the episode?, the user turn's text, the turn's score, info).
Turn = tuple[bool, str, float, dict[str, Any]]


class Gsm8kInteraction:
    """verl's GSM8K user simulator: scores the latest assistant message with the strict
    GSM8K rule (the number after the last ``#### ``, 1.0 when it equals the ground truth,
    else 0.0); a correct answer ends the episode with "Your response is correct!", a wrong
    one asks the model to reflect and try again."""

    CORRECT = "Your response is correct!"
    RETRY = "Your response is incorrect! You need to reflect on your answer and try again."

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.name = str(self.config.get("name", "gsm8k"))
        self._episodes: dict[str, dict[str, Any]] = {}

    def start(self, instance_id: str, ground_truth: Any = None, **kwargs: Any) -> None:
        self._episodes[instance_id] = {"response": "", "ground_truth": ground_truth}

    def respond(self, instance_id: str, messages: Sequence[dict[str, Any]]) -> Turn:
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        self._episodes[instance_id]["response"] = str(last.get("content") or "") if last else ""
        score = self.score(instance_id)
        if score == 1.0:
            return True, self.CORRECT, score, {}
        return False, self.RETRY, score, {}

    def score(self, instance_id: str) -> float:
        episode = self._episodes[instance_id]
        if episode["ground_truth"] is None:
            return 0.0
        result = gsm8k.compute_score("", episode["response"], episode["ground_truth"])
        return float(result["score"])

    def finalize(self, instance_id: str) -> None:
        self._episodes.pop(instance_id, None)


@dataclasses.dataclass(frozen=True)
class InteractionEntry:
    """A registered interaction: how to build it from its config."""

    build: Callable[[dict[str, Any]], Any]
    doc: str


INTERACTIONS: Registry[InteractionEntry] = Registry("interaction")
INTERACTIONS.add(
    "gsm8k",
    InteractionEntry(Gsm8kInteraction, "GSM8K answer checker (verl's Gsm8kInteraction)"),
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction",
)


def default_name(class_name: str) -> str:
    """verl's name for an entry without one: the class name, less ``Interaction``, lower."""
    short = class_name.rsplit(".", 1)[-1]
    return (short[: -len("Interaction")] if short.endswith("Interaction") else short).lower()


def load_interactions(path: str | Path) -> dict[str, Any]:
    """``name -> interaction`` from a verl interaction YAML; ValueError naming the entry
    for a malformed file, an unregistered class or a repeated name."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    items = data.get("interaction") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path}: expected 'interaction: [...]' with at least one entry")
    out: dict[str, Any] = {}
    for k, item in enumerate(items):
        cls = item.get("class_name") if isinstance(item, dict) else None
        if not isinstance(cls, str):
            raise ValueError(f"{path}: interaction #{k} has no class_name")
        if cls not in INTERACTIONS:
            raise ValueError(
                f"{path}: interaction class '{cls}' is not one temper runs (verl "
                "interactions are verl's asynchronous Python; temper has its own of: "
                f"{', '.join(INTERACTIONS.names())})"
            )
        name = str(item.get("name") or default_name(cls))
        if name in out:
            raise ValueError(f"{path}: interaction name '{name}' is used twice")
        config = dict(item.get("config") or {}, name=name)
        out[name] = INTERACTIONS.get(cls).build(config)
    return out
