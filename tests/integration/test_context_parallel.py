"""Context parallelism is exact: two gloo ranks splitting every row (`context_parallel = 2`)
give the per-token logprobs, the loss metrics and every parameter's gradient of one process,
within fp32 tolerance (logprobs and loss rel 1e-5, gradients rtol 1e-4 / atol 1e-6: the
split changes only the order of floating-point sums), on rows of ~1k tokens, packed and
padded, with IcePop (+ seq_reject_below) and GSPO (its sequence ratio, seq-mean-token-mean,
pi_old recomputed, a reference KL); and a MoE model with R2 routing replay, a LoRA adapter and
activation checkpointing.

The file is also the probe: `python THIS OUT CP DENSE_MODEL MOE_MODEL` (one process, CP = 1)
or under torchrun computes, per case of `CASES`, every micro-batch's logprobs and one batch's
gradients without a step, and saves them from rank 0.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlkit.trainer.main import TrainerRanks

CASES = {
    "icepop-packed": dict(
        loss=dict(name="icepop", params={"seq_reject_below": 0.02}), packing=True
    ),
    # GSPO's sequence ratio and seq-mean-token-mean, on pi_old recomputed, with a reference KL
    "gspo-padded": dict(
        loss=dict(name="gspo", old_policy="recomputed", params={"kl_coef": 0.1}), packing=False
    ),
    "moe-r2-lora-checkpointing": dict(
        moe=True,
        loss=dict(name="icepop"),
        packing=True,
        routing_replay="r2",
        lora=8,
        activation_checkpointing=True,
    ),
}


def long_batch(vocab: int, seed: int = 0) -> list:
    """Five samples, 1,100 to 97 tokens, prompt (mask 0) then completion (mask 1), with an
    environment span (mask 0) inside the longest, advantages of both signs, and engine logprobs
    near the model's with one far-off token."""
    from rlkit.trainer.packing import TokenSequence

    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i, (prompt, completion) in enumerate(
        [(300, 800), (40, 600), (200, 301), (9, 88), (60, 37)]
    ):
        n = prompt + completion
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * prompt + [1] * completion
        if i == 0:
            mask[500:560] = [0] * 60  # a tool reply inside the completion
        # near the random model's own logprobs (about -log V), so few tokens are masked
        noise = torch.randn(completion, generator=g) * 0.1
        inf = [0.0] * prompt + (noise - math.log(vocab)).tolist()
        if i == 3:
            inf[prompt + 5] = -0.01  # k ~ 1/V: seq_reject_below rejects this sample
        seqs.append(TokenSequence(ids, mask, inf, advantage=(i % 3) - 1.0 + 0.25))
    return seqs


def probe(out: str, context_parallel: str, dense_dir: str, moe_dir: str) -> None:
    from rlkit.protocol.model import LoraConfig, ModelConfig
    from rlkit.trainer import dist
    from rlkit.trainer.config import LossConfig, TrainerConfig
    from rlkit.trainer.trainer import Trainer

    results = {}
    for name, case in CASES.items():
        case = dict(case)
        model = ModelConfig(
            path=moe_dir if case.pop("moe", False) else dense_dir,
            lora=LoraConfig(rank=case.pop("lora", 0)),
            activation_checkpointing=case.pop("activation_checkpointing", False),
        )
        cfg = TrainerConfig(
            run_dir=str(Path(out).parent / "run"),
            model=model,
            loss=LossConfig(**case.pop("loss")),
            micro_batch_tokens=1200,
            context_parallel=int(context_parallel),
            collective_timeout_s=120,
            **case,
        )
        trainer = Trainer(cfg, total_steps=1)
        for pname, param in trainer.policy.named_parameters():
            if "lora_B" in pname:  # B starts at 0, which leaves A without a gradient
                param.detach().fill_(0.01)
        seqs = long_batch(trainer.policy.lm.config.vocab_size)
        loss = cfg.loss.resolved
        from rlkit.trainer.packing import make_micro_batches

        mbs = make_micro_batches(seqs, cfg.micro_batch_tokens, cfg.packing, trainer.hidden_size)
        logprobs: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for mb in mbs:  # every rank runs every micro-batch: a collective with cp > 1
                lp = trainer.logprobs(mb)[0]
                for s, sample in enumerate(mb.sample_ids):
                    logprobs[sample] = (lp[s] * mb.loss_mask[s]).cpu()
        metrics, nonfinite, n_mbs = trainer.compute_gradients(
            seqs, loss, loss.normalizer(seqs), loss.recomputes_old
        )
        grads = {}
        for pname, param in trainer.policy.named_parameters():
            if (grad := param.grad) is not None:
                grads[pname] = dist.whole(grad).clone()
        results[name] = {
            "metrics": metrics,
            "grads": grads,
            "logprobs": logprobs,
            "micro_batches": n_mbs,
            "nonfinite": nonfinite,
        }
        dist.barrier()
    if dist.is_main():
        torch.save(results, out)
    dist.close_distributed(wait_for_peers=True)


