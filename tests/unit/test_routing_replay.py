"""MoE routing replay in the trainer: exactness, robustness to router changes, router gradient,
packed == padded with routing, R2 through the training step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from rlkit.errors import UsageError
from rlkit.protocol.routing import UNKNOWN
from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
from rlkit.trainer.packing import MicroBatch, TokenSequence, make_micro_batches
from rlkit.trainer.routing import moe_routers
from rlkit.trainer.trainer import Trainer
from tests.helpers.sequences import sequences
from tests.helpers.tolerance import forward_terms, summation_atol


@pytest.fixture
def moe_trainer(tiny_moe_model_dir: Path, tmp_path: Path) -> Iterator[Trainer]:
    cfg = TrainerConfig(
        run_dir=str(tmp_path),
        model=ModelConfig(path=str(tiny_moe_model_dir)),
        routing_replay="r3",
        loss=LossConfig(name="grpo"),
    )
    trainer = Trainer(cfg, total_steps=1)
    yield trainer
    trainer.close()


@contextmanager
def experts_used(trainer: Trainer) -> Iterator[list[torch.Tensor]]:
    """Capture the expert ids each MoE layer's experts module actually receives."""
    seen: list[torch.Tensor] = []
    blocks = [m.experts for m in trainer.policy.lm.modules() if hasattr(m, "experts")]
    handles = [
        b.register_forward_pre_hook(lambda _m, args: seen.append(args[1].clone())) for b in blocks
    ]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def forward(trainer: Trainer, mb: MicroBatch) -> torch.Tensor:
    with torch.no_grad():
        return trainer.logprobs(mb)[0]


