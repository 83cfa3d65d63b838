"""Publish the policy as an HF model directory that vLLM (and `from_pretrained`) can load, or,
when it trains a LoRA adapter, as a PEFT adapter directory (`export_adapter`).

The sharded parameters are gathered to rank 0 on CPU, cast to the checkpoint's original dtype
and written with `save_pretrained` (which also reverts transformers' in-memory fused layouts,
e.g. MoE experts, to the on-disk names vLLM expects), plus the tokenizer files. The directory
is built under a temporary name, renamed into place, and only then marked published
(`rlkit.protocol.handoff.mark_published`) so a reader that waits for it never sees a partial
model. Beside the weights go the
fingerprint of the files as written (`rlkit.inference.fingerprint`: every engine worker checks
what it reads against it) and the trainer's logprobs of the canary sequence under these weights
(`rlkit.inference.canary`: the orchestrator compares the engine's after the update).
With the broadcast transport (`export_broadcast`) the directory holds the broadcast manifest
instead of tensor files; the tensors travel over the trainer's process group
(`rlkit.trainer.broadcaster`).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from rlkit.atomic import atomic_dir
from rlkit.inference.broadcast import Named, read_manifest, total_bytes, write_manifest
from rlkit.inference.canary import CANARY_FILE, write_canary
from rlkit.inference.fingerprint import write_fingerprint
from rlkit.inference.weights import iter_safetensors
from rlkit.protocol import handoff
from rlkit.protocol.layout import RunLayout
from rlkit.trainer import dist
from rlkit.trainer.config import LoraConfig
from rlkit.trainer.lora import to_peft_state, write_adapter
from rlkit.trainer.model import PolicyModel


def export_hf(
    policy: PolicyModel,
    out: Path,
    tokenizer,
    dtype: torch.dtype,
    extra: dict | None = None,
    canary: tuple[list[int], list[float]] | None = None,
) -> Path | None:
    """Collective. Rank 0 writes `out` atomically, then marks it published; returns it on rank 0.

    `canary`: (token ids, the trainer's logprobs of ids[1:]) written beside the weights."""
    lm = policy.lm

    def write(tmp: Path, full: dict[str, torch.Tensor]) -> None:
        state = hf_state(lm, full, dtype)
        lm.save_pretrained(tmp, state_dict=state, safe_serialization=True)
        config = copy.deepcopy(lm.config)  # save_pretrained records the fp32 training dtype
        config.dtype = dtype
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # from the files as written: save_pretrained may rename tensors (MoE experts)
        write_fingerprint(tmp, iter_safetensors(tmp))
        if canary is not None:
            write_canary(tmp, *canary)

    return _publish(
        policy, out, StateDictOptions(full_state_dict=True, cpu_offload=True), write, extra
    )


def export_broadcast(
    policy: PolicyModel,
    out: Path,
    dtype: torch.dtype,
    make_manifest: Callable[[list[Named]], dict],
    extra: dict | None = None,
    canary: tuple[list[int], list[float]] | None = None,
) -> list[Named] | None:
    """Collective. Like `export_hf` for the broadcast transport: rank 0 publishes `out` with
    the broadcast manifest (`make_manifest(tensors)`), fingerprint and canary but no tensor
    files, and returns the tensors to send, in their on-disk names and dtype (what
    `save_pretrained` would write: tied aliases dropped, in-memory fused layouts reverted)."""
    lm = policy.lm
    sent: list[list[Named]] = []

    def write(tmp: Path, full: dict[str, torch.Tensor]) -> None:
        state = on_disk(lm, hf_state(lm, full, dtype))
        tensors = [(name, tensor.contiguous()) for name, tensor in state.items()]
        write_fingerprint(tmp, tensors)
        if canary is not None:
            write_canary(tmp, *canary)
        write_manifest(tmp, make_manifest(tensors))
        sent.append(tensors)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if _publish(policy, out, options, write, extra) is None:
        return None
    return sent[0]


def write_weight_files(out: Path, tensors: list[Named], source: Path) -> Path:
    """The filesystem copy of a broadcast version: `tensors` as safetensors in `out`, with
    their fingerprint and `source`'s canary, atomically and marked STABLE (what a server
    that missed the broadcast, or rejoins, loads through ``/rlkit/update_weights``)."""
    from safetensors.torch import save_file

    with atomic_dir(out, durable=False) as tmp:
        save_file(dict(tensors), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_fingerprint(tmp, tensors)
        if (source / CANARY_FILE).is_file():
            shutil.copy(source / CANARY_FILE, tmp / CANARY_FILE)
    handoff.mark_published(out)
    return out


def on_disk(lm: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` as `save_pretrained` writes it: transformers >= 5 reverts its in-memory fused
    layouts (MoE experts) to the checkpoint's names; older releases have none."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return state
    return revert_weight_conversion(lm, state)


def hf_state(lm: torch.nn.Module, full: dict[str, torch.Tensor], dtype: torch.dtype) -> dict:
    """The gathered state dict under the HF model's names, in `dtype`, tied aliases dropped
    (one name per tensor, like HF checkpoints)."""
    aliases = {n for n, _ in lm.named_parameters(remove_duplicate=False)}
    aliases -= {n for n, _ in lm.named_parameters()}
    state = {k.removeprefix("lm."): v.to(dtype) for k, v in full.items()}
    return {k: v for k, v in state.items() if k not in aliases}


def export_adapter(
    policy: PolicyModel,
    out: Path,
    cfg: LoraConfig,
    base_model: str,
    dtype: torch.dtype,
    extra: dict | None = None,
) -> Path | None:
    """Collective. Like `export_hf` for a LoRA policy: only the adapter's (trainable) tensors
    are gathered, and rank 0 writes them as a PEFT adapter directory (`rlkit.trainer.lora`).
    vLLM loads adapters itself: no worker fingerprint check and no canary (`Trainer.export`)."""

    def write(tmp: Path, full: dict[str, torch.Tensor]) -> None:
        tensors = to_peft_state({k.removeprefix("lm."): v.to(dtype) for k, v in full.items()})
        write_adapter(tmp, tensors, cfg, base_model)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return _publish(policy, out, options, write, extra)


def _publish(
    policy: PolicyModel,
    out: Path,
    options: StateDictOptions,
    write: Callable[[Path, dict[str, torch.Tensor]], None],
    extra: dict | None,
) -> Path | None:
    """Collective: gather the state dict to rank 0, which lets `write` fill a temporary
    directory renamed to `out` (a hand-off to the servers: not flushed), then marks it published."""
    full = get_model_state_dict(policy, options=options)
    if not dist.is_main():
        dist.barrier()
        return None
    with atomic_dir(out, durable=False) as tmp:
        write(tmp, full)
        if extra:
            (tmp / "rlkit_export.json").write_text(json.dumps(extra, indent=2) + "\n")
    handoff.mark_published(out)
    dist.barrier()
    return out


def published_bytes(path: str | Path) -> int:
    """Bytes of tensors a published version holds (all weights, or just the adapter, or what
    its broadcast manifest sends): what one policy update moves to every server."""
    manifest = read_manifest(path)
    if manifest is not None:
        return total_bytes(manifest)
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def prune_weights(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` published weight dirs (rank 0 only)."""
    done = RunLayout(run_dir).weights_versions()
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
