"""`rlkit train examples/tiny-moe-cpu/train.toml` on CPU: a tiny Qwen3-MoE served by vLLM,
trained by the FSDP2 trainer with R2 routing replay, its exported weights reloaded by the
server every step; router disagreement is logged with the mismatch metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import RLKIT, ROOT, run_train

pytestmark = pytest.mark.slow


def test_rlkit_train_tiny_moe(tiny_moe_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "rl"
    cmd = [
        RLKIT,
        "train",
        str(ROOT / "examples/tiny-moe-cpu/train.toml"),
        f"--model.path={tiny_moe_model_dir}",
        f"--log.run_dir={run_dir}",
        "--log.plot=false",
        "--orchestrator.max_steps=3",
        "--orchestrator.eval.at_start=false",
        "--orchestrator.eval.at_end=false",
        "--ckpt.interval=0",
    ]
    records = run_train(cmd, run_dir, tmp_path / "train.log")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["mismatch_kl"] >= 0 and 0 <= r["mismatch_extreme_frac"] <= 1
        # R2 over two mini-steps: every token-layer pair has a known (replayed) routing
        assert r["router_known_pairs"] > 0
        assert 0 <= r["router_disagreement"] <= 1
    assert any(r["router_disagreement"] > 0 for r in records)  # the second mini-step moved
    published = sorted(p.name for p in (run_dir / "weights").glob("step_*"))
    assert published[-1] == "step_000003"  # the server loaded each step's MoE export
