"""One RL step of `rlkit train` at Qwen3's real vocabulary (151,936 entries): the `medium`
shape (`rlkit model init-tiny --size medium`, ~65 M parameters, most of them the tied
embedding), so sampling, detokenising, chunked logprobs and the weight update over a
real-sized vocabulary stay covered. Its own vLLM server: the session servers serve the tiny
model."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.protocol.batch import read_batch
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.weights import published_bytes
from tests.helpers.cli import run_cli, tiny_train_cmd
from tests.helpers.train_runs import SHORT, records, run

pytestmark = pytest.mark.slow

TRAINED_BPE = 8192  # the local tokenizer's merges end here; the rest is padding


def test_one_rl_step_at_the_real_vocabulary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    model = tmp_path / "medium"
    code, out = run_cli(
        monkeypatch, capsys, "model", "init-tiny", "--size", "medium", "--out", str(model)
    )
    assert code == 0, out
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(model, run_dir, *SHORT, "--orchestrator.max_steps=1", "--ckpt.interval=0")
    assert run(cmd, tmp_path / "train.log") == 0, (tmp_path / "train.log").read_text()[-3000:]

    (rec,) = records(run_dir)
    assert rec["step"] == 1
    assert rec["weight_update_bytes"] >= published_bytes(model) * 0.9
    # the engine (bf16) and the trainer (fp32) agree on the sampled tokens' logprobs
    assert rec["mismatch_kl"] < 1e-2, rec["mismatch_kl"]
    batch = read_batch(RunLayout(run_dir).batch(1))
    sampled = [t for s in batch.samples for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
    # a random model samples across the whole vocabulary: ids past the trained BPE made it
    # through the engine, the detokeniser, the batch and the trainer's logprobs
    assert max(sampled) >= TRAINED_BPE
    assert max(sampled) < 151_936
