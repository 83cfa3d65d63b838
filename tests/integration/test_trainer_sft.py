"""SFT end to end: `rlkit sft` lowers the loss; kill -9 then --resume is bitwise exact, with AdamW
and with Muon (whose momenta and AdamW moments go through the DCP checkpoint); a checkpoint
resumes on another number of ranks."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlkit.trainer.allocator import default_allocator

RLKIT = str(Path(sys.executable).parent / "rlkit")


def reverse_text_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 8)))
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"reverse {word}"}],
                "completion": [{"role": "assistant", "content": word[::-1]}],
            }
        )
    return rows


def write_config(tmp: Path, model: Path, run_dir: Path, optim: str = "adamw") -> Path:
    data = tmp / "reverse.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in reverse_text_rows(120)))
    cfg = tmp / f"{run_dir.name}.toml"
    cfg.write_text(
        f"""run_dir = "{run_dir}"
seed = 3
deterministic = true
micro_batch_tokens = 256
[model]
path = "{model}"
[optim]
name = "{optim}"
lr = 3e-3
warmup_steps = 2
schedule = "cosine"
[data]
path = "{data}"
epochs = 2
batch_tokens = 512
[ckpt]
interval = 2
keep_last = 2
"""
    )
    return cfg


def checkpoint_tensors(ckpt: Path, out: Path) -> dict[str, torch.Tensor]:
    """Model and optimiser tensors of a DCP checkpoint, flattened to name -> tensor."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(ckpt, out)
    state = torch.load(out, weights_only=False)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, torch.Tensor):
            flat[prefix] = node
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}", value)

    walk("", state)
    return flat


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_sft_lowers_loss_and_kill9_resume_is_bitwise(
    tiny_model_dir: Path, tmp_path: Path, optim: str
) -> None:
    run_a, run_b = tmp_path / "uninterrupted", tmp_path / "killed"
    cfg_a = write_config(tmp_path, tiny_model_dir, run_a, optim)
    cfg_b = write_config(tmp_path, tiny_model_dir, run_b, optim)
    trainer = [sys.executable, "-m", "rlkit.trainer.main", "--mode", "sft", "--config", str(cfg_b)]

    # The uninterrupted run goes through the CLI and its dotted override (same value as the file),
    # and so runs on the default allocator (`auto`); the other on the system's.
    cli = [RLKIT, "sft", str(cfg_a), f"--optim.name={optim}"]
    out = tmp_path / "cli.out"
    with out.open("w") as stdout:
        full = subprocess.Popen(cli, env=env(), stdout=stdout, stderr=subprocess.PIPE)
    victim = subprocess.Popen(trainer, env=env(), start_new_session=True, stderr=subprocess.PIPE)
    latest = run_b / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while not (latest.exists() and latest.read_text().strip() >= "step_000004"):
        assert victim.poll() is None, victim.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (run_b / "final").exists()

    resumed = subprocess.run([*trainer, "--resume"], env=env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert full.wait(timeout=300) == 0, full.stderr.read().decode()[-2000:]
    assert f"memory allocator: {default_allocator(cuda=False)}" in out.read_text()
    assert "memory allocator: system" in resumed.stdout

    losses = [json.loads(line)["loss"] for line in (run_a / "sft_metrics.jsonl").open()]
    records_b = [json.loads(line) for line in (run_b / "sft_metrics.jsonl").open()]
    assert [r["step"] for r in records_b] == list(range(1, len(losses) + 1))  # each step once
    assert [r["loss"] for r in records_b] == losses
    assert len(losses) >= 8
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3

    final_a = load_file(run_a / "final" / "model.safetensors")
    final_b = load_file(run_b / "final" / "model.safetensors")
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    last = sorted(p.name for p in (run_a / "checkpoints").glob("step_*"))[-1]
    ckpt_a = checkpoint_tensors(run_a / "checkpoints" / last, tmp_path / "a.pt")
    ckpt_b = checkpoint_tensors(run_b / "checkpoints" / last, tmp_path / "b.pt")
    assert ckpt_a.keys() == ckpt_b.keys() and any(".optim." in k for k in ckpt_a)
    assert all(torch.equal(ckpt_a[k], ckpt_b[k]) for k in ckpt_a)  # fp32 weights, optimiser
    if optim == "muon":  # Muon's momentum buffers are in the checkpoint, not only AdamW's moments
        assert any(k.endswith("momentum_buffer") for k in ckpt_a), sorted(ckpt_a)[:20]

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_a / "final")
    assert model.dtype == torch.bfloat16 and (run_a / "final" / "STABLE").exists()


@pytest.mark.slow
def test_sft_cli_runs_two_ranks_with_overrides(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`rlkit sft CFG --nproc 2 --section.field V`: torchrun gets the resolved config, not the
    overrides (it would take `--nproc` for its own `--nproc-per-node`)."""
    run_dir = tmp_path / "two"
    cfg = write_config(tmp_path, tiny_model_dir, run_dir)
    cli = [RLKIT, "sft", str(cfg), "--nproc", "2", "--max_steps", "2", "--ckpt.interval=0"]
    done = subprocess.run(cli, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = (run_dir / "sft.toml").read_text()
    assert "nproc = 2" in resolved and "max_steps = 2" in resolved
    steps = [json.loads(line)["step"] for line in (run_dir / "sft_metrics.jsonl").open()]
    assert steps == [1, 2] and (run_dir / "final" / "STABLE").exists()


@pytest.mark.slow
def test_checkpoint_resumes_on_another_number_of_ranks(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two ranks save FSDP2 shards; one process (whose parameters FSDP2 leaves plain) resumes
    from them, then two ranks again from its plain tensors: the same losses and weights as two
    ranks throughout, up to the order of the ranks' sums."""
    cfg = write_config(tmp_path, tiny_model_dir, tmp_path / "unused")
    sft = [RLKIT, "sft", str(cfg), "--resume", "--ckpt.interval=2", "--optim.schedule=constant"]

    def run(run_dir: Path, nproc: int, max_steps: int) -> None:
        cli = [*sft, f"--run_dir={run_dir}", f"--nproc={nproc}", f"--max_steps={max_steps}"]
        done = subprocess.run(cli, env=env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    steady, switched = tmp_path / "steady", tmp_path / "switched"
    run(steady, 2, 2)
    shutil.copytree(steady, switched)
    run(steady, 2, 6)
    run(switched, 1, 4)
    run(switched, 2, 6)

    def losses(run_dir: Path) -> list[tuple[int, float]]:
        records = [json.loads(line) for line in (run_dir / "sft_metrics.jsonl").open()]
        return [(r["step"], r["loss"]) for r in records]

    # each step once, across the switches: a resume that started over would log steps 1-4 again
    assert [step for step, _ in losses(switched)] == list(range(1, 7))
    assert [loss for _, loss in losses(switched)] == pytest.approx(
        [loss for _, loss in losses(steady)], rel=1e-4
    )
    final_a = load_file(steady / "final" / "model.safetensors")
    final_b = load_file(switched / "final" / "model.safetensors")
    assert final_a.keys() == final_b.keys()
    for name, tensor in final_a.items():  # bf16 exports: a rounding step apart at most
        torch.testing.assert_close(final_b[name], tensor, rtol=1e-2, atol=1e-3, msg=name)
