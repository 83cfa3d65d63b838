"""The RL loop on real batch files: publish weights, log metrics, skip NaN, reject bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlkit.errors import UsageError
from rlkit.protocol.batch import MalformedBatchError, TrainBatch, TrainSample, write_batch
from rlkit.trainer.config import CkptConfig, LossConfig, ModelConfig, TrainerConfig, WeightsConfig
from rlkit.trainer.rl import run_rl, to_sequences
from rlkit.trainer.trainer import Trainer


def make_batch(step: int, advantage_scale: float = 1.0, n: int = 6) -> TrainBatch:
    g = torch.Generator().manual_seed(step)
    samples = []
    for i in range(n):
        prompt, completion = 4 + i, 6 + 2 * i
        ids = torch.randint(0, 1000, (prompt + completion,), generator=g).tolist()
        inf = [0.0] * prompt + (-torch.rand(completion, generator=g) * 4 - 5).tolist()
        samples.append(
            TrainSample(
                token_ids=ids,
                loss_mask=[0] * prompt + [1] * completion,
                inference_logprobs=inf,
                advantage=advantage_scale * (1.0 if i % 2 else -1.0),
                policy_version=step - 1,
                reward=float(i % 2),
            )
        )
    return TrainBatch(step=step, samples=samples)


def config(model: Path, run_dir: Path, **kw) -> TrainerConfig:
    base = dict(
        run_dir=str(run_dir),
        model=ModelConfig(path=str(model)),
        micro_batch_tokens=64,
        batch_timeout_s=5,
        loss=LossConfig(name="icepop", params={"alpha": 0.0, "beta": 1e9}),
    )
    return TrainerConfig(**{**base, **kw})


def test_rl_steps_publish_weights_and_skip_nonfinite(tiny_model_dir: Path, tmp_path: Path) -> None:
    write_batch(make_batch(1, advantage_scale=3e38), tmp_path)  # loss overflows to inf
    write_batch(make_batch(2), tmp_path)
    write_batch(make_batch(3), tmp_path)
    cfg = config(
        tiny_model_dir,
        tmp_path,
        max_steps=3,
        optim={"lr": 1e-2},
        ckpt=CkptConfig(interval=1, keep_last=2),
        weights=WeightsConfig(keep_last=2),
    )
    run_rl(cfg)
    records = [json.loads(line) for line in (tmp_path / "trainer_metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["skipped"] for r in records] == [1.0, 0.0, 0.0]
    assert records[0]["loss"] is None and records[1]["loss"] is not None  # inf logged as null
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "step_time_s", "mismatch_kl"):
        assert key in records[1]
    assert records[1]["staleness_mean"] == 0.0 and records[1]["samples"] == 6

    published = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert published == ["step_000002", "step_000003"]  # keep_last=2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest",
        "step_000002",
        "step_000003",
    ]
    base = load_file(tiny_model_dir / "model.safetensors")
    new = load_file(tmp_path / "weights" / "step_000003" / "model.safetensors")
    assert (tmp_path / "weights" / "step_000003" / "STABLE").exists()
    assert base.keys() == new.keys()
    assert all(new[k].dtype == base[k].dtype and torch.isfinite(new[k]).all() for k in new)
    assert any(not torch.equal(new[k], base[k]) for k in new)


def test_skipped_step_leaves_weights_and_optimizer_untouched(
    tiny_model_dir: Path, tmp_path: Path
) -> None:

    cfg = config(tiny_model_dir, tmp_path)
    trainer = Trainer(cfg, total_steps=1)
    try:
        before = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        seqs = to_sequences(make_batch(1))
        seqs[0].advantage = float("nan")
        result = trainer.train_step(seqs, cfg.loss.resolved, cfg.loss.resolved.normalizer(seqs))
        assert result.skipped
        after = trainer.policy.state_dict()
        assert all(torch.equal(before[k].full_tensor(), after[k].full_tensor()) for k in before)
        assert not trainer.optimizer.state  # AdamW moments never saw the NaN
    finally:
        trainer.close()


def test_malformed_batch_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    batch = make_batch(1)
    batch.samples[3].loss_mask = batch.samples[3].loss_mask[:-1]
    write_batch(batch, tmp_path)
    with pytest.raises(MalformedBatchError, match="sample 3: loss_mask has"):
        run_rl(config(tiny_model_dir, tmp_path, max_steps=1))
    assert not (tmp_path / "weights").exists()


def test_missing_batch_times_out_with_a_hint(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = config(tiny_model_dir, tmp_path, max_steps=1, batch_timeout_s=0.5)
    with pytest.raises(TimeoutError, match="is the orchestrator running"):
        run_rl(cfg)


def test_out_of_memory_names_the_setting(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    cfg = config(tiny_model_dir, tmp_path)
    trainer = Trainer(cfg, total_steps=1)

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer, "logprobs", exhausted)
    try:
        with pytest.raises(UsageError, match=r"lower micro_batch_tokens \(now 64\)"):
            trainer.train_step(to_sequences(make_batch(1)), cfg.loss.resolved, 10.0)
    finally:
        trainer.close()


def test_export_keeps_checkpoint_tensor_names(tmp_path: Path) -> None:
    """Tied embeddings are written once, as in the source checkpoint (vLLM rejects extras)."""
    from safetensors import safe_open

    from rlkit.models import init_tiny

    model = init_tiny(tmp_path / "tied", tie_embeddings=True)
    trainer = Trainer(config(model, tmp_path / "run"), total_steps=1)
    try:
        out = trainer.export(tmp_path / "run" / "weights" / "step_000001")
    finally:
        trainer.close()
    with (
        safe_open(str(model / "model.safetensors"), "pt") as a,
        safe_open(str(out / "model.safetensors"), "pt") as b,
    ):
        assert sorted(a.keys()) == sorted(b.keys())
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())


def test_export_publishes_fingerprint_and_canary(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Beside the weights: the fingerprint of the files as written and the trainer's canary
    logprobs, which transformers reproduces from the exported (bf16) weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.inference.canary import canary_token_ids, read_canary
    from rlkit.inference.fingerprint import mismatches, read_fingerprint
    from rlkit.inference.weights import iter_safetensors

    trainer = Trainer(config(tiny_model_dir, tmp_path / "run"), total_steps=1)
    try:
        out = trainer.export(tmp_path / "run" / "weights" / "step_000001")
    finally:
        trainer.close()
    assert mismatches(iter_safetensors(out), read_fingerprint(out)) == []
    canary = read_canary(out)
    assert canary["token_ids"] == canary_token_ids(AutoTokenizer.from_pretrained(out))
    ids = torch.tensor([canary["token_ids"]])
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert len(canary["logprobs"]) == len(canary["token_ids"]) - 1 > 10
    assert canary["logprobs"] == pytest.approx(expected.tolist(), abs=0.05)
