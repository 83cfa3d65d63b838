"""TRL's GRPOTrainer against `rlkit train`, side by side in one run, on the same work.

    python tests/benchmarks/bench_vs_trl.py [--workloads demo,small] [--steps 60]

Workloads (both: reverse-text with the CPU demo's environment arguments, read from
examples/tiny-cpu/train.toml, so TRL and rlkit train on the same task; temperature 1, lr 5e-4,
AdamW, no KL term, no zero-advantage filtering):
- `demo`: the CPU demo's configuration: its tiny Qwen3, SFT-warm-started exactly as
  `scripts/demo.sh` does, G = 16 samples per prompt, 16-token completions, `--steps` steps;
  TRL and the sync scheduler take 8 prompts a step (128 samples, about the demo's token budget
  of 768 at its 3-5-character replies), C3PO++ runs with the demo's own capacity and budget.
- `small`: the `small` tiny-factory model (8 layers, vocab 8192), no warm start, G = 8, 12
  prompts a step, 128-token completions, `--small-steps` steps: generation dominates the step.
  C3PO++'s token budget = the mean completion tokens of the sync run's batches, so both train
  on about 96 samples a step (a budget of 96 x max_tokens would give C3PO++ four times the
  samples, as replies are shorter than the cap).

Per workload: TRL (HF generate in its one process, on CPU) and `rlkit train` with the sync
scheduler (as many groups a step as TRL) and with C3PO++.
Reported: seconds per step (mean over the steps after the first) and per sample trained, the whole
run's wall time (process start to exit, including vLLM's start-up for rlkit), and the eval
reward of each final model under one evaluation (HF generate in this process, the
environment's own rubric, 64 held-out prompts at temperature 1), with its standard error over the
prompts' means: 16 samples a prompt on `demo` (4 gave +-0.02 run-to-run, too coarse to call two
models equal), 4 on `small` (no model learns there in 6 steps; 16 took ~4 min a model).
For rlkit it also reruns its trainer alone over the run's saved batches, in the environment
`rlkit train` gives its trainer (`rlkit.launch.launcher.trainer_env`: on CPU, OpenMP threads wait
passively), and reports the step time inside `rlkit train` against the same step alone.

TRL runs with OMP_WAIT_POLICY=PASSIVE, as `rlkit train` starts its CPU trainer (on a shared
machine libgomp's default spin-waiting slows 2 threads down more than 2x).
TRL is not an rlkit dependency: it is installed (with `--no-deps`, next to the shared venv's
torch and transformers) into `.venv-bench/` at the repository root on first use and put on the
TRL process's PYTHONPATH only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH_SITE = ROOT / ".venv-bench"
TRL_PINS = ["trl==1.16.0", "accelerate==1.15.0"]  # the rest (torch, transformers) is shared
DEMO_CONFIG = ROOT / "examples/tiny-cpu/train.toml"
LR = 5e-4
SHAPES = {"demo": (16, 8), "small": (8, 12)}  # (G samples per prompt, prompts per step)


def env_args() -> dict[str, Any]:
    """The reverse-text arguments of the CPU demo's config (what `rlkit train` runs on)."""
    import tomllib

    (env,) = tomllib.loads(DEMO_CONFIG.read_text())["env"]
    assert env["id"] == "reverse-text", env
    return dict(env["args"])


def ensure_trl() -> dict[str, str]:
    """Environment for the TRL process; installs TRL into .venv-bench/ the first time."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{BENCH_SITE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    check = [sys.executable, "-c", "import trl"]
    if subprocess.run(check, env=env, capture_output=True).returncode != 0:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]
        subprocess.run([*pip, str(BENCH_SITE), *TRL_PINS], check=True)
    return env


def load_env() -> Any:
    from rlkit.envs import load_environment

    return load_environment("reverse-text", **env_args())


def env_reward(env: Any, text: str, answer: str) -> float:
    """The environment's own rubric (weighted sum) on one plain-text reply."""
    from rlkit.envs.rubric import call_with_available

    available = {
        "completion": [{"role": "assistant", "content": text}],
        "answer": answer,
        "parser": env.rubric.parser,
        "info": {},
        "state": {},
    }
    total = 0.0
    for rf in env.rubric.reward_funcs:
        total += rf.weight * float(asyncio.run(call_with_available(rf.func, available)))
    return total


# ---- models -------------------------------------------------------------------------------
def build_model(workload: str, root: Path) -> Path:
    """demo: tiny + the demo's SFT warm start; small: the small model as initialised."""
    from rlkit.models import init_tiny

    if workload == "small":
        return init_tiny(root / "small", arch="qwen3", size="small", seed=0)
    base = init_tiny(root / "base", arch="qwen3", size="tiny", seed=0)
    data = root / "sft.jsonl"
    py = sys.executable
    subprocess.run([py, str(ROOT / "examples/tiny-cpu/make_sft_data.py"), str(data)], check=True)
    sft = [py, "-m", "rlkit.trainer.main", "--mode", "sft"]
    sft += ["--config", str(ROOT / "examples/tiny-cpu/sft.toml"), f"--run_dir={root / 'sft'}"]
    subprocess.run([*sft, f"--model.path={base}", f"--data.path={data}"], check=True)
    return root / "sft" / "final"


