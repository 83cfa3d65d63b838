"""Two gloo ranks under torchrun compute the same loss and gradients as one process: on one
node (FSDP2 over both ranks) and as two "nodes" on localhost meeting through torchrun's c10d
rendezvous with hybrid sharding (HSDP: a 2-D mesh, replicated across the nodes).

The file is also the probe script: `python THIS OUT MODEL [SHARDING]` (one process) or under
torchrun computes one batch's gradients without stepping and saves the loss metrics plus the
full (unsharded) gradients to OUT from rank 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rlkit.ports import free_port
from rlkit.trainer.main import TrainerRanks


def synthetic_batch(vocab: int, seed: int = 0) -> list:
    """Seven samples of mixed lengths with prompt (mask 0) and completion (mask 1) tokens."""
    from rlkit.trainer.packing import TokenSequence

    g = torch.Generator().manual_seed(seed)
    seqs = []
    for i, (prompt, completion) in enumerate(
        [(5, 9), (3, 20), (8, 4), (6, 13), (2, 7), (9, 9), (4, 30)]
    ):
        n = prompt + completion
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * prompt + [1] * completion
        inf = [0.0] * prompt + (-torch.rand(completion, generator=g) * 5).tolist()
        seqs.append(TokenSequence(ids, mask, inf, advantage=(i % 3) - 1.0 + 0.25))
    return seqs


def probe(out: str, model_dir: str, sharding: str = "full", lora_rank: str = "0") -> None:
    from rlkit.protocol.model import LoraConfig
    from rlkit.trainer import dist
    from rlkit.trainer.config import LossConfig, ModelConfig, TrainerConfig
    from rlkit.trainer.trainer import Trainer

    cfg = TrainerConfig(
        run_dir=str(Path(out).parent / "run"),
        model=ModelConfig(path=model_dir, lora=LoraConfig(rank=int(lora_rank))),
        micro_batch_tokens=40,  # several micro-batches: uneven split across the two ranks
        loss=LossConfig(name="grpo", params={"kl_coef": 0.1}),  # with its reference model
        sharding=sharding,
        collective_timeout_s=120,
    )
    trainer = Trainer(cfg, total_steps=1)
    for name, param in trainer.policy.named_parameters():
        if "lora_B" in name:  # B starts at 0, which leaves A without a gradient
            param.detach().fill_(0.01)
    seqs = synthetic_batch(trainer.policy.lm.config.vocab_size)
    metrics, nonfinite, n_mbs = trainer.compute_gradients(
        seqs, cfg.loss.resolved, cfg.loss.resolved.normalizer(seqs)
    )
    grads = {}
    for name, param in trainer.policy.named_parameters():
        if (grad := param.grad) is not None:  # frozen (LoRA base) parameters have none
            grads[name] = dist.whole(grad).clone()
    # one process: no mesh (the parameters FSDP2 would only copy stay plain tensors)
    mesh = getattr(next(trainer.policy.parameters()), "device_mesh", None)
    if dist.is_main():
        torch.save(
            {
                "metrics": metrics,
                "grads": grads,
                "micro_batches": n_mbs,
                "mesh": mesh and (tuple(mesh.shape), mesh.mesh_dim_names),
            },
            out,
        )
    trainer.close(wait_for_peers=True)


def _env() -> dict[str, str]:
    """CPU ranks (gloo) unless each rank can have a GPU of its own, as NCCL requires."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if torch.cuda.device_count() < 2:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run(cmd: list[str], tmp: Path) -> None:
    """Run `cmd` with `tmp` as its temporary folder; torchrun leaves no folder of its own there."""
    tmp.mkdir()
    env = {**_env(), "TMPDIR": str(tmp)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("torchelastic_")]


def _compare(one: dict, two: dict) -> None:
    assert one["micro_batches"] == two["micro_batches"] >= 3
    for key in ("loss", "num_tokens", "mismatch_kl", "ref_kl"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-6), key
    assert one["grads"].keys() == two["grads"].keys()
    nonzero = 0
    for name, grad in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
        nonzero += int(grad.abs().sum() > 0)
    assert nonzero == len(one["grads"])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., dict]:
    """The one-process reference of a (model, probe arguments) configuration: a trainer process
    run once per module, whichever tests compare against it (dense: two of them)."""
    results: dict[tuple[Path, tuple[str, ...]], dict] = {}

    def reference(model_dir: Path, *args: str) -> dict:
        if (model_dir, args) not in results:
            folder = tmp_path_factory.mktemp("one-process")
            single = folder / "one.pt"
            _run([sys.executable, __file__, str(single), str(model_dir), *args], folder / "tmp")
            results[model_dir, args] = torch.load(single)
        return results[model_dir, args]

    return reference


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["dense", "moe", "lora", "tied"])
def test_two_ranks_match_one_process(
    arch: str,
    one_process: Callable[..., dict],
    tiny_model_dir: Path,
    tiny_moe_model_dir: Path,
    tmp_path: Path,
) -> None:
    """The MoE's experts are 3-D parameters sharded with their decoder layer; a LoRA model's
    FSDP groups mix frozen base weights with the trainable adapter (only it has gradients); a
    tied embedding's rows add their gradient into the unsharded weight's (`model.py`'s hook),
    which FSDP2 then reduces."""
    from rlkit.models import init_tiny

    model_dir = tiny_moe_model_dir if arch == "moe" else tiny_model_dir
    if arch == "tied":
        model_dir = init_tiny(tmp_path / "tied", seed=0, tie_embeddings=True)
    args = ["full", "8"] if arch == "lora" else []
    double = tmp_path / "two.pt"
    torchrun = [sys.executable, *TrainerRanks(nproc=2).torchrun_args()]
    _run([*torchrun, __file__, str(double), str(model_dir), *args], tmp_path / "tmp")
    two = torch.load(double)
    assert two["mesh"] == ((2,), None)
    if arch == "lora":
        assert two["grads"] and all(".lora_" in name for name in two["grads"])
    _compare(one_process(model_dir, *args), two)


@pytest.mark.slow
def test_two_nodes_hybrid_sharding_match_one_process(
    one_process: Callable[..., dict], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two torchrun launchers (--nnodes 2, c10d on 127.0.0.1), one rank each, HSDP."""
    out = tmp_path / "hsdp.pt"
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in (1, 0):  # the non-host node first: it waits for node 0's store
        launch = TrainerRanks(
            nproc=1, nnodes=2, node_rank=node, rdzv_endpoint=endpoint, rdzv_id="hsdp"
        )
        cmd = [sys.executable, *launch.torchrun_args(), __file__, str(out), str(tiny_model_dir)]
        procs.append(
            subprocess.Popen(
                [*cmd, "hybrid"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env()
            )
        )
    for proc in procs:
        output = proc.communicate(timeout=300)[0].decode(errors="ignore")
        assert proc.returncode == 0, output[-3000:]
    two = torch.load(out)
    assert two["mesh"] == ((2, 1), ("replicate", "shard"))
    _compare(one_process(tiny_model_dir), two)


if __name__ == "__main__":
    probe(*sys.argv[1:])