def random_routing(n: int, layers: int, experts: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Distinct random experts per token and layer; the last token unknown (as from an engine)."""
    routing = torch.rand(n, layers, experts, generator=g).argsort(-1)[..., :k]
    routing[-1] = UNKNOWN
    return routing


def test_replayed_forward_equals_the_forward_that_chose_the_routing(moe_trainer: Trainer) -> None:
    router = moe_trainer.policy.router
    assert router.num_layers == 2 and router.top_k == 2  # layer indices count MoE layers
    seqs = sequences(moe_trainer.policy.lm.config.vocab_size, [23, 17, 30])
    (mb,) = make_micro_batches(seqs, 128, True)
    with experts_used(moe_trainer) as normal_experts:
        normal = forward(moe_trainer, mb)
    chosen = router.own_routing().unflatten(0, mb.input_ids.shape)
    mb.routing = chosen.clone()
    with experts_used(moe_trainer) as replayed_experts:
        replayed = forward(moe_trainer, mb)
    torch.testing.assert_close(replayed, normal, rtol=0, atol=0)
    assert [e.tolist() for e in replayed_experts] == [e.tolist() for e in normal_experts]
    assert router.disagreement(mb.token_mask.flatten()) == (0.0, float(mb.num_tokens * 2))

    # perturb every router: the normal forward routes differently, the replay does not
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for r in moe_routers(moe_trainer.policy.lm):
            local = r.weight.to_local() if hasattr(r.weight, "to_local") else r.weight
            local.add_(torch.randn(local.shape, generator=g) * 0.5)
    mb.routing = None
    with experts_used(moe_trainer) as perturbed_experts:
        forward(moe_trainer, mb)
    moved = sum(int((a != b).any()) for a, b in zip(perturbed_experts, normal_experts, strict=True))
    assert moved == 2  # both MoE layers now choose other experts for some tokens
    mb.routing = chosen.clone()
    with experts_used(moe_trainer) as replayed_experts:
        lp, _ = moe_trainer.logprobs(mb)
    assert [e.tolist() for e in replayed_experts] == [e.tolist() for e in normal_experts]
    differ, known = router.disagreement(mb.token_mask.flatten())
    assert 0 < differ < known

    # the router still gets a gradient through the replayed experts' weights
    lp.sum().backward()
    for r in moe_routers(moe_trainer.policy.lm):
        grad = (
            r.weight.grad.full_tensor() if hasattr(r.weight.grad, "full_tensor") else r.weight.grad
        )
        assert grad.abs().sum() > 0


def test_packed_and_padded_batches_with_routing_agree(moe_trainer: Trainer) -> None:
    cfg = moe_trainer.policy.lm.config
    g = torch.Generator().manual_seed(0)
    seqs = sequences(cfg.vocab_size, [23, 7, 41, 16, 30])
    for s in seqs:
        s.routing = random_routing(len(s.token_ids), 2, cfg.num_experts, 2, g)

    def per_sample(packing: bool) -> dict[int, torch.Tensor]:
        out = {}
        for mb in make_micro_batches(seqs, 128, packing):
            lp = forward(moe_trainer, mb)
            for row, i in enumerate(mb.sample_ids):
                out[i] = lp[row][mb.loss_mask[row].bool()]
        return out

    packed, padded = per_sample(True), per_sample(False)
    unreplayed = {i: s.routing for i, s in enumerate(seqs)}
    for s in seqs:
        s.routing = None
    own = per_sample(True)
    terms = forward_terms(cfg, keys=max(len(s.token_ids) for s in seqs))
    for i in range(len(seqs)):
        atol = summation_atol(terms, float(padded[i].abs().max()))  # two summation orders
        torch.testing.assert_close(packed[i], padded[i], rtol=0, atol=atol)
    assert any((packed[i] - own[i]).abs().max() > 1e-3 for i in unreplayed)  # replay took effect


def test_routing_of_the_wrong_shape_names_the_sample() -> None:
    seqs = [
        TokenSequence(
            [1, 2, 3], [0, 1, 1], [0.0] * 3, routing=torch.zeros(2, 2, 2, dtype=torch.long)
        )
    ]
    with pytest.raises(ValueError, match=r"sample 0: routing has shape \(2, 2, 2\), expected \(3"):
        make_micro_batches(seqs, 16)


def test_r2_replays_pre_update_routing_and_logs_disagreement(
    tiny_moe_model_dir: Path, tmp_path: Path
) -> None:
    cfg = TrainerConfig(
        run_dir=str(tmp_path),
        model=ModelConfig(path=str(tiny_moe_model_dir)),
        routing_replay="r2",
        loss=LossConfig(name="grpo"),
        micro_batch_tokens=64,
    )
    cfg.optim.lr = 0.05  # large: the second mini-step's routers have clearly moved
    trainer = Trainer(cfg, total_steps=1)
    try:
        seqs = sequences(trainer.policy.lm.config.vocab_size, [23, 17, 30, 12])
        for i, s in enumerate(seqs):
            s.advantage = 1.0 if i % 2 else -1.0
        chunks = [seqs[:2], seqs[2:]]
        result = trainer.train_steps(
            chunks, cfg.loss.resolved, [cfg.loss.resolved.normalizer(c) for c in chunks]
        )
        m = result.metrics
        assert m["router_known_pairs"] == sum(len(s.token_ids) for s in seqs) * 2
        assert 0 < m["router_disagreement"] < 1  # second mini-step: own top-k moved, replayed
    finally:
        trainer.close()


def test_replay_on_a_dense_model_is_a_usage_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = TrainerConfig(
        run_dir=str(tmp_path), model=ModelConfig(path=str(tiny_model_dir)), routing_replay="r2"
    )
    with pytest.raises(UsageError, match="has no MoE layers"):
        Trainer(cfg, total_steps=1)


def test_router_aux_loss_is_added_when_asked(tiny_moe_model_dir: Path, tmp_path: Path) -> None:
    cfg = TrainerConfig(
        run_dir=str(tmp_path),
        model=ModelConfig(path=str(tiny_moe_model_dir)),
        router_aux_loss_coef=0.01,
        loss=LossConfig(name="grpo"),
    )
    trainer = Trainer(cfg, total_steps=1)
    try:
        seqs = sequences(trainer.policy.lm.config.vocab_size, [23, 17])
        metrics, _, _ = trainer.compute_gradients(
            seqs, cfg.loss.resolved, cfg.loss.resolved.normalizer(seqs)
        )
        assert 0 < metrics["router_aux_loss"] < 4  # E * sum_e f_e P_e: 1 when balanced
        assert "router_disagreement" not in metrics  # routing unknown: nothing to compare
    finally:
        trainer.close()


def test_routing_over_all_decoder_layers_is_narrowed_to_the_moe_layers() -> None:
    """vLLM returns routing for every decoder layer; layer indices here count MoE layers only."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from rlkit.trainer.routing import RouterControl

    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=[1],  # layer 1 is dense
    )
    control = RouterControl(AutoModelForCausalLM.from_config(config))
    assert control.num_layers == 2 and control.layer_ids == [0, 2]
    every_layer = torch.tensor([[[0, 1], [9, 9], [2, 3]]])  # [tokens, decoder layers, k]
    control.set_routing(every_layer, replay=True)
    assert control.given.tolist() == [[[0, 1], [2, 3]]]
    with pytest.raises(ValueError, match="the model has 2 MoE layers with top_k 2"):
        control.set_routing(torch.zeros(1, 4, 2, dtype=torch.long), replay=True)
