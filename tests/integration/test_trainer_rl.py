"""The RL loop on real batch files: publish weights, log metrics, skip NaN, reject bad input,
and resume after SIGKILL exactly as an uninterrupted run continues (Muon)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlkit.errors import UsageError
from rlkit.protocol.batch import MalformedBatchError, TrainBatch, TrainSample, write_batch
from rlkit.trainer.config import CkptConfig, LossConfig, ModelConfig, TrainerConfig, WeightsConfig
from rlkit.trainer.dist import whole
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
        assert all(torch.equal(whole(before[k]), whole(after[k])) for k in before)
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


def test_export_publishes_the_record_with_tensor_table_and_canary(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Beside the weights: the version's record, whose tensor table matches the files as
    written, then its canary, signed and bound to the record, whose logprobs (the trainer's)
    transformers reproduces from the exported (bf16) weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.inference.canary import canary_token_ids
    from rlkit.protocol.credentials import digest_key, token_from_env
    from rlkit.protocol.weights import Canary, PublishedVersion, iter_safetensors, mismatches

    trainer = Trainer(config(tiny_model_dir, tmp_path / "run"), total_steps=1)
    try:
        out = trainer.export(tmp_path / "run" / "weights" / "step_000001", version=1)
        assert out is not None and Canary.read(out) is None
        trainer.publish_canary(out)
    finally:
        trainer.close()
    record = PublishedVersion.read(out)
    assert record is not None and (record.version, record.transport) == (1, "filesystem")
    key = digest_key(token_from_env())  # the run's token's key, as the servers check
    assert mismatches(iter_safetensors(out), record, key) == []
    canary = Canary.read(out)
    assert canary is not None and canary.belongs_to(record)
    assert canary.signed_by(token_from_env())
    assert canary.token_ids == canary_token_ids(AutoTokenizer.from_pretrained(out))
    ids = torch.tensor([canary.token_ids])
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    assert len(canary.logprobs) == len(canary.token_ids) - 1 > 10
    assert canary.logprobs == pytest.approx(expected.tolist(), abs=0.05)


def test_ipc_export_casts_straight_into_the_buffer(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the second version on (the one before delivered), the gather casts each tensor into
    the ipc transport's buffer (`Ipc.destination`): the published tensors are the buffer's own
    bytes, no packing copy, and a worker reads exactly the policy's tensors, which its table
    accepts. While a worker still loads from the buffer, or the version before is not yet
    delivered, the gather makes new tensors (the first packed into another buffer)."""
    from rlkit.protocol import handoff
    from rlkit.protocol.credentials import digest_key, token_from_env
    from rlkit.protocol.weights import PublishedVersion, mismatches
    from rlkit.trainer.export import gather_state, hf_name
    from rlkit.weights import TransportSettings
    from rlkit.weights.ipc import Ipc, IpcDelivery, SharedBuffer, open_shared
    from rlkit.weights.transport import TimeoutParams

    packed: list[int] = []  # per fill: the tensors it copied (those not already in place)
    fill = SharedBuffer.fill

    def counting_fill(self: SharedBuffer, tensors: list, offsets: list[int]) -> None:
        mapped = self.mapped
        in_place = (
            0
            if mapped is None
            else sum(
                t.data_ptr() == mapped[o:].data_ptr()
                for (_, t), o in zip(tensors, offsets, strict=True)
            )
        )
        packed.append(len(tensors) - in_place)
        fill(self, tensors, offsets)

    monkeypatch.setattr(SharedBuffer, "fill", counting_fill)
    key = digest_key(token_from_env())
    ipc = Ipc(TransportSettings(TimeoutParams(timeout_s=5), token=token_from_env()))
    trainer = Trainer(config(tiny_model_dir, tmp_path / "run"), total_steps=3)
    out = [tmp_path / "run" / "weights" / f"step_{v:06d}" for v in (1, 2, 3)]

    def next_version() -> None:
        with torch.no_grad():
            for p in trainer.policy.parameters():
                p.add_(0.01)

    try:
        assert ipc.destination() is None  # nothing published yet
        trainer.export(out[0], version=1, transport=ipc)
        assert ipc.destination() is None  # not delivered: no wait here
        handoff.mark_delivered(out[0])
        next_version()
        views = ipc.destination()
        assert views is not None  # the delivered buffer, locked for the gather
        trainer.export(out[1], version=2, transport=ipc)
        expected = {
            hf_name(k): v for k, v in gather_state(trainer.policy, trainer.export_dtype).items()
        }
        second = PublishedVersion.read(out[1])
        received = dict(open_shared(second))  # a worker loading version 2: its lock held
        handoff.mark_delivered(out[1])
        next_version()
        trainer.export(out[2], version=3, transport=ipc)
    finally:
        trainer.close()
    first, third = PublishedVersion.read(out[0]), PublishedVersion.read(out[2])
    assert IpcDelivery.of(second).name == IpcDelivery.of(first).name  # the same pages
    n = len(second.tensors)
    assert packed == [n, 0, n]  # version 2: every tensor already in place, nothing copied
    assert set(received) == {e.name for e in second.tensors} == set(views)
    for name, tensor in received.items():
        assert torch.equal(tensor, expected[name]), name
        assert torch.equal(views[name], expected[name]), name  # the gather's writes
    assert mismatches(received.items(), second, key) == []  # untouched by version 3
    assert IpcDelivery.of(third).name != IpcDelivery.of(second).name  # packed anew
    assert mismatches(open_shared(third), third, key) == []


