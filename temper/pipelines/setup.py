"""Everything a run holds, built once from the config: data, roles, engines, trackers."""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from temper.cluster.roles import build_cluster_roles, build_cluster_rollout
from temper.config.derive import derive
from temper.config.schema import TemperConfig
from temper.data import PromptDataset, PromptSampler, build_datasets, build_sampler
from temper.data.batch import Batch
from temper.pipelines import checkpointing as ckpt
from temper.pipelines.experience import ShapingState
from temper.rewards.manager import RewardScorer
from temper.roles import Roles
from temper.rollout import RolloutEngine, SamplingParams
from temper.rollout import sampling_params_from_config as sampling_params
from temper.tracking import MultiTracker, build_trackers
from temper.utils.model_path import resolve_model_path


def output_dir(cfg: TemperConfig) -> Path:
    exp = cfg.experiment
    return Path(exp.output_dir or f"outputs/{exp.project_name}/{exp.experiment_name}").expanduser()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(cfg: TemperConfig) -> Any:
    from transformers import AutoTokenizer

    path = resolve_model_path(cfg.model.tokenizer_path or cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


class RunRewards:
    """The run's reward scorer, returning the batch with ``scores`` added."""

    def __init__(self, scorer: RewardScorer, tokenizer: Any) -> None:
        self.scorer, self.tokenizer = scorer, tokenizer

    def score(self, batch: Batch, prefix: str = "train") -> tuple[Batch, dict[str, float]]:
        out = self.scorer.score_batch(batch, self.tokenizer, prefix=prefix)
        batch["scores"] = out.scores
        return batch, dict(out.metrics)

    def close(self) -> None:
        self.scorer.close()


@dataclasses.dataclass
class Run:
    """A run's long-lived parts and its step counter."""

    cfg: TemperConfig
    out_dir: Path
    tokenizer: Any
    train_data: PromptDataset
    val_data: PromptDataset | None
    sampler: PromptSampler
    roles: Roles
    rollout: RolloutEngine
    rewards: RunRewards
    shaping: ShapingState
    tracker: MultiTracker
    train_sampling: SamplingParams
    val_sampling: SamplingParams
    total_steps: int
    step: int = 0
    resumed_from: Path | None = None
    reward_history: list[float] = dataclasses.field(default_factory=list)
    last_save_s: float = 0.0

    def sync_weights(self, force: bool = False) -> None:
        """Push the actor's weights to the rollout engine (a no-op when it shares them).

        ``force``: regardless of ``model_update_frequency`` (after loading a checkpoint).
        """
        every = max(1, self.cfg.rollout.model_update_frequency)
        if not getattr(self.rollout, "shared", False) and (force or self.step % every == 0):
            self.rollout.load_weights(self.roles.actor.engine.named_weights())

    def should_save(self, stopping: bool) -> bool:
        """Checkpoint now? Every ``save_freq`` steps, at the last step, and on a signal."""
        freq = self.cfg.experiment.save_freq
        periodic = freq > 0 and self.step % freq == 0
        return periodic or stopping or self.step >= self.total_steps

    def save_checkpoint(self) -> Path:
        """An atomic, resumable checkpoint of this step (see pipelines.checkpointing)."""
        path = ckpt.save_checkpoint(self)
        print(f"checkpoint: {path} ({self.last_save_s:.1f}s)", flush=True)
        return path

    def save_final(self) -> None:
        """The trained actor as a Hugging Face directory (loads in transformers/vLLM)."""
        self.roles.actor.engine.save_hf(str(self.out_dir / "final" / "actor"))
        self.tokenizer.save_pretrained(str(self.out_dir / "final" / "actor"))

    def summary(self, rewards: list[float] | None = None) -> dict[str, Any]:
        rewards = self.reward_history if rewards is None else rewards
        first = rewards[0] if rewards else float("nan")
        last = rewards[-1] if rewards else float("nan")
        k = min(5, len(rewards)) or 1
        return {
            "steps": self.step,
            "output_dir": str(self.out_dir),
            "reward_first": first,
            "reward_last": last,
            "reward_first5": float(np.mean(rewards[:k])) if rewards else float("nan"),
            "reward_last5": float(np.mean(rewards[-k:])) if rewards else float("nan"),
            "rewards": rewards,
        }

    def close(self) -> None:
        self.rewards.close()
        self.rollout.close()
        self.tracker.close()
        shutdown = getattr(self.roles, "shutdown", None)  # Ray worker groups
        if shutdown is not None:
            shutdown()


def build_run(cfg: TemperConfig) -> Run:
    """Load data, models and engines for ``cfg`` (config already validated)."""
    derived = derive(cfg)
    seed_everything(cfg.experiment.seed)
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    resume_from = ckpt.find_resume_checkpoint(cfg, out)
    if resume_from is not None:  # before any model loads: a bad resume fails fast
        for line in ckpt.check_resume_config(cfg, resume_from):
            print(line, flush=True)
    tokenizer = load_tokenizer(cfg)
    train_data, val_data = build_datasets(cfg, tokenizer)
    if train_data is None:
        raise ValueError("data.train_files: no training data")  # validate() catches it first
    sampler = build_sampler(cfg, len(train_data), train_data.tags)
    total = cfg.experiment.max_steps or cfg.experiment.total_epochs * sampler.batches_per_epoch
    roles = build_cluster_roles(cfg)  # in process, or Ray worker groups (resources.backend)
    samples = derived.samples_per_step
    roles.actor.set_total_steps(total * roles.actor.optimizer_steps_per_update(samples))
    if roles.critic is not None:
        roles.critic.set_total_steps(total * roles.critic.optimizer_steps_per_update(samples))
    rollout = build_cluster_rollout(cfg, roles, tokenizer)  # in process, or actor_infer ranks
    if cfg.rollout.multi_turn.enable:  # verl multi_turn: tool calls inside each response
        from temper.pipelines.agentic_rollout import rlvr_tool_engine

        rollout = rlvr_tool_engine(rollout, cfg, tokenizer)
    scorer = RewardScorer.from_config(cfg, device=roles.actor.engine.device)
    tracker = build_trackers(
        cfg.experiment.trackers,
        out,
        total_steps=total,
        every=cfg.experiment.logging_steps,
        kwargs=cfg.experiment.tracker_kwargs,
        project=cfg.experiment.project_name,
        name=cfg.experiment.experiment_name,
        start_step=ckpt.checkpoint_step(resume_from) + 1 if resume_from is not None else 0,
    )
    run = Run(
        cfg=cfg,
        out_dir=out,
        tokenizer=tokenizer,
        train_data=train_data,
        val_data=val_data,
        sampler=sampler,
        roles=roles,
        rollout=rollout,
        rewards=RunRewards(scorer, tokenizer),
        shaping=ShapingState.from_config(cfg.algorithm),
        tracker=tracker,
        train_sampling=sampling_params(cfg.rollout, validation=False),
        val_sampling=sampling_params(cfg.rollout, validation=True),
        total_steps=total,
        resumed_from=resume_from,
    )
    if resume_from is not None:
        start = time.perf_counter()
        try:
            ckpt.load_checkpoint(run, resume_from)
        except BaseException:
            run.close()  # reward workers and engines must not outlive a failed resume
            raise
        took = time.perf_counter() - start
        print(f"resumed from {resume_from} at step {run.step} ({took:.1f}s)", flush=True)
    return run


def response_metrics(batch: Batch, step_seconds: float) -> dict[str, float]:
    """Length, truncation and throughput of one step's responses."""
    lengths = batch["response_mask"].sum(-1).float()
    prompt_tokens = batch["prompt_mask"].sum().item()
    truncated = [bool(t) for t in batch["truncated"]] if "truncated" in batch else []
    return {
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/clip_ratio": float(np.mean(truncated)) if truncated else 0.0,
        "perf/tokens_per_s": (prompt_tokens + lengths.sum().item()) / max(step_seconds, 1e-9),
        "perf/samples": float(len(batch)),
    }