# ---- TRL ----------------------------------------------------------------------------------
def trl_worker(model: str, out: str, steps: int, max_tokens: int, group: int, prompts: int) -> None:
    """Runs inside the TRL process: GRPOTrainer on the same data, reward and batch shape."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            if not ends:
                ends.append(time.perf_counter())

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            ends.append(time.perf_counter())

    env = load_env()
    rows = env.get_dataset()
    data = Dataset.from_dict({"prompt": list(rows["prompt"]), "answer": list(rows["answer"])})

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        return [
            env_reward(env, c[-1]["content"], a) for c, a in zip(completions, answer, strict=True)
        ]

    config = GRPOConfig(
        output_dir=out,
        max_steps=steps,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        num_generations=group,
        per_device_train_batch_size=group * prompts,
        gradient_accumulation_steps=1,
        max_completion_length=max_tokens,
        temperature=1.0,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype="float32"),
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    trainer.save_model(str(Path(out) / "final"))
    tokenizer.save_pretrained(str(Path(out) / "final"))
    step_times = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    Path(out, "result.json").write_text(json.dumps({"train_s": train_s, "step_times": step_times}))


def run_trl(
    model: Path, root: Path, steps: int, max_tokens: int, group: int, prompts: int
) -> dict[str, Any]:
    out = root / "trl"
    cmd = [sys.executable, __file__, "--trl-worker", str(model), str(out)]
    cmd += [str(steps), str(max_tokens), str(group), str(prompts)]
    t0 = time.perf_counter()
    with open(root / "trl.log", "w") as log:
        env = {**ensure_trl(), "OMP_WAIT_POLICY": "PASSIVE"}  # what rlkit's CPU trainer gets
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    result = json.loads((out / "result.json").read_text())
    per_step = result["step_times"][1:] or [result["train_s"] / steps]
    return {
        "s_per_step": statistics.fmean(per_step),
        "wall_s": wall,
        "samples_per_step": group * prompts,
        "final": out / "final",
    }


# ---- rlkit --------------------------------------------------------------------------------
def run_rlkit(
    model: Path,
    root: Path,
    scheduler: str,
    steps: int,
    max_tokens: int,
    shape: tuple[int, int],
    token_budget: int | None,
) -> dict[str, Any]:
    """`rlkit train` on the demo's config; C3PO++ keeps the demo's capacity and budget when
    `token_budget` is None."""
    group, prompts = shape
    run_dir = root / f"rlkit-{scheduler}"
    cmd = [str(Path(sys.executable).parent / "rlkit"), "train"]
    cmd += [str(ROOT / "examples/tiny-cpu/train.toml"), f"--model.path={model}"]
    cmd += [
        f"--log.run_dir={run_dir}",
        f"--orchestrator.scheduler={scheduler}",
        f"--orchestrator.max_steps={steps}",
        f"--orchestrator.group_size={group}",
        f"--orchestrator.schedulers.sync.batch_groups={prompts}",
        f"--orchestrator.sampling.max_tokens={max_tokens}",
        "--orchestrator.drop_zero_advantage=false",
        "--orchestrator.difficulty.easy_fraction=0",
        "--orchestrator.difficulty.hard_fraction=0",
        "--orchestrator.eval.at_start=false",
        "--orchestrator.eval.at_end=false",
        f"--trainer.optim.lr={LR}",
        "--ckpt.interval=0",
        "--log.plot=false",
    ]
    if token_budget is not None:
        cmd += [
            f"--orchestrator.schedulers.c3po.capacity={group * prompts}",
            f"--orchestrator.schedulers.c3po.token_budget={token_budget}",
        ]
    t0 = time.perf_counter()
    with open(root / f"rlkit-{scheduler}.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trainer = [json.loads(x) for x in (run_dir / "trainer_metrics.jsonl").read_text().splitlines()]
    later = records[1:]
    return {
        "s_per_step": statistics.fmean(r["step_time_s"] for r in later),
        "wall_s": wall,
        "samples_per_step": statistics.fmean(r["batch_samples"] for r in records),
        "tokens_per_step": statistics.fmean(r["batch_tokens"] for r in records),
        # where a step goes (medians, s): rollouts until the batch, the trainer's turn until its
        # weights are out (its step, its export and both hand-offs), the servers' reload
        "rollout_s": statistics.median(r["rollout_time_s"] for r in later),
        "weights_wait_s": statistics.median(r["weights_wait_s"] for r in later),
        "weight_update_s": statistics.median(r["weight_update_s"] for r in later),
        "trainer_step_s": statistics.median(r["step_time_s"] for r in trainer[1:]),
        "final": run_dir / "weights" / f"step_{steps:06d}",
        "run_dir": run_dir,
    }


def trainer_alone(run_dir: Path, root: Path, steps: int) -> float:
    """The same trainer over the same saved batches, with nothing else running."""
    alone = root / f"{run_dir.name}-alone"
    shutil.copytree(run_dir / "batches", alone / "batches")
    cmd = [sys.executable, "-m", "rlkit.trainer.main", "--config", str(run_dir / "trainer.toml")]
    cmd += [f"--run_dir={alone}", "--weights.publish=false", "--ckpt.interval=0"]
    from rlkit.launch.launcher import trainer_env

    with open(root / f"{alone.name}.log", "w") as log:
        subprocess.run(
            cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=trainer_env("auto")
        )
    records = [json.loads(x) for x in (alone / "trainer_metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["step_time_s"] for r in records[1:])


# ---- one evaluation for every final model -------------------------------------------------
def evaluate(model: Path, max_tokens: int, samples: int = 16) -> tuple[float, float]:
    """Mean reward over the held-out prompts, `samples` each, HF generate at temperature 1,
    and its standard error over the prompts' means."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    env = load_env()
    rows = env.get_eval_dataset()
    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    torch.manual_seed(0)
    texts = [
        tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in rows["prompt"]
    ]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rewards = []
    with torch.no_grad():
        out = lm.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=samples,
            pad_token_id=tok.pad_token_id,
        )
    replies = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    for i, reply in enumerate(replies):
        rewards.append(env_reward(env, reply, rows["answer"][i // samples]))
    per_prompt = [
        statistics.fmean(rewards[i : i + samples]) for i in range(0, len(rewards), samples)
    ]
    return statistics.fmean(rewards), statistics.stdev(per_prompt) / len(per_prompt) ** 0.5


def run_workload(workload: str, root: Path, steps: int, schedulers: list[str]) -> dict[str, Any]:
    max_tokens = 16 if workload == "demo" else 128
    group, prompts = shape = SHAPES[workload]
    root.mkdir(parents=True)
    model = build_model(workload, root)
    results: dict[str, Any] = {"trl": run_trl(model, root, steps, max_tokens, group, prompts)}
    token_budget = None  # demo: C3PO++ as the demo runs it; small: the sync run's mean tokens
    for scheduler in schedulers:
        r = run_rlkit(model, root, scheduler, steps, max_tokens, shape, token_budget)
        if scheduler == "sync" and workload != "demo":
            token_budget = round(r["tokens_per_step"])
        r["trainer_alone_step_s"] = trainer_alone(r.pop("run_dir"), root, steps)
        r["trainer_inside_over_alone"] = r["trainer_step_s"] / r["trainer_alone_step_s"]
        results[f"rlkit-{scheduler}"] = r
    samples = 16 if workload == "demo" else 4
    initial_eval = round(evaluate(model, max_tokens, samples)[0], 4)
    out: dict[str, Any] = {
        "steps": steps,
        "max_tokens": max_tokens,
        "group": group,
        "prompts": prompts,
        "initial_eval": initial_eval,
    }
    for name, r in results.items():
        r["eval_reward"], r["eval_stderr"] = evaluate(r.pop("final"), max_tokens, samples)
        # C3PO++'s batches end at a token budget, not at a sample count
        r["ms_per_sample"] = 1000 * r["s_per_step"] / r["samples_per_step"]
        out[name] = {k: round(v, 4) for k, v in r.items()}
    for name in results:
        if name != "trl":
            out[f"trl_over_{name}_s_per_step"] = round(
                results["trl"]["s_per_step"] / results[name]["s_per_step"], 3
            )
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-worker":
        model, out, steps, max_tokens, group, prompts = sys.argv[2:8]
        trl_worker(model, out, int(steps), int(max_tokens), int(group), int(prompts))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workloads", default="demo,small")
    parser.add_argument("--steps", type=int, default=60, help="steps of the demo workload")
    parser.add_argument("--small-steps", type=int, default=6, help="steps of the small one")
    parser.add_argument(
        "--schedulers", default="sync,c3po", help="rlkit schedulers to run (sync first)"
    )
    parser.add_argument("--keep", type=Path, help="keep the runs in this directory")
    args = parser.parse_args()
    if args.schedulers.split(",")[0] != "sync":
        parser.error("--schedulers must start with sync: C3PO++'s token budget comes from it")
    ensure_trl()
    out: dict[str, Any] = {"bench": "vs_trl", "load_avg_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep or Path(tmp)
        for workload in args.workloads.split(","):
            steps = args.steps if workload == "demo" else args.small_steps
            schedulers = args.schedulers.split(",")
            out[workload] = run_workload(workload, base / workload, steps, schedulers)
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
