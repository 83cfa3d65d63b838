"""LoRA in the trainer (one process): only the adapter trains, checkpoints hold and restore just
the adapter and its optimiser state, the exported PEFT directory reproduces the trainer's
logprobs in peft; plus the pure helpers (names, server flags, version headers, model cards)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlkit.errors import UsageError
from rlkit.inference.client import Response, _response_version, _with_parent
from rlkit.inference.engine_args import lora_server_args
from rlkit.protocol.model import LoraConfig
from rlkit.protocol.weights import published_bytes
from rlkit.trainer import dist
from rlkit.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from rlkit.trainer.dist import whole
from rlkit.trainer.lora import to_peft_state
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from rlkit.trainer.sft import sft_loss
from rlkit.trainer.trainer import Trainer


def test_lora_server_args_round_the_rank_up() -> None:
    assert lora_server_args(0, 4) == []
    assert lora_server_args(8, 2) == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
    assert lora_server_args(12, 1)[-1] == "16"
    with pytest.raises(UsageError, match="rank 600"):
        lora_server_args(600, 1)


def test_served_name_is_unique_per_run_dir(tmp_path: Path) -> None:
    lora = LoraConfig(rank=8)
    a, b = lora.served_name(tmp_path / "x" / "rl"), lora.served_name(tmp_path / "y" / "rl")
    assert a.startswith("rl-") and a != b and a == lora.served_name(tmp_path / "x" / "rl")
    assert LoraConfig(rank=8, name="mine").served_name(tmp_path) == "mine"
    assert not LoraConfig().enabled


def test_peft_names() -> None:
    state = {
        "model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.zeros(1),
        "model.layers.0.self_attn.q_proj.base_layer.weight": torch.zeros(1),
    }
    assert list(to_peft_state(state)) == [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    ]


def test_adapter_versions_and_cards() -> None:
    headers = {"x-policy-version": "7", "x-adapter-versions": json.dumps({"a": 3, "b": 5})}
    resp = Response(200, headers, b"")  # type: ignore[arg-type]
    assert _response_version(resp) == 7
    assert _response_version(resp, "b") == 5 and _response_version(resp, "c") is None
    base = {"id": "/m", "root": "/m", "max_model_len": 512}
    cards = [base, {"id": "a", "root": "/run/w", "parent": "/m"}]
    assert _with_parent(cards[1], cards) == {**base, "id": "a", "parent": "/m"}
    assert _with_parent(base, cards) is base


def seqs() -> list[TokenSequence]:
    g = torch.Generator().manual_seed(0)
    return [
        TokenSequence(
            torch.randint(0, 1000, (24,), generator=g).tolist(), [0] * 8 + [1] * 16, [0.0] * 24
        )
        for _ in range(4)
    ]


def test_lora_trains_adapter_only_resumes_and_exports_peft(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    cfg = TrainerConfig(
        run_dir=str(tmp_path / "run"),
        model=ModelConfig(path=str(tiny_model_dir), lora=lora),
        optim=OptimConfig(lr=1e-2),
    )
    data = seqs()
    (mb,) = make_micro_batches(data[:1], 4096)
    trainer = Trainer(cfg, total_steps=4)
    try:
        trainable = {n for n, p in trainer.policy.named_parameters() if p.requires_grad}
        assert trainable and all(".lora_" in n for n in trainable)
        assert len(trainer.params) == len(trainable) == 2 * 3 * 2  # A, B x 3 modules x 2 layers
        # the frozen base stays in the checkpoint's bf16 (half of fp32's memory); A and B fp32
        dtypes = {p.requires_grad: p.dtype for p in trainer.policy.parameters()}
        assert dtypes == {False: torch.bfloat16, True: torch.float32}
        frozen = {n: whole(p.detach()).clone() for n, p in trainer.policy.named_parameters()}
        for _ in range(2):
            assert not trainer.train_step(data, sft_loss, normalizer=64.0).skipped
        for n, p in trainer.policy.named_parameters():
            moved = not torch.equal(whole(p.detach()), frozen[n])
            if "lora_A" not in n:  # B starts at zero: A's first step has no gradient
                assert moved == (n in trainable), n
        ckpt = trainer.save_checkpoint(2, {"next": 3})
        out = trainer.export(tmp_path / "adapter")
        with torch.no_grad():
            ours = trainer.logprobs(mb)[0][0, :23]
        after = trainer.train_step(data, sft_loss, normalizer=64.0).metrics["loss"]
    finally:
        trainer.close()
    assert out is not None and published_bytes(out) < published_bytes(tiny_model_dir) / 10
    assert sum(f.stat().st_size for f in ckpt.rglob("*.distcp")) < published_bytes(tiny_model_dir)

    cfg.ckpt.resume = "latest"
    resumed = Trainer(cfg, total_steps=4)
    try:
        assert resumed.maybe_resume() == (2, {"next": 3})
        with torch.no_grad():
            assert torch.equal(resumed.logprobs(mb)[0][0, :23], ours)
        assert resumed.train_step(data, sft_loss, normalizer=64.0).metrics["loss"] == after
    finally:
        resumed.close()

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out))
    ids = torch.tensor([data[0].token_ids])
    with torch.no_grad():
        logp = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    assert (logp[7:] - ours[7:]).abs().max() < 0.01  # the adapter is stored in bf16


def test_unknown_target_module_is_a_usage_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    lora = LoraConfig(rank=4, target_modules=["nope_proj"])
    cfg = TrainerConfig(
        run_dir=str(tmp_path), model=ModelConfig(path=str(tiny_model_dir), lora=lora)
    )
    try:
        with pytest.raises(UsageError, match="model.lora.target_modules"):
            Trainer(cfg, total_steps=1)
    finally:
        dist.close_distributed()


def test_sft_with_lora_writes_an_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rlkit.trainer.config import SFTConfig, SFTDataConfig
    from rlkit.trainer.sft import run_sft

    rows = [
        {"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1]}]}
        for w in ("abc", "hello", "lora", "peft")
    ]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SFTConfig(
        run_dir=str(tmp_path / "sft"),
        max_steps=2,
        model=ModelConfig(path=str(tiny_model_dir), lora=LoraConfig(rank=4)),
        data=SFTDataConfig(path=str(data), batch_tokens=64),
    )
    final = run_sft(cfg)
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == str(tiny_model_dir)
    assert (final / "adapter_model.safetensors").is_file()


def test_a_bad_adapter_dir_is_refused_before_the_engine(tmp_path: Path) -> None:
    from rlkit.inference.weights import check_adapter_dir

    with pytest.raises(UsageError, match="adapter_config.json"):
        check_adapter_dir(tmp_path)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(UsageError, match="no adapter_model.safetensors"):
        check_adapter_dir(tmp_path)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\x01")
    with pytest.raises(UsageError, match="not a safetensors file"):
        check_adapter_dir(tmp_path)
