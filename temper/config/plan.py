"""The run's plan: what a run derives from its config before loading anything.

Data only; :func:`temper.config.derive.derive` computes it, as part of validation.
"""

from __future__ import annotations

import dataclasses

# The optional parts of a run a pipeline's step can use (``Catalog.pipeline_uses``, a
# pipeline record's ``uses``): the plan turns on only these besides the trained actor.
ROLLOUT = "rollout"  # a rollout engine: the step generates (RL); else none is built
REFERENCE = "reference"  # a frozen reference policy, when the config asks for a KL term
CRITIC = "critic"  # a value model, when the advantage estimator needs values
#: The step compares with the frozen reference whatever the KL keys say (DPO's loss is a
#: ratio to it): with REFERENCE, the plan turns the reference on unless refused.
REFERENCE_ALWAYS = "reference_always"
#: The pipeline loads no policy model (``eval`` scores texts): ``model.path`` may be empty.
NO_POLICY = "no_policy"
#: The pipeline trains nothing (generate, eval): no step, optimizer or actor placement to
#: explain.
NO_TRAINING = "no_training"
#: The trained model is a scorer, not a policy: the backbone with a scalar head and no LM
#: head, saved as a sequence-classification model (reward-model training).
SCORE_HEAD = "score_head"
#: An implicit process reward model trained alongside the policy (PRIME): its own trained
#: engine (and frozen reference) on the actor's devices.
PRM = "prm"
#: The producer scores samples with ``reward.model`` when it is enabled (RLVR and its
#: kin; an agentic run's rewards are its environments'): on the Ray backend its own
#: worker group is placed for it (``temper.cluster.reward``).
REWARD_MODEL = "reward_model"
#: What an RL step can use: all of them (RLVR and agentic).
RL_PARTS = frozenset({ROLLOUT, REFERENCE, CRITIC})


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one step of a pipeline trains on, as its pipeline declares it.

    ``samples``: samples (responses, episodes) per step — the batch arithmetic's unit;
    ``rows``: how ``temper check`` explains it, ``(name, value, how)`` each;
    ``groups``: the groups those samples come in (a prompt's responses, an env group's
    episodes) — what a streaming rollout hands over; 0 where a step has none;
    ``at_least``: ``samples`` is a lower bound (one sample per env step: the count varies
    with the episodes' lengths), so a mini-batch may be larger and need not divide it
    (the last mini-batch of a step takes the rest).
    """

    samples: int
    rows: tuple[tuple[str, str, str], ...]
    groups: int = 0
    at_least: bool = False


@dataclasses.dataclass
class TrainArithmetic:
    """Batch arithmetic of one trained role."""

    role: str
    devices: int
    dp: int
    mini_batch_size: int
    per_rank_mini_batch: int
    micro_batch_size: int | None
    grad_accum: int | None
    optimizer_steps_per_rl_step: int


@dataclasses.dataclass
class Derived:
    """The run's plan: what it derives from its config before loading anything.

    Computed once, by validation (:func:`temper.config.load_config` keeps it); the
    run's builders — roles, placement, engine checks, the LR schedules' lengths — read
    it instead of deriving again.
    """

    shape: StepShape
    max_steps: int | None
    total_devices: int
    placement: dict[str, list[int]]
    use_critic: bool
    use_reference: bool
    actor: TrainArithmetic
    critic: TrainArithmetic | None
    uses: frozenset[str] = RL_PARTS  # what the pipeline's step can use (see ROLLOUT, …)

    @property
    def use_rollout(self) -> bool:
        """The step generates: the run builds a rollout engine."""
        return ROLLOUT in self.uses

    @property
    def use_prm(self) -> bool:
        """The step trains PRIME's implicit PRM: the run builds it."""
        return PRM in self.uses

    @property
    def samples_per_step(self) -> int:
        return self.shape.samples

    @property
    def roles(self) -> tuple[str, ...]:
        """The model roles that run: actor, then reference, critic and PRM when used."""
        used = (
            ("reference", self.use_reference),
            ("critic", self.use_critic),
            ("prm", self.use_prm),
        )
        return ("actor", *(role for role, on in used if on))
