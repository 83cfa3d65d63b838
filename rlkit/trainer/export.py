"""Publish the policy as a version the engines load (`export_version`), or, when it trains a
LoRA adapter, as a PEFT adapter directory (`export_adapter`).

The sharded parameters are gathered to rank 0 on CPU and cast to the checkpoint's original dtype
under the names vLLM expects; the run's weight transport (`rlkit.weights`) makes them reachable
(files, a broadcast, a shared buffer) and the version's record
(`rlkit.protocol.weights.PublishedVersion`: tensor table, the transport's delivery fields) goes
beside them. Each tensor's tag for the record's table (under this publication's fresh nonce) is
computed on other threads: where a core is to spare, as soon as the tensor is gathered, while
the next one is gathered (`rlkit.protocol.weights.Digester`). The directory is built under a
temporary name, renamed into place, and only then marked published
(`rlkit.protocol.handoff.mark_published`) so a reader that waits for it never sees a partial
version.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlkit.atomic import atomic_dir
from rlkit.protocol import handoff
from rlkit.protocol.credentials import digest_key
from rlkit.protocol.layout import RunLayout
from rlkit.protocol.model import LoraConfig
from rlkit.protocol.weights import Digester, Named, PublishedVersion
from rlkit.trainer import dist
from rlkit.trainer.lora import to_peft_state, write_adapter
from rlkit.trainer.model import PolicyModel
from rlkit.weights import ModelFiles, WeightTransport
from rlkit.weights.transport import destination_of


def export_version(
    policy: PolicyModel,
    out: Path,
    dtype: torch.dtype,
    transport: WeightTransport | None,
    version: int,
    model_files: ModelFiles,
    extra: dict | None = None,
    token: str | None = None,
) -> Path | None:
    """Collective. Rank 0 (the exporting rank: it alone holds `transport`) publishes policy
    `version` in `out`: the tensors in their on-disk names and `dtype` (what `save_pretrained`
    would write: tied aliases dropped, in-memory fused layouts reverted), made reachable by the
    transport, and the version's record (tensor table, the transport's delivery fields) beside
    them. Returns `out` on rank 0 (the canary follows: `Trainer.publish_canary`)."""
    lm = policy.lm
    sent: list[tuple[PublishedVersion, list[Named]]] = []
    # a fresh nonce for this publication; each tensor tagged as soon as it is gathered
    digester = Digester(digest_key(token))

    def write(tmp: Path, full: dict[str, torch.Tensor]) -> None:
        assert transport is not None, "the exporting rank publishes through a transport"
        state = on_disk(lm, hf_state(lm, full))
        tensors = [(name, tensor.contiguous()) for name, tensor in state.items()]
        record = PublishedVersion.build(version, transport.name, tensors, digester)
        record = transport.publish(tmp, record, tensors).signed(token)
        record.write(tmp)
        sent.append((record, tensors))

    def gathered(name: str, tensor: torch.Tensor) -> None:
        digester.add(tensor, hf_name(name))  # the name it is published under, mostly

    # the transport's own memory the gather may cast straight into (ipc's buffer), by name
    views = destination_of(transport) if transport is not None else None

    def into(name: str) -> torch.Tensor | None:
        return views.get(hf_name(name)) if views else None

    with digester:
        if _publish(policy, out, dtype, write, extra, gathered=gathered, into=into) is None:
            return None
    assert transport is not None
    transport.published(out, *sent[0])
    return out


def hf_model_files(lm: torch.nn.Module, tokenizer: Any, dtype: torch.dtype) -> ModelFiles:
    """Writes the model's config (with its published dtype) and tokenizer into a directory, so
    that a version's files are a loadable HF model."""

    def write(directory: Path) -> None:
        config = copy.deepcopy(lm.config)  # the in-memory config records the fp32 training dtype
        config.dtype = dtype
        config.save_pretrained(directory)
        if getattr(lm, "generation_config", None) is not None:
            lm.generation_config.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return write


def on_disk(lm: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` as `save_pretrained` writes it: transformers >= 5 reverts its in-memory fused
    layouts (MoE experts) to the checkpoint's names; older releases have none."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return state
    return revert_weight_conversion(lm, state)


def hf_name(name: str) -> str:
    """A gathered tensor's name in the HF model."""
    return name.removeprefix("lm.")


def hf_state(lm: torch.nn.Module, full: dict[str, torch.Tensor]) -> dict:
    """The gathered state dict under the HF model's names, tied aliases dropped (one name per
    tensor, like HF checkpoints)."""
    aliases = {n for n, _ in lm.named_parameters(remove_duplicate=False)}
    aliases -= {n for n, _ in lm.named_parameters()}
    state = {hf_name(k): v for k, v in full.items()}
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
        tensors = to_peft_state({k.removeprefix("lm."): v for k, v in full.items()})
        write_adapter(tmp, tensors, cfg, base_model)

    return _publish(policy, out, dtype, write, extra, trainable_only=True)


def gather_state(
    policy: torch.nn.Module,
    dtype: torch.dtype,
    trainable_only: bool = False,
    gathered_hook: Callable[[str, torch.Tensor], None] | None = None,
    into: Callable[[str], torch.Tensor | None] | None = None,
) -> dict[str, torch.Tensor]:
    """Collective: the whole state dict on rank 0's CPU in `dtype` (empty on other ranks).

    Gathered and cast one tensor at a time, so the exporting rank holds the model once in
    `dtype` plus one full fp32 tensor, not a full fp32 copy beside its cast (measured by
    `tests/benchmarks/bench_export_memory.py`); where `into(name)` gives a CPU tensor of the
    shape and `dtype` (a weight transport's buffer), the cast writes there instead of into a
    new one. A tied tensor is gathered once and appears under each of its names. Rank 0 hands
    each CPU tensor, with its first name, to `gathered_hook` as soon as it exists (the export's
    tags then run while the next one is gathered)."""
    main = dist.is_main()
    gathered: dict[int, torch.Tensor | None] = {}  # id of a tensor -> its gathered copy
    state: dict[str, torch.Tensor] = {}
    for name, value in policy.state_dict(keep_vars=True).items():
        if trainable_only and not value.requires_grad:
            continue
        if id(value) not in gathered:
            whole = dist.whole(value)
            target = into(name) if main and into is not None else None
            if target is not None and (target.shape, target.dtype) == (whole.shape, dtype):
                gathered[id(value)] = target.copy_(whole.detach())  # cast on the way
            else:
                # a copy even where no cast is needed: the transport may read it later
                gathered[id(value)] = whole.detach().to("cpu", dtype, copy=True) if main else None
            if main and gathered_hook is not None:
                gathered_hook(name, gathered[id(value)])
        if main:
            state[name] = gathered[id(value)]
    return state


def _publish(
    policy: PolicyModel,
    out: Path,
    dtype: torch.dtype,
    write: Callable[[Path, dict[str, torch.Tensor]], None],
    extra: dict | None,
    trainable_only: bool = False,
    gathered: Callable[[str, torch.Tensor], None] | None = None,
    into: Callable[[str], torch.Tensor | None] | None = None,
) -> Path | None:
    """Collective: gather the state dict to rank 0 (each tensor to `gathered` as it comes, cast
    into `into(name)` where it gives one), which lets `write` fill a temporary directory renamed
    to `out` (a hand-off to the servers: not flushed), then marks it published."""
    full = gather_state(policy, dtype, trainable_only, gathered, into)
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


def prune_weights(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` published weight dirs (rank 0 only)."""
    done = RunLayout(run_dir).weights_versions()
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
