"""Supervised fine-tuning on chat data: cross-entropy on assistant tokens, same FSDP2 trainer.

Rows are `{"messages": [...]}` or `{"prompt": [...], "completion": [...]}` (chat messages), from
a JSONL file or an HF dataset. Assistant tokens are found through the model's own chat template:
the conversation up to an assistant turn is rendered with the generation prompt, then with the
turn, and the token difference is that turn (so it includes the end-of-turn token the model
must learn to emit). The step plan is a pure function of (data, seed), so a resumed run only
needs the step number to continue on exactly the same samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from torch import Tensor

from rlkit.errors import UsageError
from rlkit.progress import make_console
from rlkit.protocol.layout import RunLayout
from rlkit.trainer import dist
from rlkit.trainer.config import SFTConfig, SFTDataConfig
from rlkit.trainer.metrics_log import MetricsLog
from rlkit.trainer.packing import MicroBatch, TokenSequence
from rlkit.trainer.trainer import Trainer

console = make_console(stderr=True)


def load_rows(cfg: SFTDataConfig) -> list[dict[str, Any]]:
    """Rows from a local JSON/JSONL file or an HF dataset name (loaded with `datasets`)."""
    import datasets

    if not cfg.path:
        raise UsageError("data.path is empty: set it to a JSONL file or an HF dataset name")
    path = Path(cfg.path)
    try:
        if path.suffix in (".jsonl", ".json"):
            if not path.is_file():
                raise UsageError(f"data.path {path}: file not found")
            ds = datasets.load_dataset("json", data_files=str(path), split="train")
        elif path.exists():
            ds = datasets.load_from_disk(str(path))
            ds = ds[cfg.split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(cfg.path, split=cfg.split)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"cannot load data.path {cfg.path!r}: {exc}") from exc
    return list(ds)


def conversation(row: dict[str, Any], index: int) -> list[dict[str, Any]]:
    if "messages" in row and row["messages"]:
        messages = row["messages"]
    elif "prompt" in row and "completion" in row:
        messages = list(row["prompt"]) + list(row["completion"])
    else:
        raise UsageError(f"data row {index}: needs `messages` or `prompt` + `completion` lists")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m for m in messages
    ):
        raise UsageError(f"data row {index}: messages must be a list of {{role, content}} dicts")
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def tokenize_conversation(tokenizer, messages: list[dict[str, Any]], index: int) -> TokenSequence:
    """Token ids of the whole conversation and a mask of its assistant turns' tokens."""

    def ids(msgs: list[dict[str, Any]], gen_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen_prompt)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    full = ids(messages, False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(ids(messages[:i], True))
        upto = ids(messages[: i + 1], False)
        if full[: len(upto)] != upto:
            raise UsageError(
                f"data row {index}: the chat template does not render turn {i} as a prefix of "
                "the conversation, so assistant tokens cannot be located"
            )
        mask[start : len(upto)] = [1] * (len(upto) - start)
    return TokenSequence(token_ids=full, loss_mask=mask, inference_logprobs=[0.0] * len(full))


def build_sequences(tokenizer, rows: list[dict[str, Any]], max_len: int) -> list[TokenSequence]:
    seqs = []
    for i, row in enumerate(rows):
        seq = tokenize_conversation(tokenizer, conversation(row, i), i)
        n = min(max_len, len(seq.token_ids))
        seq = TokenSequence(seq.token_ids[:n], seq.loss_mask[:n], [0.0] * n)
        if any(seq.loss_mask[1:]):
            seqs.append(seq)
    if not seqs:
        raise UsageError("no data row has assistant tokens to train on")
    return seqs


def plan_steps(seqs: list[TokenSequence], cfg: SFTDataConfig, seed: int) -> list[list[int]]:
    """Sample indices of every optimiser step over all epochs (seeded shuffle per epoch)."""
    steps: list[list[int]] = []
    for epoch in range(cfg.epochs):
        order = np.arange(len(seqs))
        if cfg.shuffle:
            order = np.random.default_rng([seed, epoch]).permutation(len(seqs))
        current: list[int] = []
        tokens = 0
        for i in order.tolist():
            n = len(seqs[i].token_ids)
            if current and tokens + n > cfg.batch_tokens:
                steps.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += n
        if current:
            steps.append(current)
    return steps


def sft_loss(
    mb: MicroBatch, logprobs: Tensor, _old: Tensor | None, entropy: Tensor, normalizer: float
) -> tuple[Tensor, dict[str, float]]:
    """Mean negative log-likelihood over all assistant tokens of the optimiser step."""
    mask = mb.loss_mask.to(logprobs.device)
    loss = -(logprobs * mask).sum() / normalizer
    count = mask.sum().clamp(min=1)
    metrics = {
        "loss": float(loss.detach()),
        "num_tokens": float(mask.sum()),
        "entropy": float((entropy * mask).sum() / count),
    }
    return loss, metrics


def run_sft(cfg: SFTConfig) -> Path:
    """Train, checkpoint every `ckpt.interval` steps, and write `run_dir/final` (HF model dir)."""
    from transformers import AutoTokenizer

    if not cfg.model.path:
        raise UsageError("model.path is empty: set it to a local HF model directory or HF name")
    run_dir = Path(cfg.run_dir)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    seqs = build_sequences(tokenizer, load_rows(cfg.data), cfg.data.max_seq_len)
    plan = plan_steps(seqs, cfg.data, cfg.seed)
    total = min(len(plan), cfg.max_steps) if cfg.max_steps else len(plan)
    trainer = Trainer(cfg, total_steps=total)
    try:
        step, _ = trainer.maybe_resume()
        metrics = MetricsLog(RunLayout(run_dir).sft_metrics, step, enabled=dist.is_main())
        columns = [TextColumn("sft"), BarColumn(), TextColumn("{task.completed}/{task.total}")]
        columns += [TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn()]
        with Progress(*columns, console=console, disable=not dist.is_main()) as progress:
            task = progress.add_task("sft", total=total, completed=step, loss=float("nan"))
            while step < total:
                batch = [seqs[i] for i in plan[step]]
                normalizer = float(sum(sum(s.loss_mask[1:]) for s in batch))
                result = trainer.train_step(batch, sft_loss, normalizer)
                step += 1
                metrics.append({"step": step, **result.metrics})
                progress.update(task, completed=step, loss=result.metrics.get("loss", 0.0))
                if cfg.ckpt.interval and step % cfg.ckpt.interval == 0:
                    trainer.save_checkpoint(step, {"sft_step": step})
        final = RunLayout(run_dir).sft_model
        trainer.export(final, extra={"step": step, "source": cfg.model.path})
        if dist.is_main():
            console.print(f"wrote {final}")
        trainer.close(wait_for_peers=True)
        return final
    finally:
        trainer.close()