def _run(cmd: list[str], tmp: Path) -> None:
    tmp.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _compare(one: dict, two: dict) -> None:
    assert one["micro_batches"] == two["micro_batches"]
    assert not one["nonfinite"] and not two["nonfinite"]
    assert one["logprobs"].keys() == two["logprobs"].keys()
    for sample, lp in one["logprobs"].items():
        torch.testing.assert_close(two["logprobs"][sample], lp, rtol=1e-5, atol=1e-5)
    for key, value in one["metrics"].items():
        assert two["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert one["grads"].keys() == two["grads"].keys()
    nonzero = 0
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        nonzero += int(grad.abs().sum() > 0)
    assert nonzero == len(one["grads"])


@pytest.mark.slow
def test_context_parallel_two_ranks_match_one_process(
    tiny_model_dir: Path, tiny_moe_model_dir: Path, tmp_path: Path
):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    models = [str(tiny_model_dir), str(tiny_moe_model_dir)]
    _run([sys.executable, __file__, str(one), "1", *models], tmp_path / "t1")
    torchrun = [sys.executable, *TrainerRanks(nproc=2).torchrun_args()]
    _run([*torchrun, __file__, str(two), "2", *models], tmp_path / "t2")
    one_rank, two_ranks = torch.load(one), torch.load(two)
    assert one_rank.keys() == two_ranks.keys() == CASES.keys()
    for case in CASES:
        _compare(one_rank[case], two_ranks[case])
    assert one_rank["icepop-packed"]["metrics"]["seq_rejected"] > 0  # rejection is exercised
    assert two_ranks["moe-r2-lora-checkpointing"]["metrics"]["router_known_pairs"] > 0


@pytest.mark.slow
def test_rlkit_train_with_two_context_parallel_ranks(tiny_model_dir: Path, tmp_path: Path):
    """`rlkit train` end to end on the CPU demo config (real vLLM server) with two trainer ranks
    that split every row (`trainer.context_parallel = 2`): the launcher says what the ranks form,
    every step trains on finite losses and publishes its weights, and step 1's mismatch KL (the
    split trainer's logprobs against the engine's, same weights) is at rounding level (6e-7
    when recorded; 1e-4 leaves room for the engine's bf16)."""
    from tests.helpers.cli import tiny_train_cmd
    from tests.helpers.train_runs import SHORT, records, run

    steps = 3
    run_dir = tmp_path / "run"
    cmd = tiny_train_cmd(
        tiny_model_dir,
        run_dir,
        *SHORT,
        f"--orchestrator.max_steps={steps}",
        "--ckpt.interval=0",
        "--trainer.nproc_per_node=2",
        "--trainer.context_parallel=2",
    )
    log = tmp_path / "run.log"
    assert run(cmd, log) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "trainer mesh: 2 rank(s) = data parallel 1 x context parallel 2" in text
    done = records(run_dir)
    assert [r["step"] for r in done] == list(range(1, steps + 1))
    assert done[0]["mismatch_kl"] < 1e-4, done[0]
    for record in done:
        assert math.isfinite(record["loss"]), record
        assert record["weights_canary_kl"] is not None, record


if __name__ == "__main__":
    probe(*sys.argv[1:])