def rl_trainer_config(tmp: Path, model: Path, run_dir: Path) -> Path:
    """A trainer process's own config: Muon, a checkpoint every step, deterministic kernels."""
    cfg = tmp / f"{run_dir.name}.toml"
    cfg.write_text(
        f"""run_dir = "{run_dir}"
seed = 3
deterministic = true
max_steps = 4
micro_batch_tokens = 64
batch_timeout_s = 300
[model]
path = "{model}"
[optim]
name = "muon"
lr = 1e-2
[loss]
name = "icepop"
params = {{ alpha = 0.0, beta = 1e9 }}
[ckpt]
interval = 1
keep_last = 2
"""
    )
    return cfg


@pytest.mark.slow
def test_muon_rl_trainer_sigkilled_resumes_as_uninterrupted(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The trainer process of `rlkit train` with Muon, SIGKILLed while it waits for batch 3
    (after step 2's checkpoint), resumes and trains steps 3 and 4 as a run never killed does:
    same losses to 1e-6, same published weights (Muon's momentum is in the checkpoint)."""
    run_a, run_b = tmp_path / "uninterrupted", tmp_path / "killed"
    for run_dir, steps in ((run_a, (1, 2, 3, 4)), (run_b, (1, 2))):
        for step in steps:
            write_batch(make_batch(step), run_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def trainer(run_dir: Path, *extra: str) -> list[str]:
        cfg = rl_trainer_config(tmp_path, tiny_model_dir, run_dir)
        return [sys.executable, "-m", "rlkit.trainer.main", "--config", str(cfg), *extra]

    full = subprocess.Popen(trainer(run_a), env=env, stderr=subprocess.PIPE)
    victim = subprocess.Popen(
        trainer(run_b), env=env, start_new_session=True, stderr=subprocess.PIPE
    )
    latest = run_b / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while not (latest.exists() and latest.read_text().strip() == "step_000002"):
        assert victim.poll() is None, victim.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint of step 2"
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # waiting for batch 3: nothing of step 3 exists yet
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    for step in (3, 4):
        write_batch(make_batch(step), run_b)
    resumed = subprocess.run(
        [*trainer(run_b), "--resume"], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert full.wait(timeout=300) == 0, full.stderr.read().decode()[-2000:]

    def losses(run_dir: Path) -> dict[int, float]:
        lines = (run_dir / "trainer_metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines)}

    expected, got = losses(run_a), losses(run_b)
    assert list(got) == [1, 2, 3, 4]  # each step logged once
    assert all(abs(got[s] - expected[s]) <= 1e-6 for s in expected), (got, expected)
    final_a = load_file(run_a / "weights" / "step_000004" / "model.safetensors")
    final_b = load_file(run_b / "weights" / "step_000004" / "model.safetensors")
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    base = load_file(tiny_model_dir / "model.safetensors")
    assert any(not torch.equal(final_a[k], base[k]) for k in final_a)  # Muon moved the weights
