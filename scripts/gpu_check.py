"""`scripts/gpu_check.sh`: is this NVIDIA machine ready for rlkit? One table of results and figures.

The plan, in order, each step a subprocess with its own time limit and log under `--work-dir`:
install the `gpu` extra (from a local wheel folder with `--wheels`: nothing is downloaded), build
the small model, measure engine start and generation tokens/s on it, run the inference
integration tests and the trainer tests on CUDA (bf16, NCCL), the broadcast weight-transfer
tests, and the demo config for 20 steps with filesystem weight updates and a few with
`weight_transfer = "broadcast"`. Figures: engine start (s), generation tokens/s, trainer
tokens/s, weight update seconds by path.

An ops script, not part of the library. Only the standard library is imported at module level:
the install step runs from this script before rlkit's own dependencies are there. `--dry-run`
prints the plan and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INFERENCE_TESTS = [
    "tests/integration/test_inference_server.py",
    "tests/integration/test_eval_vllm.py",
    "tests/integration/test_trainer_vllm.py",
]
TRAINER_TESTS = [
    "tests/integration/test_trainer_rl.py",
    "tests/integration/test_trainer_distributed.py",
    "tests/unit/test_trainer_engine.py",
]
TOTAL_LIMIT_S = 600


class NoGPU(RuntimeError):
    """This machine has no NVIDIA GPU that nvidia-smi can see."""


@dataclass
class Step:
    """One command of the check; `figures` reads its results after it ran."""

    name: str
    argv: list[str]
    timeout_s: int
    figures: Callable[[], dict[str, float | None]] | None = None


@dataclass
class Result:
    name: str
    status: str  # ok, FAILED (code N), TIMEOUT, skipped
    seconds: float
    figures: dict[str, float | None] = field(default_factory=dict)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dry-run", action="store_true", help="Print the plan; run nothing.")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "gpu-check")
    parser.add_argument("--skip-install", action="store_true", help="Use the installed packages.")
    parser.add_argument(
        "--wheels", type=Path, help="Install from this folder of wheels only (no index)."
    )
    parser.add_argument("--demo-steps", type=int, default=20, help="Steps of the demo run.")
    parser.add_argument(
        "--broadcast-steps", type=int, default=5, help="Demo steps with broadcast weights."
    )
    parser.add_argument("--python", default=sys.executable, help="The interpreter to use.")
    parser.add_argument(
        "--only",
        action="append",
        metavar="STEP",
        help="Run only this step, named as in --dry-run's plan (repeatable); the model step, "
        "which the others need, always runs.",
    )
    args = parser.parse_args(argv)
    names = [step.name for step in build_plan(argparse.Namespace(**{**vars(args), "only": None}))]
    unknown = [name for name in args.only or [] if name not in names]
    if unknown:
        parser.error(f"--only {unknown[0]!r}: no such step; the steps are {', '.join(names)}")
    if args.demo_steps < 2 or args.broadcast_steps < 2:
        parser.error("--demo-steps and --broadcast-steps must be at least 2 (step 1 warms up)")
    if args.wheels is not None and not args.wheels.is_dir():
        parser.error(f"--wheels {args.wheels}: not a directory")
    return args


def gpu_names() -> list[str]:
    """The GPUs `nvidia-smi -L` lists; NoGPU when there is no nvidia-smi or no GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise NoGPU("nvidia-smi not found: gpu_check needs a machine with NVIDIA GPUs and driver")
    done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    gpus = [line for line in done.stdout.splitlines() if line.startswith("GPU ")]
    if done.returncode != 0 or not gpus:
        raise NoGPU(f"nvidia-smi lists no GPU: {(done.stderr or done.stdout).strip()[:300]}")
    return gpus


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mean_after_warmup(records: list[dict], key: str) -> float | None:
    """Mean of `key` over the records after the first (compilation and cache warm-up)."""
    values = [r[key] for r in records[1:] if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def demo_figures(run_dir: Path, path: str) -> Callable[[], dict[str, float | None]]:
    def figures() -> dict[str, float | None]:
        trainer = read_jsonl(run_dir / "trainer_metrics.jsonl")
        steps = read_jsonl(run_dir / "metrics.jsonl")
        return {
            "trainer tokens/s": mean_after_warmup(trainer, "tokens_per_s"),
            f"weight update s ({path})": mean_after_warmup(steps, "weight_update_s"),
            "step s": mean_after_warmup(steps, "step_time_s"),
        }

    return figures


def json_figures(path: Path) -> Callable[[], dict[str, float | None]]:
    return lambda: json.loads(path.read_text()) if path.exists() else {}


def build_plan(args: argparse.Namespace) -> list[Step]:
    py, work = args.python, args.work_dir.resolve()
    model = work / "model"
    install = [py, "-m", "pip", "install", "-q"]
    if args.wheels is not None:
        install += ["--no-index", "--find-links", str(args.wheels.resolve())]
    install += ["-e", f"{ROOT}[gpu,dev]", "-e", str(ROOT / "environments" / "reverse-text")]
    pytest = [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    demo = [
        py, "-m", "rlkit_cli.main", "train", str(ROOT / "examples/tiny-cpu/train.toml"),
        f"--model.path={model}",
        "--orchestrator.drop_zero_advantage=false",  # an untrained model solves little
        "--orchestrator.eval.at_start=false",
        "--orchestrator.eval.at_end=false",
        "--ckpt.interval=0",
        "--log.plot=false",
    ]  # fmt: skip
    plan = [
        Step(
            "model",
            [
                py,
                "-m",
                "rlkit_cli.main",
                "model",
                "init-tiny",
                "--out",
                str(model),
                "--arch",
                "qwen3",
                "--size",
                "small",
                "--seed",
                "0",
            ],
            120,
        ),  # fmt: skip
        Step(
            "engine",
            [py, str(Path(__file__).resolve()), "engine", str(model), str(work / "engine.json")],
            180,
            json_figures(work / "engine.json"),
        ),
        Step("inference tests", [*pytest, *INFERENCE_TESTS], 240),
        Step("trainer tests", [*pytest, *TRAINER_TESTS], 240),
        Step(
            "broadcast weight transfer tests",
            [*pytest, "tests/integration", "-k", "broadcast"],
            180,
        ),
        Step(
            "demo, filesystem weights",
            [
                *demo,
                f"--log.run_dir={work / 'demo-fs'}",
                f"--orchestrator.max_steps={args.demo_steps}",
            ],
            300,
            demo_figures(work / "demo-fs", "filesystem"),
        ),  # fmt: skip
        Step(
            "demo, broadcast weights",
            [
                *demo,
                f"--log.run_dir={work / 'demo-broadcast'}",
                f"--orchestrator.max_steps={args.broadcast_steps}",
                "--inference.weight_transfer=broadcast",
            ],
            240,
            demo_figures(work / "demo-broadcast", "broadcast"),
        ),  # fmt: skip
    ]
    if not args.skip_install:
        plan.insert(0, Step("install gpu extra", install, 300))
    if args.only:
        plan = [step for step in plan if step.name in args.only or step.name == "model"]
    return plan


def format_plan(plan: list[Step]) -> str:
    lines = [f"gpu_check plan ({len(plan)} steps, at most {TOTAL_LIMIT_S} s in all):"]
    for i, step in enumerate(plan, 1):
        lines.append(f"{i}. {step.name} (limit {step.timeout_s} s)\n   {' '.join(step.argv)}")
    return "\n".join(lines)


def run_step(step: Step, log_dir: Path, budget_s: float) -> Result:
    """Run one step (output to its log); a step that would outlast the budget is cut short."""
    if budget_s <= 0:
        return Result(step.name, "skipped (out of time)", 0.0)
    log = log_dir / (step.name.replace(" ", "_").replace(",", "") + ".log")
    t0 = time.monotonic()
    with open(log, "w") as out:
        try:
            code = subprocess.run(
                step.argv,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=min(step.timeout_s, budget_s),
            ).returncode
            status = "ok" if code == 0 else f"FAILED (code {code}, {log})"
        except subprocess.TimeoutExpired:
            status = f"TIMEOUT ({log})"
    result = Result(step.name, status, time.monotonic() - t0)
    if step.figures is not None:
        try:
            result.figures = step.figures()
        except (OSError, ValueError, KeyError) as exc:
            result.figures = {f"figures unreadable: {exc}": None}
    return result


def format_table(gpus: list[str], results: list[Result]) -> str:
    """One plain-text table: step, status, seconds, figures (plain so logs keep it intact)."""
    rows = [("step", "status", "s", "figures")]
    for r in results:
        figures = ", ".join(
            f"{k} {'-' if v is None else format(v, '.3g')}" for k, v in r.figures.items()
        )
        rows.append((r.name, r.status, f"{r.seconds:.1f}", figures))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"GPUs: {'; '.join(gpus)}"]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=False))
            + "  "
            + row[3]
        )
    passed = sum(r.status == "ok" for r in results)
    lines.append(f"{passed}/{len(results)} steps ok")
    return "\n".join(lines)


