"""GiGPO vs GRPO on FrozenLake with the tiny model: success rate per step, same seeds.

Both runs play the same episodes' seeds with the step-wise env manager
(``agentic.env_manager: step``: a fresh prompt per env step, one sample per step) from
the same warm-started tiny model, with the same optimizer, batch and sampling; only the
advantage differs:

* ``grpo``: every step of an episode gets its episode's return minus the mean over its
  env group (ROLL's agentic grpo: ``reinforce`` over ``reward_normalization`` mean
  within the env group);
* ``gigpo``: the same episode term plus ω × the step level — the step's discounted return
  minus the mean over the group's steps that started from the same state.

The warm start: the random tiny model answers nothing valid, so neither run would see a
reward. It is first taught, by a few hundred supervised Adam steps on the envs' own step
prompts, to answer ``<answer>A</answer>`` with an action drawn uniformly at random: a
policy that acts, with no preference between actions. The map is one fixed 3×3 lake
(two shortest routes of four moves, one hole), so anchor states recur across episodes.

Prints one line per step and run (train success rate under sampling, mean return) and
writes ``--out/curves.json``. On two CPU cores a 15-step pair takes several minutes.

    python benchmarks/gigpo_vs_grpo.py                   # 15 steps, seed 0
    python benchmarks/gigpo_vs_grpo.py --steps 30 --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LAKE = ["SFF", "FHF", "FFG"]
ACTIONS = ["Left", "Down", "Right", "Up"]
TAG = {
    "env_type": "frozen_lake",
    "max_turns": 6,
    "max_tokens_per_turn": 32,  # the tiny tokenizer spells an answer in about 22 tokens
    "format_penalty": -0.1,
    "history_length": 1,  # no window of past steps: short prompts for the tiny model
    "env_config": {"desc": LAKE, "is_slippery": False},
}


def config(model: Path, out: Path, estimator: str, steps: int, seed: int) -> dict[str, Any]:
    algorithm: dict[str, Any] = {"adv_estimator": estimator, "norm_adv_by_std_in_grpo": False}
    norm = {"grouping": "state", "method": "identity"}
    if estimator == "reinforce":  # ROLL's agentic grpo: the group mean is the baseline
        algorithm = {"adv_estimator": "reinforce"}
        norm = {"grouping": "state", "method": "mean"}
    return {
        "pipeline": "agentic",
        "experiment": {
            "output_dir": str(out),
            "max_steps": steps,
            "seed": seed,
            "test_freq": 0,
            "save_freq": 0,
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model)},
        "data": {"max_prompt_length": 600},
        "rollout": {"response_length": 32, "max_model_len": 700, "temperature": 1.0},
        "actor": {
            "mini_batch_size": 64,
            "micro_batch_size_per_device": 32,
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
        },
        "algorithm": algorithm,
        "agentic": {
            "env_manager": "step",
            "train_env_manager": {"num_env_groups": 8, "group_size": 8, "tags": ["T"]},
            "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
            "custom_envs": {"T": TAG},
            "reward_normalization": norm,
        },
    }


def warm_start(model_dir: Path, out_dir: Path, seed: int, sft_steps: int) -> float:
    """Teach the tiny model to answer each step prompt with a uniformly random action."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from temper.envs import EnvManager, StepRecord
    from temper.pipelines.catalog import build_config
    from temper.rollout.chat import ChatTokenizer

    cfg = build_config(config(model_dir, out_dir, "gigpo", 1, seed))
    manager = EnvManager.from_agentic(cfg.agentic, "train", seed + 1000)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    chat = ChatTokenizer(tok)
    rng = random.Random(seed)
    rows: list[tuple[list[int], list[int]]] = []
    for step in range(4):  # random walks from the start: the states an episode visits
        slots = manager.reset(step)
        records: dict[int, list[StepRecord]] = {s.env_id: [] for s in slots}
        live = [s.env_id for s in slots]
        while live:
            answers = []
            for env_id in live:
                prompt = manager.step_text(env_id, records[env_id])
                answer = f"<answer>{rng.choice(ACTIONS)}</answer>"
                ids, _ = chat.prompt([{"role": "user", "content": prompt}])  # as the run renders
                target = tok(answer + (tok.eos_token or ""), add_special_tokens=False)
                rows.append((list(ids), list(target["input_ids"])))
                answers.append(answer)
            results = manager.step(live, answers)
            for env_id, r, a in zip(live, results, answers):
                records[env_id].append(StepRecord(manager.observation(env_id), a, r.reward))
            live = [r.env_id for r in results if not r.done]
    width = max(len(p) + len(t) for p, t in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.full((len(rows), width), pad)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, (p, t) in enumerate(rows):
        ids[k, : len(p) + len(t)] = torch.tensor(p + t)
        labels[k, len(p) : len(p) + len(t)] = torch.tensor(t)
        mask[k, : len(p) + len(t)] = 1
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    loss = torch.tensor(0.0)
    for _ in range(sft_steps):
        batch = torch.randperm(len(rows), generator=gen)[:32]
        loss = model(input_ids=ids[batch], attention_mask=mask[batch], labels=labels[batch]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tok.save_pretrained(str(out_dir))
    return float(loss.detach())


def train(model: Path, out: Path, estimator: str, steps: int, seed: int) -> list[dict[str, Any]]:
    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import build_config

    run_pipeline(build_config(config(model, out, estimator, steps, seed)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/success_rate" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from temper.utils.tiny import make_tiny_model

    root = args.out or Path(tempfile.mkdtemp(prefix="gigpo_vs_grpo_"))
    make_tiny_model(root / "tiny")
    loss = warm_start(root / "tiny", root / "warm", args.seed, args.sft_steps)
    print(f"warm start: supervised loss {loss:.3f} after {args.sft_steps} steps")
    curves: dict[str, list[dict[str, float]]] = {}
    for name, estimator in (("grpo", "reinforce"), ("gigpo", "gigpo")):
        start = time.perf_counter()
        rows = train(root / "warm", root / name, estimator, args.steps, args.seed)
        curves[name] = [
            {
                "step": r["step"],
                "success_rate": r["train/success_rate"],
                "return_mean": r["env/T/return_mean"],
            }
            for r in rows
        ]
        print(f"{name}: {time.perf_counter() - start:.0f} s")
    print("step  grpo success  gigpo success  grpo return  gigpo return")
    for g, s in zip(curves["grpo"], curves["gigpo"]):
        print(
            f"{g['step']:4d}  {g['success_rate']:12.3f}  {s['success_rate']:13.3f}  "
            f"{g['return_mean']:11.3f}  {s['return_mean']:12.3f}"
        )
    (root / "curves.json").write_text(json.dumps(curves, indent=1))
    print(f"curves: {root / 'curves.json'}")


if __name__ == "__main__":
    main()
