"""`rlkit train examples/tiny-moe-cpu/train.toml` on CPU: a tiny Qwen3-MoE served by vLLM with
rlkit's routing capture, trained by the FSDP2 trainer replaying the engine's routing (R3), its
exported weights reloaded by the server every step; router disagreement is logged with the
mismatch metrics. R3 against a server that cannot return routing is refused up front."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.inference.pool import ClientPool
from rlkit.orchestrator.loop import require_routing
from rlkit.protocol.batch import read_batch
from rlkit.protocol.layout import RunLayout
from tests.helpers.cli import RLKIT, ROOT, SIGNAL_ENV, run_train

pytestmark = pytest.mark.slow


def test_rlkit_train_tiny_moe_with_r3(tiny_moe_model_dir: Path, tmp_path: Path) -> None:
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
        f"--env.0.id={SIGNAL_ENV}",  # an untrained model: reverse-text would pay it nothing
    ]
    records = run_train(cmd, run_dir, tmp_path / "train.log")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["mismatch_kl"] >= 0 and 0 <= r["mismatch_extreme_frac"] <= 1
        assert r["router_known_pairs"] > 0
        # engine (bf16) and trainer (fp32) mostly agree: the captured routing is aligned with
        # the tokens (random expert pairs out of 4 choose 2 would disagree 5 times in 6). A tiny
        # random router's logits are close, so bf16 flips many near-ties: 0.33 seen on an AVX2
        # CPU, ~0.2 on AVX-512; misaligned routing would sit near 0.83.
        assert 0 <= r["router_disagreement"] < 0.5
    batch = read_batch(RunLayout(run_dir).batch(1))
    for sample in batch.samples:
        assert sample.routing is not None and sample.routing_dims == (2, 2)
    published = sorted(p.name for p in (run_dir / "weights").glob("step_*"))
    assert published[-1] == "step_000003"  # the server loaded each step's MoE export


def test_r3_refused_when_the_engine_cannot_return_routing(vllm_server) -> None:
    async def check() -> None:
        pool = ClientPool([vllm_server.url], api_key=vllm_server.token)
        try:
            await require_routing(pool)
        finally:
            await pool.aclose()

    with pytest.raises(UsageError, match=r"routing_replay = 'r3' needs routed experts"):
        asyncio.run(check())