def engine_figures(model: str, out: Path, prompts: int = 64, max_tokens: int = 256) -> None:
    """Start a vLLM server on `model` (timed) and generate `prompts` x `max_tokens` tokens at
    once; writes {"engine start s", "generation tokens/s"} to `out`."""
    import asyncio

    from rlkit.inference import start_server

    t0 = time.monotonic()
    server = start_server(model, log_path=out.with_suffix(".server.log"))
    try:
        server.wait_ready(300)
        start_s = time.monotonic() - t0

        async def generate() -> float:
            sampling = {"max_tokens": max_tokens, "min_tokens": max_tokens, "temperature": 1.0}
            async with server.client() as client:
                await client.completion("warm up", model, sampling)
                t1 = time.monotonic()
                outs = await asyncio.gather(
                    *(client.completion(f"prompt {i}", model, sampling) for i in range(prompts))
                )
                tokens = sum(len(g.completion_token_ids) for g in outs)
                return tokens / (time.monotonic() - t1)

        tokens_per_s = asyncio.run(generate())
    finally:
        server.stop()
    out.write_text(json.dumps({"engine start s": start_s, "generation tokens/s": tokens_per_s}))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["engine"]:
        engine_figures(argv[1], Path(argv[2]))
        return 0
    args = parse_args(argv)
    plan = build_plan(args)
    if args.dry_run:
        print(format_plan(plan))
        return 0
    try:
        gpus = gpu_names()
    except NoGPU as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 1
    log_dir = args.work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + TOTAL_LIMIT_S
    results = []
    for step in plan:
        print(f"[gpu_check] {step.name} ...", flush=True)
        results.append(run_step(step, log_dir, deadline - time.monotonic()))
        print(f"[gpu_check] {step.name}: {results[-1].status}", flush=True)
    print(format_table(gpus, results))
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
